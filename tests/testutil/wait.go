package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// WaitMounted waits until dir is a mount point, or timeout passes, or gone
// is closed (the process that should mount it exited). It does not sleep:
// the kernel wakes poll(2) on /proc/self/mountinfo with POLLPRI whenever
// the mount table changes (proc(5)).
func WaitMounted(dir string, timeout time.Duration, gone <-chan struct{}) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 64<<10)
	for {
		// Reading to the end arms the next notification.
		for {
			n, err := f.Read(buf)
			if n == 0 || err != nil {
				break
			}
		}
		if IsMounted(dir) {
			return nil
		}
		select {
		case <-gone:
			return fmt.Errorf("%s: the process exited without mounting", dir)
		default:
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%s not mounted within %v", dir, timeout)
		}
		// Wake at least every 100ms to notice gone.
		ms := min(int(left/time.Millisecond)+1, 100)
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}
		if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if _, err := f.Seek(0, 0); err != nil {
			return err
		}
	}
}

// Adopt takes charge of a goverlay mount on dir that the test made by other
// means than Mount (mount(8), the mount-helper form): it finds the daemon
// by its executable and its mount point argument and, like Mount, makes
// the end of the test unmount, wait for the daemon to exit 0 and check
// that nothing is left mounted.
func Adopt(t testing.TB, dir string) *Mounted {
	t.Helper()
	return AdoptOf(t, dir, Binary(t))
}

// AdoptOf is Adopt for a mount served by another goverlay binary than the
// one the tests built (an installed one).
func AdoptOf(t testing.TB, dir, bin string) *Mounted {
	t.Helper()
	LeakCheck(t)
	m := &Mounted{Dir: dir}
	trackMount(dir)
	t.Cleanup(func() { m.finish(t, true, false) })
	pids := FindProcs(bin, dir)
	if len(pids) != 1 {
		t.Fatalf("want one %s process serving %s, found %v", filepath.Base(bin), dir, pids)
	}
	p, err := Track(pids[0], t.Name())
	if err != nil {
		t.Fatal(err)
	}
	m.PID, m.proc = pids[0], p
	// Without it a copy of the mount in another test's namespace would
	// keep the daemon alive past its unmount (detachCopies).
	m.recordDev()
	return m
}
