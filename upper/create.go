package upper

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// Over says what a new name replaces in its upper directory.
type Over int

const (
	// OverNothing: the name is free in the upper directory.
	OverNothing Over = iota
	// OverWhiteout: a char 0/0 whiteout holds the name.
	OverWhiteout
	// OverAUFSWhiteout: a ".wh.NAME" file hides the name.
	OverAUFSWhiteout
	// OverUnseen: no ".wh.NAME" hides the name, and the name itself was
	// not looked at (ProbeFile). Create finds out.
	OverUnseen
)

// Probe tells what holds name in the upper directory d, as far as a create
// is concerned.
func Probe(d *lower.Dir, name string) (Over, error) {
	var st unix.Stat_t
	err := d.Stat(name, &st)
	switch {
	case err == nil && lower.IsWhiteout(&st):
		return OverWhiteout, nil
	case err == nil:
		return OverNothing, unix.EEXIST
	case !errors.Is(err, unix.ENOENT):
		return OverNothing, err
	}
	if d.Stat(lower.WhiteoutPrefix+name, &st) == nil {
		return OverAUFSWhiteout, nil
	}
	return OverNothing, nil
}

// ProbeFile is Probe for a new regular file, which the create itself looks
// for: it says only whether a ".wh.NAME" hides the name (then it probes in
// full), and otherwise OverUnseen. A file made in place is opened with
// O_EXCL, which fails on any name taken, a whiteout included; Create
// probes then, and otherwise before it makes the file.
func ProbeFile(d *lower.Dir, name string) (Over, error) {
	var st unix.Stat_t
	if d.Stat(lower.WhiteoutPrefix+name, &st) == nil {
		return Probe(d, name)
	}
	return OverUnseen, nil
}

// Object describes a new object to create.
type Object struct {
	// Mode is the file type and permission bits.
	Mode uint32
	// Rdev is the device number of a device node.
	Rdev uint32
	// Target is a symlink's target.
	Target string
	// Uid and Gid own the object: for real, or in the override xattr
	// when the upper layer keeps owners there (KeepsOverride).
	Uid, Gid uint32
	// Opaque marks a new directory opaque: it replaces a whiteout, so
	// the directories of the same name below must not show through.
	Opaque bool
	// Flags are the open flags for a regular file; Create returns its fd.
	Flags int
	// ACL and DefaultACL are the access and default ACL xattrs to give
	// the object (Inherit computes them); nil for none.
	ACL, DefaultACL []byte
	// DirHasNoACL says that the directory it goes in was read and has
	// no default ACL: a file made there in place gets none from it.
	DirHasNoACL bool
}

// Create makes o as name in the upper directory d, which holds over at
// that name. The object never appears half made or with the wrong owner or
// mode: it is built in the workdir with its owner and mode set, then
// renamed into place; over a whiteout the rename is an exchange and the
// whiteout is then removed from the workdir (Linux:
// ovl_create_over_whiteout()). Its ACLs are set before it is published
// too. A regular file on a free name, the common case, is made in place
// when the open gives it all it must have (createInPlace), else as an
// unnamed O_TMPFILE given its name with linkat (createTmpfile), unless
// the upper keeps owners and modes in the override xattr (make writes
// it). It returns an open fd for a regular file, -1 otherwise.
func (l *Layer) Create(d *lower.Dir, name string, o Object, over Over) (int, error) {
	return l.CreateStat(d, name, o, over, nil)
}

