package overlay

import (
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
	// kind is decided at open (node.openMode) and never changes;
	// backing is the ID of the backing file the kernel is given with
	// it.
	kind    ioKind
	backing int32

	mu    sync.Mutex
	fd    int
	upper bool // fd is the upper file's
	// stale is the lower file's fd after the switch to the upper file:
	// kept open until Release, since a read reply may still be reading
	// from it (Read).
	stale int
}

// newHandle wraps fd, an open file of n (in the upper layer when upper),
// opened for writing when write, for the OPEN, CREATE or TMPFILE request
// of ctx to reply with.
func newHandle(ctx context.Context, n *node, fd int, upper, write bool) *handle {
	h := &handle{n: n, fd: fd, upper: upper, stale: -1}
	h.kind, h.backing = n.openMode(fd, upper, write)
	n.ofs.raw.handleOpened(ctx, h)
	return h
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
//
// Lock order: locMu, then h.mu (Setattr truncates through a handle with
// locMu held).
func (h *handle) current() (int, error) {
	h.mu.Lock()
	if h.upper {
		fd := h.fd
		h.mu.Unlock()
		return fd, nil
	}
	h.mu.Unlock()
	h.n.locMu.RLock()
	defer h.n.locMu.RUnlock()
	return h.currentLocked()
}

// currentLocked is current with h.n.locMu held for reading.
func (h *handle) currentLocked() (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.upper || h.n.gone() {
		return h.fd, nil
	}
	par, name := h.n.location()
	if !par.Layer.Upper || h.n.metacopyData() != nil {
		// Still the lower file's data (a metacopy file's until its
		// data is copied in).
		return h.fd, nil
	}
	fd, err := par.Open(name, unix.O_RDONLY)
	if err != nil {
		return -1, err
	}
	h.stale, h.fd, h.upper = h.fd, fd, true
	return fd, nil
}

// writeFD is current for a write: the privileges the write must remove
// are removed first (killIfAsked).
func (h *handle) writeFD(ctx context.Context) (int, error) {
	fd, err := h.current()
	if err != nil {
		return -1, err
	}
	h.n.atimeStale()
	return fd, h.n.killIfAsked(ctx)
}

// Read reads at off.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	fd, err := h.current()
	if err != nil {
		return nil, h.n.ofs.errno(err)
	}
	// go-fuse preads from fd into the reply after we return (mount.go:
	// no splice). fd stays open until Release, which the kernel sends
	// only after every read's reply.
	return fuse.ReadResultFd(uintptr(fd), off, len(dest)), 0
}

// Write writes at off. Only handles opened for writing, which are always on
// the upper file, get writes.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	fd, err := h.writeFD(ctx)
	if err != nil {
		return 0, h.n.ofs.errno(err)
	}
	var n int
	if h.n.ofs.raw.seen(ctx).flags&flagCacheWrite == 0 {
		n, err = unix.Pwrite(fd, data, off)
	} else {
		// strippable takes locMu, which comes before timesMu
		// (doc.go): asked before cacheWrite takes timesMu.
		n, err = h.n.cacheWrite(ctx, fd, [][]byte{data}, off, h.n.strippable(fd))
	}
	return uint32(max(n, 0)), h.n.ofs.errno(err)
}

// strippable reports whether a write by the daemon to fd, regular file n,
// could make the upper filesystem remove privileges: n carries
// security.capability (removed whoever writes), or suid or sgid (removed
// when the daemon lacks CAP_FSETID in the initial user namespace, as it
// does rootless).
func (n *node) strippable(fd int) bool {
	if n.nosec.Known() {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return true
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return false
	}
	par, name := n.location()
	_, err := par.Getxattr(name, privs.CapabilityXattr)
	return err == nil
}

