package overlay

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// An open file whose last name is removed (unlink, or a rename over it)
// must go on working through its descriptors: ftruncate, fchmod,
// futimens, fsetxattr and fgetxattr reach the daemon as requests on the
// node, most without the handle (the kernel passes one only with a
// truncate), and the node reached its file by name. So before the last
// name of an open upper file goes, the file gets a second name in the
// workdir (upper.Layer.Keep), which the node uses from then on as an
// O_TMPFILE file uses its own (tmpfile.go): every operation works
// unchanged, the mount shows no name, fstat shows nlink 0, and the last
// close removes it.
//
// A lower file that was opened (read-only: a writer has copied it up) and
// then lost its last name is still where it was, in its lower layer: it
// becomes a lower orphan, read there as before. A change through its
// descriptor (fchmod, futimens, fsetxattr, a reopen for writing through
// /proc) copies it up into the workdir under a fresh name and nowhere
// else (copyUpOrphan), which makes it an orphan like the above. The
// kernel overlay's copy-up links its copy to the removed name
// (ovl_copy_up_tmpfile(), ovl_copy_up_one()'s destname), which the
// whiteout or the file renamed over it holds, and fails with EEXIST;
// goverlay does what a local filesystem does for an open file.

// keepIfOpen gives n a name in the workdir when (d, name), about to be
// removed, is the last name of n and n is open. It returns that name, or
// "" when none is needed or it cannot be had (the file then goes as
// before).
//
// Preconditions: n.locMu is held for writing, or n is nil.
func (n *node) keepIfOpen(d *lower.Dir, name string) string {
	if !n.mustKeep(d, name) {
		return ""
	}
	keep, err := n.ofs.upper.Keep(d, name)
	if err != nil {
		n.ofs.log.Printf("cannot keep the open file %q after its last name goes: %v", name, err)
		return ""
	}
	return keep
}

// mustKeep reports whether (d, name), about to be removed, is the last
// name of the open file n in the upper layer.
//
// Preconditions: n.locMu is held for writing, or n is nil.
func (n *node) mustKeep(d *lower.Dir, name string) bool {
	if n == nil || n.isDir() || !d.Layer.Upper {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	last := n.linkCountLocked() == 1 && n.link0.dir.Dir == d && n.link0.name == name
	return last && n.heldLocked()
}

// removeKeeping removes (d, name), the last name of the open file n, by
// moving the file into the workdir (upper.Layer.RemoveKeep; with a
// whiteout when whiteout), and returns its name there. Where that fails
// for another reason than the name being gone, it removes the name as
// for a file not open, and returns "".
//
// Preconditions: n.locMu is held for writing.
func (n *node) removeKeeping(d *lower.Dir, name string, whiteout bool) (string, error) {
	keep, err := n.ofs.upper.RemoveKeep(d, name, whiteout)
	if err == nil || errors.Is(err, syscall.ENOENT) {
		return keep, err
	}
	n.ofs.log.Printf("cannot keep the open file %q after its last name goes: %v", name, err)
	return "", n.ofs.upper.Remove(d, name, false, whiteout)
}

// dropKept removes what keepIfOpen made when the removal failed.
func (n *node) dropKept(keep string) {
	if keep != "" {
		n.ofs.upper.RemoveTemp(keep)
	}
}

// nameRemoved records that (d, name) of n is gone; with keep, n lives on
// in the workdir under that name until its last close.
//
// Preconditions: n.locMu is held for writing.
func (n *node) nameRemoved(d *lower.Dir, name, keep string) {
	n.atimeStale() // the link count, and so ctime, changed
	if keep == "" {
		if !n.keepLower() {
			n.removeLink(d, name)
		}
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.onlyLinkLocked(link{lower.Member{Dir: n.ofs.upper.Work}, keep})
	n.tmp, n.orphan = true, true
	// Its handles may all have closed since keepIfOpen looked.
	n.dropTempLocked()
}

// keepLower makes n a lower orphan when it is an open file of a lower
// layer, whose only name was just removed. It reports whether it did.
func (n *node) keepLower() bool {
	n.mu.Lock()
	keep := !n.isDir() && n.linkCountLocked() == 1 && !n.link0.dir.Layer.Upper && n.heldLocked()
	n.orphanLower = n.orphanLower || keep
	n.mu.Unlock()
	if keep && !n.ofs.io.noOpen {
		// The kernel drops the link count it caches for the file: let
		// it ask again, and see the lower file's, which the kernel
		// overlay reports too for a reader (ovl_getattr()). Attributes
		// only (offset -1), which waits for no lock or request. Opened
		// without a request, the file shows 0 (fillAttr), the count
		// the kernel now caches.
		n.NotifyContent(-1, 0)
	}
	return keep
}

// copyUpOrphan copies up n, a lower orphan whose lower file is name in
// par, into the workdir: n is an orphan from then on.
//
// Preconditions: n.copyMu is held.
func (n *node) copyUpOrphan(par lower.Member, name string, data bool) error {
	var st unix.Stat_t
	if err := par.Stat(name, &st); err != nil {
		return err
	}
	src := upper.Source{Dir: par.Dir, Name: name, Stat: st, Override: n.ofs.copyOverride(par.Dir, name, &st), Data: n.metacopyData()}
	tmp, err := n.ofs.upper.CopyUpTemp(src, data)
	if err != nil {
		return err
	}
	n.locMu.Lock()
	defer n.locMu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.orphanLower {
		// Its last handle closed meanwhile.
		n.ofs.upper.RemoveTemp(tmp)
		return syscall.ENOENT
	}
	n.onlyLinkLocked(link{lower.Member{Dir: n.ofs.upper.Work}, tmp})
	n.orphanLower, n.tmp, n.orphan = false, true, true
	if d := n.dataLocked(); d != nil {
		n.setDataLocked(nil)
		d.Close()
	}
	n.ofs.stats.copyUps.Add(1)
	return nil
}
