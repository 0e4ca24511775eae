package lower

import "sync/atomic"

// Caches is what a mount keeps of its layers to answer without system
// calls, beyond the layers themselves. One belongs to each mount and is
// shared by its layers (Layer.Caches), so that each bound holds for the
// mount; nothing in it is process-wide. Each cache says below where its
// entries go.
type Caches struct {
	// fds are the open fds of directories that can reopen themselves
	// (fdcache.go), at most a quarter of RLIMIT_NOFILE. An fd leaves
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

// NewCaches makes the caches of one mount, with the default bounds.
func NewCaches() *Caches {
	return &Caches{fds: newCache(), listings: &lcache{max: 1 << 18}}
}

// NoFchmodat2 reports whether the kernel was found without fchmodat2(2).
func (c *Caches) NoFchmodat2() bool { return c.noFchmodat2.Load() }
