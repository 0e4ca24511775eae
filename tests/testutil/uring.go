package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// EnableUring is the fuse module's switch for FUSE over io_uring: the
// kernel offers it in INIT only while it is Y, and a mount that took it
// keeps it after the switch goes back.
const EnableUring = "/sys/module/fuse/parameters/enable_uring"

// uringMounts makes every Mount offer io_uring (OfferUring).
var uringMounts atomic.Bool

// uringMu serialises this process's mounts that switch enable_uring on;
// the lock file does the same across test processes, so that one of them
// putting the switch back does not take it from another's mount.
var uringMu sync.Mutex

// NeedUring skips the test where the kernel has no FUSE over io_uring.
func NeedUring(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat(EnableUring); err != nil {
		t.Skip("this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)")
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
	uringMu.Lock()
	defer uringMu.Unlock()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "goverlay-tests-enable-uring.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(EnableUring)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(EnableUring, []byte("Y"), 0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(EnableUring, old, 0); err != nil {
			t.Errorf("put %s back to %s: %v", EnableUring, strings.TrimSpace(string(old)), err)
		}
	}()
	fn()
}

// CheckUring fails the test unless m serves its requests over io_uring.
func CheckUring(t testing.TB, m *Mounted) {
	t.Helper()
	if s := ReadStats(t, m); !strings.HasPrefix(s.Transport, "io_uring") {
		t.Errorf("%s: transport %q, want io_uring", m.Dir, s.Transport)
	}
}
