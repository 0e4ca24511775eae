package lower

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Stat overrides: instead of the real owner and mode, a layer may keep each
// object's uid:gid:mode (and, in the containers format, its type) in an
// xattr, so that an unprivileged user, or a store with force_mask, can hold
// any owner and mode (fuse-overlayfs -o xattr_permissions,
// containers/storage force_mask). The xattr holds on-disk ids: id mappings
// apply on top of it as they do on real owners.
const (
	// OverrideContainersXattr is containers/storage's format,
	// "UID:GID:MODE:TYPE" (pkg/idtools ContainersOverrideXattr; TYPE is
	// file, dir, symlink, pipe, socket, block-MAJ-MIN or char-MAJ-MIN).
	OverrideContainersXattr = "user.containers.override_stat"
	// OverrideUserXattr is fuse-overlayfs' older unprivileged name,
	// "UID:GID:MODE"; read when the containers one is absent.
	OverrideUserXattr = "user.fuseoverlayfs.override_stat"
	// OverridePrivilegedXattr is fuse-overlayfs' xattr_permissions=1.
	OverridePrivilegedXattr = "security.fuseoverlayfs.override_stat"
)

// OverrideMode says whether and where a layer keeps stat overrides.
type OverrideMode int

const (
	// OverrideNone: owners and modes are the real ones.
	OverrideNone OverrideMode = iota
	// OverridePrivileged: security.fuseoverlayfs.override_stat.
	OverridePrivileged
	// OverrideContainers: user.containers.override_stat, falling back
	// to reading user.fuseoverlayfs.override_stat.
	OverrideContainers
)

// Xattr is the name the mode writes.
func (m OverrideMode) Xattr() string {
	switch m {
	case OverridePrivileged:
		return OverridePrivilegedXattr
	case OverrideContainers:
		return OverrideContainersXattr
	}
	return ""
}

// readNames are the names read, in order of preference.
func (m OverrideMode) readNames() []string {
	switch m {
	case OverridePrivileged:
		return []string{OverridePrivilegedXattr}
	case OverrideContainers:
		return []string{OverrideContainersXattr, OverrideUserXattr}
	}
	return nil
}

// IsOverrideXattr reports whether name is one of the stat-override xattrs.
func IsOverrideXattr(name string) bool {
	return name == OverrideContainersXattr || name == OverrideUserXattr || name == OverridePrivilegedXattr
}

// DetectOverride tells the mode of a layer from the xattrs of its root, as
// fuse-overlayfs does for every layer (direct.c
// direct_load_data_source(): security, then containers, then user).
// containers/storage with force_mask gives each layer's root one.
func (l *Layer) DetectOverride() OverrideMode {
	for _, c := range []struct {
		name string
		mode OverrideMode
	}{
		{OverridePrivilegedXattr, OverridePrivileged},
		{OverrideContainersXattr, OverrideContainers},
		{OverrideUserXattr, OverrideContainers},
	} {
		if _, err := l.root.Getxattr("", c.name); err == nil {
			return c.mode
		}
	}
	return OverrideNone
}

// Override is what a stat-override xattr says about an object.
type Override struct {
	Uid, Gid uint32
	// Mode holds the permission bits (07777) and, when the xattr names
	// one, the file type (S_IFMT bits); a type of 0 keeps the real one.
	Mode uint32
	// Rdev is a device's number, from "block-MAJ-MIN"/"char-MAJ-MIN".
	Rdev uint64
}

// ParseOverride reads "UID:GID:MODE[:TYPE]" (MODE in octal). Fields beyond
// TYPE and the parts of TYPE beyond a device's minor number are ignored,
// for forward compatibility, as containers/storage's parser does
// (pkg/idtools parseOverrideXattr).
func ParseOverride(v []byte) (Override, error) {
	var o Override
	f := strings.Split(strings.TrimRight(string(v), "\x00"), ":")
	if len(f) < 3 {
		return o, fmt.Errorf("override %q: want UID:GID:MODE[:TYPE]", v)
	}
	uid, err1 := strconv.ParseUint(f[0], 10, 32)
	gid, err2 := strconv.ParseUint(f[1], 10, 32)
	mode, err3 := strconv.ParseUint(f[2], 8, 32)
	if err := errors.Join(err1, err2, err3); err != nil {
		return o, fmt.Errorf("override %q: %w", v, err)
	}
	o.Uid, o.Gid = uint32(uid), uint32(gid)
	// fuse-overlayfs up to 1.13 wrote the whole st_mode ("%o"), type
	// bits included.
	o.Mode = uint32(mode) & (07777 | unix.S_IFMT)
	if len(f) < 4 {
		return o, nil
	}
	typ, dev := f[3], ""
	if i := strings.IndexByte(typ, '-'); i >= 0 {
		typ, dev = typ[:i], typ[i+1:]
	}
	var t uint32
	switch typ {
	case "file":
		t = unix.S_IFREG
	case "dir":
		t = unix.S_IFDIR
	case "symlink":
		t = unix.S_IFLNK
	case "pipe":
		t = unix.S_IFIFO
	case "socket":
		t = unix.S_IFSOCK
	case "block", "char":
		t = unix.S_IFBLK
		if typ == "char" {
			t = unix.S_IFCHR
		}
		d := strings.Split(dev, "-")
		if len(d) < 2 {
			return o, fmt.Errorf("override %q: device type without MAJ-MIN", v)
		}
		maj, err1 := strconv.ParseUint(d[0], 10, 32)
		min, err2 := strconv.ParseUint(d[1], 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return o, fmt.Errorf("override %q: %w", v, err)
		}
		o.Rdev = unix.Mkdev(uint32(maj), uint32(min))
	default:
		return o, fmt.Errorf("override %q: unknown type %q", v, f[3])
	}
	o.Mode = o.Mode&07777 | t
	return o, nil
}

