package overlay

import (
	"context"
	"os"
	"path/filepath"
	"sync"
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
// (Read, Write, ...) through an open file of the node that the requests
// share (nodeFD), opened where the file is when none fits: a copy-up, or
// a write to a file open for reading only, opens another. CREATE and
// TMPFILE still arrive (fuse_create_open()); their replies carry no
// handle, since the kernel would send no RELEASE for it, and the new
// file's fd becomes its nodeFD (keepCreated).
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
//   - Reads follow a copy-up at once: the nodeFD of the lower file no
//     longer fits.
//   - A file whose last name is removed: the daemon cannot tell whether
//     it is open, so it takes every file the kernel still holds (go-fuse:
//     the node is not forgotten) for open (heldLocked): an upper file is
//     kept in the workdir and a lower one stays a lower orphan
//     (orphan.go) until the kernel forgets the inode (OnForget), which it
//     does at the last close of an unlinked file.
//   - No passthrough: it is set up in the reply to an OPEN. Writes take
//     the writeback cache (writeback.go) unless writeback=0.
//   - The kernel checks the permissions of an open itself, as it always
//     did (default_permissions); the daemon opens the layer's file as
//     itself, as OPEN did.

// nodeFD is an open file of a node that the requests on a file opened
// without a request share, from one request to the next: the
// kernel's readahead state lives in the open file (struct file's f_ra), so
// a file opened anew for each READ of a sequential reader would read
// ahead as for a random one, and each request would pay an open.
type nodeFD struct {
	fd    int
	upper bool // the upper file's; else the lower file's or a metacopy file's data
	rw    bool
	// users counts the requests using fd; stale marks it replaced,
	// evicted or forgotten: the last user closes it.
	users int
	stale bool
}

// fdRing bounds the nodeFDs of a mount: a new one takes the oldest one's
// place, which is closed once unused.
type fdRing struct {
	mu    sync.Mutex
	nodes []*node
	next  int
	// budget is the mount's fd budget (Options.FDBudget), 0 for none.
	budget int
}

// ringSize is the size of a mount's fdRing: 1,024, or an eighth of the
// mount's fd budget where that is less, or without one of what the
// process may open (RLIMIT_NOFILE), read when the ring is first used; the
// layers' directory fds take up to a quarter (lower/fdcache.go).
func ringSize(budget int) int {
	n := 1024
	limit := uint64(max(budget, 0))
	var rl unix.Rlimit
	if limit == 0 && unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		limit = rl.Cur
	}
	if limit > 0 {
		n = int(min(max(limit/8, 16), uint64(n)))
	}
	return n
}

// add records that n now has a nodeFD and returns the node whose nodeFD
// it replaces in the ring, if any.
func (r *fdRing) add(n *node) *node {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes == nil {
		r.nodes = make([]*node, ringSize(r.budget))
	}
	old := r.nodes[r.next]
	r.nodes[r.next] = n
	r.next = (r.next + 1) % len(r.nodes)
	return old
}

// dataFD returns n's nodeFD for a request on a file opened without a
// request, opening the file where it is now when n has none that fits: for
// reading its data (a metacopy file's data file), or for writing, after a
// copy-up. The caller gives it back with putFD.
func (n *node) dataFD(ctx context.Context, write bool) (*nodeFD, error) {
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
	data := n.metacopyData()
	upper := par.Layer.Upper && data == nil
	n.mu.Lock()
	if c := n.fd; c != nil && !c.stale && c.upper == upper && (c.rw || !write) {
		c.users++
		n.mu.Unlock()
		return c, nil
	}
	n.mu.Unlock()
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	var (
		fd  int
		err error
	)
	if data != nil {
		fd, err = data.Open(flags)
	} else {
		fd, err = par.Open(name, flags)
	}
	if err != nil {
		return nil, err
	}
	c := &nodeFD{fd: fd, upper: upper, rw: write, users: 1}
	n.keepFD(c)
	return c, nil
}

// keepFD makes c, a new open file of n with its users counted, n's
// nodeFD, in place of the one n had, which is closed once unused, and of
// the oldest of the mount's (fdRing).
func (n *node) keepFD(c *nodeFD) {
	if old := n.ofs.fds.add(n); old != nil {
		old.dropFD()
	}
	n.mu.Lock()
	old := n.fd
	n.fd = c
	n.mu.Unlock()
	if old != nil {
		n.putFD(old, true)
	}
}

// putFD gives back c, from dataFD; with drop, c is to be closed once
// unused.
func (n *node) putFD(c *nodeFD, drop bool) {
	n.mu.Lock()
	if drop {
		c.stale = true
	} else {
		c.users--
	}
	done := c.stale && c.users == 0
	n.mu.Unlock()
	if done {
		unix.Close(c.fd)
	}
}

// dropFD closes n's nodeFD once unused (the kernel forgot n, or the
// fdRing needs its place).
func (n *node) dropFD() {
	n.mu.Lock()
	c := n.fd
	n.fd = nil
	n.mu.Unlock()
	if c != nil {
		n.putFD(c, true)
	}
}

