package lower

import (
	"container/list"
	"sync"

	"golang.org/x/sys/unix"
)

// fdCache bounds the directory fds kept open across calls. Directories of
// the layers are reopened on demand (Dir.acquire), so the open ones are a
// cache: the least recently used unpinned ones are closed beyond the
// limit. The kernel may keep far more directories in its dentry cache than
// the process may have fds (RLIMIT_NOFILE; 20,000 is common, and raising
// it needs CAP_SYS_RESOURCE).
var fdCache = newCache()

type cache struct {
	mu  sync.Mutex
	lru list.List // of *Dir, most recently used at the front
	max int
}

func newCache() *cache {
	c := &cache{max: 4096}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur > 0 {
		// A quarter of what we may open: the rest is for open files,
		// the FUSE device and the layers' roots.
		c.max = int(min(max(rl.Cur/4, 64), 1<<16))
	}
	return c
}

// SetFDCacheSize sets how many idle directory fds may stay open (tests).
func SetFDCacheSize(n int) {
	fdCache.mu.Lock()
	fdCache.max = max(n, 1)
	fdCache.mu.Unlock()
	fdCache.trim()
}

// OpenDirFDs reports how many idle directory fds the cache holds.
func OpenDirFDs() int {
	fdCache.mu.Lock()
	defer fdCache.mu.Unlock()
	return fdCache.lru.Len()
}

// add puts d at the front.
//
// Preconditions: d.mu is held.
func (c *cache) add(d *Dir) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.lru != nil {
		c.lru.MoveToFront(d.lru)
		return
	}
	d.lru = c.lru.PushFront(d)
}

// remove takes d out.
//
// Preconditions: d.mu is held.
func (c *cache) remove(d *Dir) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.lru != nil {
		c.lru.Remove(d.lru)
		d.lru = nil
	}
}

// trim closes the least recently used idle fds beyond the limit. A Dir
// whose lock is taken is busy and skipped: trim never waits for one, so it
// may run from anywhere.
func (c *cache) trim() {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.lru.Back()
	for c.lru.Len() > c.max && e != nil {
		prev := e.Prev()
		d := e.Value.(*Dir)
		if d.mu.TryLock() {
			c.lru.Remove(e)
			d.lru = nil
			d.closeIdleLocked()
			d.mu.Unlock()
		}
		e = prev
	}
}
