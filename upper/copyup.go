package upper

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// Source is an object to copy up: entry Name of directory Dir in a lower
// layer, with its stat.
type Source struct {
	Dir  *lower.Dir
	Name string
	Stat unix.Stat_t
	// Override, when set, is the source's owner and mode as the mount
	// shows them (from its override xattr): the copy gets them in the
	// upper layer's override xattr, or for real when the upper layer
	// keeps none (KeepsOverride). Stat stays the real stat.
	Override *lower.Override
	// Data, when set, is where the source's data is: the source is a
	// metacopy file of a lower layer.
	Data *lower.DataFile
	// Meta makes the copy of a regular file a metacopy file: its
	// metadata, the lower file's size as a hole, overlay.origin and an
	// empty overlay.metacopy, as the kernel's with metacopy=on (Linux:
	// fs/overlayfs/copy_up.c ovl_copy_up_metadata()). Its data is read
	// from the lower file until CopyDataIn.
	Meta bool
}

// openData opens the source's data for reading.
func (src *Source) openData() (int, error) {
	if src.Data != nil {
		return src.Data.Open(unix.O_RDONLY)
	}
	return src.Dir.Open(src.Name, unix.O_RDONLY)
}

// CopyUp copies src into directory dst of the upper layer under name, the
// way the kernel does (Linux: fs/overlayfs/copy_up.c ovl_copy_up_one()):
// the copy is built in the workdir (data, owner, mode, xattrs other than the
// overlay's own, times), fsynced, and published with one
// renameat2(RENAME_NOREPLACE). Without data (an open with O_TRUNC) a
// regular file is copied empty. ino, when not zero, is recorded so that the
// object keeps its inode number across remounts (InoXattr).
//
// If another copy-up of the same directory won the race, CopyUp removes its
// own copy and returns nil: the directory is in the upper layer either
// way. A non-directory already holding the name is EEXIST: the caller
// serialises the copy-ups of one file, so that is another file (one
// renamed there), which must not be taken for this one.
func (l *Layer) CopyUp(src Source, dst *lower.Dir, name string, data bool, ino uint64) error {
	tmp := l.tmpName()
	if err := l.build(src, tmp, data); err != nil {
		removeAll(l.Work, tmp)
		return fmt.Errorf("copy up %q: %w", name, err)
	}
	if ino != 0 && !src.Meta {
		// Best effort: without it only st_ino changes at the next mount.
		// A metacopy file reports its lower file's number, as the
		// kernel's, and gets the xattr with its data (CopyDataIn):
		// without it, its xattr block holds only overlay.metacopy,
		// which ext4 shares among all such files, as the kernel's.
		l.Work.DoPath(tmp, func(p string) error {
			return xattr.LSet(p, l.opts.XattrPrefix+InoXattr, []byte(strconv.FormatUint(ino, 10)))
		})
	}
	var times [2]unix.Timespec
	restore := l.saveTimes(dst, &times)
	dfd, release, err := dst.Pin()
	if err != nil {
		removeAll(l.Work, tmp)
		return err
	}
	defer release()
	err = unix.Renameat2(l.wfd, tmp, dfd, name, unix.RENAME_NOREPLACE)
	if err != nil {
		removeAll(l.Work, tmp)
		if errors.Is(err, unix.EEXIST) && src.Stat.Mode&unix.S_IFMT == unix.S_IFDIR {
			var st unix.Stat_t
			if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return nil
			}
		}
		return fmt.Errorf("copy up %q: publish: %w", name, err)
	}
	if restore {
		// A copy-up is not a change of the parent as far as the
		// mount is concerned (Linux: ovl_set_timestamps(pstat)).
		unix.UtimesNanoAt(dfd, ".", times[:], 0)
	}
	return nil
}

// CopyUpTemp copies src into the workdir under a fresh name, which it
// returns, and gives it no other: the copy-up of an open file whose last
// name was removed. RemoveTemp removes it; a crash leaves it to Open's
// cleaning of the workdir.
func (l *Layer) CopyUpTemp(src Source, data bool) (string, error) {
	tmp := l.tmpName()
	if err := l.build(src, tmp, data); err != nil {
		removeAll(l.Work, tmp)
		return "", fmt.Errorf("copy up %q: %w", src.Name, err)
	}
	return tmp, nil
}

// InoXattr, under the overlay's xattr prefix, holds the inode number an
// object had before its copy-up.
const InoXattr = "goverlay.ino"

// saveTimes reads the atime and mtime of directory d.
func (l *Layer) saveTimes(d *lower.Dir, ts *[2]unix.Timespec) bool {
	var st unix.Stat_t
	if d.StatSelf(&st) != nil {
		return false
	}
	ts[0], ts[1] = st.Atim, st.Mtim
	return true
}

// build makes the copy of src at tmp in the workdir.
func (l *Layer) build(src Source, tmp string, data bool) error {
	w := l.wfd
	st := &src.Stat
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fd, err := unix.Openat(w, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		switch {
		case src.Meta:
			// A hole of the file's size: the kernel overlay reports
			// the upper's size, and reads the lower's data.
			if err := unix.Ftruncate(fd, st.Size); err != nil {
				return err
			}
		case data && st.Size > 0:
			if err := copyOpened(fd, src.openData, st.Size); err != nil {
				return err
			}
		}
		if err := l.setMeta(tmp, src); err != nil {
			return err
		}
		if src.Meta {
			// No fsync: there is no data to lose, and the upper
			// filesystem's journal commits the inode's metadata
			// and xattrs before the rename that publishes it, as
			// the kernel relies on (ovl_copy_up_metadata() syncs
			// nothing; ovl_copy_up_file() syncs copied data).
			return l.markMetacopy(fd, src)
		}
		if !l.opts.NoFsync {
			return unix.Fsync(fd)
		}
		return nil
	case unix.S_IFDIR:
		if err := unix.Mkdirat(w, tmp, 0o700); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := src.Dir.Readlink(src.Name)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(string(target), w, tmp); err != nil {
			return err
		}
	default:
		if err := unix.Mknodat(w, tmp, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return err
		}
	}
	return l.setMeta(tmp, src)
}