// Format renders o for mode m: containers/storage's
// "UID:GID:%04o:TYPE" (pkg/idtools FormatContainersOverrideXattrDevice)
// for OverrideContainers, fuse-overlayfs' "UID:GID:%o" for
// OverridePrivileged.
func (o Override) Format(m OverrideMode) []byte {
	if m == OverridePrivileged {
		return fmt.Appendf(nil, "%d:%d:%o", o.Uid, o.Gid, o.Mode&07777)
	}
	var typ string
	switch o.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		typ = "dir"
	case unix.S_IFLNK:
		typ = "symlink"
	case unix.S_IFIFO:
		typ = "pipe"
	case unix.S_IFSOCK:
		typ = "socket"
	case unix.S_IFBLK:
		typ = fmt.Sprintf("block-%d-%d", unix.Major(o.Rdev), unix.Minor(o.Rdev))
	case unix.S_IFCHR:
		typ = fmt.Sprintf("char-%d-%d", unix.Major(o.Rdev), unix.Minor(o.Rdev))
	default:
		typ = "file"
	}
	return fmt.Appendf(nil, "%d:%d:%04o:%s", o.Uid, o.Gid, o.Mode&07777, typ)
}

// OverrideOf is the override st describes: its owner, mode and type.
func OverrideOf(st *unix.Stat_t) Override {
	return Override{Uid: st.Uid, Gid: st.Gid, Mode: st.Mode & (07777 | unix.S_IFMT), Rdev: st.Rdev}
}

// Apply puts o into st. A type is taken only where it turns a regular file
// into something a store without privileges could not make (a device, a
// FIFO or a socket kept as a plain file by containers/storage); the type
// of directories and symlinks is what the layer has, whatever the xattr
// says, because the tree is walked by it.
func (o Override) Apply(st *unix.Stat_t) {
	st.Uid, st.Gid = o.Uid, o.Gid
	t := o.Type(st.Mode & unix.S_IFMT)
	if t != st.Mode&unix.S_IFMT {
		st.Rdev = o.Rdev
		st.Size, st.Blocks = 0, 0
	}
	st.Mode = t | o.Mode&07777
}

// Type is the file type (S_IFMT bits) an object of real type real shows
// with override o (Apply): the xattr's type where it turns a regular file
// into a device, a FIFO or a socket, the real one otherwise.
func (o Override) Type(real uint32) uint32 {
	if real == unix.S_IFREG {
		switch t := o.Mode & unix.S_IFMT; t {
		case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
			return t
		}
	}
	return real
}

// ReadOverride reads the override of entry name in d (d itself when name
// is ""), by the mode of d's layer. ok is false when the layer keeps none
// or the object has none (then its real owner and mode stand, where
// fuse-overlayfs 1.10 fails the stat with ENODATA) or an unreadable one.
func (d *Dir) ReadOverride(name string) (o Override, ok bool) {
	for _, x := range d.Layer.Override.readNames() {
		v, err := d.Getxattr(name, x)
		if err != nil {
			continue
		}
		o, err := ParseOverride(v)
		return o, err == nil
	}
	return o, false
}

// StatOverride is Stat with the entry's override applied
// (ApplyOverride): the owner and mode the mount shows.
func (d *Dir) StatOverride(name string, st *unix.Stat_t) error {
	if err := d.Stat(name, st); err != nil {
		return err
	}
	d.ApplyOverride(name, st)
	return nil
}

// ApplyOverride replaces the owner and mode in st, the stat of entry name
// in d, by the entry's override, if any.
func (d *Dir) ApplyOverride(name string, st *unix.Stat_t) {
	if d.Layer.Override == OverrideNone {
		return
	}
	if o, ok := d.ReadOverride(name); ok {
		o.Apply(st)
	}
}
