// Package lower reads overlay layers: the on-disk format (whiteouts, opaque
// directories) and the merged view of one directory across a stack of layers.
//
// Every access to a layer is a *at syscall relative to a directory fd that
// belongs to that layer, with AT_SYMLINK_NOFOLLOW or O_NOFOLLOW, so a symlink
// inside a layer is never followed out of it. The package never writes.
package lower

import (
	"strings"

	"golang.org/x/sys/unix"
)

// On-disk names of the AUFS whiteout format, which containers/storage uses for
// layers extracted for a mount program.
const (
	// WhiteoutPrefix marks a whiteout file: ".wh.NAME" hides NAME below.
	WhiteoutPrefix = ".wh."
	// OpaqueMarker inside a directory makes it opaque.
	OpaqueMarker = ".wh..wh..opq"
)

// Overlay xattr namespaces. The kernel uses "trusted.overlay." by default
// and "user.overlay." with -o userxattr (Linux: fs/overlayfs/overlayfs.h).
const (
	TrustedPrefix = "trusted.overlay."
	UserPrefix    = "user.overlay."
)

// IsPrivateXattr reports whether name is one of the overlay's own xattrs,
// which are never shown through the mount nor copied up.
func IsPrivateXattr(name string) bool {
	return strings.HasPrefix(name, TrustedPrefix) || strings.HasPrefix(name, UserPrefix)
}

// IsWhiteoutName reports whether a directory entry name belongs to the AUFS
// whiteout format and is therefore never listed.
func IsWhiteoutName(name string) bool {
	return strings.HasPrefix(name, WhiteoutPrefix)
}

// IsWhiteout reports whether st describes a kernel-format whiteout: a
// character device with device number 0/0
// (Linux: include/linux/fs.h WHITEOUT_MODE, WHITEOUT_DEV).
func IsWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// opaqueValue reports whether an overlay.opaque xattr value marks the
// directory opaque. "y" is opaque; "x" (6.7+) means "not opaque, but may
// hold xattr whiteouts" (Linux: fs/overlayfs/util.c ovl_get_opaquedir_val()).
func opaqueValue(v []byte) (opaque, xwhiteouts bool) {
	if len(v) != 1 {
		return false, false
	}
	return v[0] == 'y', v[0] == 'x'
}
