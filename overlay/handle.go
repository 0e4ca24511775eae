package overlay

import (
	"bytes"
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/privs"
)

// handle is one open regular file.
//
// A handle opened read-only before its file was copied up follows the
// copy-up: its next read reopens the upper file (gVisor's currentFDLocked),
// so it never serves the stale lower data, nor puts it back in the page
// cache, as fuse-overlayfs does.
type handle struct {
	n *node
	// passthrough is decided at open (node.openMode) and never changes.
	passthrough bool

	mu    sync.Mutex
	fd    int
	upper bool // fd is the upper file's
	// stale is the lower file's fd after the switch to the upper file:
	// kept open until Release, since a read reply may still be splicing
	// from it (Read).
	stale int
}

// newHandle wraps fd, an open file of n (in the upper layer when upper),
// opened for writing when write.
func newHandle(n *node, fd int, upper, write bool) *handle {
	h := &handle{n: n, fd: fd, upper: upper, stale: -1}
	h.passthrough = n.openMode(upper, write)
	return h
}

var _ = (fs.FilePassthroughFder)((*handle)(nil))

// PassthroughFd offers the kernel the upper file to read and write
// directly (FUSE passthrough), when openMode chose it.
func (h *handle) PassthroughFd() (int, bool) {
	if !h.passthrough {
		return -1, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fd, true
}

var (
	_ = (fs.FileReader)((*handle)(nil))
	_ = (fs.FileWriter)((*handle)(nil))
	_ = (fs.FileWritever)((*handle)(nil))
	_ = (fs.FileReleaser)((*handle)(nil))
	_ = (fs.FileFsyncer)((*handle)(nil))
	_ = (fs.FileFlusher)((*handle)(nil))
	_ = (fs.FileLseeker)((*handle)(nil))
	_ = (fs.FileAllocater)((*handle)(nil))
)

// current returns the fd to use, switching to the upper file when the node
// was copied up since the handle was opened.
func (h *handle) current() (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.upper {
		return h.fd, nil
	}
	par, name := h.n.location()
	if !par.Layer.Upper {
		return h.fd, nil
	}
	fd, err := par.Open(name, unix.O_RDONLY)
	if err != nil {
		return -1, err
	}
	h.stale, h.fd, h.upper = h.fd, fd, true
	return fd, nil
}

// Read reads at off.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	fd, err := h.current()
	if err != nil {
		return nil, errno(err)
	}
	// go-fuse splices from fd to /dev/fuse after we return (falling
	// back to pread): no copy through our memory. fd stays open until
	// Release, which the kernel sends only after every read's reply.
	return fuse.ReadResultFd(uintptr(fd), off, len(dest)), 0
}

// Write writes at off. Only handles opened for writing, which are always on
// the upper file, get writes.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	fd, err := h.current()
	if err == nil {
		err = h.n.killIfAsked(ctx)
	}
	if err != nil {
		return 0, errno(err)
	}
	if h.n.ofs.raw.seen(ctx).flags&flagCacheWrite != 0 && h.n.hasCapability() {
		n, err := mmapWrite(fd, data, off)
		return uint32(max(n, 0)), errno(err)
	}
	n, err := unix.Pwrite(fd, data, off)
	return uint32(max(n, 0)), errno(err)
}

// hasCapability reports whether regular file n carries security.capability.
func (n *node) hasCapability() bool {
	if n.nosec.Known() {
		return false
	}
	par, name := n.location()
	_, err := par.Getxattr(name, privs.CapabilityXattr)
	return err == nil
}

// mmapWrite writes a page that the kernel writes back from a shared
// mapping through a mapping of our own. A write(2) by the daemon would
// make the upper filesystem remove security.capability (its
// file_remove_privs() does not spare root), where a store through a mapping
// removes nothing — which is what the kernel overlay, mapping the upper file
// itself, does. Pages of a mapping lie within the file; anything else
// falls back to pwrite.
func mmapWrite(fd int, data []byte, off int64) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	if len(data) == 0 || off+int64(len(data)) > st.Size {
		return unix.Pwrite(fd, data, off)
	}
	page := int64(unix.Getpagesize())
	start := off &^ (page - 1)
	m, err := unix.Mmap(fd, start, int(off-start)+len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return unix.Pwrite(fd, data, off)
	}
	n := copy(m[off-start:], data)
	return n, unix.Munmap(m)
}

