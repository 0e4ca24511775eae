// Package uringswitch lets tests mount while the kernel offers FUSE over
// io_uring, and gives them one workload to send over the ring (Workload).
// It imports nothing of goverlay's, so that the overlay and fuseserve
// packages' own tests can use it as well as tests/testutil.
package uringswitch

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Param is the fuse module's switch for FUSE over io_uring: the kernel
// offers it in INIT only while it is Y, and a mount that took it keeps it
// after the switch goes back.
const Param = "/sys/module/fuse/parameters/enable_uring"

// mu serialises this process's callers of Offered; a lock file does the
// same across test processes, so that one of them putting the switch back
// does not take it from another's mount. Withheld holds the lock file
// shared, so that no test mounts while another offers io_uring unless it
// asked for io_uring itself.
var mu sync.Mutex

// offering is set while this process offers io_uring (Offered).
var offering atomic.Bool

// lockFile opens the lock file the test processes share.
func lockFile(t testing.TB) *os.File {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "goverlay-tests-enable-uring.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return lock
}

// Available reports whether the kernel has FUSE over io_uring, and why
// not.
func Available() (bool, string) {
	if os.Getuid() != 0 {
		return false, "switching enable_uring needs root"
	}
	if _, err := os.Stat(Param); err != nil {
		return false, "this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)"
	}
	return true, ""
}

// Offered runs fn while the kernel offers FUSE over io_uring to new mounts,
// and then puts the switch back as it was.
func Offered(t testing.TB, fn func()) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	lock := lockFile(t)
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(Param)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(Param, []byte("Y"), 0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(Param, old, 0); err != nil {
			t.Errorf("put %s back to %s: %v", Param, strings.TrimSpace(string(old)), err)
		}
	}()
	offering.Store(true)
	defer offering.Store(false)
	fn()
}

// Withheld runs fn, a mount that did not ask for io_uring, while no test
// process offers it: goverlay takes io_uring wherever the kernel offers it,
// and a mount made while another test offers it would serve its requests
// over io_uring where its test expects /dev/fuse. A mount made inside
// Offered (this process offering) runs at once: the tests that offer
// io_uring run alone in their process.
func Withheld(t testing.TB, fn func()) {
	t.Helper()
	if offering.Load() {
		fn()
		return
	}
	lock := lockFile(t)
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	fn()
}
