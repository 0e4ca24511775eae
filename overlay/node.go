package overlay

import (
	"context"
	"fmt"
	"hash/fnv"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/privs"
)

// node is one merged inode.
//
// A directory owns the open fds of its instances in the layers (chain). A
// non-directory is reached through the directory that holds it in its
// topmost layer (parent) under name; that directory belongs to the parent
// node, which the go-fuse tree keeps alive as long as this node.
type node struct {
	fs.Inode
	ofs *FS
	// dir is set, before the node is published, for a directory.
	dir bool

	// copyMu serialises the copy-up of this node. The locks of a node,
	// and their order, are described in doc.go.
	copyMu sync.Mutex
	// locMu is held for reading while a name of a non-directory node is
	// used for a syscall (from reading the name to the syscall's
	// return), and for writing while a rename or unlink changes its
	// names, so no syscall meets a name half moved, or another file that
	// took the name meanwhile. A directory is reached through its own
	// fds, which follow it (lower.Dir.Moved). Never taken for reading
	// twice by one request (a waiting writer would deadlock it): the
	// *Locked and "Preconditions" functions expect it held.
	locMu sync.RWMutex
	// nosec is set once the file is known to carry no suid, sgid or
	// security.capability (privs.NoSec).
	nosec privs.NoSec
	// fastExec is a directory's "anyone may search it" bit (fastexec.go).
	fastExec atomic.Bool
	// skipped is set on a directory once a READDIRPLUS of it gave an
	// entry without attributes (listattrs.go).
	skipped atomic.Bool

	// mu guards the fields below, which a copy-up or a rename changes.
	mu sync.Mutex
	// chain is the merged directory, topmost first; nil for non-directories.
	chain lower.Chain
	// link0 locates a non-directory: its first name, as the directory
	// (in the topmost layer that has the file) that holds it and the
	// name there; operations use it. Hard links in the upper layer share
	// one node, so a node may have more names: rareFields.links
	// (links.go).
	link0 link
	// The flags below sit together, in one word.
	// unlinked is set when the last name of the file was removed.
	unlinked bool
	// tmp marks a file that lives in the workdir: an O_TMPFILE file
	// not linked yet (tmpfile.go), or an orphan.
	tmp bool
	// orphan marks an open file whose last name was removed: it was
	// kept under a name in the workdir until its last close (orphan.go).
	orphan bool
	// orphanLower marks an open file of a lower layer whose last name
	// was removed: it is read where it is until a change copies it up
	// into the workdir, which makes it an orphan (orphan.go).
	orphanLower bool
	// dirFacts caches what a new object in a directory takes from it
	// (dirfacts.go). Atomic, not guarded by mu: it sits here to fill
	// the word the flags above leave.
	dirFacts atomic.Uint32
	// fd is the open file that requests on a file opened without a
	// request share (noopen.go).
	fd *nodeFD
	// rare holds the fields few nodes set, made at the first set:
	// a node without them fits a smaller size class of the Go heap
	// (nodesize_test.go). Set once, under mu.
	rare atomic.Pointer[rareFields]
}

// rareFields are a node's fields that few nodes set. Those but timesMu
// and atimeFresh are guarded by node.mu.
type rareFields struct {
	// timesMu serialises setting a file's times with keepMtime
	// (timesLock).
	timesMu sync.Mutex
	// openCached and openPassthrough count the open handles by I/O
	// mode (passthrough.go): the kernel refuses to mix the two on one
	// inode (ETXTBSY). openPassthrough counts the users of backing, the
	// backing file's ID, which is the lower file's when backingLower;
	// changing counts the opens for writing and truncates under way
	// (dataChangeStart).
	openCached, openPassthrough, changing int32
	backing                               int32
	backingLower                          bool
	// released is closed when backingLower ends, for those waiting
	// for it (dataChangeStart).
	released chan struct{}
	// redirect is the overlay.redirect of a directory's upper instance,
	// as stored (relative or absolute): where its lower instances are,
	// when it was moved (prepareMove); for a metacopy file, where its
	// data is.
	redirect string
	// target is a symlink's target once read or made: a symlink never
	// changes, and a path walk that met it just before its name was
	// removed still follows it (Readlink).
	target []byte
	// data is where a metacopy file's data is (metacopy.go); nil for
	// any other node. The node owns it.
	data *lower.DataFile
	// links are a non-directory's names after link0 (links.go).
	links []link
	// parted is set on a lower hard link whose copy-up made it a file
	// of its own: the node, numbered after the lower file, no longer
	// has the identity a lookup of its upper file gives (copyUp).
	parted bool
	// partedIno is the inode number a parted node reports: its copy's,
	// which a lookup of its name gives from then on; 0 to report the
	// node's own (a metacopy file reports its lower file's).
	partedIno uint64
	// key identifies an upper file in FS.upperFiles.
	key devIno
	// wb is the record of a regular file's write-back WRITEs, kept
	// once one failed or left a gap (wberr.go); guarded by timesMu.
	wb *wbState
	// atimeFresh is until when, in Unix nanoseconds, the upper file's
	// atime needs no update under relatime (atime.go); 0 once the file
	// changed, atimeChecking while an open checks it. Atomic, not
	// guarded by node.mu.
	atimeFresh atomic.Int64
}