// mmapWrite writes a page that the kernel writes back from its cache (a
// shared mapping's, or the writeback cache's) through a mapping of our own.
// A write(2) by the daemon would make the upper filesystem remove
// security.capability (its file_remove_privs() does not spare root), and
// suid and sgid where the daemon lacks CAP_FSETID (rootless), where a store
// through a mapping removes nothing — which is what the kernel overlay,
// mapping the upper file itself, does. Privileges a write must remove were
// removed when the kernel cached it (writeback.go). Pages of a mapping lie within the file; anything else
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
	fd, err := h.writeFD(ctx)
	if err != nil {
		return 0, h.n.ofs.errno(err)
	}
	var n int
	if h.n.ofs.raw.seen(ctx).flags&flagCacheWrite == 0 {
		n, err = unix.Pwritev(fd, data, off)
	} else {
		n, err = h.n.cacheWrite(ctx, fd, data, off, h.n.strippable(fd))
	}
	return uint32(max(n, 0)), h.n.ofs.errno(err)
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
	h.n.closed(h.kind)
	return h.n.ofs.errno(err)
}

// handleOpenFlags are the FOPEN_* flags of every regular file's open.
//
//   - FOPEN_KEEP_CACHE: the layers change only through this mount, which
//     keeps the page cache right itself, so the kernel may keep a file's
//     pages across opens (go-fuse drops it for a passthrough handle).
//   - FOPEN_NOFLUSH: no FLUSH request at each close(2), one round trip
//     less per open file. FLUSH would carry nothing: this daemon buffers
//     nothing (Flush is empty), POSIX locks stay in the kernel (locks are
//     not negotiated), and without the writeback cache the kernel has no
//     dirty pages to write back at close — writes are sent through, and
//     the pages of a shared writable mapping are written when it is
//     unmapped (fuse_vma_close()) or by periodic writeback, no longer also
//     at a close(2) of a descriptor while the mapping lives on (a
//     passthrough handle maps the upper file itself).
//     The kernel honours the flag only without the writeback cache
//     (fuse_flush()): with it (writeback.go), every close(2) writes the
//     dirty pages back and sends FLUSH. The passthrough mask allows it.
const handleOpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH

// Flush is called on a close(2) of a descriptor when the open's
// FOPEN_NOFLUSH (handleOpenFlags) is not honoured: with the writeback cache.
// Nothing is buffered here and no lock is kept, so it answers ENOSYS, after
// which the kernel sends no FLUSH on this mount again (fuse_flush() sets
// no_flush; it still writes the dirty pages back at every close).
func (h *handle) Flush(ctx context.Context) syscall.Errno { return syscall.ENOSYS }

// Fsync syncs the file (its data only when flags has FUSE_FSYNC_FDATASYNC).
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	fd, err := h.current()
	if err != nil {
		return h.n.ofs.errno(err)
	}
	if flags&1 != 0 {
		err = unix.Fdatasync(fd)
	} else {
		err = unix.Fsync(fd)
	}
	if err == nil {
		// The kernel sends FSYNC once its writeback is done, and
		// after it reported a failed one (wberr.go).
		h.n.wbReset()
	}
	return h.n.ofs.errno(err)
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the backing file, once it
// holds what the kernel caches (seekFlush).
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if !h.kind.backed() {
		h.n.seekFlush(off)
	}
	fd, err := h.current()
	if err != nil {
		return 0, h.n.ofs.errno(err)
	}
	r, err := unix.Seek(fd, int64(off), int(whence))
	return uint64(r), h.n.ofs.errno(err)
}

// Allocate is fallocate(2).
func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	fd, err := h.current()
	if err != nil {
		return h.n.ofs.errno(err)
	}
	h.n.atimeStale()
	// The kernel updates its own mtime, or none (FALLOC_FL_KEEP_SIZE).
	return h.n.ofs.errno(h.n.keepMtime(fd, func() error { return unix.Fallocate(fd, mode, int64(off), int64(size)) }))
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
//
// Preconditions: h.n.locMu is held for reading.
func (h *handle) truncate(size uint64) error {
	fd, err := h.currentLocked()
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
