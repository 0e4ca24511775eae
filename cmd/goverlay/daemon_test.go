package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/goverlay/goverlay/cmd/internal/mountclient"
)

// TestReporterRoundTrip checks that what the child writes is what the
// parent decodes.
func TestReporterRoundTrip(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	rep := &reporter{pipe: w, logf: func(f string, a ...any) { logged = append(logged, f) }}
	code := rep.fail(failf(exitBadLayer, "lowerdir %s does not exist; create it or fix the path", "/x"))
	if code != exitBadLayer {
		t.Errorf("fail returned %d", code)
	}
	msg, _ := io.ReadAll(r)
	gotCode, text, ok := mountclient.ParseReport(msg)
	if !ok || gotCode != exitBadLayer || text != "lowerdir /x does not exist; create it or fix the path" {
		t.Errorf("decoded %d %q %v from %q", gotCode, text, ok, msg)
	}
	if len(logged) != 1 {
		t.Errorf("failure not logged: %q", logged)
	}
	if rep.pipe != nil {
		t.Errorf("pipe not released")
	}
}

func TestReporterForeground(t *testing.T) {
	var stderr bytes.Buffer
	rep := &reporter{stderr: &stderr}
	if code := rep.fail(errors.New("mount: boom")); code != exitMount {
		t.Errorf("plain error: code %d, want %d", code, exitMount)
	}
	if got := stderr.String(); got != "goverlay: mount: boom\n" {
		t.Errorf("stderr %q", got)
	}
	if err := rep.ready(nil); err != nil {
		t.Errorf("ready in the foreground: %v", err)
	}
}

func TestDaemonPipeRejectsStrays(t *testing.T) {
	for _, v := range []string{"", "x", "1", "-5", "99999"} {
		t.Setenv(daemonEnv, v)
		if p := daemonPipe(); p != nil {
			t.Errorf("%s=%q accepted", daemonEnv, v)
		}
		if _, set := os.LookupEnv(daemonEnv); set {
			t.Errorf("%s still set", daemonEnv)
		}
	}
	// An open fd that is not a pipe is refused too.
	f, err := os.CreateTemp(t.TempDir(), "notapipe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Setenv(daemonEnv, strconv.Itoa(int(f.Fd())))
	if p := daemonPipe(); p != nil {
		t.Errorf("regular file accepted as the report pipe")
	}
}
