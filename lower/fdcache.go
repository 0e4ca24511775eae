package lower

import (
	"container/list"
	"sync"

	"golang.org/x/sys/unix"
)

// cache bounds the directory fds kept open across calls (Caches.fds).
// Directories of the layers are reopened on demand (Dir.acquire), so the
// open ones are a cache: beyond the limit, the ones not used lately (clock
// algorithm) are closed. The kernel may keep far more directories in its
// dentry cache than the process may have fds (RLIMIT_NOFILE; 20,000 is
// common, and raising it needs CAP_SYS_RESOURCE).
type cache struct {
	mu  sync.Mutex
	lru list.List // of *Dir with an open fd it can reopen; new ones at the front
	max int
}

// newCache sizes the cache from budget, the fds the mount may keep open,
// or, when budget is 0, from what the process may open (RLIMIT_NOFILE).
func newCache(budget int) *cache {
	c := &cache{max: 4096}
	limit := uint64(max(budget, 0))
	var rl unix.Rlimit
	if limit == 0 && unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		limit = rl.Cur
	}
	if limit > 0 {
		// A quarter of what we may open: the rest is for open files,
		// the FUSE device and the layers' roots.
		c.max = int(min(max(limit/4, 64), 1<<16))
	}
	return c
}

// SetFDCacheSize sets how many idle directory fds may stay open (tests).
func (cs *Caches) SetFDCacheSize(n int) {
	c := cs.fds
	c.mu.Lock()
	c.max = max(n, 1)
	c.mu.Unlock()
	c.trim()
}

// OpenDirFDs reports how many directory fds the cache holds, idle or in
// use.
func (cs *Caches) OpenDirFDs() int {
	c := cs.fds
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// add puts d, whose fd was just opened, in the cache, and closes idle fds
// beyond the limit. It is the only time an access takes the cache's lock:
// using an open fd marks its Dir (Dir.used) and nothing else (the clock
// algorithm), so lookups share no lock.
//
// Preconditions: d.mu is held.
func (c *cache) add(d *Dir) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.lru == nil {
		d.lru = c.lru.PushFront(d)
	}
	c.trimLocked()
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

// trim closes idle fds beyond the limit.
func (c *cache) trim() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trimLocked()
}

// trimLocked closes the fds of the Dirs not used since it last passed over
// them, oldest first, until the cache is within its limit. A Dir in use
// (pinned, or its lock taken) gets a second chance like a used one: trim
// never waits for a Dir's lock, so it may run from anywhere. Every Dir in
// use leaves the cache over its limit until they are released.
//
// Preconditions: c.mu is held.
func (c *cache) trimLocked() {
	for tries := 2 * c.lru.Len(); c.lru.Len() > c.max && tries > 0; tries-- {
		e := c.lru.Back()
		d := e.Value.(*Dir)
		if !d.mu.TryLock() {
			c.lru.MoveToFront(e)
			continue
		}
		if d.pins > 0 || d.used {
			d.used = false
			c.lru.MoveToFront(e)
			d.mu.Unlock()
			continue
		}
		c.lru.Remove(e)
		d.lru = nil
		d.closeIdleLocked()
		d.mu.Unlock()
	}
}
