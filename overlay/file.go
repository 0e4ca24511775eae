package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

var _ = (fs.NodeOpener)((*node)(nil))

// Open opens a regular file. Opening for writing copies the file up first
// (without its data when O_TRUNC will discard it); a read-only open never
// does.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.isDir() {
		return nil, 0, syscall.EISDIR
	}
	write := flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0
	if write {
		done, err := n.dataChangeStart()
		if err != nil {
			return nil, 0, n.ofs.errno(err)
		}
		defer done()
		kind := copyData
		if flags&syscall.O_TRUNC != 0 {
			kind = copyNoData
		}
		if err := n.copyUp(ctx, kind); err != nil {
			return nil, 0, n.ofs.errno(err)
		}
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return nil, 0, syscall.ENOENT
	}
	par, name := n.location()
	bflags := backingFlags(flags)
	if write && flags&syscall.O_TRUNC != 0 {
		bflags |= unix.O_TRUNC
	}
	if int(flags)&unix.O_ACCMODE == unix.O_WRONLY {
		// Reads through a writer's handle are the kernel's own (the
		// writeback cache reading a page it fills only in part),
		// not the caller's (atime.go).
		bflags |= unix.O_NOATIME
	}
	if write {
		n.atimeStale()
	}
	open := par.Open
	data := n.metacopyData()
	if data != nil {
		// A metacopy file (only read here: a writer copied its data
		// in): its data is the lower file's.
		open = func(_ string, flags int) (int, error) { return data.Open(flags) }
	}
	upperFD := par.Layer.Upper && data == nil
	// O_NOATIME is dropped where the daemon may not use it
	// (lower.Dir.Open).
	fd, err := open(name, bflags)
	if err == nil && write && n.ofs.raw.killRequested(ctx) {
		// O_TRUNC by a caller without CAP_FSETID.
		if err = n.killPrivs(); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		return nil, 0, n.ofs.errno(err)
	}
	h := newHandle(ctx, n, fd, upperFD, write)
	if upperFD && !write && bflags&(unix.O_NOATIME|unix.O_DIRECT) == 0 {
		// An open for reading only (a direct reader's reads all
		// reach the daemon).
		n.touchOpened(h.fd)
	}
	return h, handleOpenFlags, 0
}

var _ = (fs.NodeReadlinker)((*node)(nil))

// Readlink reads the topmost instance of a symlink. A path walk may follow
// a symlink whose name another request has just removed, or given to
// something else: the answer is the symlink's own target, as on a local
// filesystem, never what the name holds now.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n.mu.Lock()
	var t []byte
	if r := n.rareLocked(); r != nil {
		t = r.target
	}
	n.mu.Unlock()
	if t != nil {
		return t, 0
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return nil, syscall.ENOENT
	}
	parent, name := n.location()
	if parent.Dir == nil {
		return nil, syscall.EINVAL
	}
	b, err := parent.Readlink(name)
	if err != nil {
		return nil, n.ofs.errno(err)
	}
	n.mu.Lock()
	n.rareMadeLocked().target = b
	n.mu.Unlock()
	return b, 0
}