// CreateStat is Create that also fills st, when not nil, with the
// attributes of the object it made, taken from the object itself (its fd,
// or its name in the workdir before it is published) and never from name
// in d, which may hold something else by the time anyone looks.
func (l *Layer) CreateStat(d *lower.Dir, name string, o Object, over Over, st *unix.Stat_t) (int, error) {
	if over == OverUnseen {
		if l.inPlace(o, OverNothing) {
			fd, err := l.createInPlace(d, name, o, st)
			if !errors.Is(err, unix.EEXIST) {
				return fd, err
			}
		}
		// Taken, perhaps by a whiteout, or not made in place.
		var err error
		if over, err = Probe(d, name); err != nil {
			return -1, err
		}
	}
	if l.inPlace(o, over) {
		return l.createInPlace(d, name, o, st)
	}
	if over == OverNothing && o.Mode&unix.S_IFMT == unix.S_IFREG && o.Flags&unix.O_ACCMODE != unix.O_RDONLY && l.tmpfile != tmpfileNone && !l.KeepsOverride(o.Mode) {
		fd, err := l.createTmpfile(d, name, o)
		if err == nil && st != nil {
			if err = unix.Fstat(fd, st); err != nil {
				unix.Close(fd)
				return -1, err
			}
		}
		return fd, err
	}
	tmp := l.tmpName()
	fd, err := l.make(tmp, o)
	if err == nil && st != nil {
		if fd >= 0 {
			err = unix.Fstat(fd, st)
		} else {
			err = unix.Fstatat(l.wfd, tmp, st, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err == nil {
			l.Work.ApplyOverride(tmp, st)
		} else if fd >= 0 {
			unix.Close(fd)
			fd = -1
		}
	}
	if err != nil {
		removeAll(l.Work, tmp)
		return -1, err
	}
	if err := l.publish(tmp, d, name, over); err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, err
	}
	return fd, nil
}

// createTmpfile makes the regular file o as name in d, on a name that holds
// nothing. The file is made unnamed (O_TMPFILE, in the workdir, so that it
// gets what a file built there by make would: nothing from a default ACL
// of d, only o's own ACL), given its owner, its exact mode and its ACL
// through the fd, and only then linked into d (Linux: ovl_create_upper()
// creates in place with the caller's
// fsuid; the unnamed file gives the same atomicity without changing the
// daemon's credentials). Until the linkat it has no name: a crash or an
// error leaves nothing behind, not even in the workdir. The linkat fails
// with EEXIST on a taken name, as the publishing rename does. It costs the
// same four syscalls as make and publish, without a workdir entry to
// create and remove and without a cross-directory rename.
//
// Precondition: l.tmpfile is not tmpfileNone.
func (l *Layer) createTmpfile(d *lower.Dir, name string, o Object) (int, error) {
	fd, err := unix.Openat(l.wfd, ".", o.Flags|unix.O_TMPFILE|unix.O_CLOEXEC, o.Mode&07777)
	if err != nil {
		return -1, err
	}
	// Owner first, unless the file has it already (the daemon's own, as
	// probed): chown clears suid/sgid. Then the exact mode, unless the
	// open gave it: the process umask took nothing from it, and it has
	// no set-id or sticky bit (probeTmpfile).
	if o.Uid != l.tmpOwner[0] || o.Gid != l.tmpOwner[1] {
		err = unix.Fchown(fd, int(o.Uid), int(o.Gid))
	}
	if err == nil && (o.Mode&07000 != 0 || o.Mode&l.tmpMask != 0 || !l.tmpMaskOnly) {
		err = unix.Fchmod(fd, o.Mode&07777)
	}
	if err == nil && o.ACL != nil {
		// After the chmod, which would rewrite the ACL's mask; the
		// mode is the one the ACL gives anyway (Inherit).
		if err = unix.Fsetxattr(fd, ACLAccessXattr, o.ACL, 0); err != nil {
			err = fmt.Errorf("set the inherited ACL: %w", err)
		}
	}
	if err == nil {
		err = d.Do(func(dfd int) error { return l.linkFd(fd, dfd, name) })
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// A regular file that the open itself gives all it must have is made in
// place, as Linux's ovl_create_upper() makes it: openat(O_CREAT|O_EXCL)
// in its directory. It is so when the file goes on a free name, belongs to
// the daemon's own fsuid and fsgid (what an O_TMPFILE file in the
// workdir gets, probeTmpfile), has no ACL to get (none inherited, and its
// directory has no default ACL that the upper filesystem would apply), no
// set-id or sticky bit, and a mode the daemon's umask takes nothing from.
// It then never exists with another owner or mode, as with the unnamed
// file, and costs two system calls (openat, fstat) where the unnamed file
// costs three (openat, linkat, fstat).

// inPlace reports whether o over over is made in place.
func (l *Layer) inPlace(o Object, over Over) bool {
	return over == OverNothing && o.Mode&unix.S_IFMT == unix.S_IFREG && l.tmpfile != tmpfileNone &&
		!l.KeepsOverride(o.Mode) && o.ACL == nil && o.DirHasNoACL && l.tmpMaskOnly &&
		o.Mode&07000 == 0 && o.Mode&l.tmpMask == 0 &&
		o.Uid == l.tmpOwner[0] && o.Gid == l.tmpOwner[1]
}

// createInPlace makes the regular file o as name in d (inPlace), with st
// its stat when st is not nil, and returns its fd.
func (l *Layer) createInPlace(d *lower.Dir, name string, o Object, st *unix.Stat_t) (int, error) {
	fd := -1
	err := d.Do(func(dfd int) error {
		var err error
		fd, err = unix.Openat(dfd, name, o.Flags|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, o.Mode&07777)
		return err
	})
	if err != nil {
		return -1, err
	}
	var own unix.Stat_t
	if st == nil {
		st = &own
	}
	err = unix.Fstat(fd, st)
	// Should the process umask have changed since it was probed, the
	// mode is set as asked, through the fd.
	if err == nil && st.Mode&07777 != o.Mode&07777 {
		if err = unix.Fchmod(fd, o.Mode&07777); err == nil {
			err = unix.Fstat(fd, st)
		}
	}
	if err != nil {
		// Not half made: the name goes again (the kernel holds the
		// directory for the create, so it is still this file).
		unix.Close(fd)
		d.Do(func(dfd int) error { return unix.Unlinkat(dfd, name, 0) })
		return -1, err
	}
	return fd, nil
}

// How an unnamed O_TMPFILE file is given a name (probeTmpfile).
const (
	// tmpfileNone: the upper filesystem has no O_TMPFILE, or it cannot
	// be linked.
	tmpfileNone = iota
	// tmpfileEmptyPath: linkat(fd, "", AT_EMPTY_PATH), which needs
	// CAP_DAC_READ_SEARCH.
	tmpfileEmptyPath
	// tmpfileProc: linkat of /proc/self/fd/N with AT_SYMLINK_FOLLOW,
	// for a daemon without that capability.
	tmpfileProc
)

// linkFd gives the unnamed file fd the name name in dfd.
func (l *Layer) linkFd(fd, dfd int, name string) error {
	if l.tmpfile == tmpfileEmptyPath {
		return unix.Linkat(fd, "", dfd, name, unix.AT_EMPTY_PATH)
	}
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), dfd, name, unix.AT_SYMLINK_FOLLOW)
}

// probeTmpfile finds how O_TMPFILE files can be made in the workdir and
// linked (tmpfileEmptyPath, tmpfileProc), by linking one into the workdir
// and removing it again, and records the owner such a file gets
// (l.tmpOwner: the daemon's fsuid, and its fsgid or the workdir's group)
// and what the open takes from its mode (l.tmpMask: the daemon's umask;
// l.tmpMaskOnly: no ACL either).
func (l *Layer) probeTmpfile() int {
	for _, how := range []int{tmpfileEmptyPath, tmpfileProc} {
		fd, err := unix.Openat(l.wfd, ".", unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o777)
		if err != nil {
			return tmpfileNone
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return tmpfileNone
		}
		_, aclErr := unix.Fgetxattr(fd, ACLAccessXattr, nil)
		l.tmpMask = 0o777 &^ (st.Mode & 0o777)
		l.tmpMaskOnly = errors.Is(aclErr, unix.ENODATA) || errors.Is(aclErr, unix.EOPNOTSUPP)
		l.tmpfile = how
		name := l.tmpName()
		err = l.linkFd(fd, l.wfd, name)
		unix.Close(fd)
		if err == nil {
			unix.Unlinkat(l.wfd, name, 0)
			l.tmpOwner = [2]uint32{st.Uid, st.Gid}
			return how
		}
	}
	return tmpfileNone
}

// make builds o at tmp in the workdir.
func (l *Layer) make(tmp string, o Object) (int, error) {
	w := l.wfd
	fd := -1
	var err error
	perm := o.Mode & 07777
	if l.KeepsOverride(o.Mode) {
		perm = backingMode
	}
	switch o.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fd, err = unix.Openat(w, tmp, o.Flags|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, perm)
	case unix.S_IFDIR:
		err = unix.Mkdirat(w, tmp, perm)
	case unix.S_IFLNK:
		err = unix.Symlinkat(o.Target, w, tmp)
	default:
		err = unix.Mknodat(w, tmp, o.Mode&unix.S_IFMT|perm, int(o.Rdev))
	}
	if err != nil {
		return -1, err
	}
	fail := func(err error) (int, error) {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, err
	}
	if err := l.setOwner(tmp, lower.Override{Uid: o.Uid, Gid: o.Gid, Mode: o.Mode, Rdev: uint64(o.Rdev)}); err != nil {
		return fail(err)
	}
	if err := l.setACLs(tmp, o); err != nil {
		return fail(err)
	}
	if o.Opaque {
		if err := l.SetOpaque(l.Work, tmp); err != nil {
			return fail(err)
		}
	}
	return fd, nil
}

