// Package upper writes the upper layer in the kernel overlay's on-disk
// format: copy-up through the workdir, whiteouts, opaque directories.
//
// Every new object is built in the workdir and published with one rename
// or, for a new regular file, made unnamed (O_TMPFILE) and published with
// one linkat, so a reader never sees it half made, and a crash leaves at
// most a stray entry in the workdir, which Open removes at the next mount.
package upper

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// WhiteoutFormat says how deletions are recorded.
type WhiteoutFormat int

const (
	// KernelWhiteouts are char 0/0 devices (Linux overlayfs).
	KernelWhiteouts WhiteoutFormat = iota
	// AUFSWhiteouts are empty ".wh.NAME" files, for upper filesystems that
	// refuse mknod (some rootless setups).
	AUFSWhiteouts
)

func (f WhiteoutFormat) String() string {
	if f == AUFSWhiteouts {
		return "aufs (.wh. files)"
	}
	return "kernel (char 0/0)"
}

// Options configure the upper layer.
type Options struct {
	// XattrPrefix is "trusted.overlay." or, with userxattr,
	// "user.overlay.": the namespace the overlay's own marks go to.
	XattrPrefix string
	// NoFsync skips the fsync of copied-up data before it is published
	// (-o fsync=0, volatile).
	NoFsync bool
}

// Layer is the writable layer and its workdir.
type Layer struct {
	*lower.Layer
	// Work is the scratch directory workdir/work, on the upper's
	// filesystem, where objects are built before they are renamed into
	// place.
	Work *lower.Dir
	// Whiteouts is the format deletions are written in.
	Whiteouts WhiteoutFormat
	// workdir is the workdir itself, whose fd holds its lock
	// (lockInUse) until Close.
	workdir *lower.Dir
	// wfd is Work's fd, which stays open until Close (Work has no parent
	// to be reopened from, so the fd cache never closes it).
	wfd int

	opts Options
	// tmpPrefix and seq make the names of objects in the workdir:
	// "#pid." and a sequence number (tmpName).
	tmpPrefix string
	seq       atomic.Uint64
	// tmpfile says how createTmpfile links an unnamed file
	// (probeTmpfile), or that it cannot.
	tmpfile int
	// tmpOwner is the uid and gid an O_TMPFILE file in the workdir
	// starts with (probeTmpfile): createTmpfile chowns only to others.
	tmpOwner [2]uint32
	// tmpMask is what the open of an O_TMPFILE file in the workdir
	// takes from the mode it asks for (the daemon's umask), and
	// tmpMaskOnly says that it does nothing else (no default ACL of
	// the workdir gives the file an ACL): createTmpfile then sets the
	// mode only where the open did not give it (probeTmpfile).
	tmpMask     uint32
	tmpMaskOnly bool
}

// workName is the scratch subdirectory, as the kernel names it
// (Linux: fs/overlayfs/super.c OVL_WORKDIR_NAME).
const workName = "work"

// Open prepares the upper layer u with the workdir at workPath: checks that
// both are on one filesystem, empties workdir/work of what an interrupted
// operation left, and probes whether whiteouts can be made.
func Open(u *lower.Layer, workPath string, o Options) (*Layer, error) {
	wfd, err := unix.Open(workPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open workdir %q: %w", workPath, err)
	}
	return OpenAt(u, wfd, workPath, o)
}

