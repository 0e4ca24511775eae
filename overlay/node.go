package overlay

import (
	"context"
	"runtime"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
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

	mu sync.Mutex
	// chain is the merged directory, topmost first; nil for non-directories.
	chain lower.Chain
	// parent and name locate a non-directory.
	parent lower.Member
	name   string
}

func (f *FS) newRoot() *node {
	return &node{ofs: f, chain: lower.RootChain(f.layers)}
}

func (f *FS) rootIno() uint64 {
	var st unix.Stat_t
	if err := f.layers[0].Root().StatSelf(&st); err != nil {
		return 1
	}
	return f.ino.ino(st.Dev, st.Ino)
}

// newChild makes the node for entry e, found in n under name.
func (n *node) newChild(ctx context.Context, name string, e *lower.Entry) *fs.Inode {
	sa := fs.StableAttr{
		Mode: e.Stat.Mode & unix.S_IFMT,
		Ino:  n.ofs.ino.ino(e.Stat.Dev, e.Stat.Ino),
	}
	if old := n.GetChild(name); old != nil && old.StableAttr() == sa {
		// Already known: keep the node (and its fds) the kernel has.
		e.Chain.Close()
		return old
	}
	c := &node{ofs: n.ofs}
	if e.IsDir() {
		c.chain = e.Chain
		// OnForget closes the fds of a node the kernel knew; a node
		// go-fuse discarded (it lost a lookup race to an equal one)
		// never gets OnForget, and the cleanup closes its fds.
		// Closing twice is harmless (lower.Dir.Close).
		runtime.AddCleanup(c, lower.Chain.Close, e.Chain)
	} else {
		c.parent = e.Parent
		c.name = name
	}
	return n.NewInode(ctx, c, sa)
}

var _ = (fs.NodeOnForgetter)((*node)(nil))

// OnForget closes a forgotten directory's fds. The root's chain holds the
// layer roots, which the FS owns.
func (n *node) OnForget() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.chain != nil && !n.IsRoot() {
		n.chain.Close()
	}
}

// isDir reports whether n is a directory.
func (n *node) isDir() bool { return n.chain != nil }

// stat reads the attributes of n's topmost instance.
func (n *node) stat(st *unix.Stat_t) error {
	if n.isDir() {
		return n.chain[0].StatSelf(st)
	}
	return n.parent.Stat(n.name, st)
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
	out.Uid, out.Gid = st.Uid, st.Gid
	out.Rdev = uint32(st.Rdev)
	out.Blksize = uint32(st.Blksize)
	if n.isDir() && len(n.chain) > 1 {
		// Counting subdirectories across layers is not worth it;
		// nlink=1 pacifies find(1) (Linux: ovl_getattr()).
		out.Nlink = 1
	}
}

// errno turns an error of the layers into the errno FUSE replies with.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return fs.ToErrno(err)
}
