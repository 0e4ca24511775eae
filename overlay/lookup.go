package overlay

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

var _ = (fs.NodeLookuper)((*node)(nil))

// Lookup resolves name across the layers (lower.Chain.Lookup).
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.ofs.hooks.lookup.run(name)
	child, errno := n.lookup(ctx, name, out)
	if errno == 0 && out.Attr.Mode&syscall.S_IFMT != syscall.S_IFDIR && n.skipped.Load() {
		// Someone wants more of a listing than its names
		// (listattrs.go).
		n.ofs.statWalk.Store(time.Now().Add(statWalkFor).UnixNano())
	}
	if errno == 0 && out.Attr.Mode&syscall.S_IFMT == syscall.S_IFREG {
		c := child.Operations().(*node)
		n.ofs.lastLookup.Store(c)
		c.prefetch(ctx, int64(out.Attr.Size))
	}
	return child, errno
}

// lookup is Lookup without the stat-walk signal: READDIRPLUS's lookups
// (dirHandle.Lookup) are not a sign that anyone stats.
func (n *node) lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if lower.IsWhiteoutName(name) {
		// The AUFS format's names are never part of the merged view.
		return nil, syscall.ENOENT
	}
	if len(name) > unix.NAME_MAX {
		return nil, syscall.ENAMETOOLONG
	}
	n.mu.Lock()
	chain := n.chain
	n.mu.Unlock()
	e, err := chain.Lookup(name, n.ofs.layers)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			n.ofs.stats.negativeLookups.Add(1)
		}
		var re *lower.RedirectError
		if errors.As(err, &re) {
			n.ofs.warnRedirect(name, re)
		}
		var me *lower.MetacopyError
		if errors.As(err, &me) {
			n.ofs.warnMetacopy(name, me)
		}
		return nil, n.ofs.errno(err)
	}
	child := n.newChild(ctx, name, e)
	c := child.Operations().(*node)
	c.fillAttr(&e.Stat, &out.Attr)
	c.setEntryTimeouts(out)
	n.ofs.stats.lookups.Add(1)
	return child, 0
}

var _ = (fs.NodeStatfser)((*node)(nil))

// Statfs reports the upper layer's filesystem, or the top lower's on a
// read-only mount (Linux: ovl_statfs()).
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st unix.Statfs_t
	err := n.ofs.layers[0].Root().Do(func(fd int) error { return unix.Fstatfs(fd, &st) })
	if err != nil {
		return n.ofs.errno(err)
	}
	out.Blocks = st.Blocks
	out.Bfree = st.Bfree
	out.Bavail = st.Bavail
	out.Files = st.Files
	out.Ffree = st.Ffree
	out.Bsize = uint32(st.Bsize)
	out.Frsize = uint32(st.Frsize)
	out.NameLen = uint32(st.Namelen)
	return 0
}

// warnRedirect logs a redirect a lookup of name could not follow, as the
// kernel logs an invalid one (Linux: ovl_get_redirect_xattr()), at most
// once a second: a layer full of them must not flood the log.
func (f *FS) warnRedirect(name string, re *lower.RedirectError) {
	now := time.Now().UnixNano()
	last := f.redirectWarned.Load()
	if now-last < int64(time.Second) || !f.redirectWarned.CompareAndSwap(last, now) {
		return
	}
	f.log.Printf("lookup %q: %v", name, re)
}