// setACLs gives tmp in the workdir the ACLs of o. It comes after
// setOwner: a chmod would rewrite the access ACL's mask, although to what
// it is already (Inherit derives the mode from the ACL).
func (l *Layer) setACLs(tmp string, o Object) error {
	for _, a := range []struct {
		name string
		v    []byte
	}{{ACLAccessXattr, o.ACL}, {ACLDefaultXattr, o.DefaultACL}} {
		if a.v == nil {
			continue
		}
		err := l.Work.DoPath(tmp, func(p string) error { return unix.Lsetxattr(p, a.name, a.v, 0) })
		if err != nil {
			return fmt.Errorf("set the inherited %s: %w", a.name, err)
		}
	}
	return nil
}

// publish renames tmp from the workdir to name in d.
func (l *Layer) publish(tmp string, d *lower.Dir, name string, over Over) error {
	w := l.wfd
	dfd, release, err := d.Pin()
	if err != nil {
		removeAll(l.Work, tmp)
		return err
	}
	defer release()
	switch over {
	case OverWhiteout:
		if err := unix.Renameat2(w, tmp, dfd, name, unix.RENAME_EXCHANGE); err != nil {
			removeAll(l.Work, tmp)
			return err
		}
		// tmp is now the whiteout.
		unix.Unlinkat(w, tmp, 0)
		return nil
	default:
		if err := unix.Renameat2(w, tmp, dfd, name, unix.RENAME_NOREPLACE); err != nil {
			removeAll(l.Work, tmp)
			return err
		}
		if over == OverAUFSWhiteout {
			// Until this unlink both names exist, and in the AUFS
			// format the name beside its whiteout wins.
			unix.Unlinkat(dfd, lower.WhiteoutPrefix+name, 0)
		}
		return nil
	}
}

