package upper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// markMetacopy gives fd, the copy of src, the kernel's marks of a metacopy
// file: overlay.origin, a file handle of the lower file, and an empty
// overlay.metacopy. Like the kernel, it records no origin for a lower hard
// link, whose association with its other names the copy-up breaks (Linux:
// ovl_copy_up_metadata()).
func (l *Layer) markMetacopy(fd int, src Source) error {
	if fh, ok := originFH(src.Dir, src.Name); ok && src.Stat.Nlink == 1 {
		// Best effort, as the kernel's: a lower filesystem without
		// file handles gets no origin.
		if err := unix.Fsetxattr(fd, l.opts.XattrPrefix+"origin", fh, 0); err != nil {
			return fmt.Errorf("origin: %w", err)
		}
	}
	if err := unix.Fsetxattr(fd, l.opts.XattrPrefix+lower.MetacopyXattr, nil, 0); err != nil {
		return fmt.Errorf("metacopy: %w", err)
	}
	return nil
}

// originFH encodes the file handle of entry name of d as the kernel stores
// it in overlay.origin (Linux: fs/overlayfs/overlayfs.h struct ovl_fb,
// ovl_encode_real_fh()): version 0, magic 0xfb, the length, flags (the
// byte order: big-endian or none), the handle type, the filesystem's uuid
// (null, as the kernel writes it with uuid=null or on one filesystem), and
// the handle itself.
func originFH(d *lower.Dir, name string) ([]byte, bool) {
	var h unix.FileHandle
	err := d.Do(func(fd int) error {
		var err error
		h, _, err = unix.NameToHandleAt(fd, name, 0)
		return err
	})
	if err != nil || h.Size() == 0 || 21+h.Size() > 255 {
		return nil, false
	}
	var flags byte
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 {
		flags = 1 // OVL_FH_FLAG_BIG_ENDIAN
	}
	fb := make([]byte, 21, 21+h.Size())
	fb[0], fb[1], fb[2], fb[3], fb[4] = 0, 0xfb, byte(21+h.Size()), flags, byte(h.Type())
	return append(fb, h.Bytes()...), true
}

// DataInOptions say what CopyDataIn does beyond removing the metacopy
// mark.
type DataInOptions struct {
	// Data copies the data; without it (an open with O_TRUNC, which
	// discards the data) nothing is copied.
	Data bool
	// KeepMtime puts the file's mtime back after the copy: with the
	// kernel's writeback cache the kernel keeps the mtime itself and may
	// have set it already, and the copy is not a change of the file.
	KeepMtime bool
	// Ino, when not zero, is recorded as CopyUp records it.
	Ino uint64
}

// CopyDataIn copies the data of metacopy file name of upper directory d
// into it, in place, from data, and makes it a file of its own (Linux:
// fs/overlayfs/copy_up.c ovl_copy_up_meta_inode_data()): the commit point is
// the removal of overlay.metacopy, before which the data is synced (unless
// fsync=0), so that a crash leaves a file that still reads the lower data.
// The number in o.Ino is recorded in place of overlay.origin: the file no
// longer reports its lower file's number by itself. Writing the file would
// remove security.capability (and, for a daemon without CAP_FSETID, suid
// and sgid): they are put back, as the kernel puts the capability back.
func (l *Layer) CopyDataIn(d *lower.Dir, name string, data *lower.DataFile, o DataInOptions) error {
	fd, err := d.Open(name, unix.O_WRONLY)
	if err != nil {
		return fmt.Errorf("copy up data of %q: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if o.Data && st.Size > 0 {
		if err := l.fillData(fd, &st, data, o.KeepMtime); err != nil {
			return fmt.Errorf("copy up data of %q: %w", name, err)
		}
	}
	ino := o.Ino
	if ino != 0 {
		// Best effort, as in CopyUp. The number replaces the
		// origin, as after any copy-up of goverlay's: both together
		// would not fit in an ext4 inode, and the file would take an
		// xattr block the kernel's copy does not.
		unix.Fremovexattr(fd, l.opts.XattrPrefix+"origin")
		unix.Fsetxattr(fd, l.opts.XattrPrefix+InoXattr, []byte(strconv.FormatUint(ino, 10)), 0)
	}
	err = unix.Fremovexattr(fd, l.opts.XattrPrefix+lower.MetacopyXattr)
	if err != nil && !errors.Is(err, unix.ENODATA) {
		return fmt.Errorf("copy up data of %q: %w", name, err)
	}
	return nil
}

// fillData copies data's contents into fd, a metacopy file with stat st,
// and with keepMtime puts st's mtime back.
func (l *Layer) fillData(fd int, st *unix.Stat_t, data *lower.DataFile, keepMtime bool) error {
	caps, capsErr := fgetxattr(fd, capabilityXattr)
	err := copyOpened(fd, func() (int, error) { return data.Open(unix.O_RDONLY) }, st.Size)
	if err != nil {
		return err
	}
	if capsErr == nil {
		if err := unix.Fsetxattr(fd, capabilityXattr, caps, 0); err != nil {
			return err
		}
	}
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return err
	}
	if after.Mode != st.Mode {
		if err := unix.Fchmod(fd, st.Mode&07777); err != nil {
			return err
		}
	}
	if keepMtime {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, st.Mtim}
		if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
			return err
		}
	}
	if !l.opts.NoFsync {
		return unix.Fsync(fd)
	}
	return nil
}

const capabilityXattr = "security.capability"

// fgetxattr reads attribute attr of fd whatever its size.
func fgetxattr(fd int, attr string) ([]byte, error) {
	for size := 64; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Fgetxattr(fd, attr, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<16 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// SetFileRedirect is SetRedirect for a non-directory: entry name of d, a
// metacopy file that moves or gets another name, records where its data
// is (Linux: fs/overlayfs/dir.c ovl_set_redirect()).
func (l *Layer) SetFileRedirect(d *lower.Dir, name, path string, u *Undo) error {
	attr := l.opts.XattrPrefix + "redirect"
	old, err := d.Getxattr(name, attr)
	had := err == nil
	if err != nil && !errors.Is(err, unix.ENODATA) {
		return err
	}
	set := func(v []byte) error {
		return d.DoPath(name, func(p string) error { return unix.Lsetxattr(p, attr, v, 0) })
	}
	if err := set([]byte(path)); err != nil {
		return err
	}
	u.push(func() error {
		if had {
			return set(old)
		}
		return d.DoPath(name, func(p string) error { return unix.Lremovexattr(p, attr) })
	})
	return nil
}

// ProbeMetacopy reports whether the upper filesystem lets the daemon mark
// a file as a metacopy file: trusted.* xattrs need CAP_SYS_ADMIN in the
// initial user namespace.
func (l *Layer) ProbeMetacopy() error {
	name := l.tmpName()
	fd, err := unix.Openat(l.wfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fsetxattr(fd, l.opts.XattrPrefix+lower.MetacopyXattr, nil, 0)
	unix.Close(fd)
	unix.Unlinkat(l.wfd, name, 0)
	return err
}
