package overlay

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// move is one side of a rename made ready by prepareMove.
type move struct {
	c *node
	// lowers: c is a directory with lower instances, which moves with a
	// redirect (not as an upper-only directory).
	lowers bool
	// redirect is the redirect prepareMove wrote, "" when it kept the
	// one c had or wrote none.
	redirect string
}

// prepareMove copies n, the child about to be moved, into the upper layer.
// samedir is set when it stays in the same parent. What it marks is
// recorded in undo; the node learns of it only when the rename is done
// (commit).
//
// A directory with instances in lower layers moves with a redirect, as the
// kernel does with redirect_dir=on (Linux: fs/overlayfs/dir.c
// ovl_set_redirect()): its upper instance records where its lower
// instances are, overlay.redirect, so that a later lookup, ours or the
// kernel's, merges it with them wherever it now is. The value is written
// as the kernel writes it (redirectFor): the directory's path in the merged
// view before the move, which a lookup resolves in the layers below the
// upper, each of which may redirect again. A directory that already has a
// redirect keeps it when it stays in its parent or the redirect is
// absolute. With redirect_dir=off the answer is EXDEV, the kernel's answer
// then, and mv(1) falls back to copying. Both sides of a RENAME_EXCHANGE
// move, and each gets a redirect of its own.
func (n *node) prepareMove(ctx context.Context, samedir bool, undo *upper.Undo) (move, syscall.Errno) {
	m := move{c: n}
	if !n.isDir() {
		if err := n.copyUp(ctx, copyMeta); err != nil {
			return m, n.ofs.errno(err)
		}
		// A metacopy file moves with a redirect to its data.
		var e syscall.Errno
		m.redirect, e = n.metacopyRedirect(!samedir, undo)
		return m, e
	}
	n.mu.Lock()
	pure := len(n.chain) == 1 && n.chain[0].Layer.Upper
	old := n.redirectLocked()
	n.mu.Unlock()
	if pure {
		return m, 0
	}
	if n.ofs.opts.RedirectDirOff {
		return m, syscall.EXDEV
	}
	absolute := !samedir
	if old != "" && (!absolute || old[0] == '/') {
		// Still right, on the upper instance that holds it.
		m.lowers = true
		return m, 0
	}
	path, e := n.redirectFor(absolute)
	if e != 0 {
		return m, e
	}
	d, err := n.upperDir(ctx)
	if err != nil {
		return m, n.ofs.errno(err)
	}
	if err := n.ofs.upper.SetRedirect(d, path, undo); err != nil {
		// Where the upper refuses the xattr, the kernel answers EXDEV
		// (Linux: fs/overlayfs/util.c ovl_check_setxattr() on
		// EOPNOTSUPP), and mv copies. So do we, also where its
		// namespace is refused: trusted.* as root of a user namespace
		// without -o userxattr (EPERM), which is how rootless podman
		// runs its mount program.
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EPERM) {
			return m, syscall.EXDEV
		}
		return m, n.ofs.errno(err)
	}
	m.lowers, m.redirect = true, path
	return m, 0
}

// commit records on the node what prepareMove wrote, once the rename is
// done.
func (m move) commit() {
	if m.redirect != "" {
		m.c.mu.Lock()
		m.c.setRedirectLocked(m.redirect)
		m.c.mu.Unlock()
	}
	if m.lowers {
		m.c.ofs.keepIdentity(m.c.top().Dir, m.c.StableAttr())
	}
}

// redirectMax is the longest absolute redirect written, the kernel's
// default (Linux: fs/overlayfs/params.c, the redirect_max parameter).
const redirectMax = 256