// Link makes name in d a hard link to entry srcName of the upper directory
// src.
func (l *Layer) Link(src *lower.Dir, srcName string, d *lower.Dir, name string, over Over) error {
	tmp := l.tmpName()
	if err := src.Do(func(sfd int) error { return unix.Linkat(sfd, srcName, l.wfd, tmp, 0) }); err != nil {
		return err
	}
	return l.publish(tmp, d, name, over)
}

// SetOpaque marks the directory name in d opaque with the overlay's xattr.
// The kernel's format has no marker file: an upper dir with both confuses
// it (fuse-overlayfs #306). Only where the xattr cannot be set does the
// AUFS marker stand in.
func (l *Layer) SetOpaque(d *lower.Dir, name string) error {
	err := d.DoPath(name, func(p string) error {
		return xattr.LSet(p, l.opts.XattrPrefix+"opaque", []byte("y"))
	})
	if err == nil {
		return nil
	}
	sub, oerr := d.OpenDir(name)
	if oerr != nil {
		return fmt.Errorf("mark opaque: %w", err)
	}
	defer sub.Close()
	fd, ferr := sub.OpenMode(lower.OpaqueMarker, unix.O_CREAT|unix.O_WRONLY, 0o600)
	if ferr != nil {
		return fmt.Errorf("mark opaque: %w", err)
	}
	return unix.Close(fd)
}

// Remove deletes name from the upper directory d. With whiteout, a name
// that still exists in a lower layer, the name is replaced by a whiteout in
// one step (renameat2 RENAME_WHITEOUT moves the object to the workdir);
// whatever it was, a directory with whiteouts in it included, is then
// removed from the workdir. Without, a file or an empty directory is
// removed where it is; a directory that holds whiteouts (empty through
// the mount) is moved to the workdir and emptied there, so that it never
// shows half emptied.
func (l *Layer) Remove(d *lower.Dir, name string, isDir, whiteout bool) error {
	dfd, release, err := d.Pin()
	if err != nil {
		return err
	}
	defer release()
	if !whiteout {
		if !isDir {
			return unix.Unlinkat(dfd, name, 0)
		}
		err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
	tmp, err := l.moveToWork(dfd, d, name, whiteout)
	if err != nil {
		return err
	}
	if isDir {
		return removeDir(l.Work, tmp)
	}
	return removeAll(l.Work, tmp)
}

// Rmdir removes directory name from the upper directory d if it holds
// nothing (ENOTEMPTY otherwise): for a directory that holds no whiteout,
// whose emptiness through the mount is its emptiness on disk.
func (l *Layer) Rmdir(d *lower.Dir, name string) error {
	return d.Do(func(dfd int) error { return unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR) })
}

