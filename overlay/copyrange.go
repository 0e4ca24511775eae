package overlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/upper"
)

// copy_file_range(2) between two files of the mount.
//
// The kernel sends COPY_FILE_RANGE (fs/fuse/file.c
// __fuse_copy_file_range()) after it has written back the dirty pages of
// both ranges and removed the destination's privileges the kernel itself
// removes (file_modified()); it drops the destination's cached pages of
// the range afterwards. The daemon copies between the layers' files, as
// the kernel overlay's ovl_copy_file_range() does: with copy_file_range
// where the layers' filesystem can (a reflink on btrfs or xfs, a copy
// inside the kernel on ext4), through a buffer where the two files are
// on different filesystems. A copy then costs one request where the
// kernel's own copy through the page cache (what EOPNOTSUPP makes it do)
// costs a WRITE, and a READ of what it has not cached, per 128 KiB.
//
// A destination with suid or sgid is refused with EOPNOTSUPP, and the
// kernel copies through its page cache instead (vfs_copy_file_range()
// falls back to do_splice_direct() inside one filesystem), with WRITEs.
// What the caller's copy must remove, the kernel has had removed before
// sending the request (file_modified(): a SETATTR that has the daemon
// remove suid and sgid, a REMOVEXATTR of security.capability). The
// daemon's own copy_file_range on the upper file must then remove
// nothing more, but the upper filesystem removes suid and sgid from a
// file written by a daemon without CAP_FSETID (rootless): writes of such
// files go through a mapping (mmapWrite), which has no copy_file_range.
// EOPNOTSUPP, unlike ENOSYS, keeps the kernel sending COPY_FILE_RANGE for
// the other files.

var _ = (fs.NodeCopyFileRanger)((*node)(nil))

// maxCopyRange bounds one request's copy; the kernel asks again for the
// rest, as for any short copy_file_range.
const maxCopyRange = 1 << 30

// CopyFileRange copies up to length bytes of n at offIn to out at offOut.
func (n *node) CopyFileRange(ctx context.Context, fin fs.FileHandle, offIn uint64, outInode *fs.Inode, fout fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	out, ok := outInode.Operations().(*node)
	if !ok || flags != 0 || offIn > 1<<62 || offOut > 1<<62 {
		return 0, syscall.EINVAL
	}
	wfd, wdone, err := out.rangeFD(ctx, fout, true)
	if err != nil {
		return 0, n.ofs.errno(err)
	}
	defer wdone()
	out.atimeStale()
	rfd := wfd
	if n != out {
		fd, rdone, err := n.rangeFD(ctx, fin, false)
		if err != nil {
			return 0, n.ofs.errno(err)
		}
		defer rdone()
		rfd = fd
	}
	var copied int64
	err = out.keepMtimeStat(wfd, func(st *unix.Stat_t) (err error) {
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return syscall.EOPNOTSUPP
		}
		copied, err = upper.CopyRange(wfd, rfd, int64(offOut), int64(offIn), int64(min(length, maxCopyRange)))
		return err
	})
	if copied > 0 {
		n.ofs.stats.copyRanges.Add(1)
		// A short copy is a copy: the kernel asks again for the rest,
		// and meets the error then.
		return uint32(copied), 0
	}
	return 0, n.ofs.errno(err)
}

// rangeFD is the fd a copy reads n from, or writes it through (copied up
// first), and the function that gives it back: the handle's where the
// file was opened with a request, else the node's shared one (nodeFD).
func (n *node) rangeFD(ctx context.Context, f fs.FileHandle, write bool) (int, func(), error) {
	if h, ok := f.(*handle); ok {
		fd, err := h.current()
		return fd, func() {}, err
	}
	c, err := n.dataFD(ctx, write)
	if err != nil {
		return -1, nil, err
	}
	return c.fd, func() { n.putFD(c, false) }, nil
}
