package overlay

import (
	"github.com/goverlay/goverlay/lower"
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
// close removes it. A lower file that was opened read-only and then
// removed keeps reading from its lower layer; what would need a copy-up
// of it answers ENOENT.

// keepIfOpen gives c a name in the workdir when (d, name), about to be
// removed, is the last name of c and c is open. It returns that name, or
// "" when none is needed or it cannot be had (the file then goes as
// before).
//
// Preconditions: c.locMu is held for writing, or c is nil.
func (c *node) keepIfOpen(d *lower.Dir, name string) string {
	if c == nil || c.isDir() || !d.Layer.Upper {
		return ""
	}
	c.mu.Lock()
	last := len(c.links) == 1 && c.links[0].dir.Dir == d && c.links[0].name == name
	open := c.openCached+c.openPassthrough > 0
	c.mu.Unlock()
	if !last || !open {
		return ""
	}
	keep, err := c.ofs.upper.Keep(d, name)
	if err != nil {
		c.ofs.log.Printf("cannot keep the open file %q after its last name goes: %v", name, err)
		return ""
	}
	return keep
}

// dropKept removes what keepIfOpen made when the removal failed.
func (c *node) dropKept(keep string) {
	if keep != "" {
		c.ofs.upper.RemoveTemp(keep)
	}
}

// nameRemoved records that (d, name) of c is gone; with keep, c lives on
// in the workdir under that name until its last close.
//
// Preconditions: c.locMu is held for writing.
func (c *node) nameRemoved(d *lower.Dir, name, keep string) {
	if keep == "" {
		c.removeLink(d, name)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.links = []link{{lower.Member{Dir: c.ofs.upper.Work}, keep}}
	c.tmp, c.orphan = true, true
	// Its handles may all have closed since keepIfOpen looked.
	c.dropTempLocked()
}
