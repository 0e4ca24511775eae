package overlay

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
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
// overlay reads none but its directories'. A walk that stats every entry
// (ls -l, tar, du, cp -a, find -printf '%s') needs those attributes, and
// READDIRPLUS gives them for a whole batch in one request where each
// entry would otherwise cost a LOOKUP.
//
// A file the kernel already knows (go-fuse holds its node) by this one
// name gets the attributes GETATTR would give, from its node's file (one
// stat), not a lookup (a stat in each layer that may hold the name and a
// read of its xattrs): an rm -rf of a tree just copied into the mount
// lists directories whose every entry is known. They refresh what the
// kernel keeps that no reply since has updated (st_blocks once the
// writeback cache wrote the data, st_nlink once another name was linked).
//
// Otherwise a READDIRPLUS entry gives attributes (a lookup):
//   - if it is a directory, which a walk enters (the lookup saves a
//     LOOKUP then; a known one may have had its attributes invalidated by
//     a change inside it, fuse_dir_changed());
//   - while a stat walk goes on: for statWalkFor after the kernel looked
//     up a non-directory in a directory whose READDIRPLUS left entries
//     without attributes (node.skipped; FS.statWalk, set by Lookup). The
//     first batch such a walk reads costs a LOOKUP per entry; the walk
//     then gets its attributes in READDIRPLUS, and pays that again at
//     most once per statWalkFor.
//
// Any other entry goes out with node ID 0: the kernel passes the name
// and type to the reader and makes no dentry (fuse_direntplus_link():
// "the userspace filesystem did not want to return attributes/handle
// for this entry"); a stat of it is a LOOKUP.

// statWalkFor is how long READDIRPLUS gives every entry's attributes
// after a LOOKUP of a non-directory in a directory whose READDIRPLUS left
// entries without them.
const statWalkFor = 2 * time.Second

var _ = (fs.FileLookuper)((*dirHandle)(nil))

// Lookup is READDIRPLUS's lookup of the entry Readdirent returned last
// (go-fuse's bridge asks the directory handle before the node).
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if in := d.n.GetChild(name); in != nil && !in.IsDir() {
		c := in.Operations().(*node)
		var st unix.Stat_t
		if c.onlyName(name) && !c.isParted() && c.stat(&st) == nil {
			c.fillAttr(&st, &out.Attr)
			c.setEntryTimeouts(out)
			return in, 0
		}
		// Gone meanwhile, a node with other names, which a copy-up
		// may have parted from this one (a lower file's hard links),
		// or one parted from them, whose name now is a node of its
		// own (node.part): the lookup says what the name is now.
		return d.n.lookup(ctx, name, out)
	}
	if !d.attrsOf(name) {
		d.n.skipped.Store(true)
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
	return time.Now().UnixNano() < d.n.ofs.statWalk.Load()
}

// onlyName reports whether name is the one name n is known by.
func (n *node) onlyName(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.linkCountLocked() == 1 && n.link0.name == name
}