// RemoveKeep deletes the file name from the upper directory d as Remove
// does, but keeps it in the workdir for the descriptors still open on it,
// under the name it returns (until RemoveTemp): in one rename, with the
// whiteout when whiteout.
func (l *Layer) RemoveKeep(d *lower.Dir, name string, whiteout bool) (string, error) {
	dfd, release, err := d.Pin()
	if err != nil {
		return "", err
	}
	defer release()
	return l.moveToWork(dfd, d, name, whiteout)
}

// moveToWork renames name from the upper directory d (open as dfd) to a
// fresh name in the workdir, which it returns; with whiteout, a whiteout
// takes its place, in the same step where the upper filesystem can.
func (l *Layer) moveToWork(dfd int, d *lower.Dir, name string, whiteout bool) (string, error) {
	tmp := l.tmpName()
	flags := uint(0)
	if whiteout && l.Whiteouts == KernelWhiteouts {
		flags = unix.RENAME_WHITEOUT
	}
	err := unix.Renameat2(dfd, name, l.wfd, tmp, flags)
	if flags != 0 && errors.Is(err, unix.EINVAL) {
		// RENAME_WHITEOUT unsupported: move, then whiteout.
		flags = 0
		err = unix.Renameat2(dfd, name, l.wfd, tmp, 0)
	}
	if err != nil {
		return "", err
	}
	if whiteout && flags == 0 {
		if err := l.Whiteout(d, name); err != nil {
			// Put the object back rather than lose the deletion's
			// effect silently.
			unix.Renameat2(l.wfd, tmp, dfd, name, unix.RENAME_NOREPLACE)
			return "", err
		}
	}
	return tmp, nil
}

// Whiteout hides name, which exists only in lower layers, from the upper
// directory d.
func (l *Layer) Whiteout(d *lower.Dir, name string) error {
	if l.Whiteouts == KernelWhiteouts {
		err := d.Do(func(fd int) error { return unix.Mknodat(fd, name, unix.S_IFCHR, 0) })
		if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EOPNOTSUPP) {
			return err
		}
	}
	fd, err := d.OpenMode(lower.WhiteoutPrefix+name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// EmptyDir replaces the upper directory name in d, which looks empty
// through the mount but may hold whiteouts, with an empty opaque one, in
// one step: an empty opaque directory is built in the workdir and
// exchanged with it (RENAME_EXCHANGE), and the old one, whiteouts and all,
// removed from the workdir (Linux: ovl_clear_empty()). Removing the
// whiteouts one by one in place would bring the names they hide back if
// the daemon died half way.
func (l *Layer) EmptyDir(d *lower.Dir, name string) error {
	var st unix.Stat_t
	if err := d.Stat(name, &st); err != nil {
		return err
	}
	tmp := l.tmpName()
	if err := unix.Mkdirat(l.wfd, tmp, 0o700); err != nil {
		return err
	}
	// The same directory as far as anyone can see: owner, mode, xattrs
	// and times.
	err := l.setMeta(tmp, Source{Dir: d, Name: name, Stat: st})
	if err == nil {
		err = l.SetOpaque(l.Work, tmp)
	}
	if err != nil {
		removeAll(l.Work, tmp)
		return err
	}
	err = d.Do(func(fd int) error {
		return unix.Renameat2(l.wfd, tmp, fd, name, unix.RENAME_EXCHANGE)
	})
	if err != nil {
		removeAll(l.Work, tmp)
		return err
	}
	return removeAll(l.Work, tmp)
}

// CreateTemp makes the regular file o in the workdir under a fresh name,
// where nothing shows it through the mount: the body of an O_TMPFILE file
// until it is linked into place (Link from l.Work). It returns the name and
// an open fd.
func (l *Layer) CreateTemp(o Object) (string, int, error) {
	tmp := l.tmpName()
	fd, err := l.make(tmp, o)
	if err != nil {
		removeAll(l.Work, tmp)
		return "", -1, err
	}
	return tmp, fd, nil
}

// Keep gives the file name in d a second name in the workdir and returns
// it: the file then outlives the removal of name, as an open file outlives
// its last name in a local filesystem. RemoveTemp drops it; a crash leaves
// it to Open's cleaning of the workdir.
func (l *Layer) Keep(d *lower.Dir, name string) (string, error) {
	tmp := l.tmpName()
	err := d.Do(func(fd int) error { return unix.Linkat(fd, name, l.wfd, tmp, 0) })
	if err != nil {
		return "", err
	}
	return tmp, nil
}

// RemoveTemp removes a file CreateTemp, Keep or CopyUpTemp made.
func (l *Layer) RemoveTemp(name string) error {
	return unix.Unlinkat(l.wfd, name, 0)
}
