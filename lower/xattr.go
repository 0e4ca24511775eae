package lower

import (
	"github.com/pkg/xattr"
)

// Getxattr reads attribute attr of entry name in d, or of d itself when name
// is "". A symlink entry's own attributes are read, never its target's.
func (d *Dir) Getxattr(name, attr string) (v []byte, err error) {
	err = d.DoPath(name, func(p string) error {
		if name == "" {
			// /proc/self/fd/N is a magic link: follow it to the
			// directory.
			v, err = xattr.Get(p, attr)
		} else {
			v, err = xattr.LGet(p, attr)
		}
		return err
	})
	return v, err
}

// Listxattr lists the attribute names of entry name in d, or of d itself
// when name is "".
func (d *Dir) Listxattr(name string) (names []string, err error) {
	err = d.DoPath(name, func(p string) error {
		if name == "" {
			names, err = xattr.List(p)
		} else {
			names, err = xattr.LList(p)
		}
		return err
	})
	return names, err
}

// isOpaque reports how the directory d marks itself: opaque (nothing below
// shows through) or holding xattr whiteouts (opaque value "x"). Both the
// trusted and the user namespace are honoured, and the AUFS marker file.
func (d *Dir) isOpaque() (opaque, xwhiteouts bool) {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		v, err := d.Getxattr("", prefix+"opaque")
		if err != nil {
			continue
		}
		o, x := opaqueValue(v)
		if o {
			return true, false
		}
		xwhiteouts = xwhiteouts || x
	}
	return d.hasEntry(OpaqueMarker), xwhiteouts
}

// isXattrWhiteout reports whether the zero-size regular file name in d is an
// xattr whiteout (Linux 6.7+: overlay.whiteout inside an "x" directory).
func (d *Dir) isXattrWhiteout(name string) bool {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		if _, err := d.Getxattr(name, prefix+"whiteout"); err == nil {
			return true
		}
	}
	return false
}
