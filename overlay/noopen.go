package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Regular files open without a request (noopen=1, the default).
//
// The first OPEN is answered ENOSYS (rawFS.Open). The kernel then opens
// every regular file of the mount by itself, with FOPEN_KEEP_CACHE, and
// sends no RELEASE at the last close (fs/fuse/file.c fuse_file_open(),
// fuse_file_put(); fc->no_open), as it does for directories
// (diropen.go). An open(2) and close(2) of a file, and so a read of a
// cached file or an exec of a cached binary, then reach the daemon not at
// all, where they cost two requests, OPEN and RELEASE.
//
// What does reach the daemon are the requests on the data, with file
// handle 0: READ, WRITE, FSYNC, FALLOCATE, LSEEK, and FLUSH (answered
// ENOSYS once, after which the kernel sends none). The node serves them
// (Read, Write, ...): each opens the file where it is at that moment
// (requestHandle), does the one operation through a handle of its own
// and closes it. Where a handle did come with the request, which CREATE
// and TMPFILE still return (fuse_create_open()), the handle serves it as
// with noopen=0.
//
// What differs from noopen=0, where OPEN copies up a lower file opened
// for writing (the kernel overlay's ovl_open()):
//
//   - A lower file is copied up at its first change: a WRITE, a
//     FALLOCATE, or a SETATTR. An open(O_TRUNC) arrives as a SETATTR of
//     size 0 (ATTR_OPEN; atomic O_TRUNC is not negotiated, mount.go), with
//     FATTR_KILL_SUIDGID for a caller without CAP_FSETID, and copies up
//     without data as before. An open for writing that writes nothing
//     leaves the file in its lower layer.
//   - Reads follow a copy-up at once: each opens the file where it is.
//   - A file whose last name is removed: the daemon cannot tell whether
//     it is open, so it takes every file the kernel still holds (go-fuse:
//     the node is not forgotten) for open (node.held): an upper file is
//     kept in the workdir and a lower one stays a lower orphan
//     (orphan.go) until the kernel forgets the inode (OnForget), which it
//     does at the last close of an unlinked file.
//   - No passthrough: it is set up in the reply to an OPEN. Writes take
//     the writeback cache (writeback.go) unless writeback=0.
//   - The kernel checks the permissions of an open itself, as it always
//     did (default_permissions); the daemon opens the layer's file as
//     itself, as OPEN did.

// requestHandle opens n's file for one request on a file the kernel
// opened without a request: for reading its data (a metacopy file's data
// file), or for writing, after copying it up.
func (n *node) requestHandle(ctx context.Context, write bool) (*handle, error) {
	if write {
		if err := n.copyUp(ctx, copyData); err != nil {
			return nil, err
		}
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return nil, syscall.ENOENT
	}
	par, name := n.location()
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	var (
		fd  int
		err error
	)
	data := n.metacopyData()
	if data != nil && !write {
		fd, err = data.Open(flags)
	} else {
		fd, err = par.Open(name, flags)
	}
	if err != nil {
		return nil, err
	}
	return &handle{n: n, fd: fd, upper: par.Layer.Upper && (data == nil || write), stale: -1}, nil
}

// close closes a handle of requestHandle.
func (h *handle) close() {
	unix.Close(h.fd)
	if h.stale >= 0 {
		unix.Close(h.stale)
	}
}

var (
	_ = (fs.NodeReader)((*node)(nil))
	_ = (fs.NodeWriter)((*node)(nil))
	_ = (fs.NodeWritever)((*node)(nil))
	_ = (fs.NodeFsyncer)((*node)(nil))
	_ = (fs.NodeAllocater)((*node)(nil))
	_ = (fs.NodeLseeker)((*node)(nil))
)

// Read reads at off through f, or for a file opened without a request,
// from the file where it is now. The data is read here, not after the
// return (fuse.ReadResultFd), since the fd is closed at the return.
func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Read(ctx, dest, off)
	}
	h, err := n.requestHandle(ctx, false)
	if err != nil {
		return nil, errno(err)
	}
	defer h.close()
	k, err := unix.Pread(h.fd, dest, off)
	if err != nil {
		return nil, errno(err)
	}
	return fuse.ReadResultData(dest[:k]), 0
}

// Write writes at off through f, or for a file opened without a request,
// to the file in the upper layer, copied up first.
func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Write(ctx, data, off)
	}
	h, err := n.requestHandle(ctx, true)
	if err != nil {
		return 0, errno(err)
	}
	defer h.close()
	return h.Write(ctx, data, off)
}

// Writev is Write of several buffers.
func (n *node) Writev(ctx context.Context, f fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Writev(ctx, data, off)
	}
	h, err := n.requestHandle(ctx, true)
	if err != nil {
		return 0, errno(err)
	}
	defer h.close()
	return h.Writev(ctx, data, off)
}

// Fsync syncs the file. One still in its lower layer was never written
// through the mount, and its layer is not the mount's to sync (the
// kernel's ovl_fsync() syncs upper files alone).
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	if n.isDir() {
		return 0
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return syscall.ENOENT
	}
	par, name := n.location()
	if !par.Layer.Upper {
		return 0
	}
	fd, err := par.Open(name, unix.O_RDONLY)
	if err != nil {
		return errno(err)
	}
	defer unix.Close(fd)
	if flags&1 != 0 {
		return errno(unix.Fdatasync(fd))
	}
	return errno(unix.Fsync(fd))
}

// Allocate is fallocate(2), on the upper file.
func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Allocate(ctx, off, size, mode)
	}
	h, err := n.requestHandle(ctx, true)
	if err != nil {
		return errno(err)
	}
	defer h.close()
	return h.Allocate(ctx, off, size, mode)
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the file's data.
func (n *node) Lseek(ctx context.Context, f fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Lseek(ctx, off, whence)
	}
	h, err := n.requestHandle(ctx, false)
	if err != nil {
		return 0, errno(err)
	}
	defer h.close()
	return h.Lseek(ctx, off, whence)
}

// heldLocked reports whether n may be open: it has open handles, or, on
// a mount whose files open without a request, the kernel still holds it.
//
// Preconditions: n.mu is held.
func (n *node) heldLocked() bool {
	if n.openCached+n.openPassthrough > 0 {
		return true
	}
	// go-fuse's own record of the kernel's references: the
	// NodeOnForgetter it points to instead tells only when they end,
	// and OnForget uses it so.
	return n.ofs.io.noOpen && !n.Forgotten() //nolint:staticcheck
}
