package overlay

import (
	"context"
	"errors"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

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
	if isDir {
		if done, errno := n.rmdirMadeHere(ctx, name); done {
			return errno
		}
	}
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
	// Where the name is: known without a lookup for a file of the upper
	// layer that the kernel holds by this one name (soleUpperName), such
	// as every file an untar or a copy made; asked of the layers
	// otherwise.
	upperFile := child != nil && child.soleUpperName(n, name)
	var dirID devIno
	if !upperFile {
		n.mu.Lock()
		chain := n.chain
		n.mu.Unlock()
		e, err := chain.Lookup(name, n.ofs.layers)
		if err != nil {
			return n.ofs.errno(err)
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
				return n.ofs.errno(err)
			}
		}
		upperFile, dirID = e.Parent.Layer.Upper, devIno{e.Stat.Dev, e.Stat.Ino}
	}
	below, err := n.inLower(name)
	if err != nil {
		return n.ofs.errno(err)
	}
	pd, err := n.upperDir(ctx)
	if err != nil {
		return n.ofs.errno(err)
	}
	var keep string
	if child != nil {
		child.locMu.Lock()
		defer child.locMu.Unlock()
	}
	switch {
	case upperFile && child.mustKeep(pd, name):
		// An open file (noopen.go: one the kernel still holds) lives
		// on in the workdir, moved there in the removal's one step.
		keep, err = child.removeKeeping(pd, name, below)
	case upperFile:
		err = n.ofs.upper.Remove(pd, name, isDir, below)
	default:
		err = n.ofs.upper.Whiteout(pd, name)
	}
	if err != nil {
		return n.ofs.errno(err)
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
		n.ofs.keptIDs.Delete(dirID)
	}
	return 0
}

// rmdirMadeHere removes directory name of n without asking the layers
// where it is or whether it is empty, when the kernel knows it as a
// directory made through the mount (factMadeHere) in the upper layer
// alone, whose removal leaves no whiteout: it holds no whiteout, so an
// rmdir(2) that succeeds removed an empty directory. done is false where
// the general path has to run: a directory the rmdir found not empty
// goes through it as well.
func (n *node) rmdirMadeHere(ctx context.Context, name string) (done bool, _ syscall.Errno) {
	in := n.GetChild(name)
	if in == nil || !in.IsDir() {
		return false, 0
	}
	c := in.Operations().(*node)
	if made, _ := c.dirFact(factMadeHere); !made {
		return false, 0
	}
	c.mu.Lock()
	chain := c.chain
	c.mu.Unlock()
	if len(chain) != 1 || !chain[0].Layer.Upper {
		return false, 0
	}
	top := chain[0]
	if below, err := n.inLower(name); err != nil || below {
		return false, 0
	}
	pd, err := n.upperDir(ctx)
	if err != nil {
		return true, n.ofs.errno(err)
	}
	var st unix.Stat_t
	if err := top.StatSelf(&st); err != nil {
		return false, 0
	}
	if err := n.ofs.upper.Rmdir(pd, name); errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		// Names, or an opaque marker file (".wh..wh..opq", where the
		// upper filesystem takes no xattr): the general path tells.
		return false, 0
	} else if err != nil {
		return true, n.ofs.errno(err)
	}
	// Its kept identity, if it was moved, is no longer needed.
	n.ofs.keptIDs.Delete(devIno{st.Dev, st.Ino})
	return true, 0
}

// soleUpperName reports whether non-directory n is a file of the upper
// layer whose one name is name in directory p's upper instance: what a
// lookup of name in p would find, without asking the layers.
func (n *node) soleUpperName(p *node, name string) bool {
	top := p.top()
	if !top.Layer.Upper || n.isDir() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.firstLinkLocked()
	return n.linkCountLocked() == 1 && !n.tmp && !n.orphanLower && !n.unlinked &&
		l.name == name && l.dir.Dir == top.Dir
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
