package main

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/cmd/internal/mountclient"
)

func TestFailf(t *testing.T) {
	cause := fmt.Errorf("fusermount exited with code 256\n")
	err := failf(exitMount, "mounting on %s failed: %w; run with -f -d to see the mount call", "/m", cause)
	if got, want := err.Error(), "mounting on /m failed: fusermount exited with code 256; run with -f -d to see the mount call"; got != want {
		t.Errorf("message\n got %q\nwant %q", got, want)
	}
	if !errors.Is(err, cause) {
		t.Errorf("cause lost")
	}
	if exitCodeOf(err) != exitMount {
		t.Errorf("code %d", exitCodeOf(err))
	}
	err = failf(exitBadLayer, "x: %w", unix.EACCES)
	if !errors.Is(err, unix.EACCES) || err.Error() != "x: permission denied" {
		t.Errorf("errno wrapping: %v", err)
	}
	if exitCodeOf(nil) != exitOK || exitCodeOf(errors.New("x")) != exitMount {
		t.Errorf("exitCodeOf defaults")
	}
}

// TestExitDaemonShared: goverlay-mount exits with goverlay's code when the
// server cannot report.
func TestExitDaemonShared(t *testing.T) {
	if mountclient.ExitDaemon != exitDaemon {
		t.Errorf("mountclient.ExitDaemon is %d, goverlay's exitDaemon %d", mountclient.ExitDaemon, exitDaemon)
	}
}
