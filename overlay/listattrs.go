package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// READDIRPLUS gives attributes where they will be used.
//
// The kernel asks READDIRPLUS for the first batch of every listing it
// has not cached (FUSE_READDIRPLUS_AUTO, mount.go), and the daemon looks
// each entry up for it: on a lower file that is a stat in each layer
// that may hold it and a read of its xattrs (metacopy), a directory's
// xattrs (opaque, redirect) too. A walk that reads only names and types
// (find(1) with -name or -type, which take d_type from getdents) then
// makes the daemon read every inode of the tree, where the kernel
// overlay reads none but its directories'.
//
// So a READDIRPLUS entry gives attributes (a lookup) only where some
// other way of reading the tree has shown that they will be asked for:
//   - a directory, which a walk enters (the lookup saves a LOOKUP then);
//   - a name the kernel already knows (go-fuse holds its node): its
//     attributes are refreshed;
//   - an entry of a directory whose subtree has had a non-directory
//     looked up by the kernel (node.statted, set by Lookup): a stat
//     walk, ls -l, tar, or an open. The first batch of such a walk
//     costs one LOOKUP per entry; the rest of the subtree gets its
//     attributes in READDIRPLUS as before.
//
// Any other entry goes out with node ID 0: the kernel passes the name
// and type to the reader and makes no dentry (fuse_direntplus_link():
// "the userspace filesystem did not want to return attributes/handle
// for this entry"); a stat of it is a LOOKUP.

var _ = (fs.FileLookuper)((*dirHandle)(nil))

// Lookup is READDIRPLUS's lookup of the entry Readdirent returned last
// (go-fuse's bridge asks the directory handle before the node).
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !d.attrsOf(name) {
		// go-fuse leaves the entry's node ID 0.
		return nil, syscall.ENOENT
	}
	return d.n.lookup(ctx, name, out)
}

// attrsOf reports whether READDIRPLUS looks up entry name of d.
func (d *dirHandle) attrsOf(name string) bool {
	d.mu.Lock()
	last := d.last
	d.mu.Unlock()
	if last.Name != name || last.Mode&syscall.S_IFMT == 0 || last.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		// Not the entry just read (a batch the kernel asks for again
		// after an interrupted one), one whose type the layer did not
		// say (DT_UNKNOWN), or a directory.
		return true
	}
	if d.n.GetChild(name) != nil {
		return true
	}
	return d.n.subtreeStatted()
}

// subtreeStatted reports whether n or a directory above it is statted.
func (n *node) subtreeStatted() bool {
	for p := &n.Inode; p != nil; _, p = p.Parent() {
		if pn, ok := p.Operations().(*node); ok && pn.statted.Load() {
			return true
		}
	}
	return false
}
