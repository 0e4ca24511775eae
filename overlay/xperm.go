package overlay

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// Stat overrides (-o xattr_permissions=1|2, containers/storage's
// force_mask): owners and modes kept in an xattr instead of for real
// (lower/override.go has the format). fuse-overlayfs decides per layer: a
// lower layer whose root carries an override xattr is read through it
// (direct.c direct_load_data_source()), and the upper layer keeps owners in
// one when xattr_permissions asks for it (main.c main()). Through the mount:
//
//   - stat shows the xattr's owner and mode (then uid/gid mapping applies,
//     as to real owners);
//   - chmod and chown write the xattr and leave the real ones alone;
//   - a new object records its creator and mode in the xattr and is owned
//     by the daemon with a permissive mode (upper.backingMode);
//   - copy-up carries the owner and mode over into the upper's xattr;
//   - the override xattrs can be neither read, listed, set nor removed.

// xattrPermissions are the values of -o xattr_permissions.
var xattrPermissions = map[int]lower.OverrideMode{
	0: lower.OverrideNone,
	1: lower.OverridePrivileged,
	2: lower.OverrideContainers,
}

// ValidXattrPermissions reports whether v is a value of -o
// xattr_permissions.
func ValidXattrPermissions(v int) bool {
	_, ok := xattrPermissions[v]
	return ok
}

// setupOverrides gives each layer its override mode and, when the upper
// layer keeps owners in an xattr, makes sure its root has one: the topmost
// lower root's (fuse-overlayfs copies it too), so the merged root shows
// the owner and mode the image gives it.
func (f *FS) setupOverrides() error {
	mode, ok := xattrPermissions[f.opts.XattrPermissions]
	if !ok {
		return fmt.Errorf("xattr_permissions=%d: want 0, 1 or 2", f.opts.XattrPermissions)
	}
	for _, l := range f.layers {
		if l.Upper {
			l.Override = mode
		} else {
			l.Override = l.DetectOverride()
		}
		f.overrides = f.overrides || l.Override != lower.OverrideNone
	}
	if f.upper == nil || mode == lower.OverrideNone || slices.Contains(f.opts.KernelOptions, "ro") {
		return nil
	}
	root := f.layers[0].Root()
	if _, ok := root.ReadOverride(""); ok {
		return nil
	}
	for _, l := range f.layers[1:] {
		if o, ok := l.Root().ReadOverride(""); ok {
			o.Mode = o.Mode&07777 | unix.S_IFDIR
			if err := f.upper.SetOverride(root, "", o); err != nil {
				return fmt.Errorf("record the owner of upperdir %s in %s: %w", f.opts.Upper, mode.Xattr(), err)
			}
			return nil
		}
	}
	return nil
}

// copyOverride is the owner and mode a copy-up of entry name in d (d
// itself when name is "") must give the copy besides the real ones: its
// override xattr's, or, when the upper layer keeps owners in an xattr, its
// real ones (st), which the copy records there. nil: copy it as it is.
func (f *FS) copyOverride(d *lower.Dir, name string, st *unix.Stat_t) *lower.Override {
	if o, ok := d.ReadOverride(name); ok {
		return &o
	}
	if f.upper.Override == lower.OverrideNone {
		return nil
	}
	o := lower.OverrideOf(st)
	return &o
}

// setattrOverride applies a chmod (mode) or chown (uid, gid; -1 keeps one)
// to the override xattr of the upper object name in d (d itself when name
// is ""), when the upper layer keeps it there; done is false otherwise, and
// the change is for the caller to make for real. The other fields stay as
// the xattr (or, without one yet, the real stat) has them.
func (f *FS) setattrOverride(d *lower.Dir, name string, mode *uint32, uid, gid int) (done bool, err error) {
	if f.upper.Override == lower.OverrideNone {
		return false, nil
	}
	var st unix.Stat_t
	if err := d.Stat(nameOrDot(name), &st); err != nil {
		return false, err
	}
	if !f.upper.KeepsOverride(st.Mode) {
		return false, nil
	}
	o, ok := d.ReadOverride(name)
	if !ok {
		o = lower.OverrideOf(&st)
	}
	if mode != nil {
		o.Mode = o.Mode&unix.S_IFMT | *mode&07777
	}
	if uid >= 0 {
		o.Uid = uint32(uid)
	}
	if gid >= 0 {
		o.Gid = uint32(gid)
	}
	return true, f.upper.SetOverride(d, name, o)
}

// hiddenXattr reports whether attribute attr is invisible through the
// mount: the overlay's own, and the stat overrides when the mount uses
// them (they are the owner and mode, not data of the file).
func (f *FS) hiddenXattr(attr string) bool {
	return lower.IsPrivateXattr(attr) || (f.overrides && lower.IsOverrideXattr(attr))
}
