package testutil

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/testutil/uringswitch"
)

// Result is how a command ended.
type Result struct {
	Code     int // exit code; -1 when it was killed or did not start
	Stdout   string
	Stderr   string
	Err      error // from exec, for messages
	TimedOut bool
}

// String is a one-paragraph summary for failure messages.
func (r Result) String() string {
	s := "exit " + strconv.Itoa(r.Code)
	if r.TimedOut {
		s += " (timed out)"
	}
	if r.Stdout != "" {
		s += "\nstdout: " + r.Stdout
	}
	if r.Stderr != "" {
		s += "\nstderr: " + r.Stderr
	}
	return s
}

// StderrLines is the non-empty lines of stderr.
func (r Result) StderrLines() []string {
	var out []string
	for _, l := range strings.Split(r.Stderr, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// Run runs a command with a deadline and returns its outcome. Output goes
// to files, not pipes, so that a daemon inheriting them cannot keep Run
// waiting. env entries are added to the environment.
func Run(t testing.TB, timeout time.Duration, env []string, name string, args ...string) Result {
	t.Helper()
	return RunIn(t, timeout, "", env, name, args...)
}

// RunIn is Run in the working directory wd ("" for this process's).
func RunIn(t testing.TB, timeout time.Duration, wd string, env []string, name string, args ...string) Result {
	t.Helper()
	dir := t.TempDir()
	outF, err := os.CreateTemp(dir, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer outF.Close()
	errF, err := os.CreateTemp(dir, "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer errF.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = outF, errF
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = wd
	goverlay := builtBinary()
	mountCmd := filepath.Join(filepath.Dir(goverlay), "goverlay-mount")
	traced := name == "strace" && slices.Contains(args, mountCmd)
	if mounts := goverlay != "" && (name == goverlay || name == mountCmd || traced) && (len(args) == 0 || args[0] != "bench"); mounts {
		// The binary may mount: not while another test offers
		// io_uring. The bench, which mounts and offers io_uring
		// itself, does not wait.
		uringswitch.Withheld(t, func() { err = cmd.Run() })
	} else {
		err = cmd.Run()
	}
	r := Result{Code: 0, Err: err}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		r.Code = -1
	}
	if ctx.Err() != nil {
		r.TimedOut = true
	}
	o, _ := os.ReadFile(outF.Name())
	e, _ := os.ReadFile(errF.Name())
	r.Stdout, r.Stderr = string(o), string(e)
	return r
}
