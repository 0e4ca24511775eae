package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var _ = (fs.NodeOpener)((*node)(nil))

// Open opens the topmost instance of a regular file for reading.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.isDir() {
		return nil, 0, syscall.EISDIR
	}
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
		// Writing needs a copy-up into the upper layer.
		return nil, 0, syscall.EROFS
	}
	// Flags that only make sense at the mount, or that we handle, are
	// not passed on: O_CREAT/O_EXCL (the kernel resolved those), O_NOCTTY.
	keep := int(flags) & (unix.O_DIRECT | unix.O_NOATIME | unix.O_SYNC | unix.O_DSYNC)
	n.mu.Lock()
	parent, name := n.parent, n.name
	n.mu.Unlock()
	fd, err := parent.Open(name, unix.O_RDONLY|keep)
	if err == unix.EPERM && keep&unix.O_NOATIME != 0 {
		fd, err = parent.Open(name, unix.O_RDONLY|keep&^unix.O_NOATIME)
	}
	if err != nil {
		return nil, 0, errno(err)
	}
	// Lower files never change while mounted: the kernel may keep their
	// pages across opens.
	return fs.NewLoopbackFile(fd), fuse.FOPEN_KEEP_CACHE, 0
}

var _ = (fs.NodeReadlinker)((*node)(nil))

// Readlink reads the topmost instance of a symlink.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n.mu.Lock()
	parent, name := n.parent, n.name
	n.mu.Unlock()
	if parent.Dir == nil {
		return nil, syscall.EINVAL
	}
	b, err := parent.Readlink(name)
	return b, errno(err)
}
