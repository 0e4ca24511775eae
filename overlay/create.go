package overlay

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// checkNewName refuses names the overlay cannot store: the AUFS whiteout
// format's names (fuse-overlayfs does the same) and names too long.
func checkNewName(name string) syscall.Errno {
	if lower.IsWhiteoutName(name) {
		return syscall.EINVAL
	}
	if len(name) > unix.NAME_MAX {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// owner is who owns a new object made by the caller of ctx in directory n:
// the caller, with the directory's group where the directory is setgid
// (which new subdirectories inherit too).
func (n *node) owner(ctx context.Context, mode uint32) (uid, gid, outMode uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		uid, gid = n.ofs.opts.Owners.onDisk(c.Uid, c.Gid)
	}
	outMode = mode
	known, w := n.dirFact(factNoSetgid)
	if known {
		return uid, gid, outMode
	}
	var st unix.Stat_t
	if n.stat(&st) != nil {
		return uid, gid, outMode
	}
	if st.Mode&unix.S_ISGID == 0 {
		n.rememberDirFact(w, factNoSetgid)
		return uid, gid, outMode
	}
	gid = st.Gid
	if mode&unix.S_IFMT == unix.S_IFDIR {
		outMode |= unix.S_ISGID
	}
	return uid, gid, outMode
}

// inherit settles the mode and ACLs of the new object o in the upper
// directory pd, n's upper instance, the way a local filesystem does: from
// pd's default ACL (the merged directory's: copy-up brought it along),
// or, without one, by applying the caller's umask. The kernel leaves the
// umask to us: with ACLs on we negotiate FUSE_DONT_MASK (fsOptions), so
// that the mode asked for reaches us whole; without DONT_MASK the mode
// comes masked, and masking it again changes nothing.
//
// Where the upper keeps modes in the override xattr (xattr_permissions),
// or ACLs are off (noacl), nothing is inherited and the umask applies, as
// before ACL inheritance; an upper filesystem without ACLs has no default
// ACL to give.
func (n *node) inherit(ctx context.Context, pd *lower.Dir, o *upper.Object) error {
	var def []byte
	if !n.ofs.opts.NoACL && !n.ofs.upper.KeepsOverride(o.Mode) && o.Mode&unix.S_IFMT != unix.S_IFLNK {
		known, w := n.dirFact(factNoDefaultACL)
		if !known {
			var err error
			def, err = pd.Getxattr("", upper.ACLDefaultXattr)
			if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP) {
				def, err = nil, nil
				n.rememberDirFact(w, factNoDefaultACL)
			}
			if err != nil {
				return fmt.Errorf("read the default ACL: %w", err)
			}
		}
		o.DirHasNoACL = def == nil
	}
	in, err := upper.Inherit(def, o.Mode, n.ofs.raw.umask(ctx))
	if err != nil {
		return err
	}
	o.Mode, o.ACL, o.DefaultACL = in.Mode, in.Access, in.Default
	return nil
}

