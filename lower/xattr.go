package lower

import (
	"github.com/pkg/xattr"
)

// Getxattr reads attribute attr of entry name in d, or of d itself when name
// is "". A symlink entry's own attributes are read, never its target's.
func (d *Dir) Getxattr(name, attr string) ([]byte, error) {
	if name == "" {
		// /proc/self/fd/N is a magic link: follow it to the directory.
		return xattr.Get(d.ProcPath(""), attr)
	}
	return xattr.LGet(d.ProcPath(name), attr)
}

// Listxattr lists the attribute names of entry name in d, or of d itself
// when name is "".
func (d *Dir) Listxattr(name string) ([]string, error) {
	if name == "" {
		return xattr.List(d.ProcPath(""))
	}
	return xattr.LList(d.ProcPath(name))
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