// keepCreated makes fd, the new upper file n was created as with the
// open flags flags, n's nodeFD, for the writes that follow; an fd opened
// with O_DIRECT or O_SYNC is closed instead, as other opens of the file
// need neither.
func (n *node) keepCreated(fd int, flags uint32) {
	if int(flags)&(unix.O_DIRECT|unix.O_SYNC|unix.O_DSYNC) != 0 {
		unix.Close(fd)
		return
	}
	rw := backingFlags(flags)&unix.O_ACCMODE == unix.O_RDWR
	n.keepFD(&nodeFD{fd: fd, upper: true, rw: rw})
}

// handleOf wraps c for one request as a handle, whose methods do the
// work (c's fd is an upper file's for a write).
func (n *node) handleOf(c *nodeFD) *handle {
	return &handle{n: n, fd: c.fd, upper: c.upper, stale: -1}
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
// return (fuse.ReadResultFd): once given back, the shared fd may be
// closed (fdRing, OnForget).
func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.noteRead(off)
	if h, ok := f.(*handle); ok {
		return h.Read(ctx, dest, off)
	}
	c, err := n.dataFD(ctx, false)
	if err != nil {
		return nil, n.ofs.errno(err)
	}
	defer n.putFD(c, false)
	k, err := unix.Pread(c.fd, dest, off)
	if err != nil {
		return nil, n.ofs.errno(err)
	}
	return fuse.ReadResultData(dest[:k]), 0
}

// Write writes at off through f, or for a file opened without a request,
// to the file in the upper layer, copied up first.
func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Write(ctx, data, off)
	}
	c, err := n.dataFD(ctx, true)
	if err != nil {
		n.writeFailed(ctx, off, err)
		return 0, n.ofs.errno(err)
	}
	defer n.putFD(c, false)
	return n.handleOf(c).Write(ctx, data, off)
}

// Writev is Write of several buffers.
func (n *node) Writev(ctx context.Context, f fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Writev(ctx, data, off)
	}
	c, err := n.dataFD(ctx, true)
	if err != nil {
		n.writeFailed(ctx, off, err)
		return 0, n.ofs.errno(err)
	}
	defer n.putFD(c, false)
	return n.handleOf(c).Writev(ctx, data, off)
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
		return n.ofs.errno(err)
	}
	defer unix.Close(fd)
	return n.handleOf(&nodeFD{fd: fd, upper: true}).Fsync(ctx, flags)
}

// Allocate is fallocate(2), on the upper file.
func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Allocate(ctx, off, size, mode)
	}
	c, err := n.dataFD(ctx, true)
	if err != nil {
		return n.ofs.errno(err)
	}
	defer n.putFD(c, false)
	return n.handleOf(c).Allocate(ctx, off, size, mode)
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the file's data.
func (n *node) Lseek(ctx context.Context, f fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Lseek(ctx, off, whence)
	}
	n.seekFlush(off)
	c, err := n.dataFD(ctx, false)
	if err != nil {
		return 0, n.ofs.errno(err)
	}
	defer n.putFD(c, false)
	r, err := unix.Seek(c.fd, int64(off), int(whence))
	return uint64(r), n.ofs.errno(err)
}

// heldLocked reports whether n may be open: it has open handles, or, on
// a mount whose files open without a request, the kernel still holds it.
//
// Preconditions: n.mu is held.
func (n *node) heldLocked() bool {
	if r := n.rareLocked(); r != nil && r.openCached+r.openPassthrough > 0 {
		return true
	}
	// go-fuse's own record of the kernel's references: the
	// NodeOnForgetter it points to instead tells only when they end,
	// and OnForget uses it so.
	return n.ofs.io.noOpen && !n.Forgotten() //nolint:staticcheck
}

// The kernel learns that the daemon answers no OPEN at the first OPEN
// (fuse_file_open(): fc->no_open). Until then every file a CREATE made
// is released with a RELEASE at its last close (fuse_file_put()): an
// untar or a shell loop of `echo > f` into a fresh mount, which opens no
// file, paid one more request per file for nothing. So once the mount is
// live, and before anyone uses it, teachNoOpen opens one regular file of
// the mount, found in a short walk from its root.

// noOpenDirs, noOpenEntries and noOpenTries bound teachNoOpen's walk:
// directories read, entries looked at, files tried.
const (
	noOpenDirs    = 32
	noOpenEntries = 2048
	noOpenTries   = 8
)

// teachNoOpen opens and closes one regular file of the mount at
// mountpoint, so that the kernel has its OPEN answered ENOSYS and opens
// every file by itself from then on. It reports whether it did; a mount
// without a regular file it may open within the walk's bounds learns it
// at the first OPEN, as before.
func (f *FS) teachNoOpen(mountpoint string) bool {
	if !f.io.noOpen || f.ReadOnly() {
		// No CREATE on a read-only mount, and OPEN requests with
		// noopen=0 are answered.
		return false
	}
	dirs, entries, tries := []string{mountpoint}, 0, 0
	for n := 0; n < len(dirs) && n < noOpenDirs && entries < noOpenEntries; n++ {
		d, err := os.Open(dirs[n])
		if err != nil {
			continue
		}
		ents, _ := d.ReadDir(noOpenEntries - entries)
		d.Close()
		entries += len(ents)
		for _, e := range ents {
			p := filepath.Join(dirs[n], e.Name())
			switch {
			case e.IsDir():
				dirs = append(dirs, p)
			case e.Type().IsRegular() && tries < noOpenTries:
				tries++
				fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
				if err == nil {
					unix.Close(fd)
					return true
				}
			}
		}
	}
	return false
}
