package upper

import (
	"strconv"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// The attribute changes of an object already in the upper layer: entry
// name of the upper directory d, or d itself when name is "". None of
// them follows a symlink that the name may have become.

// nameOrDot makes "" (the directory itself) usable as an *at path.
func nameOrDot(name string) string {
	if name == "" {
		return "."
	}
	return name
}

// Chmod changes the mode of name in d (d itself for ""), never of what a
// symlink there points to: fchmodat2(AT_SYMLINK_NOFOLLOW) (lower.Dir
// Fchmodat2), or before Linux 6.6 the object opened O_PATH|O_NOFOLLOW and
// changed through its /proc link. Linux gives symlinks no mode of their
// own: EOPNOTSUPP.
func Chmod(d *lower.Dir, name string, mode uint32) error {
	return d.Do(func(fd int) error {
		if name == "" {
			return unix.Fchmodat(fd, ".", mode, 0)
		}
		if ok, err := d.Fchmodat2(fd, name, mode); ok {
			return err
		}
		pfd, err := unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		var st unix.Stat_t
		if err := unix.Fstat(pfd, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return unix.EOPNOTSUPP
		}
		return unix.Chmod("/proc/self/fd/"+strconv.Itoa(pfd), mode)
	})
}

// Chown changes the owner of name in d (d itself for ""); -1 keeps the
// user or group.
func Chown(d *lower.Dir, name string, uid, gid int) error {
	return d.Do(func(fd int) error {
		return unix.Fchownat(fd, nameOrDot(name), uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Truncate sets the size of the regular file name in d.
func Truncate(d *lower.Dir, name string, size int64) error {
	if name == "" {
		return unix.EISDIR
	}
	fd, err := d.Open(name, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Ftruncate(fd, size)
}

// SetTimes sets the atime and mtime of name in d (d itself for ""), as
// utimensat(2) does with ts (UTIME_NOW and UTIME_OMIT included).
func SetTimes(d *lower.Dir, name string, ts [2]unix.Timespec) error {
	return d.Do(func(fd int) error {
		return unix.UtimesNanoAt(fd, nameOrDot(name), ts[:], unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Setxattr sets attribute attr of name in d (d itself for ""), as
// setxattr(2) does with flags.
func Setxattr(d *lower.Dir, name, attr string, data []byte, flags int) error {
	if name != "" {
		if ok, err := d.SetxattrAt(name, attr, data, flags); ok {
			return err
		}
	}
	return xattrPath(d, name, func(p string, follow bool) error {
		if follow {
			return xattr.SetWithFlags(p, attr, data, flags)
		}
		return xattr.LSetWithFlags(p, attr, data, flags)
	})
}

// Removexattr removes attribute attr of name in d (d itself for "").
func Removexattr(d *lower.Dir, name, attr string) error {
	if name != "" {
		if ok, err := d.RemovexattrAt(name, attr); ok {
			return err
		}
	}
	return xattrPath(d, name, func(p string, follow bool) error {
		if follow {
			return xattr.Remove(p, attr)
		}
		return xattr.LRemove(p, attr)
	})
}

// xattrPath calls op with the /proc path of entry name in d, or of d itself
// (followed: it is a magic link to the directory).
func xattrPath(d *lower.Dir, name string, op func(path string, follow bool) error) error {
	return d.DoPath(name, func(p string) error { return op(p, name == "") })
}