// setMeta gives the copy at tmp the source's owner, mode, xattrs and times.
// chown comes first because it clears suid/sgid and security.capability,
// which chmod and the xattr copy then restore.
func (l *Layer) setMeta(tmp string, src Source) error {
	w := l.wfd
	st := &src.Stat
	if st.Uid == lower.NoID || st.Gid == lower.NoID {
		// An owner the source's id-mapped mount could not show
		// (lower.NoID): the kernel refuses such a copy-up too.
		return unix.EOVERFLOW
	}
	o := lower.OverrideOf(st)
	if src.Override != nil {
		o.Uid, o.Gid = src.Override.Uid, src.Override.Gid
		o.Mode = st.Mode&unix.S_IFMT | src.Override.Mode&07777
		if t := src.Override.Mode & unix.S_IFMT; st.Mode&unix.S_IFMT == unix.S_IFREG && t != 0 && t != unix.S_IFREG {
			// A device kept as a plain file stays one, and says so.
			o.Mode, o.Rdev = t|o.Mode&07777, src.Override.Rdev
		}
	}
	// Without Override the source is copied as it is, its override
	// xattr (if any) with the others.
	keep := src.Override != nil && l.KeepsOverride(st.Mode)
	if !keep {
		if err := l.setRealOwner(tmp, o); err != nil {
			return err
		}
	}
	if err := copyXattrs(src.Dir, src.Name, l.Work, tmp); err != nil {
		return err
	}
	if keep {
		// After the xattr copy, which may bring the source's own.
		if err := l.setOverrideOwner(tmp, o); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(w, tmp, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// copyXattrs copies every attribute but the overlay's own. Attributes the
// upper filesystem does not support are skipped, as the kernel does for
// EOPNOTSUPP (Linux: ovl_copy_xattr()).
func copyXattrs(from *lower.Dir, fromName string, to *lower.Dir, toName string) error {
	names, err := from.Listxattr(fromName)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil
		}
		return err
	}
	return to.DoPath(toName, func(dst string) error {
		for _, a := range names {
			if lower.IsPrivateXattr(a) {
				continue
			}
			v, err := from.Getxattr(fromName, a)
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			if err != nil {
				return err
			}
			if err := xattr.LSet(dst, a, v); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("xattr %s: %w", a, err)
			}
		}
		return nil
	})
}

// copyOpened copies size bytes into out from the file open gives, which it
// closes after.
func copyOpened(out int, open func() (int, error), size int64) error {
	in, err := open()
	if err != nil {
		return err
	}
	defer unix.Close(in)
	return copyData(out, in, size)
}

// copyData copies size bytes from in to out: a reflink where the filesystem
// shares extents (FICLONE), else the data segments one by one so that holes
// stay holes, with copy_file_range, else read/write.
func copyData(out, in int, size int64) error {
	if unix.IoctlFileClone(out, in) == nil {
		// A clone takes the whole file; the copy is of size bytes.
		return unix.Ftruncate(out, size)
	}
	var off int64
	for off < size {
		start, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			// No SEEK_DATA: copy everything as data.
			start = off
		}
		end, err := unix.Seek(in, start, unix.SEEK_HOLE)
		if err != nil {
			end = size
		}
		if end > size {
			end = size
		}
		if _, err := CopyRange(out, in, start, start, end-start); err != nil {
			return err
		}
		off = end
	}
	// A trailing hole: give the file its size without writing zeros.
	return unix.Ftruncate(out, size)
}

// CopyRange copies up to n bytes of in at inOff to out at outOff, as
// copy_file_range(2) between two files of a mount does: with
// copy_file_range, else through a buffer where the two filesystems cannot
// copy between themselves (EXDEV across filesystems, EOPNOTSUPP), or
// where copy_file_range copies nothing before the end of the range: some
// filesystems answer 0 for files they cannot copy, which must not end a
// copy-up short (copyData fills the rest with a hole); the buffer copy
// then finds the real end. It stops at the end of in and returns the
// bytes copied, which are the bytes copied so far when it fails after
// some.
func CopyRange(out, in int, outOff, inOff, n int64) (int64, error) {
	var done int64
	for done < n {
		roff, woff := inOff+done, outOff+done
		c, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(n-done, 1<<30)), 0)
		if err == nil && c > 0 {
			done += int64(c)
			continue
		}
		if err == nil || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
			errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
			k, err := readWriteAt(out, in, outOff+done, inOff+done, n-done)
			return done + k, err
		}
		return done, err
	}
	return done, nil
}

// readWriteAt copies up to n bytes of in at inOff to out at outOff
// through a buffer, up to the end of in.
func readWriteAt(out, in int, outOff, inOff, n int64) (int64, error) {
	buf := make([]byte, min(n, 1<<20))
	var done int64
	for done < n {
		c, err := unix.Pread(in, buf[:min(n-done, int64(len(buf)))], inOff+done)
		if err != nil {
			return done, err
		}
		if c == 0 {
			break
		}
		for w := 0; w < c; {
			k, err := unix.Pwrite(out, buf[w:c], outOff+done+int64(w))
			if err != nil {
				return done + int64(w), err
			}
			w += k
		}
		done += int64(c)
	}
	return done, nil
}
