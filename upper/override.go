package upper

import (
	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// KeepsOverride reports whether an object of type mode (S_IFMT bits) keeps
// its owner and mode in the upper layer's override xattr
// (-o xattr_permissions) rather than for real. The kernel allows user.*
// xattrs only on regular files and directories (fs/xattr.c
// xattr_permission(): EPERM), so with user.containers.override_stat
// symlinks, devices, FIFOs and sockets are owned for real; fuse-overlayfs
// ignores that EPERM and leaves them owned by itself, mode 0755.
func (l *Layer) KeepsOverride(mode uint32) bool {
	switch l.Override {
	case lower.OverrideNone:
		return false
	case lower.OverrideContainers:
		t := mode & unix.S_IFMT
		return t == unix.S_IFREG || t == unix.S_IFDIR
	}
	return true
}

// SetOverride records o as the owner and mode of entry name in the upper
// directory d (d itself when name is ""), in the upper layer's format.
func (l *Layer) SetOverride(d *lower.Dir, name string, o lower.Override) error {
	v := o.Format(l.Override)
	return d.DoPath(name, func(p string) error {
		if name == "" {
			return xattr.Set(p, l.Override.Xattr(), v)
		}
		return xattr.LSet(p, l.Override.Xattr(), v)
	})
}

// backingMode is the real mode of an object whose owner and mode live in
// the override xattr: 0755, so that its owner, the daemon, may do anything
// with it and the real mode never refuses what the override allows (the
// kernel checks the override: default_permissions). fuse-overlayfs uses
// mode|0755, which makes a file created 0666 world-writable on the host
// and keeps set-id bits on a file the daemon (root) owns; here the real
// object grants nothing on the host beyond reading.
const backingMode = 0o755

// setOwner gives the object tmp in the workdir the owner and mode of o:
// in the override xattr when the upper layer keeps them there
// (setOverrideOwner), for real otherwise (setRealOwner).
func (l *Layer) setOwner(tmp string, o lower.Override) error {
	if l.KeepsOverride(o.Mode) {
		return l.setOverrideOwner(tmp, o)
	}
	return l.setRealOwner(tmp, o)
}

// setOverrideOwner records o in the override xattr of tmp, which keeps the
// daemon's owner and gets backingMode.
func (l *Layer) setOverrideOwner(tmp string, o lower.Override) error {
	if o.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(l.wfd, tmp, backingMode, 0); err != nil {
			return err
		}
	}
	return l.SetOverride(l.Work, tmp, o)
}

// setRealOwner chowns and chmods tmp to o. chown comes first because it
// clears suid/sgid (and security.capability, which a later xattr copy
// restores).
func (l *Layer) setRealOwner(tmp string, o lower.Override) error {
	if err := unix.Fchownat(l.wfd, tmp, int(o.Uid), int(o.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if o.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	// The exact mode: the process umask must not apply.
	return unix.Fchmodat(l.wfd, tmp, o.Mode&07777, 0)
}