// rareLocked returns n's rare fields, nil when none was ever set.
//
// Preconditions: n.mu is held, or n is not published yet.
func (n *node) rareLocked() *rareFields { return n.rare.Load() }

// rareMadeLocked returns n's rare fields, made if need be.
//
// Preconditions: n.mu is held, or n is not published yet.
func (n *node) rareMadeLocked() *rareFields {
	r := n.rare.Load()
	if r == nil {
		r = new(rareFields)
		n.rare.Store(r)
	}
	return r
}

// redirectLocked is n's redirect ("" for none).
//
// Preconditions: n.mu is held.
func (n *node) redirectLocked() string {
	if r := n.rareLocked(); r != nil {
		return r.redirect
	}
	return ""
}

// setRedirectLocked records n's redirect.
//
// Preconditions: n.mu is held, or n is not published yet.
func (n *node) setRedirectLocked(redirect string) {
	if redirect != "" || n.rareLocked() != nil {
		n.rareMadeLocked().redirect = redirect
	}
}

// dataLocked is where n's data is when n is a metacopy file, else nil.
//
// Preconditions: n.mu is held.
func (n *node) dataLocked() *lower.DataFile {
	if r := n.rareLocked(); r != nil {
		return r.data
	}
	return nil
}

// setDataLocked records where n's data is (nil: its own).
//
// Preconditions: n.mu is held, or n is not published yet.
func (n *node) setDataLocked(d *lower.DataFile) {
	if d != nil || n.rareLocked() != nil {
		n.rareMadeLocked().data = d
	}
}

// timesLock takes n's timesMu and returns its unlock.
func (n *node) timesLock() func() {
	r := n.rare.Load()
	if r == nil {
		n.mu.Lock()
		r = n.rareMadeLocked()
		n.mu.Unlock()
	}
	r.timesMu.Lock()
	return r.timesMu.Unlock
}

func (f *FS) newRoot() *node {
	n := &node{ofs: f, dir: true, chain: lower.RootChain(f.layers)}
	n.refreshFastExec()
	return n
}

func (f *FS) rootIno() uint64 {
	var st unix.Stat_t
	// Like any directory, the root is numbered after its bottom instance.
	if err := f.layers[len(f.layers)-1].Root().StatSelf(&st); err != nil {
		return 1
	}
	return f.ino.ino(st.Dev, st.Ino)
}

// newChild makes the node for entry e, found in n under name.
func (n *node) newChild(ctx context.Context, name string, e *lower.Entry) *fs.Inode {
	return n.newChildAs(ctx, name, e, n.ofs.stableAttr(e, name, n))
}

