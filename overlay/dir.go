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

// OpendirHandle opens a merged listing. The listing is read once per open
// and again on a seek to 0, so offsets stay stable for telldir/seekdir
// within one open directory (Linux: fs/overlayfs/readdir.c keeps a cache
// per open file the same way).
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	d := &dirHandle{n: n}
	if errno := d.load(); errno != 0 {
		return nil, 0, errno
	}
	// Not FOPEN_CACHE_DIR: the cached listing pins the directory's inode
	// in the kernel past `echo 2 > drop_caches`, and with it the node and
	// its fds (tests/reliability TestNoGrowth). A warm readdir therefore
	// reaches the daemon, which builds it from the lower layers' cached
	// listings and the upper directory (lower/listing.go).
	return d, 0, 0
}

// dirHandle is one open merged directory.
type dirHandle struct {
	n *node

	mu      sync.Mutex
	entries []fuse.DirEntry // ".", "..", then the merged names
	next    int             // index of the next entry to return
}

var (
	_ = (fs.FileReaddirenter)((*dirHandle)(nil))
	_ = (fs.FileSeekdirer)((*dirHandle)(nil))
	_ = (fs.FileReleasedirer)((*dirHandle)(nil))
	_ = (fs.FileFsyncdirer)((*dirHandle)(nil))
)

// load reads the merged listing.
func (d *dirHandle) load() syscall.Errno {
	n := d.n
	n.mu.Lock()
	chain := n.chain
	n.mu.Unlock()
	ents, err := chain.ReadDir()
	if err != nil {
		return errno(err)
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
	d.mu.Lock()
	d.entries = list
	d.next = 0
	d.mu.Unlock()
	return 0
}

// Readdirent returns the next entry, nil at the end.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.next >= len(d.entries) {
		return nil, 0
	}
	e := d.entries[d.next]
	d.next++
	return &e, 0
}

// Seekdir moves to an offset handed out by Readdirent; 0 reads the
// directory again, as rewinddir(3) promises.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off == 0 {
		return d.load()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
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
		return errno(err)
	}
	defer unix.Close(fd)
	return errno(unix.Fsync(fd))
}
