package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

// TestMountError: a fusermount3 failure is told in words, with the exit
// status rather than the raw wait status.
func TestMountError(t *testing.T) {
	err := mountError("/m", &overlay.FusermountError{Path: "/usr/bin/fusermount3", Status: 256})
	if exitCodeOf(err) != exitMount || !strings.Contains(err.Error(), "fusermount3 refused to mount on /m (exit status 1;") || strings.Contains(err.Error(), "256") {
		t.Errorf("got %q (exit %d)", err, exitCodeOf(err))
	}
	err = mountError("/m", fmt.Errorf("wrapped: %w", &overlay.FusermountError{Path: "/bin/fusermount3", Status: syscall.WaitStatus(unix.SIGKILL)}))
	if exitCodeOf(err) != exitMount || !strings.Contains(err.Error(), "fusermount3 refused to mount on /m (killed by SIGKILL;") {
		t.Errorf("got %q (exit %d)", err, exitCodeOf(err))
	}
	err = mountError("/m", unix.EPERM)
	if exitCodeOf(err) != exitMount || err.Error() != "mounting on /m failed: operation not permitted; run with -f -d to see the mount call" {
		t.Errorf("got %q (exit %d)", err, exitCodeOf(err))
	}
}

// TestCheckUnprivileged: for a user other than root, unreadable layers,
// an unwritable mountpoint and a missing fusermount3 are found before
// anything is created.
func TestCheckUnprivileged(t *testing.T) {
	l := newLayout(t)
	oldAccess, oldEuid, oldFm := faccessat, geteuid, haveSetuidFusermount
	defer func() { faccessat, geteuid, haveSetuidFusermount = oldAccess, oldEuid, oldFm }()
	c := l.config()
	if err := checkUnprivileged(c); os.Geteuid() == 0 && err != nil {
		t.Errorf("root: %v", err)
	}
	geteuid = func() int { return 1000 }
	haveSetuidFusermount = func() bool { return true }
	deny := func(path string, mode uint32) {
		faccessat = func(_ int, p string, m uint32, _ int) error {
			if p == path && m&mode != 0 {
				return unix.EACCES
			}
			return nil
		}
	}
	deny("", 0)
	if err := checkUnprivileged(c); err != nil {
		t.Errorf("all accessible: %v", err)
	}
	deny(c.Lower[0], unix.R_OK)
	wantFail(t, checkUnprivileged(c), exitBadLayer, "lowerdir "+c.Lower[0]+" cannot be read by uid 1000 (permission denied); give that user read and search permission on it (chmod a+rX), or mount as root")
	deny(c.Mountpoint, unix.W_OK)
	wantFail(t, checkUnprivileged(c), exitBadLayer, "mountpoint "+c.Mountpoint+" is not writable by uid 1000; fusermount3 mounts only on a directory the user may write to: use one you own, or mount as root")
	deny("", 0)
	haveSetuidFusermount = func() bool { return false }
	if err := checkUnprivileged(c); exitCodeOf(err) != exitFuse || !strings.Contains(err.Error(), "no setuid-root fusermount3") {
		t.Errorf("no fusermount3: %v", err)
	}
}
