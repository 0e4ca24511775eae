package overlay

import (
	"context"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/privs"
	"github.com/goverlay/goverlay/upper"
)

// xattrTarget names the directory and entry that hold n's attributes: a
// directory's topmost instance itself (name ""), or a non-directory by name
// in the directory that holds it.
func (n *node) xattrTarget() (lower.Member, string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.chain != nil {
		return n.chain[0], ""
	}
	l := n.firstLinkLocked()
	return l.dir, l.name
}

var _ = (fs.NodeGetxattrer)((*node)(nil))

// Getxattr reads an attribute of the topmost instance. The overlay's own
// attributes, and the stat overrides of a mount that uses them, do not exist
// as far as the mount is concerned (hiddenXattr).
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if n.ofs.hiddenXattr(attr) {
		return 0, syscall.ENODATA
	}
	if attr == privs.CapabilityXattr && n.capGetxattr() {
		return 0, syscall.ENODATA
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	d, name := n.xattrTarget()
	v, err := d.Getxattr(name, attr)
	if err == nil && isACLXattr(attr) && n.ofs.opts.Owners.mapsIDs() {
		// Named entries show their ids mapped, as owners do: the
		// kernel checks the caller against what we show.
		v, err = n.ofs.opts.Owners.aclShown(v)
	}
	if err != nil {
		return 0, n.ofs.errno(err)
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

var _ = (fs.NodeListxattrer)((*node)(nil))

// Listxattr lists the topmost instance's attributes, without the overlay's
// own, and without trusted.* for callers other than root (Linux:
// fs/overlayfs/xattrs.c ovl_can_list(); FUSE does not tell us the caller's
// capabilities, so uid 0 stands for CAP_SYS_ADMIN).
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	d, name := n.xattrTarget()
	names, err := d.Listxattr(name)
	if err != nil {
		return 0, n.ofs.errno(err)
	}
	root := true
	if c, ok := fuse.FromContext(ctx); ok {
		root = c.Uid == 0
	}
	var b strings.Builder
	for _, a := range names {
		if n.ofs.hiddenXattr(a) || (!root && strings.HasPrefix(a, "trusted.")) {
			continue
		}
		b.WriteString(a)
		b.WriteByte(0)
	}
	if len(dest) < b.Len() {
		return uint32(b.Len()), syscall.ERANGE
	}
	return uint32(copy(dest, b.String())), 0
}

var _ = (fs.NodeSetxattrer)((*node)(nil))

// Setxattr sets an attribute after a copy-up. The overlay's own attributes
// and the stat overrides cannot be set through the mount (hiddenXattr).
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.ofs.hiddenXattr(attr) {
		return syscall.EPERM
	}
	if isACLXattr(attr) && n.ofs.opts.Owners.mapsIDs() {
		var err error
		if data, err = n.ofs.opts.Owners.aclOnDisk(data); err != nil {
			return n.ofs.errno(err)
		}
	}
	blocks := n.blocksBefore(attr)
	d, _, err := n.toUpper(ctx, copyMeta)
	if err != nil {
		return n.ofs.errno(err)
	}
	e := n.withUpperName(d, func(d *lower.Dir, name string) syscall.Errno {
		return n.ofs.errno(upper.Setxattr(d, name, attr, data, int(flags)))
	})
	n.xattrChanged(attr, blocks)
	return e
}

var _ = (fs.NodeRemovexattrer)((*node)(nil))

// Removexattr removes an attribute after a copy-up.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.ofs.hiddenXattr(attr) {
		return syscall.EPERM
	}
	// Do not copy up for an attribute that is not there.
	if _, errno := n.Getxattr(ctx, attr, nil); errno != 0 && errno != syscall.ERANGE {
		return errno
	}
	blocks := n.blocksBefore(attr)
	d, _, err := n.toUpper(ctx, copyMeta)
	if err != nil {
		return n.ofs.errno(err)
	}
	e := n.withUpperName(d, func(d *lower.Dir, name string) syscall.Errno {
		return n.ofs.errno(upper.Removexattr(d, name, attr))
	})
	n.xattrChanged(attr, blocks)
	return e
}

// An xattr too large for the inode takes a block of its own on most
// filesystems (ext4, xfs), and st_blocks counts it. The kernel keeps a
// regular file's attributes under the writeback cache, and a SETXATTR or
// REMOVEXATTR refreshes only its ctime (fuse_setxattr(),
// fuse_update_ctime(); ctime is one of the attributes the kernel then
// keeps itself, fuse_get_cache_mask()): stat(2) would go on reporting
// the blocks of before, where the kernel overlay reports the upper
// file's. So when the change moved st_blocks, the kernel is told to ask
// again (FUSE_NOTIFY_INVAL_INODE for the attributes only, which waits
// for no lock, before the reply).

// blocksBefore returns n's st_blocks before a change of xattr attr, or -1
// where the kernel asks for them anyway (not a regular file, no writeback
// cache, or an ACL under FUSE_POSIX_ACL, after which the kernel drops all
// of the file's attributes) or the stat failed.
func (n *node) blocksBefore(attr string) int64 {
	if n.isDir() || !n.ofs.writeback.Load() || (isACLXattr(attr) && n.ofs.kernelACLs.Load()) {
		return -1
	}
	var st unix.Stat_t
	if n.stat(&st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1
	}
	return st.Blocks
}

// xattrChanged updates what depends on attribute attr of n, which had
// blocks (blocksBefore) before the change.
func (n *node) xattrChanged(attr string, blocks int64) {
	n.atimeStale()
	if blocks >= 0 {
		var st unix.Stat_t
		if n.stat(&st) == nil && st.Blocks != blocks {
			n.NotifyContent(-1, 0)
		}
	}
	if isSecurityXattr(attr) {
		n.invalidateNoSec()
	}
	switch attr {
	case upper.ACLAccessXattr:
		n.refreshFastExec()
	case upper.ACLDefaultXattr:
		n.forgetDirFacts()
	}
}
