package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// O_TMPFILE: the file is made in the workdir under a fresh name, where the
// mount does not show it, and every name-based operation works on it as on
// any upper file. linkat(2) gives it its first name (Link, with the
// workdir entry removed); a last close without one removes it; a crash
// leaves it in the workdir, which the next mount empties.

var _ = (fs.NodeTmpfiler)((*node)(nil))

// Tmpfile makes an unnamed regular file in directory n.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	// The file belongs to this directory as far as the caller can tell
	// (its group from a setgid directory, its filesystem): the
	// directory must be in the upper layer for it to be linked there.
	pd, err := n.upperDir(ctx)
	if err != nil {
		return nil, nil, 0, n.ofs.errno(err)
	}
	o := upper.Object{Mode: mode&07777 | unix.S_IFREG, Flags: n.ofs.createFlags(flags)}
	o.Uid, o.Gid, o.Mode = n.owner(ctx, o.Mode)
	// Its ACL too: the kernel overlay gives an O_TMPFILE file what it
	// gives a created one.
	if err := n.inherit(ctx, pd, &o); err != nil {
		return nil, nil, 0, n.ofs.errno(err)
	}
	name, fd, err := n.ofs.upper.CreateTemp(o)
	if err != nil {
		return nil, nil, 0, n.ofs.errno(err)
	}
	e := &lower.Entry{Parent: lower.Member{Dir: n.ofs.upper.Work}}
	if err := unix.Fstat(fd, &e.Stat); err != nil {
		unix.Close(fd)
		n.ofs.upper.RemoveTemp(name)
		return nil, nil, 0, n.ofs.errno(err)
	}
	n.ofs.upper.Work.ApplyOverride(name, &e.Stat)
	c := &node{ofs: n.ofs, link0: link{e.Parent, name}, tmp: true}
	child := n.NewInode(ctx, c, fs.StableAttr{Mode: unix.S_IFREG, Ino: n.ofs.ino.ino(e.Stat.Dev, e.Stat.Ino)})
	c.fillAttr(&e.Stat, &out.Attr)
	c.setEntryTimeouts(out)
	if n.ofs.io.noOpen {
		// The kernel would send no RELEASE for a handle once it
		// opens files by itself (fuse_file_put()): the file's I/O
		// goes through the node (noopen.go), which keeps fd.
		c.keepCreated(fd, flags)
		return child, nil, handleOpenFlags, 0
	}
	return child, newHandle(ctx, c, fd, true, true), handleOpenFlags, 0
}

// linkTemp gives the O_TMPFILE file n its first name, name in the upper
// directory d, which holds over there.
func (n *node) linkTemp(d *lower.Dir, name string, over upper.Over) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	tmpName := n.firstLinkLocked().name
	if err := n.ofs.upper.Link(n.ofs.upper.Work, tmpName, d, name, over); err != nil {
		return err
	}
	n.ofs.upper.RemoveTemp(tmpName)
	n.onlyLinkLocked(link{lower.Member{Dir: d}, name})
	n.tmp = false
	return nil
}

// dropTempLocked removes the body of an O_TMPFILE file that was closed without
// ever being linked, or of an orphan (orphan.go), once no handle is open;
// a lower orphan not copied up is then gone.
//
// Preconditions: n.mu is held.
func (n *node) dropTempLocked() {
	if n.heldLocked() {
		return
	}
	if n.orphanLower {
		n.orphanLower, n.unlinked = false, true
	}
	if n.tmp {
		n.ofs.upper.RemoveTemp(n.firstLinkLocked().name)
		n.tmp = false
		if n.orphan {
			n.unlinked = true
		}
	}
}
