package testutil

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil/uringswitch"
)

// EnableUring is the fuse module's switch for FUSE over io_uring
// (uringswitch.Param).
const EnableUring = uringswitch.Param

// uringMounts makes every Mount offer io_uring (OfferUring).
var uringMounts atomic.Bool

// NeedUring skips the test where the kernel has no FUSE over io_uring, or
// GOVERLAY_TEST_MASK hides it.
func NeedUring(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	SkipIfMasked(t, "uring", "serving requests over io_uring")
	if ok, why := uringswitch.Available(); !ok {
		t.Skip(why)
	}
}

// OfferUring makes every Mount until the test ends happen while the kernel
// offers FUSE over io_uring, and fail the test unless the mount serves its
// requests over it. It skips the test where the kernel has none.
func OfferUring(t testing.TB) {
	t.Helper()
	NeedUring(t)
	uringMounts.Store(true)
	t.Cleanup(func() { uringMounts.Store(false) })
}

// WithUringOffered runs fn while the kernel offers FUSE over io_uring to
// new mounts, and then puts enable_uring back as it was.
func WithUringOffered(t testing.TB, fn func()) {
	t.Helper()
	uringswitch.Offered(t, fn)
}

// WithUringWithheld runs fn, which starts a mount that did not ask for
// io_uring, while no test offers it (uringswitch.Withheld). Mount, MountWith
// and Run of the binary do this themselves.
func WithUringWithheld(t testing.TB, fn func()) {
	t.Helper()
	uringswitch.Withheld(t, fn)
}

// CheckUring fails the test unless m serves its requests over io_uring.
func CheckUring(t testing.TB, m *Mounted) {
	t.Helper()
	if s := ReadStats(t, m); !strings.HasPrefix(s.Transport, "io_uring") {
		t.Errorf("%s: transport %q, want io_uring", m.Dir, s.Transport)
	}
}
