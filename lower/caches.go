package lower

import "sync/atomic"

// Caches is what a mount keeps of its layers to answer without system
// calls, beyond the layers themselves. One belongs to each mount and is
// shared by its layers (Layer.Caches), so that each bound holds for the
// mount; nothing in it is process-wide. Each cache says below where its
// entries go.
type Caches struct {
	// fds are the open fds of directories that can reopen themselves
	// (fdcache.go), at most a quarter of the mount's fd budget
	// (NewCachesBudget), by default of RLIMIT_NOFILE. An fd leaves
	// when its Dir is closed or forgotten (Dir.Close, Dir.Forget: its
	// node was forgotten by the kernel), or when the cache trims it; a
	// reopen checks that it found the same directory.
	fds *cache
	// listings are the listings of the read-only layers' directories
	// (listing.go), at most a budget of entries. A listing leaves when
	// its Dir is closed or forgotten, or when the cache trims it. Those
	// layers do not change under the mount, so nothing else makes a
	// listing stale; the upper layer's directories are never cached.
	listings *lcache
	// noXattrAt is set once the kernel answered ENOSYS to getxattrat or
	// listxattrat (before Linux 6.13; xattr.go). It is never cleared:
	// the kernel does not gain a system call.
	noXattrAt atomic.Bool
	// noFchmodat2 is the same for fchmodat2 (before Linux 6.6;
	// features.go).
	noFchmodat2 atomic.Bool
}

// NewCaches makes the caches of one mount, with the default bounds: its
// directory fds take up to a quarter of what the process may open
// (RLIMIT_NOFILE).
func NewCaches() *Caches { return NewCachesBudget(0) }

// NewCachesBudget makes the caches of a mount that may keep up to fds
// files open, which its directory fds take a quarter of; 0 is NewCaches.
// A process that serves several mounts gives each a share of its
// RLIMIT_NOFILE, since each mount's cache sized from the whole of it
// would let them together run the process out of fds (EMFILE).
func NewCachesBudget(fds int) *Caches {
	return &Caches{fds: newCache(fds), listings: &lcache{max: 1 << 18}}
}

// NoFchmodat2 reports whether the kernel was found without fchmodat2(2).
func (c *Caches) NoFchmodat2() bool { return c.noFchmodat2.Load() }
