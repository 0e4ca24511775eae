package overlay

import (
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var _ = (fs.NodeOpendirHandler)((*node)(nil))

// OpendirHandle opens a merged listing. The listing is read at the first
// READDIR of an open, not at the open (most opens are then served from the
// kernel's readdir cache and never read it), and again on a seek to 0, so
// offsets stay stable for telldir/seekdir within one open directory
// (Linux: fs/overlayfs/readdir.c keeps a cache per open file the same way,
// and reads it at the first iterate, not at open).
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	d := &dirHandle{n: n}
	// The kernel opens directories without asking (diropen.go); this
	// handle serves one pass of READDIRs. The kernel keeps the listing
	// in the directory's page cache and serves later opens from it
	// (FOPEN_CACHE_DIR, kept across opens by FOPEN_KEEP_CACHE, the flags
	// of an open the kernel makes itself; fs/fuse/readdir.c): a warm
	// readdir costs nothing here. Every change
	// of a merged listing is an operation on that directory through this
	// mount (create, mknod, mkdir, symlink, link, unlink, rmdir, rename),
	// after which the kernel drops the cached listing itself
	// (fuse_dir_changed() bumps the inode's version, which
	// fuse_readdir_cached() checks); the layers do not change behind the
	// mount's back. The cached pages pin the directory's inode in the
	// kernel, and with it the node, until the page cache is dropped
	// (`echo 3 > drop_caches`, or memory pressure), not past `echo 2`.
	return d, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle is one open merged directory.
type dirHandle struct {
	n *node

	mu      sync.Mutex
	loaded  bool            // entries holds the listing
	entries []fuse.DirEntry // ".", "..", then the merged names
	next    int             // index of the next entry to return
	// last is the entry Readdirent returned last, which READDIRPLUS
	// then looks up (Lookup).
	last fuse.DirEntry
}

var (
	_ = (fs.FileReaddirenter)((*dirHandle)(nil))
	_ = (fs.FileSeekdirer)((*dirHandle)(nil))
	_ = (fs.FileReleasedirer)((*dirHandle)(nil))
	_ = (fs.FileFsyncdirer)((*dirHandle)(nil))
)

// load reads the merged listing; d.mu is held.
func (d *dirHandle) load() syscall.Errno {
	n := d.n
	n.mu.Lock()
	chain := n.chain
	n.mu.Unlock()
	// A listing read through the mount: an access of the directory
	// (atime.go).
	ents, err := chain.ReadDirAccess()
	if err != nil {
		return d.n.ofs.errno(err)
	}
	self := n.StableAttr().Ino
	parentIno := self
	if _, p := n.Parent(); p != nil {
		parentIno = p.StableAttr().Ino
	}
	list := make([]fuse.DirEntry, 0, len(ents)+2)
	list = append(list,
		fuse.DirEntry{Name: ".", Mode: unix.S_IFDIR, Ino: self},
		fuse.DirEntry{Name: "..", Mode: unix.S_IFDIR, Ino: parentIno})
	for _, e := range ents {
		list = append(list, fuse.DirEntry{Name: e.Name, Mode: e.Mode, Ino: n.ofs.ino.ino(e.Layer.Dev, e.Ino)})
	}
	for i := range list {
		// The offset of an entry is where the next one starts.
		list[i].Off = uint64(i + 1)
	}
	d.entries, d.next, d.loaded = list, 0, true
	return 0
}

// Readdirent returns the next entry, nil at the end.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.loaded {
		if errno := d.load(); errno != 0 {
			return nil, errno
		}
	}
	if d.next >= len(d.entries) {
		return nil, 0
	}
	e := d.entries[d.next]
	d.next++
	d.last = e
	return &e, 0
}

// Seekdir moves to an offset handed out by Readdirent; 0 reads the
// directory again, as rewinddir(3) promises.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		d.loaded, d.next = false, 0
		return 0
	}
	if !d.loaded {
		if errno := d.load(); errno != 0 {
			return errno
		}
	}
	if off > uint64(len(d.entries)) {
		return syscall.EINVAL
	}
	d.next = int(off)
	return 0
}

// Releasedir drops the listing.
func (d *dirHandle) Releasedir(ctx context.Context, releaseFlags uint32) {}

// Fsyncdir syncs the topmost instance of the directory.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	d.n.mu.Lock()
	chain := d.n.chain
	d.n.mu.Unlock()
	fd, err := chain[0].Open(".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return d.n.ofs.errno(err)
	}
	defer unix.Close(fd)
	return d.n.ofs.errno(unix.Fsync(fd))
}
