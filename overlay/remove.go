package overlay

import (
	"context"
	"errors"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/goverlay/goverlay/lower"
)

// merged reports whether directory n has instances below the upper layer
// as well as in it.
func (n *node) merged() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.chain) > 1 && n.chain[0].Layer.Upper
}

// lowerPart returns the members of n's chain below the upper layer.
func (n *node) lowerPart() lower.Chain {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.chain) > 0 && n.chain[0].Layer.Upper {
		return n.chain[1:]
	}
	return n.chain
}

// inLower reports whether name is visible in the lower layers of
// directory n, which decides whether removing it needs a whiteout.
func (n *node) inLower(name string) (bool, error) {
	e, err := n.lowerPart().Lookup(name, n.ofs.layers)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, err
	}
	e.Close()
	return true, nil
}

// remove deletes name from directory n: from the upper layer if it is
// there, and with a whiteout if a lower layer has it too. A name only in a
// lower layer gets just the whiteout: nothing is copied up (fuse-overlayfs
// copies the whole file first).
func (n *node) remove(ctx context.Context, name string, isDir bool) syscall.Errno {
	var child *node
	if in := n.GetChild(name); in != nil && !isDir {
		// No copy-up of the file between the lookup below, which
		// says which layer holds it, and the removal: an open for
		// writing copies up without the inode lock the kernel holds
		// for the unlink, and a whiteout made for a name found only
		// below would then meet the copied-up file (EEXIST).
		child = in.Operations().(*node)
		child.copyMu.Lock()
		defer child.copyMu.Unlock()
	}
	n.mu.Lock()
	chain := n.chain
	n.mu.Unlock()
	e, err := chain.Lookup(name, n.ofs.layers)
	if err != nil {
		return errno(err)
	}
	defer e.Close()
	if e.IsDir() != isDir {
		if isDir {
			return syscall.ENOTDIR
		}
		return syscall.EISDIR
	}
	if isDir {
		if err := checkEmpty(e.Chain); err != nil {
			return errno(err)
		}
	}
	below, err := n.inLower(name)
	if err != nil {
		return errno(err)
	}
	pd, err := n.upperDir(ctx)
	if err != nil {
		return errno(err)
	}
	var keep string
	if child != nil {
		child.locMu.Lock()
		defer child.locMu.Unlock()
	}
	switch {
	case e.Parent.Layer.Upper && child.mustKeep(pd, name):
		// An open file (noopen.go: one the kernel still holds) lives
		// on in the workdir, moved there in the removal's one step.
		keep, err = child.removeKeeping(pd, name, below)
	case e.Parent.Layer.Upper:
		err = n.ofs.upper.Remove(pd, name, isDir, below)
	default:
		err = n.ofs.upper.Whiteout(pd, name)
	}
	if err != nil {
		return errno(err)
	}
	if child != nil {
		// Its other names, if any, go on.
		child.nameRemoved(pd, name, keep)
	}
	if below {
		n.ofs.stats.whiteouts.Add(1)
	}
	if isDir {
		// Its kept identity, if it was moved, is no longer needed.
		n.ofs.keptIDs.Delete(devIno{e.Stat.Dev, e.Stat.Ino})
	}
	return 0
}

var _ = (fs.NodeUnlinker)((*node)(nil))

// Unlink removes a non-directory.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, false)
}

var _ = (fs.NodeRmdirer)((*node)(nil))

// Rmdir removes a directory that looks empty through the mount; whiteouts
// in its upper instance go with it.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, true)
}

// checkEmpty answers ENOTEMPTY for a merged directory that shows a name;
// whiteouts and the names they hide do not count (Linux:
// fs/overlayfs/readdir.c ovl_check_empty_dir()).
func checkEmpty(c lower.Chain) error {
	ents, err := c.ReadDir()
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return syscall.ENOTEMPTY
	}
	return nil
}