// Writev writes several buffers at off in one pwritev.
func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	fd, err := h.current()
	if err == nil {
		err = h.n.killIfAsked(ctx)
	}
	if err != nil {
		return 0, errno(err)
	}
	if h.n.ofs.raw.seen(ctx).flags&flagCacheWrite != 0 && h.n.hasCapability() {
		n, err := mmapWrite(fd, bytes.Join(data, nil), off)
		return uint32(max(n, 0)), errno(err)
	}
	n, err := unix.Pwritev(fd, data, off)
	return uint32(max(n, 0)), errno(err)
}

// Release closes the fd.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return syscall.EBADF
	}
	err := unix.Close(h.fd)
	h.fd = -1
	if h.stale >= 0 {
		unix.Close(h.stale)
		h.stale = -1
	}
	n, pt := h.n, h.passthrough
	n.ofs.raw.afterRelease(ctx, func() { n.closed(pt) })
	return errno(err)
}

// handleOpenFlags are the FOPEN_* flags of every regular file's open.
//
//   - FOPEN_KEEP_CACHE: the layers change only through this mount, which
//     keeps the page cache right itself, so the kernel may keep a file's
//     pages across opens (go-fuse drops it for a passthrough handle).
//   - FOPEN_NOFLUSH: no FLUSH request at each close(2), one round trip
//     less per open file. FLUSH would carry nothing: this daemon buffers
//     nothing (Flush is empty), POSIX locks stay in the kernel (locks are
//     not negotiated), and without the writeback cache (never negotiated:
//     it excludes passthrough) the kernel has no dirty pages to write
//     back at close — writes are sent through, and the pages of a shared
//     writable mapping are written when it is unmapped (fuse_vma_close())
//     or by periodic writeback, no longer also at a close(2) of a
//     descriptor while the mapping lives on (a passthrough handle maps the
//     upper file itself).
//     The kernel honours the flag only without the writeback cache
//     (fuse_flush()); the passthrough mask allows it.
const handleOpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH

// Flush is called on each close(2) of a descriptor, unless the open said
// FOPEN_NOFLUSH (handleOpenFlags); nothing is buffered here.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

// Fsync syncs the file (its data only when flags has FUSE_FSYNC_FDATASYNC).
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	fd, err := h.current()
	if err != nil {
		return errno(err)
	}
	if flags&1 != 0 {
		return errno(unix.Fdatasync(fd))
	}
	return errno(unix.Fsync(fd))
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the backing file.
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	fd, err := h.current()
	if err != nil {
		return 0, errno(err)
	}
	r, err := unix.Seek(fd, int64(off), int(whence))
	return uint64(r), errno(err)
}

// Allocate is fallocate(2).
func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	fd, err := h.current()
	if err != nil {
		return errno(err)
	}
	return errno(unix.Fallocate(fd, mode, int64(off), int64(size)))
}

// stat is fstat of the open file, with a lower file's owners as its
// layer's Dir.Stat gives them (lower.Layer.UnshiftStat).
func (h *handle) stat(st *unix.Stat_t) error {
	fd, err := h.current()
	if err != nil {
		return err
	}
	if err := unix.Fstat(fd, st); err != nil {
		return err
	}
	h.mu.Lock()
	up := h.upper
	h.mu.Unlock()
	if !up {
		par, _ := h.n.location()
		par.Layer.UnshiftStat(st)
	}
	return nil
}

// truncate sets the size through the handle.
func (h *handle) truncate(size uint64) error {
	fd, err := h.current()
	if err != nil {
		return err
	}
	return unix.Ftruncate(fd, int64(size))
}

// backingFlags are the open flags passed on to the layer's file. O_APPEND
// is left out: the kernel gives every write its offset, and pwrite on an
// O_APPEND fd would ignore it. O_CREAT, O_EXCL and O_TRUNC were handled
// already, O_NOCTTY is meaningless here.
func backingFlags(flags uint32) int {
	f := int(flags) & (unix.O_ACCMODE | unix.O_DIRECT | unix.O_NOATIME | unix.O_SYNC | unix.O_DSYNC)
	if f&unix.O_ACCMODE == unix.O_WRONLY {
		// The kernel may read through any handle (readahead of a
		// partial page write); a write-only fd could not serve it.
		f = f&^unix.O_ACCMODE | unix.O_RDWR
	}
	return f
}