// OpenAt is Open with the workdir open already as wfd (lower.OpenUpper),
// which it owns from then on.
func OpenAt(u *lower.Layer, wfd int, workPath string, o Options) (*Layer, error) {
	workdir := lower.NewDir(u, wfd)
	ok := false
	defer func() {
		if !ok {
			workdir.Close()
		}
	}()
	var st unix.Stat_t
	if err := workdir.StatSelf(&st); err != nil {
		return nil, fmt.Errorf("stat workdir %q: %w", workPath, err)
	}
	if st.Dev != u.Dev {
		return nil, fmt.Errorf("workdir %q is on another filesystem than upperdir %q; put both on one filesystem", workPath, u.Path)
	}
	if err := lockInUse(u.Root(), "upperdir", u.Path); err != nil {
		return nil, err
	}
	if err := lockInUse(workdir, "workdir", workPath); err != nil {
		return nil, err
	}
	// Mode 0, as the kernel makes it (ovl_workdir_create()): only a
	// process that overrides permissions gets in. One that does not (an
	// unprivileged user) opens it up to its owner, itself, instead.
	if err := unix.Mkdirat(wfd, workName, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create %s/%s: %w", workPath, workName, err)
	}
	openWork := func() (int, error) {
		return unix.Openat(wfd, workName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	wfd2, err := openWork()
	if errors.Is(err, unix.EACCES) && unix.Fchmodat(wfd, workName, 0o700, 0) == nil {
		wfd2, err = openWork()
	}
	if err != nil {
		return nil, fmt.Errorf("open %s/%s: %w", workPath, workName, err)
	}
	// A Dir of its own, kept open: every operation passes through it.
	work := lower.NewDir(u, wfd2)
	l := &Layer{Layer: u, Work: work, workdir: workdir, wfd: wfd2, opts: o,
		tmpPrefix: "#" + strconv.FormatInt(int64(os.Getpid()), 16) + "."}
	if err := l.Clean(); err != nil {
		work.Close()
		return nil, fmt.Errorf("clean %s/%s: %w", workPath, workName, err)
	}
	l.Whiteouts = l.probeWhiteouts()
	l.tmpfile = l.probeTmpfile()
	ok = true
	return l, nil
}

// ErrInUse says that the upperdir or the workdir belongs to another live
// mount.
var ErrInUse = errors.New("in use by another mount")

// inUseWait is how long lockInUse waits for a layer's lock to be released.
const inUseWait = 5 * time.Second

// lockInUse takes an exclusive flock(2) on d, held until its fd is closed
// (the upper layer's root and the workdir live as long as the mount), so
// that a second goverlay on the same upperdir or workdir is refused
// instead of emptying the workdir under a copy-up in flight. The kernel
// overlay marks both directories in use for the same reason (Linux:
// fs/overlayfs/super.c ovl_inuse_trylock()).
//
// A daemon whose mount was just unmounted holds the lock until it has
// closed its layers and exited, which on a loaded machine, with many
// inodes cached, took over a second: the lock is tried again for up to
// inUseWait, so that `umount; goverlay ...` run back to back works. A
// layer a live mount holds is refused that much later.
func lockInUse(d *lower.Dir, role, path string) error {
	lock := func() error { return d.Do(func(fd int) error { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) }) }
	err := lock()
	for end := time.Now().Add(inUseWait); errors.Is(err, unix.EWOULDBLOCK) && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
		err = lock()
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("%s %q is %w (another goverlay holds it); unmount that first, or give this mount its own %s", role, path, ErrInUse, role)
	}
	if err != nil {
		return fmt.Errorf("lock %s %q: %w", role, path, err)
	}
	return nil
}

// Close releases the workdir, and with it the lock on it.
func (l *Layer) Close() error {
	l.workdir.Close()
	return l.Work.Close()
}

// XattrPrefix is the namespace of the overlay's own marks.
func (l *Layer) XattrPrefix() string { return l.opts.XattrPrefix }

// tmpName returns a fresh name in the workdir ("#" and a hex counter, as
// the kernel's ovl_lookup_temp() does, and the PID so two daemons sharing a
// workdir by mistake do not collide).
func (l *Layer) tmpName() string {
	return l.tmpPrefix + strconv.FormatUint(l.seq.Add(1), 16)
}

// Clean removes everything in workdir/work: at mount, leftovers of a
// copy-up or of a removal that a crash interrupted; once the mount is gone,
// files kept for descriptors that are now closed. Nothing in it is ever
// visible through the mount.
func (l *Layer) Clean() error {
	ents, err := l.Work.ReadDirRaw()
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := removeAll(l.Work, e.Name); err != nil {
			return err
		}
	}
	return nil
}

// removeAll removes name in d and, for a directory, everything below it,
// without following symlinks.
func removeAll(d *lower.Dir, name string) error {
	err := d.Do(func(fd int) error { return unix.Unlinkat(fd, name, 0) })
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	return removeDir(d, name)
}

// removeDir removes the directory name from d with everything in it: in
// one rmdir when it is empty.
func removeDir(d *lower.Dir, name string) error {
	err := d.Do(func(fd int) error { return unix.Unlinkat(fd, name, unix.AT_REMOVEDIR) })
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return err
	}
	sub, err := d.OpenDir(name)
	if err != nil {
		return err
	}
	ents, err := sub.ReadDirRaw()
	if err == nil {
		for _, e := range ents {
			if e.Mode == unix.S_IFDIR {
				err = removeDir(sub, e.Name)
			} else {
				err = removeAll(sub, e.Name)
			}
			if err != nil {
				break
			}
		}
	}
	sub.Close()
	if err != nil {
		return err
	}
	return d.Do(func(fd int) error { return unix.Unlinkat(fd, name, unix.AT_REMOVEDIR) })
}

// probeWhiteouts makes a whiteout in the workdir to see whether the upper
// filesystem allows it.
func (l *Layer) probeWhiteouts() WhiteoutFormat {
	name := l.tmpName()
	if err := unix.Mknodat(l.wfd, name, unix.S_IFCHR, 0); err != nil {
		return AUFSWhiteouts
	}
	unix.Unlinkat(l.wfd, name, 0)
	return KernelWhiteouts
}
