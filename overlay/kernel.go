package overlay

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The kernel goverlay needs.
//
// Linux 5.11 is the oldest release goverlay mounts on (CheckKernel),
// for two things it cannot do without:
//
//   - openat2(2) with RESOLVE_NO_XDEV (5.6) opens every directory of a
//     layer (lower/layer.go openat2Dir): nothing else refuses a walk into
//     a mount inside a layer opened in place.
//   - FUSE_HANDLE_KILLPRIV_V2 (5.11, FUSE protocol 7.33): NOSEC
//     (nosec.go) and the privilege removal goverlay does itself
//     (privs.go) rest on the kill flags the kernel then puts on WRITE,
//     OPEN and SETATTR.
//
// Newer features are used where the running kernel has them, with a
// fallback where it has not:
//
//   - open_tree(2) OPEN_TREE_CLONE (5.2) and mount_setattr(2) (5.12): each
//     layer is opened through a private clone of its mount; without
//     mount_setattr through a clone that is not private, without
//     open_tree in place (lower/mounts.go).
//   - statx(2) STATX_MNT_ID (5.8) and "idmapped" in mountinfo (5.12):
//     telling an id-mapped layer, for detection only (lower/idmapped.go).
//   - fchmodat2(2) with AT_SYMLINK_NOFOLLOW (6.6); else the object opened
//     O_PATH|O_NOFOLLOW and changed through /proc (upper/attr.go).
//   - FUSE passthrough (6.9, root only; passthroughGrantable); else the
//     writeback cache.
//   - getxattrat(2)/listxattrat(2) (6.13); else /proc/self/fd paths
//     (lower/xattr.go).
//   - FUSE over io_uring (6.14, while the fuse module's enable_uring is
//     Y); else /dev/fuse (uring.go).
//
// -o mask= (mask.go) has goverlay behave as if the kernel lacked any of
// these, and the FUSE features older kernels lack besides, so that the
// fallbacks run on a kernel that has them all; the suites run under a
// kernel profile that way (GOVERLAY_TEST_MASK, tests/testutil/mask.go).

// MinKernel is the oldest Linux release, major and minor, goverlay mounts
// on (above).
var MinKernel = [2]int{5, 11}

// CheckKernel reports an error when release, as uname -r prints it, is
// older than MinKernel. A release it cannot read (empty, an unusual
// format) is let through.
func CheckKernel(release string) error {
	maj, min, ok := kernelVersion(release)
	if !ok || !olderThan(maj, min, MinKernel) {
		return nil
	}
	return fmt.Errorf("Linux %s is older than %d.%d, the oldest goverlay runs on (it needs openat2 with RESOLVE_NO_XDEV and FUSE_HANDLE_KILLPRIV_V2): upgrade the kernel",
		release, MinKernel[0], MinKernel[1])
}

// olderThan reports whether version maj.min comes before want.
func olderThan(maj, min int, want [2]int) bool {
	return maj < want[0] || maj == want[0] && min < want[1]
}

// kernelVersion reads "6.18.44-..." as 6, 18.
func kernelVersion(release string) (maj, min int, ok bool) {
	f := strings.SplitN(release, ".", 3)
	if len(f) < 2 {
		return 0, 0, false
	}
	maj, err1 := strconv.Atoi(f[0])
	digits := f[1]
	if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = digits[:i]
	}
	min, err2 := strconv.Atoi(digits)
	return maj, min, err1 == nil && err2 == nil
}

// runningKernel is the release of the running kernel, as kernelVersion
// reads it.
func runningKernel() (maj, min int, ok bool) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return 0, 0, false
	}
	return kernelVersion(unix.ByteSliceToString(u.Release[:]))
}
