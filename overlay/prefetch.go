package overlay

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// A read walk: a program that opens and reads file after file (tar, a
// copy, a build reading its sources, a container's first start). Each
// file costs a LOOKUP and then a READ, and where its data is not cached
// the READ waits in the daemon for the disk, after the LOOKUP's round
// trip and its own. While READs follow LOOKUPs so, a LOOKUP of a
// regular file also has the layer's filesystem start reading the file's
// first prefetchMax bytes (POSIX_FADV_WILLNEED queues the reads and
// returns, mm/fadvise.c), through the node's data fd, which the READ then
// uses: the disk works while the reply and the READ cross.
//
// A walk that only stats (ls -l, find -printf, du) sends LOOKUPs but no
// READ after them, so it starts no read walk and reads no data.

// readWalkFor is how long LOOKUPs start reads after a READ at offset 0 of
// the file the kernel looked up last.
const readWalkFor = 2 * time.Second

// prefetchMax is as much as the kernel's first READ of a file asks for
// (its readahead window, 128 KiB: VM_READAHEAD_PAGES).
const prefetchMax = 128 << 10

// noteRead starts or extends a read walk when the kernel reads the start
// of the file it looked up last.
func (n *node) noteRead(off int64) {
	if off == 0 && n.ofs.lastLookup.Load() == n {
		n.ofs.readWalk.Store(time.Now().Add(readWalkFor).UnixNano())
	}
}

// prefetch starts reading the first size bytes (up to prefetchMax) of
// regular file n during a read walk.
func (n *node) prefetch(ctx context.Context, size int64) {
	if size <= 0 || time.Now().UnixNano() >= n.ofs.readWalk.Load() {
		return
	}
	c, err := n.dataFD(ctx, false)
	if err != nil {
		return
	}
	if unix.Fadvise(c.fd, 0, min(size, prefetchMax), unix.FADV_WILLNEED) == nil {
		n.ofs.stats.prefetches.Add(1)
	}
	n.putFD(c, false)
}