// newChildAs is newChild with the identity already known.
func (n *node) newChildAs(ctx context.Context, name string, e *lower.Entry, sa fs.StableAttr) *fs.Inode {
	// A node the kernel already knows for this identity is not looked
	// for here: it may be in the middle of being forgotten (OnForget
	// closing its fds), and only go-fuse can tell that race apart. It
	// keeps the node it knows and drops ours, whose fds the runtime
	// cleanup below then closes.
	if !e.IsDir() && e.Parent.Layer.Upper {
		// A hard link of an upper file the kernel already knows
		// under another name: the same node, one name more.
		if x := n.ofs.knownUpperFile(e, &sa); x != nil {
			x.addLink(e.Parent, name)
			e.Close()
			return x.EmbeddedInode()
		}
	}
	c := &node{ofs: n.ofs}
	if e.IsDir() {
		c.dir = true
		c.chain = e.Chain
		if e.Chain[0].Layer.Upper {
			// Only the upper instance's own redirect is the
			// directory's (the kernel's OVL_I(inode)->redirect): a
			// lower instance's is that layer's business.
			c.setRedirectLocked(e.Redirect)
		}
		c.computeFastExec(&e.Stat)
		// OnForget closes the fds of a node the kernel knew; a node
		// go-fuse discarded (it lost a lookup race to an equal one)
		// never gets OnForget, and the cleanup closes its fds.
		// Closing twice is harmless (lower.Dir.Close).
		runtime.AddCleanup(c, guardedCleanup(n.ofs.guard, "closing a discarded directory's fds", lower.Chain.Close), e.Chain)
	} else {
		c.link0 = link{e.Parent, name}
		if e.Data != nil {
			c.setDataLocked(e.Data)
			if e.Parent.Layer.Upper {
				c.setRedirectLocked(e.Redirect)
			}
			// The node owns it: a copy-up or data copy-in closes
			// it (setData), else the cleanup does.
			runtime.AddCleanup(c, guardedCleanup(n.ofs.guard, "closing a discarded file's data file", (*lower.DataFile).Close), e.Data)
		}
	}
	child := n.NewInode(ctx, c, sa)
	if !e.IsDir() && e.Parent.Layer.Upper {
		n.ofs.registerUpperFile(c, &e.Stat)
	}
	return child
}

var _ = (fs.NodeOnForgetter)((*node)(nil))

// OnForget closes a forgotten directory's fds. The root's chain holds the
// layer roots, which the FS owns.
//
// Forget, not Close: go-fuse can hand a node it is forgetting to a lookup
// that raced with the FORGET (registerNew found it before the FORGET took
// it out, and revives it once the FORGET is done, OnForget included); the
// node must then still reach its directories, which reopen themselves. The
// runtime cleanup (newChildAs) closes them for good once the node is
// garbage.
func (n *node) OnForget() {
	n.ofs.forgetUpperFile(n)
	n.wbReset()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.chain != nil && !n.IsRoot() {
		n.chain.Forget()
	}
	if !n.isDir() && n.ofs.io.noOpen {
		// The last close of a file opened without a request
		// (noopen.go): an orphan goes now, and the shared fd.
		n.dropTempLocked()
		if c := n.fd; c != nil {
			n.fd = nil
			c.stale = true
			if c.users == 0 {
				unix.Close(c.fd)
			}
		}
	}
}

// stableAttr is the identity of the node for entry e, found in p under
// name.
//
// A directory takes its inode number from its bottom instance, which a
// copy-up (it adds an instance on top) does not change. A non-directory
// takes its topmost instance's, or for a copied-up file the number
// recorded at its copy-up (upper.InoXattr).
//
// Lower hard links share an inode number but must not share a FUSE inode:
// a write through one name copies that name up and must not show under the
// others (fuse-overlayfs shows it). Gen tells them apart by name.
func (f *FS) stableAttr(e *lower.Entry, name string, p *node) fs.StableAttr {
	st := &e.Stat
	sa := fs.StableAttr{Mode: st.Mode & unix.S_IFMT}
	switch {
	case e.IsDir():
		bottom := e.Chain[len(e.Chain)-1]
		var bst unix.Stat_t
		if bottom.StatSelf(&bst) == nil {
			st = &bst
		}
		sa.Ino = f.ino.ino(st.Dev, st.Ino)
		if e.Redirect != "" {
			// A redirected directory shares its bottom instance
			// with the directory at the redirect's path, which
			// hostile layers may show as well: they are still two
			// directories.
			sa.Gen = f.ino.ino(e.Stat.Dev, e.Stat.Ino) | 1
			// But one this mount moved keeps the identity the
			// kernel knows it by (keepIdentity).
			if v, ok := f.keptIDs.Load(devIno{e.Stat.Dev, e.Stat.Ino}); ok && v.(fs.StableAttr).Ino == sa.Ino {
				sa = v.(fs.StableAttr)
			}
		}
	case e.Parent.Layer.Upper:
		if ino, ok := f.upperIno(e.Parent.Dir, name); ok {
			sa.Ino = ino
		} else if e.Data != nil && e.LowerIno != 0 {
			// A metacopy file reports its lower file's number, as
			// the kernel's (ovl_getattr()).
			sa.Ino = f.ino.ino(e.LowerDev, e.LowerIno)
		} else {
			sa.Ino = f.ino.ino(st.Dev, st.Ino)
		}
	default:
		sa.Ino = f.ino.ino(st.Dev, st.Ino)
		if st.Nlink > 1 {
			h := fnv.New64a()
			fmt.Fprintf(h, "%d/%s", p.StableAttr().Ino, name)
			sa.Gen = h.Sum64() | 1
		}
	}
	return sa
}

