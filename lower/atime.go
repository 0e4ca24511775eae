package lower

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Access times.
//
// The daemon's own reads of a layer must change access times only as the
// overlay's mount options say, never as the filesystem the layer lives on
// would. The kernel overlay opens the real files and directories with
// O_NOATIME (ovl_path_open(), ovl_open_realfile()), never updates a lower
// file's atime (Documentation/filesystems/overlayfs.rst, "Non-standard
// behavior": ovl_get_layers() makes each lower clone MNT_NOATIME), and
// updates an upper file's with touch_atime() on its private clone of the
// upper mount, whose own atime flags it clears (ovl_get_upper()), once the
// overlay mount's noatime, relatime or strictatime allowed it
// (ovl_update_time()).
//
// goverlay's clones of the layers' mounts (mounts.go) do the same: a lower
// layer's is noatime, the upper layer's carries the mount's policy (Atime).
// A read of an upper file by the daemon, through an fd opened without
// O_NOATIME, then updates the file's atime exactly where the kernel
// overlay's read would, in the upper filesystem's read itself (its
// file_accessed()), at no cost of ours; and so does the kernel's own read
// of a passthrough file, whose backing file it opens on the daemon's fd's
// path, that is on the clone (fuse_passthrough_open()). Reads the mount
// makes for itself (a copy-up's, an emptiness check's, a lookup's listing)
// and every read of a lower layer are opened O_NOATIME, which also covers
// a layer opened in place, without a clone; there the upper filesystem's
// own mount options decide when the rest updates atime.

// AtimeMode is when a read updates access times: the mount options
// relatime (the default), strictatime and noatime.
type AtimeMode uint8

const (
	// Relatime updates atime when it is not after mtime or ctime, or
	// is more than a day old (relatime_need_update(), fs/inode.c).
	Relatime AtimeMode = iota
	// Strictatime updates it at every read.
	Strictatime
	// Noatime never does.
	Noatime
)

// Atime is a layer's access-time policy: lower layers' is Noatime, the
// upper layer's the mount's.
type Atime struct {
	Mode AtimeMode
	// NoDirs: a directory's atime never changes (nodiratime).
	NoDirs bool
}

// Never reports whether a read of a directory (dir) or of any other file
// must leave its atime alone.
func (a Atime) Never(dir bool) bool { return a.Mode == Noatime || dir && a.NoDirs }

// mountAttr is a as mount_setattr(2) sets it.
func (a Atime) mountAttr() *unix.MountAttr {
	attr := &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR__ATIME}
	switch a.Mode {
	case Noatime:
		attr.Attr_set = unix.MOUNT_ATTR_NOATIME
	case Strictatime:
		attr.Attr_set = unix.MOUNT_ATTR_STRICTATIME
	default:
		attr.Attr_set = unix.MOUNT_ATTR_RELATIME
	}
	if a.NoDirs {
		attr.Attr_set |= unix.MOUNT_ATTR_NODIRATIME
	} else {
		attr.Attr_clr |= unix.MOUNT_ATTR_NODIRATIME
	}
	return attr
}

// Atime is the layer's access-time policy.
func (l *Layer) Atime() Atime { return l.atime }

// noatimeFlag is O_NOATIME for an open of a directory (dir) or another
// file of l whose reads must not change its atime, else 0.
func (l *Layer) noatimeFlag(dir bool) int {
	if l.atime.Never(dir) {
		return unix.O_NOATIME
	}
	return 0
}

// openatNoatime is openat(2), without O_NOATIME where that is refused:
// it is for the file's owner, or a caller with CAP_FOWNER over it, which
// the daemon may not be (EPERM, may_open()).
func openatNoatime(dfd int, name string, flags int, mode uint32) (int, error) {
	fd, err := unix.Openat(dfd, name, flags, mode)
	if errors.Is(err, unix.EPERM) && flags&unix.O_NOATIME != 0 {
		fd, err = unix.Openat(dfd, name, flags&^unix.O_NOATIME, mode)
	}
	return fd, err
}
