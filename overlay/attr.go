package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// toUpper copies n up and returns where it is in the upper layer: a
// directory's own instance (name ""), or a non-directory's directory and
// name. data says whether a regular file's contents are needed.
func (n *node) toUpper(ctx context.Context, data bool) (*lower.Dir, string, error) {
	if !n.isDir() && n.gone() {
		return nil, "", syscall.ENOENT
	}
	if n.isDir() {
		d, err := n.upperDir(ctx)
		return d, "", err
	}
	if err := n.copyUp(ctx, data); err != nil {
		return nil, "", err
	}
	par, name := n.location()
	return par.Dir, name, nil
}

var _ = (fs.NodeSetattrer)((*node)(nil))

// Setattr changes mode, owner, size or times, after a copy-up (which skips
// the data when the file is truncated to 0).
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	size, hasSize := in.GetSize()
	d, _, err := n.toUpper(ctx, !hasSize || size > 0)
	if err != nil {
		return errno(err)
	}
	if e := n.withUpperName(d, func(d *lower.Dir, name string) syscall.Errno {
		return n.setattrAt(f, d, name, in)
	}); e != 0 {
		return e
	}
	var st unix.Stat_t
	if err := n.stat(&st); err != nil {
		return errno(err)
	}
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		n.refreshFastExec()
	}
	n.fillAttr(&st, &out.Attr)
	out.SetTimeout(n.attrTimeout())
	return 0
}

// withUpperName calls fn with where n is in the upper layer, after its
// copy-up: a directory's own instance d (name ""), or a non-directory's
// directory and name, held for the call (locMu) so that no rename or
// unlink moves it in between.
func (n *node) withUpperName(d *lower.Dir, fn func(d *lower.Dir, name string) syscall.Errno) syscall.Errno {
	if n.isDir() {
		return fn(d, "")
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return syscall.ENOENT
	}
	par, name := n.location()
	return fn(par.Dir, name)
}

// setattrAt applies in to n, which is name in the upper directory d.
//
// Preconditions: n.locMu is held for reading (withUpperName).
func (n *node) setattrAt(f fs.FileHandle, d *lower.Dir, name string, in *fuse.SetAttrIn) syscall.Errno {
	size, hasSize := in.GetSize()
	if m, ok := in.GetMode(); ok {
		done, err := n.ofs.setattrOverride(d, name, &m, -1, -1)
		if err == nil && !done {
			err = upper.Chmod(d, name, m&07777)
		}
		n.invalidateNoSec()
		if err != nil {
			return errno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	uid, gid = n.ofs.opts.Owners.onDisk(uid, gid)
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		done, err := n.ofs.setattrOverride(d, name, nil, u, g)
		if err == nil && !done {
			err = upper.Chown(d, name, u, g)
		}
		n.invalidateNoSec()
		if err != nil && !n.ofs.opts.Owners.squashed() {
			// With squashing, every file shows the squashed
			// owner, and chown always succeeds (fuse-overlayfs).
			return errno(err)
		}
	}
	if hasSize {
		if err := n.truncate(f, d, name, size); err != nil {
			return errno(err)
		}
	}
	switch {
	case n.isDir():
	case in.Valid&fuse.FATTR_KILL_SUIDGID != 0:
		// A truncate by a caller without CAP_FSETID, or any chown
		// (fuse_do_setattr() in fs/fuse/dir.c sets the flag then).
		if err := n.killPrivs(); err != nil {
			return errno(err)
		}
	case in.Valid&^(fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) == 0 && n.ofs.nosec:
		// The kernel's file_remove_privs() found something to remove
		// (passthrough.go).
		if err := n.killPrivsNow(); err != nil {
			return errno(err)
		}
	}
	if n.ofs.writeback.Load() {
		// Not between keepMtime's fstat and futimens.
		n.timesMu.Lock()
		defer n.timesMu.Unlock()
	}
	return errno(setTimes(d, name, in))
}

// nameOrDot makes "" (the directory itself) usable as an *at path.
func nameOrDot(name string) string {
	if name == "" {
		return "."
	}
	return name
}

// truncate sets a regular file's size, through the caller's handle when it
// has one (ftruncate), else by opening the upper file.
func (n *node) truncate(f fs.FileHandle, d *lower.Dir, name string, size uint64) error {
	if h, ok := f.(*handle); ok {
		return h.truncate(size)
	}
	return upper.Truncate(d, name, int64(size))
}

// setTimes applies atime/mtime changes, "now" included.
func setTimes(d *lower.Dir, name string, in *fuse.SetAttrIn) error {
	omit := unix.Timespec{Nsec: unix.UTIME_OMIT}
	ts := [2]unix.Timespec{omit, omit}
	set := false
	if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
		ts[0], set = unix.Timespec{Nsec: unix.UTIME_NOW}, true
	} else if a, ok := in.GetATime(); ok {
		ts[0], set = unix.NsecToTimespec(a.UnixNano()), true
	}
	if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
		ts[1], set = unix.Timespec{Nsec: unix.UTIME_NOW}, true
	} else if m, ok := in.GetMTime(); ok {
		ts[1], set = unix.NsecToTimespec(m.UnixNano()), true
	}
	if !set {
		return nil
	}
	return upper.SetTimes(d, name, ts)
}

var _ = (fs.NodeSetxattrer)((*node)(nil))

// Setxattr sets an attribute after a copy-up. The overlay's own attributes
// and the stat overrides cannot be set through the mount (hiddenXattr).
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.ofs.hiddenXattr(attr) {
		return syscall.EPERM
	}
	if isACLXattr(attr) && n.ofs.opts.Owners.mapsIDs() {
		var err error
		if data, err = n.ofs.opts.Owners.aclOnDisk(data); err != nil {
			return errno(err)
		}
	}
	d, _, err := n.toUpper(ctx, true)
	if err != nil {
		return errno(err)
	}
	e := n.withUpperName(d, func(d *lower.Dir, name string) syscall.Errno {
		return errno(upper.Setxattr(d, name, attr, data, int(flags)))
	})
	n.xattrChanged(attr)
	return e
}

var _ = (fs.NodeRemovexattrer)((*node)(nil))

// Removexattr removes an attribute after a copy-up.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.ofs.hiddenXattr(attr) {
		return syscall.EPERM
	}
	// Do not copy up for an attribute that is not there.
	if _, errno := n.Getxattr(ctx, attr, nil); errno != 0 && errno != syscall.ERANGE {
		return errno
	}
	d, _, err := n.toUpper(ctx, true)
	if err != nil {
		return errno(err)
	}
	e := n.withUpperName(d, func(d *lower.Dir, name string) syscall.Errno {
		return errno(upper.Removexattr(d, name, attr))
	})
	n.xattrChanged(attr)
	return e
}

// xattrChanged updates what depends on attribute attr of n.
func (n *node) xattrChanged(attr string) {
	if isSecurityXattr(attr) {
		n.invalidateNoSec()
	}
	if attr == upper.ACLAccessXattr {
		n.refreshFastExec()
	}
}