// redirectFor is the redirect directory n gets when it moves, before the
// move (Linux: fs/overlayfs/dir.c ovl_get_redirect()): relative, its name,
// when it stays in its parent; absolute otherwise, its path in the merged
// view, where an ancestor's own redirect stands for its name and an
// absolute one ends the path. Such a path is what a lookup through the
// layers below the upper resolves to n's lower instances, as each of those
// layers saw them. A path longer than redirectMax is EXDEV: mv copies.
func (n *node) redirectFor(absolute bool) (string, syscall.Errno) {
	if !absolute {
		name, _ := n.parentNode()
		return name, 0
	}
	var parts []string
	for d := n; d != nil && !d.IsRoot(); {
		d.mu.Lock()
		r := d.redirectLocked()
		d.mu.Unlock()
		name, p := d.parentNode()
		if r == "" {
			r = name
		}
		parts = append(parts, r)
		if r[0] == '/' {
			break
		}
		d = p
	}
	slices.Reverse(parts)
	path := strings.Join(parts, "/")
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	if len(path) > redirectMax {
		return "", syscall.EXDEV
	}
	return path, 0
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
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return n.ofs.errno(err)
	}
	if dstExists {
		defer dstE.Close()
	}
	if flags&unix.RENAME_NOREPLACE != 0 && dstExists {
		return syscall.EEXIST
	}
	exchange := flags&unix.RENAME_EXCHANGE != 0
	// Prepared as a copy-up is: what the rename needs in the upper layer
	// first (copy-ups, redirects, opaque marks), the marks recorded in
	// undo; one renameat2 commits (upper.Rename); a failure before it
	// takes the marks off again. Once committed, undo is empty.
	var undo upper.Undo
	defer undo.Run()
	var dst *node
	var dstMove move
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
		if dstMove, e = dst.prepareMove(ctx, n == np, &undo); e != 0 {
			return e
		}
	} else if dstExists && dstE.IsDir() {
		if err := checkEmpty(dstE.Chain); err != nil {
			return n.ofs.errno(err)
		}
	}
	srcMove, e := src.prepareMove(ctx, n == np, &undo)
	if e != 0 {
		return e
	}
	sd, err := n.upperDir(ctx)
	if err != nil {
		return n.ofs.errno(err)
	}
	dd, err := np.upperDir(ctx)
	if err != nil {
		return n.ofs.errno(err)
	}
	// A file renamed over is not copied up while the rename looks at the
	// target and replaces it, as with unlink (remove): a copy-up that had
	// chosen the name before the rename would publish over the file
	// moved there, or meet it. Taken after the copy-ups above, so that
	// the rename holds one copyMu at a time.
	var replaced *node
	if dst == nil && dstExists && !dstE.IsDir() {
		if in := np.GetChild(newName); in != nil {
			replaced = in.Operations().(*node)
			replaced.copyMu.Lock()
			defer replaced.copyMu.Unlock()
		}
	}
	// A directory landing on a name that a lower directory has must not
	// merge with it; a redirected one merges with what its redirect says.
	// The kernel marks an upper-only directory moved into a merged
	// directory opaque in any case (Linux: ovl_rename()), and so do we,
	// so that both write the same upper layer.
	opaque := false
	if src.isDir() && !srcMove.lowers {
		if opaque, err = np.landsOpaque(newName); err != nil {
			return n.ofs.errno(err)
		}
	}
	var whiteout bool
	over := upper.OverNothing
	if exchange {
		if dst.isDir() && !dstMove.lowers {
			// The other way round, the same rule as for src above.
			dopaque, err := n.landsOpaque(name)
			if err != nil {
				return n.ofs.errno(err)
			}
			if dopaque {
				if err := n.ofs.upper.MarkOpaque(dd, newName, &undo); err != nil {
					return n.ofs.errno(err)
				}
			}
		}
	} else {
		if whiteout, err = n.inLower(name); err != nil {
			return n.ofs.errno(err)
		}
		if over, err = upper.Probe(dd, newName); errors.Is(err, unix.EEXIST) {
			over = upper.OverNothing
			if dstE.IsDir() {
				// The target looks empty but its upper instance may
				// hold whiteouts, which rename(2) would call content.
				// Not undone: an empty opaque directory shows the
				// same as the emptied one did (the kernel's
				// ovl_clear_empty() does the same before its rename).
				if err := n.ofs.upper.EmptyDir(dd, newName); err != nil {
					return n.ofs.errno(err)
				}
			}
		} else if err != nil {
			return n.ofs.errno(err)
		}
	}
	// The nodes whose names change: no syscall may use a name of theirs
	// between the rename and the record of it (locMu).
	unlock := lockNames(src, dst, replaced)
	defer unlock()
	keep := replaced.keepIfOpen(dd, newName)
	ro := upper.RenameOptions{Flags: uint(flags), Whiteout: whiteout, Over: over, Opaque: opaque}
	if err := n.ofs.upper.Rename(sd, name, dd, newName, ro, &undo); err != nil {
		replaced.dropKept(keep)
		return n.ofs.errno(err)
	}
	srcMove.commit()
	if dst != nil {
		dstMove.commit()
	}
	src.moved(sd, name, dd, newName)
	if dst != nil {
		dst.moved(dd, newName, sd, name)
	} else if replaced != nil {
		replaced.nameRemoved(dd, newName, keep)
	} else if dstExists && dstE.IsDir() {
		// The directory replaced is gone: its kept identity, if it
		// was moved, with it (as in remove).
		n.ofs.keptIDs.Delete(devIno{dstE.Stat.Dev, dstE.Stat.Ino})
	}
	return 0
}

// landsOpaque reports whether an upper-only directory moved to name in
// directory n must be marked opaque: n is merged, or a lower layer has
// name (see Rename).
func (n *node) landsOpaque(name string) (bool, error) {
	if n.merged() {
		return true, nil
	}
	return n.inLower(name)
}

// moved records that n now lives in upper directory d under name.
func (n *node) moved(from *lower.Dir, fromName string, d *lower.Dir, name string) {
	n.atimeStale() // a rename sets ctime
	if n.isDir() {
		// An open fd follows the directory; a reopen must know.
		n.top().Moved(d, name)
		return
	}
	n.invalidateNoSec()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.replaceLinkLocked(from, fromName, lower.Member{Dir: d}, name)
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
