package overlay

import (
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// link is one name of a non-directory: the directory that holds it, in
// the topmost layer that has the file, and the name there.
type link struct {
	dir  lower.Member
	name string
}

// firstLinkLocked is the name operations use.
//
// Preconditions: n.mu is held.
func (n *node) firstLinkLocked() link { return n.link0 }

// moreLinksLocked are n's names after the first.
//
// Preconditions: n.mu is held.
func (n *node) moreLinksLocked() []link {
	if r := n.rareLocked(); r != nil {
		return r.links
	}
	return nil
}

// onlyLinkLocked makes l n's only name.
//
// Preconditions: n.mu is held, or n is not published yet.
func (n *node) onlyLinkLocked(l link) {
	n.link0 = l
	if r := n.rareLocked(); r != nil {
		r.links = nil
	}
}

// linkCountLocked is how many names n has.
//
// Preconditions: n.mu is held.
func (n *node) linkCountLocked() int {
	if n.link0.dir.Dir == nil {
		return 0
	}
	return 1 + len(n.moreLinksLocked())
}

// addLink records another name of n.
func (n *node) addLink(d lower.Member, name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.link0.dir.Dir == d.Dir && n.link0.name == name {
		return
	}
	for _, l := range n.moreLinksLocked() {
		if l.dir.Dir == d.Dir && l.name == name {
			return
		}
	}
	if n.link0.dir.Dir == nil {
		n.link0 = link{d, name}
		return
	}
	r := n.rareMadeLocked()
	r.links = append(r.links, link{d, name})
}

// removeLink forgets a name of n that is gone. The last one is kept: open
// handles and the kernel may still use the node, and the name is as good
// an answer (ENOENT) as any; but the node no longer stands for the file
// (unlinked), whose inode number the filesystem may give to a new one.
func (n *node) removeLink(d *lower.Dir, name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	more := n.moreLinksLocked()
	if n.link0.dir.Dir == d && n.link0.name == name {
		if len(more) == 0 {
			n.unlinked = true
			return
		}
		n.link0 = more[0]
		n.rareLocked().links = more[1:]
		return
	}
	for i, l := range more {
		if l.dir.Dir == d && l.name == name {
			n.rareLocked().links = append(more[:i:i], more[i+1:]...)
			return
		}
	}
	if n.linkCountLocked() == 1 {
		// A file of a lower layer, located in its own layer: the name
		// removed from the upper (a whiteout now) was its only one.
		n.unlinked = true
	}
}

// replaceLinkLocked renames one name of n.
//
// Preconditions: n.mu is held.
func (n *node) replaceLinkLocked(from *lower.Dir, fromName string, to lower.Member, name string) {
	if n.link0.dir.Dir == from && n.link0.name == fromName {
		n.link0 = link{to, name}
		return
	}
	more := n.moreLinksLocked()
	for i, l := range more {
		if l.dir.Dir == from && l.name == fromName {
			more[i] = link{to, name}
			return
		}
	}
	// Not known by that name (a name the kernel found first): it is the
	// name now.
	if n.link0.dir.Dir != nil {
		r := n.rareMadeLocked()
		r.links = append([]link{n.link0}, r.links...)
	}
	n.link0 = link{to, name}
}

// upperFiles finds the node of an upper file the kernel knows, so that a
// lookup of another hard link of it gets the same node.
// A sync.Map: lookups of upper files share no lock.
type upperFiles struct {
	nodes sync.Map // devIno → *node
}

// knownUpperFile returns the live node of the upper file e, if the kernel
// knows one. A node whose file was removed (its inode number may now be a
// new file's) does not count; then sa gets a generation its node does not
// have, so that go-fuse, which finds nodes by (Ino, Gen), does not take
// the new file for the old one.
//
// A node of another type than e is stale as well: the inode number it
// was known by now belongs to e (removed, and reused by the filesystem,
// while the kernel still knew the node), and go-fuse would answer e with
// the old node, whose type the kernel then finds wrong (EIO).
func (f *FS) knownUpperFile(e *lower.Entry, sa *fs.StableAttr) *node {
	v, _ := f.upperFiles.nodes.Load(devIno{e.Stat.Dev, e.Stat.Ino})
	x, _ := v.(*node)
	if x == nil || x.Forgotten() || x.StableAttr().Ino != sa.Ino {
		return nil
	}
	x.mu.Lock()
	if x.StableAttr().Mode != sa.Mode && !x.tmp {
		x.unlinked = true
	}
	gone := x.unlinked
	x.mu.Unlock()
	if gone {
		sa.Gen = x.StableAttr().Gen + 1
		return nil
	}
	return x
}

// staleUpperFile marks the node the mount knows for the upper file st, if
// any, as gone, and gives sa a generation of its own: st is a new object,
// so whatever node had its inode number stood for a file removed since.
func (f *FS) staleUpperFile(st *unix.Stat_t, sa *fs.StableAttr) {
	v, _ := f.upperFiles.nodes.Load(devIno{st.Dev, st.Ino})
	x, _ := v.(*node)
	if x == nil || x.StableAttr().Ino != sa.Ino {
		return
	}
	x.mu.Lock()
	x.unlinked = true
	x.mu.Unlock()
	sa.Gen = x.StableAttr().Gen + 1
}

// registerUpperFile records n as the node of the upper file st.
func (f *FS) registerUpperFile(n *node, st *unix.Stat_t) {
	k := devIno{st.Dev, st.Ino}
	n.mu.Lock()
	n.rareMadeLocked().key = k
	n.mu.Unlock()
	f.upperFiles.nodes.Store(k, n)
}

// forgetUpperFile drops n when the kernel forgets it.
func (f *FS) forgetUpperFile(n *node) {
	n.mu.Lock()
	r := n.rareLocked()
	var k devIno
	if r != nil {
		k = r.key
	}
	n.mu.Unlock()
	if r != nil {
		f.upperFiles.nodes.CompareAndDelete(k, n)
	}
}

var _ = (fs.NodeLinker)((*node)(nil))

// Link gives target another name in n. The target is copied up first (a
// hard link can only join two names of the upper layer).
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := checkNewName(name); errno != 0 {
		return nil, errno
	}
	t := target.(*node)
	if t.isDir() {
		return nil, syscall.EPERM
	}
	if err := t.copyUp(ctx, copyMeta); err != nil {
		return nil, n.ofs.errno(err)
	}
	// A metacopy file's names must all find its data (Linux:
	// ovl_link() → ovl_set_link_redirect()). Not undone if the link
	// fails: the redirect is right for the name it has.
	var undo upper.Undo
	redirect, e := t.metacopyRedirect(true, &undo)
	if e != 0 {
		return nil, e
	}
	if redirect != "" {
		t.mu.Lock()
		t.setRedirectLocked(redirect)
		t.mu.Unlock()
	}
	pd, err := n.upperDir(ctx)
	if err != nil {
		return nil, n.ofs.errno(err)
	}
	over, err := upper.Probe(pd, name)
	if err != nil {
		return nil, n.ofs.errno(err)
	}
	t.mu.Lock()
	tmp, gone := t.tmp, t.orphan || t.orphanLower || t.unlinked
	parted := t.partedLocked()
	t.mu.Unlock()
	if gone {
		// A file with no name left is not given one again (linkat(2)
		// answers ENOENT but for an O_TMPFILE file).
		return nil, syscall.ENOENT
	}
	if tmp {
		err = t.linkTemp(pd, name, over)
	} else {
		// The source name held (locMu) from here to the linkat.
		t.locMu.RLock()
		tp, tname := t.location()
		if t.gone() {
			err = syscall.ENOENT
		} else if err = n.ofs.upper.Link(tp.Dir, tname, pd, name, over); err == nil && !parted {
			t.addLink(lower.Member{Dir: pd}, name)
		}
		t.atimeStale() // the link count, and so ctime, changed
		t.locMu.RUnlock()
	}
	if err != nil {
		return nil, n.ofs.errno(err)
	}
	if parted {
		// The new name must show the upper file's identity, not this
		// node's (the lower file's number), which its first name too
		// loses once the kernel looks it up again (copyUp): the node
		// a lookup of the new name makes or finds.
		return n.lookup(ctx, name, out)
	}
	var st unix.Stat_t
	if err := pd.StatOverride(name, &st); err != nil {
		return nil, n.ofs.errno(err)
	}
	t.dataBlocks(&st)
	t.fillAttr(&st, &out.Attr)
	t.setEntryTimeouts(out)
	return t.EmbeddedInode(), 0
}
