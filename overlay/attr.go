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
// name. kind says whether a regular file's contents are needed (copyUp).
func (n *node) toUpper(ctx context.Context, kind copyKind) (*lower.Dir, string, error) {
	if !n.isDir() && n.gone() {
		return nil, "", syscall.ENOENT
	}
	if n.isDir() {
		d, err := n.upperDir(ctx)
		return d, "", err
	}
	if err := n.copyUp(ctx, kind); err != nil {
		return nil, "", err
	}
	par, name := n.location()
	return par.Dir, name, nil
}

var _ = (fs.NodeSetattrer)((*node)(nil))

// Setattr changes mode, owner, size or times, after a copy-up (which skips
// the data when the file is truncated to 0, and copies the metadata alone
// when the size does not change and metacopy is on).
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		// After the change, whether or not all of it was made.
		defer n.forgetDirFacts()
	}
	n.atimeStale()
	var st unix.Stat_t
	idle, statted := n.idleFlush(in, &st)
	if !idle {
		size, hasSize := in.GetSize()
		kind := copyMeta
		if hasSize {
			done, err := n.dataChangeStart()
			if err != nil {
				return n.ofs.errno(err)
			}
			defer done()
			// The kernel drops its pages beyond the new size
			// with it: a failed write-back is behind (wberr.go).
			defer n.wbReset()
			kind = copyData
			if size == 0 {
				kind = copyNoData
			}
		}
		d, _, err := n.toUpper(ctx, kind)
		if err != nil {
			return n.ofs.errno(err)
		}
		if e := n.withUpperName(d, func(d *lower.Dir, name string) syscall.Errno {
			return n.setattrAt(f, d, name, in)
		}); e != 0 {
			return e
		}
	}
	if !idle || !statted {
		if err := n.stat(&st); err != nil {
			return n.ofs.errno(err)
		}
	}
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		n.refreshFastExec()
	}
	n.fillAttr(&st, &out.Attr)
	out.SetTimeout(n.attrTimeout())
	return 0
}

// idleFlush reports whether in, for an orphan (orphan.go: a file whose
// last name was removed while the kernel held it, kept in the workdir or,
// for a lower file, where it is), changes nothing: the writeback cache's
// flush of the times the kernel holds (fuse_flush_times()), which follows
// the unlink or rename that removed the name (fuse_update_ctime() marks
// the inode dirty) and carries the file's own mtime. It copies nothing up,
// and an rm -rf of files made through the mount changes no times in the
// workdir. statted says that st holds the file's attributes, which the
// check read.
func (n *node) idleFlush(in *fuse.SetAttrIn, st *unix.Stat_t) (idle, statted bool) {
	n.mu.Lock()
	orphan := n.orphanLower || n.orphan
	n.mu.Unlock()
	if !orphan || in.Valid&^(fuse.FATTR_MTIME|fuse.FATTR_CTIME|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) != 0 {
		return false, false
	}
	if in.Valid&fuse.FATTR_MTIME == 0 {
		return true, false // ctime alone: the file's own is kept
	}
	if n.stat(st) != nil {
		return false, false
	}
	return st.Mtim.Sec == int64(in.Mtime) && st.Mtim.Nsec == int64(in.Mtimensec), true
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
			return n.ofs.errno(err)
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
		// NoSec stays: a chown gives a file no set-id bit and no
		// capability (it may take them), so a file known clean
		// stays clean, and the strip that FATTR_KILL_SUIDGID asks
		// for below has nothing to do on it (killPrivs).
		if err != nil && !n.ofs.opts.Owners.squashed() {
			// With squashing, every file shows the squashed
			// owner, and chown always succeeds (fuse-overlayfs).
			return n.ofs.errno(err)
		}
	}
	if hasSize {
		if err := n.truncate(f, d, name, size); err != nil {
			return n.ofs.errno(err)
		}
	}
	switch {
	case n.isDir():
	case in.Valid&fuse.FATTR_KILL_SUIDGID != 0:
		// A truncate by a caller without CAP_FSETID, or any chown
		// (fuse_do_setattr() in fs/fuse/dir.c sets the flag then).
		if err := n.killPrivs(); err != nil {
			return n.ofs.errno(err)
		}
	case in.Valid&^(fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) == 0 && n.ofs.nosec:
		// The kernel's file_remove_privs() found something to remove
		// (passthrough.go).
		if err := n.killPrivsNow(); err != nil {
			return n.ofs.errno(err)
		}
	}
	if n.ofs.writeback.Load() {
		// Not between keepMtime's fstat and futimens.
		defer n.timesLock()()
	}
	return n.ofs.errno(setTimes(d, name, in))
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

var _ = (fs.NodeGetattrer)((*node)(nil))

// Getattr reports the topmost instance's attributes.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st unix.Stat_t
	if h, ok := f.(*handle); ok && h.n.metacopyData() == nil {
		// fstat(2): the open file, whatever names it has left. A
		// metacopy file's handle is on its data, whose attributes
		// are not the file's: those are its upper file's (n.stat).
		if err := h.stat(&st); err != nil {
			return n.ofs.errno(err)
		}
		n.applyOverride(&st)
	} else if err := n.stat(&st); err != nil {
		return n.ofs.errno(err)
	}
	n.fillAttr(&st, &out.Attr)
	if ino := n.StableAttr().Ino; out.Ino != ino {
		// A parted hard link (node.part): go-fuse answers with the
		// node's number, rawFS.GetAttr with the copy's.
		n.ofs.raw.reportIno(ctx, out.Ino)
		out.Ino = ino
	}
	out.SetTimeout(n.attrTimeout())
	n.ofs.stats.getattrs.Add(1)
	return 0
}
