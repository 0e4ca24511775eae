package overlay

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// prepareMove copies c, the child about to be moved, into the upper layer.
//
// A directory with instances in lower layers moves with a redirect, as the
// kernel does with redirect_dir=on (Linux: fs/overlayfs/dir.c
// ovl_set_redirect()): its upper instance records the path of its lower
// instances, overlay.redirect (always absolute here), so that a later
// lookup, ours or the kernel's, merges it with them wherever it now is.
// It reports whether c got a redirect. With redirect_dir=off the answer is
// EXDEV, the kernel's answer then, and mv(1) falls back to copying. Both
// sides of a RENAME_EXCHANGE move, and each gets a redirect of its own.
func (c *node) prepareMove(ctx context.Context) (redirected bool, e syscall.Errno) {
	if !c.isDir() {
		return false, errno(c.copyUp(ctx, true))
	}
	c.mu.Lock()
	pure := len(c.chain) == 1 && c.chain[0].Layer.Upper
	c.mu.Unlock()
	if pure {
		return false, 0
	}
	if c.ofs.opts.RedirectDirOff {
		return false, syscall.EXDEV
	}
	path := c.lowerPath()
	d, err := c.upperDir(ctx)
	if err != nil {
		return false, errno(err)
	}
	if err := c.ofs.upper.SetRedirect(d, path); err != nil {
		// Where the upper refuses the xattr, the kernel answers EXDEV
		// (Linux: fs/overlayfs/util.c ovl_check_setxattr() on
		// EOPNOTSUPP), and mv copies. So do we, also where its
		// namespace is refused: trusted.* as root of a user namespace
		// without -o userxattr (EPERM), which is how rootless podman
		// runs its mount program.
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EPERM) {
			return false, syscall.EXDEV
		}
		return false, errno(err)
	}
	c.mu.Lock()
	c.redirect = path
	c.mu.Unlock()
	c.ofs.keepIdentity(d, c.StableAttr())
	return true, 0
}

// lowerPath is where directory c's lower instances are, from the root:
// its redirect, or its name under its parent's lower path.
func (c *node) lowerPath() string {
	if c.IsRoot() {
		return ""
	}
	c.mu.Lock()
	r := c.redirect
	c.mu.Unlock()
	name, p := c.parentNode()
	switch {
	case r != "" && r[0] == '/':
		return r
	case r != "":
		name = r
	}
	if p == nil {
		return "/" + name
	}
	return p.lowerPath() + "/" + name
}

var _ = (fs.NodeRenamer)((*node)(nil))

// Rename moves name in n to newName in newParent, with renameat2's
// RENAME_NOREPLACE and RENAME_EXCHANGE.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return syscall.EINVAL
	}
	if errno := checkNewName(newName); errno != 0 {
		return errno
	}
	np := newParent.(*node)
	srcIn := n.GetChild(name)
	if srcIn == nil {
		return syscall.ENOENT
	}
	src := srcIn.Operations().(*node)

	np.mu.Lock()
	nchain := np.chain
	np.mu.Unlock()
	dstE, err := nchain.Lookup(newName, n.ofs.layers)
	dstExists := err == nil
	if err != nil && err != syscall.ENOENT {
		return errno(err)
	}
	if dstExists {
		defer dstE.Chain.Close()
	}
	if flags&unix.RENAME_NOREPLACE != 0 && dstExists {
		return syscall.EEXIST
	}
	exchange := flags&unix.RENAME_EXCHANGE != 0
	var dst *node
	var dstRedirected bool
	if exchange {
		if !dstExists {
			return syscall.ENOENT
		}
		dstIn := np.GetChild(newName)
		if dstIn == nil {
			return syscall.ENOENT
		}
		dst = dstIn.Operations().(*node)
		var e syscall.Errno
		if dstRedirected, e = dst.prepareMove(ctx); e != 0 {
			return e
		}
	} else if dstExists && dstE.IsDir() {
		ents, err := dstE.Chain.ReadDir()
		if err != nil {
			return errno(err)
		}
		if len(ents) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	redirected, e := src.prepareMove(ctx)
	if e != 0 {
		return e
	}
	sd, err := n.upperDir(ctx)
	if err != nil {
		return errno(err)
	}
	dd, err := np.upperDir(ctx)
	if err != nil {
		return errno(err)
	}
	// A directory landing on a name that a lower directory has must not
	// merge with it; a redirected one merges with what its redirect says.
	// The kernel marks an upper-only directory moved into a merged
	// directory opaque in any case (Linux: ovl_rename()), and so do we,
	// so that both write the same upper layer.
	opaque := false
	if src.isDir() && !redirected {
		if opaque, err = np.landsOpaque(newName); err != nil {
			return errno(err)
		}
	}
	var whiteout bool
	over := upper.OverNothing
	if exchange {
		if dst.isDir() && !dstRedirected {
			// The other way round, the same rule as for src above.
			dopaque, err := n.landsOpaque(name)
			if err != nil {
				return errno(err)
			}
			if dopaque {
				if err := n.ofs.upper.SetOpaque(dd, newName); err != nil {
					return errno(err)
				}
			}
		}
	} else {
		if whiteout, err = n.inLower(name); err != nil {
			return errno(err)
		}
		if over, err = upper.Probe(dd, newName); err == unix.EEXIST {
			over = upper.OverNothing
			if dstE.IsDir() {
				// The target looks empty but its upper instance may
				// hold whiteouts, which rename(2) would call content.
				if err := n.ofs.upper.EmptyDir(dd, newName); err != nil {
					return errno(err)
				}
			}
		} else if err != nil {
			return errno(err)
		}
	}
	// The nodes whose names change: no syscall may use a name of theirs
	// between the rename and the record of it (locMu).
	var replaced *node
	if dst == nil && dstExists && !dstE.IsDir() {
		if in := np.GetChild(newName); in != nil {
			replaced = in.Operations().(*node)
		}
	}
	unlock := lockNames(src, dst, replaced)
	defer unlock()
	keep := replaced.keepIfOpen(dd, newName)
	if err := n.ofs.upper.Rename(sd, name, dd, newName, uint(flags), whiteout, over, opaque); err != nil {
		replaced.dropKept(keep)
		return errno(err)
	}
	src.moved(sd, name, dd, newName)
	if dst != nil {
		dst.moved(dd, newName, sd, name)
	} else if replaced != nil {
		replaced.nameRemoved(dd, newName, keep)
	}
	return 0
}

// landsOpaque reports whether an upper-only directory moved to name in
// directory p must be marked opaque: p is merged, or a lower layer has
// name (see Rename).
func (p *node) landsOpaque(name string) (bool, error) {
	if p.merged() {
		return true, nil
	}
	return p.inLower(name)
}

// moved records that c now lives in upper directory d under name.
func (c *node) moved(from *lower.Dir, fromName string, d *lower.Dir, name string) {
	if c.isDir() {
		// An open fd follows the directory; a reopen must know.
		c.top().Moved(d, name)
		return
	}
	c.invalidateNoSec()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.replaceLinkLocked(from, fromName, lower.Member{Dir: d}, name)
}

// lockNames takes the locMu of each distinct node given, in address order
// (the only place that holds more than one), and returns the unlock.
func lockNames(nodes ...*node) func() {
	var ns []*node
	for _, n := range nodes {
		if n != nil && !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	slices.SortFunc(ns, func(a, b *node) int {
		return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b)))
	})
	for _, n := range ns {
		n.locMu.Lock()
	}
	return func() {
		for _, n := range ns {
			n.locMu.Unlock()
		}
	}
}
