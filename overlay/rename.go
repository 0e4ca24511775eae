package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// prepareMove copies c, the child about to be moved, into the upper layer.
// A directory that has instances in lower layers cannot move: that needs
// redirect_dir, which is not implemented yet, so the answer is EXDEV, the
// kernel overlay's answer with redirect_dir=off, and mv(1) falls back to
// copying.
func (c *node) prepareMove(ctx context.Context) syscall.Errno {
	if !c.isDir() {
		return errno(c.copyUp(ctx, true))
	}
	c.mu.Lock()
	pure := len(c.chain) == 1 && c.chain[0].Layer.Upper
	c.mu.Unlock()
	if !pure {
		return syscall.EXDEV
	}
	return 0
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
	dstE, err := nchain.Lookup(newName)
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
	if exchange {
		if !dstExists {
			return syscall.ENOENT
		}
		dstIn := np.GetChild(newName)
		if dstIn == nil {
			return syscall.ENOENT
		}
		dst = dstIn.Operations().(*node)
		if errno := dst.prepareMove(ctx); errno != 0 {
			return errno
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
	if errno := src.prepareMove(ctx); errno != 0 {
		return errno
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
	// merge with it.
	opaque := false
	if src.isDir() {
		if opaque, err = np.inLower(newName); err != nil {
			return errno(err)
		}
	}
	var whiteout bool
	over := upper.OverNothing
	if exchange {
		if dst.isDir() {
			dopaque, err := n.inLower(name)
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
				if err := n.ofs.upper.ClearWhiteouts(dd, newName); err != nil {
					return errno(err)
				}
			}
		} else if err != nil {
			return errno(err)
		}
	}
	if err := n.ofs.upper.Rename(sd, name, dd, newName, uint(flags), whiteout, over, opaque); err != nil {
		return errno(err)
	}
	src.moved(dd, newName)
	if dst != nil {
		dst.moved(sd, name)
	}
	return 0
}

// moved records that a non-directory now lives in upper directory d under
// name. A directory's fds follow it by themselves.
func (c *node) moved(d *lower.Dir, name string) {
	if c.isDir() {
		return
	}
	c.invalidateNoSec()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parent, c.name = lower.Member{Dir: d}, name
}
