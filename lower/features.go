package lower

import (
	"errors"
	"math/bits"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// System calls of newer kernels.
//
// goverlay uses each of these where the running kernel has it, and a
// fallback where it has not (overlay/kernel.go lists them). A mount may
// also be told to take some for absent (-o mask=, overlay/mask.go): a
// layer's Masked names them, and each call below answers as a kernel
// without it would, so that the fallback runs on a kernel that has the
// call. Counters.Fallbacks counts the fallbacks run, for `goverlay stats`.
//
// openat2(2) with RESOLVE_NO_XDEV (Linux 5.6) is not among them: nothing
// else refuses a walk into a mount inside a layer opened in place, so
// goverlay has no fallback for it, and needs 5.11 anyway.

// Features is a set of the system calls above.
type Features uint32

const (
	// OpenTree: open_tree(2) with OPEN_TREE_CLONE (Linux 5.2), which
	// opens a layer through a clone of its mount; without it the layer
	// is opened in place (mounts.go).
	OpenTree Features = 1 << iota
	// MountSetattr: mount_setattr(2) (5.12), which makes that clone
	// private; without it the clone stays a peer of its mount
	// (mounts.go openCloned).
	MountSetattr
	// StatxMntID: statx(2) with STATX_MNT_ID (5.8), which finds a
	// layer's mount in /proc/self/mountinfo; without it the layer
	// counts as not id-mapped, as on every kernel without it: id-mapped
	// mounts came with 5.12 (idmapped.go).
	StatxMntID
	// Fchmodat2: fchmodat2(2) with AT_SYMLINK_NOFOLLOW (6.6); without it
	// the object is opened O_PATH|O_NOFOLLOW and changed through its
	// /proc link (upper/attr.go).
	Fchmodat2
	// XattrAt: getxattrat(2), listxattrat(2), setxattrat(2) and
	// removexattrat(2) (6.13); without them an entry's attributes are
	// read and changed through /proc/self/fd paths (xattr.go).
	XattrAt

	// AllFeatures is every feature above.
	AllFeatures = OpenTree | MountSetattr | StatxMntID | Fchmodat2 | XattrAt
)

// featureNames are the features' names, in the order of their bits, as
// -o mask= takes them.
var featureNames = [...]string{"open_tree", "mount_setattr", "statx_mnt_id", "fchmodat2", "xattrat"}

// Has reports whether f holds every feature of g.
func (f Features) Has(g Features) bool { return f&g == g }

// Names lists the features of f by name, in the order of their bits.
func (f Features) Names() []string {
	var n []string
	for i, name := range featureNames {
		if f&(1<<i) != 0 {
			n = append(n, name)
		}
	}
	return n
}

func (f Features) String() string { return strings.Join(f.Names(), "+") }

// FeatureNamed returns the feature called name (Names), or 0.
func FeatureNamed(name string) Features {
	for i, n := range featureNames {
		if n == name {
			return 1 << i
		}
	}
	return 0
}

// Fallbacks counts, per feature, the fallbacks run because the kernel
// lacks the feature or the mask hides it.
type Fallbacks [len(featureNames)]atomic.Uint64

// ran counts one fallback for feature f.
func (c *Fallbacks) ran(f Features) {
	if c != nil && f != 0 {
		c[bits.TrailingZeros32(uint32(f))].Add(1)
	}
}

// Of reports the fallbacks run for feature f.
func (c *Fallbacks) Of(f Features) uint64 {
	return c[bits.TrailingZeros32(uint32(f))].Load()
}

// lackedErr is the error of a call the kernel lacks or the mask hides:
// ENOSYS, with the feature that was missing.
type lackedErr struct{ f Features }

func (e lackedErr) Error() string { return e.f.String() + ": " + unix.ENOSYS.Error() }

func (e lackedErr) Unwrap() error { return unix.ENOSYS }

// absent returns lackedErr{f} for ENOSYS, the answer of a kernel without
// the call, and err otherwise.
func absent(f Features, err error) error {
	if errors.Is(err, unix.ENOSYS) {
		return lackedErr{f}
	}
	return err
}

// Fchmodat2 changes the mode of entry name of d, whose fd is dirfd, never
// of what a symlink there points to: fchmodat2(2) with AT_SYMLINK_NOFOLLOW
// (Linux 6.6+), which refuses a symlink with EOPNOTSUPP. It reports ok
// false, having done nothing, on a kernel without the call (remembered for
// the mount, as by the *xattrat calls) or where the layer masks it; the
// caller then takes the fallback (upper/attr.go Chmod).
func (d *Dir) Fchmodat2(dirfd int, name string, mode uint32) (ok bool, err error) {
	if d.Layer.Masked.Has(Fchmodat2) || d.Layer.Caches.noFchmodat2.Load() {
		d.Layer.Counters.Fallbacks.ran(Fchmodat2)
		return false, nil
	}
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return true, err
	}
	_, _, errno := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
		uintptr(mode), unix.AT_SYMLINK_NOFOLLOW, 0, 0)
	switch errno {
	case 0:
		return true, nil
	case unix.ENOSYS:
		d.Layer.Caches.noFchmodat2.Store(true)
		d.Layer.Counters.Fallbacks.ran(Fchmodat2)
		return false, nil
	}
	return true, errno
}