// create makes a new object o under name in directory n and returns its
// node, its attributes in out, and for a regular file an open fd.
func (n *node) create(ctx context.Context, name string, o upper.Object, out *fuse.EntryOut) (*fs.Inode, int, syscall.Errno) {
	if errno := checkNewName(name); errno != 0 {
		return nil, -1, errno
	}
	pd, err := n.upperDir(ctx)
	if err != nil {
		return nil, -1, n.ofs.errno(err)
	}
	probe := upper.Probe
	if made, _ := n.dirFact(factMadeHere); made {
		probe = noWhiteouts
	} else if o.Mode&unix.S_IFMT == unix.S_IFREG {
		probe = upper.ProbeFile // the create looks for the name itself
	}
	over, err := probe(pd, name)
	if err != nil {
		return nil, -1, n.ofs.errno(err)
	}
	o.Uid, o.Gid, o.Mode = n.owner(ctx, o.Mode)
	if err := n.inherit(ctx, pd, &o); err != nil {
		return nil, -1, n.ofs.errno(err)
	}
	// A new directory over a whiteout must not merge with what the
	// whiteout hid (Linux: ovl_create_over_whiteout() sets opaque). With
	// redirect_dir on, the kernel also marks a new directory in a merged
	// directory opaque (an optimisation: its lookups need not look
	// below); doing the same keeps the two uppers alike.
	isDir := o.Mode&unix.S_IFMT == unix.S_IFDIR
	o.Opaque = isDir && (over != upper.OverNothing || (!n.ofs.opts.RedirectDirOff && n.merged()))
	e := &lower.Entry{Parent: lower.Member{Dir: pd}}
	// The reply describes the object made, as it was made: its stat
	// comes from the object itself, not from name, which another
	// request may have given to something else by now.
	fd, err := n.ofs.upper.CreateStat(pd, name, o, over, &e.Stat)
	if err != nil {
		return nil, -1, n.ofs.errno(err)
	}
	if e.IsDir() {
		var d *lower.Dir
		if d, err = pd.OpenDir(name); err == nil {
			var st unix.Stat_t
			if err = d.StatSelf(&st); err == nil && (st.Dev != e.Stat.Dev || st.Ino != e.Stat.Ino) {
				// Not the directory made: it is gone already.
				err = syscall.ENOENT
			}
			if err != nil {
				d.Close()
			}
			e.Chain = lower.Chain{{Dir: d}}
		}
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, -1, n.ofs.errno(err)
	}
	// A new object has no inode number from before a copy-up to look
	// for: its identity is its own.
	sa := fs.StableAttr{Mode: e.Stat.Mode & unix.S_IFMT, Ino: n.ofs.ino.ino(e.Stat.Dev, e.Stat.Ino)}
	if !e.IsDir() {
		// A node the mount knows under this inode number stands for
		// a file that is gone (its number was free to be reused): it
		// must not be taken for the new object.
		n.ofs.staleUpperFile(&e.Stat, &sa)
	}
	child := n.newChildAs(ctx, name, e, sa)
	c := child.Operations().(*node)
	if e.IsDir() {
		// In the upper layer alone, and empty (dirfacts.go).
		c.rememberDirFact(0, factMadeHere)
	}
	if o.Target != "" {
		c.mu.Lock()
		c.rareMadeLocked().target = []byte(o.Target)
		c.mu.Unlock()
	}
	if fd >= 0 && e.Stat.Mode&(unix.S_ISUID|unix.S_ISGID) == 0 {
		// A new file has no capability and no set-id bit: known clean
		// from the start, so the GETXATTR(security.capability) the
		// kernel sends before its first write is answered without a
		// system call (capGetxattr), as for a file checked once.
		c.nosec.Set(c.nosec.Begin())
	}
	c.fillAttr(&e.Stat, &out.Attr)
	c.setEntryTimeouts(out)
	return child, fd, 0
}

// noWhiteouts is the probe of a directory with no whiteout to find
// (factMadeHere).
func noWhiteouts(*lower.Dir, string) (upper.Over, error) { return upper.OverNothing, nil }

var _ = (fs.NodeCreater)((*node)(nil))

// Create makes and opens a regular file.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	o := upper.Object{Mode: mode&07777 | unix.S_IFREG, Flags: n.ofs.createFlags(flags)}
	child, fd, errno := n.create(ctx, name, o, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if n.ofs.io.noOpen {
		// The kernel would send no RELEASE for a handle once it
		// opens files by itself (fuse_file_put()): the file's I/O
		// goes through the node (noopen.go), which keeps fd.
		child.Operations().(*node).keepCreated(fd, flags)
		return child, nil, handleOpenFlags, 0
	}
	return child, newHandle(ctx, child.Operations().(*node), fd, true, true), handleOpenFlags, 0
}

var _ = (fs.NodeMkdirer)((*node)(nil))

// Mkdir makes a directory.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	child, _, errno := n.create(ctx, name, upper.Object{Mode: mode&07777 | unix.S_IFDIR}, out)
	return child, errno
}

var _ = (fs.NodeMknoder)((*node)(nil))

// Mknod makes a FIFO, socket or device node. A char 0/0 device would be a
// whiteout in the upper layer, so it is refused.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if mode&unix.S_IFMT == unix.S_IFCHR && dev == 0 {
		return nil, syscall.EPERM
	}
	child, fd, errno := n.create(ctx, name, upper.Object{Mode: mode, Rdev: dev}, out)
	if fd >= 0 {
		// A regular file (mknod(2) with S_IFREG) is made open; the
		// kernel opens it by itself when it is used.
		unix.Close(fd)
	}
	return child, errno
}

var _ = (fs.NodeSymlinker)((*node)(nil))

// Symlink makes a symbolic link.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	child, _, errno := n.create(ctx, name, upper.Object{Mode: unix.S_IFLNK | 0o777, Target: target}, out)
	return child, errno
}