// keepIdentity records that the directory whose upper instance is d was
// moved with a redirect by this mount while the kernel knew it as sa: a
// later lookup of it (the kernel looks a rename's target up again, and
// any name once its entry times out) must give the same node, or the
// kernel takes it for another directory in the middle of a rename (it
// answered rename(n/b, n) EISDIR instead of ENOTEMPTY). Without the
// record, a redirected directory is told apart from the directory at its
// redirect's path by a generation (stableAttr); the record is checked
// against the bottom instance too, so a reused upper inode number does not
// take it.
func (f *FS) keepIdentity(d *lower.Dir, sa fs.StableAttr) {
	var st unix.Stat_t
	if d.StatSelf(&st) == nil {
		f.keptIDs.Store(devIno{st.Dev, st.Ino}, sa)
	}
}

// isDir reports whether n is a directory.
func (n *node) isDir() bool { return n.dir }

// stat reads the attributes of n's topmost instance, with the owner and
// mode of its override xattr where its layer keeps them there
// (lower.Dir.ApplyOverride).
func (n *node) stat(st *unix.Stat_t) error {
	if n.isDir() {
		top := n.top()
		if err := top.StatSelf(st); err != nil {
			return err
		}
		top.ApplyOverride("", st)
		return nil
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return syscall.ENOENT
	}
	par, name := n.location()
	if err := par.StatOverride(name, st); err != nil {
		return err
	}
	n.dataBlocks(st)
	return nil
}

// dataBlocks puts a metacopy file's data's st_blocks into st, as the
// kernel reports them (Linux: ovl_getattr()).
func (n *node) dataBlocks(st *unix.Stat_t) {
	if d := n.metacopyData(); d != nil {
		var dst unix.Stat_t
		if d.Stat(&dst) == nil {
			st.Blocks = dst.Blocks
		}
	}
}

// applyOverride puts the owner and mode of n's override xattr, if any,
// into st, a stat of n's topmost instance taken otherwise (fstat of an
// open handle). An unlinked file has no name to read it by and keeps its
// real ones.
func (n *node) applyOverride(st *unix.Stat_t) {
	if n.isDir() {
		n.top().ApplyOverride("", st)
		return
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	if n.gone() {
		return
	}
	par, name := n.location()
	par.ApplyOverride(name, st)
}

// fillAttr converts a layer's stat into what the mount reports.
func (n *node) fillAttr(st *unix.Stat_t, out *fuse.Attr) {
	out.Ino = n.StableAttr().Ino
	out.Size = uint64(st.Size)
	out.Blocks = uint64(st.Blocks)
	out.Atime, out.Atimensec = uint64(st.Atim.Sec), uint32(st.Atim.Nsec)
	out.Mtime, out.Mtimensec = uint64(st.Mtim.Sec), uint32(st.Mtim.Nsec)
	out.Ctime, out.Ctimensec = uint64(st.Ctim.Sec), uint32(st.Ctim.Nsec)
	out.Mode = st.Mode
	out.Nlink = uint32(st.Nlink)
	out.Uid, out.Gid = n.ofs.opts.Owners.shown(st.Uid, st.Gid)
	out.Rdev = uint32(st.Rdev)
	out.Blksize = uint32(st.Blksize)
	n.mu.Lock()
	tmp, layers, orphanLower := n.tmp, len(n.chain), n.orphanLower
	if r := n.rareLocked(); r != nil && r.partedIno != 0 {
		out.Ino = r.partedIno
	}
	n.mu.Unlock()
	if tmp && out.Nlink > 0 {
		out.Nlink-- // the workdir's name is not a name
	}
	if orphanLower && n.ofs.io.noOpen {
		// A lower file whose last name was removed while open. The
		// kernel overlay shows the lower file's count for a reader
		// and 0 for a writer, which its open copied up; opened
		// without a request, the two look alike here, and 0 is
		// what a local filesystem shows for both.
		out.Nlink = 0
	}
	if n.isDir() && (layers > 1 || n.ofs.opts.StaticNlink) {
		// Counting subdirectories across layers is not worth it;
		// nlink=1 pacifies find(1) (Linux: ovl_getattr()).
		out.Nlink = 1
	}
}
