// Package testutil is the integration-test harness of goverlay: it builds
// the real binary, mounts it and the kernel overlay, snapshots trees and
// checks that every test leaves no mount and no daemon behind.
package testutil

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  string
	// buildBin is the built binary; leak checks read it while another
	// test may still be building, so it is guarded.
	buildMu  sync.Mutex
	buildBin string

	helpOnce sync.Once
	helpText string

	mountOnce sync.Once
	mountErr  string
)

// ModuleRoot is the directory holding go.mod of the module under test.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// Binary builds ./cmd/goverlay with the race detector, once per test
// process, and returns its path. The daemon it starts is race-checked too:
// a race makes it exit 66, which the harness reports as a failure.
//
// GOVERLAY_TEST_BINARY names a prebuilt binary to use instead.
func Binary(t testing.TB) string {
	t.Helper()
	becomeSubreaper()
	buildOnce.Do(func() {
		if b := os.Getenv("GOVERLAY_TEST_BINARY"); b != "" {
			abs, _ := filepath.Abs(b)
			setBuilt(abs)
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err.Error()
			return
		}
		dir, err := os.MkdirTemp("", "goverlay-bin-")
		if err != nil {
			buildErr = err.Error()
			return
		}
		buildDir = dir
		bin := filepath.Join(dir, "goverlay")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-race", "-o", bin, "./cmd/goverlay")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = "go build -race ./cmd/goverlay: " + err.Error() + "\n" + string(out)
			return
		}
		setBuilt(bin)
	})
	if buildErr != "" {
		t.Fatal(buildErr)
	}
	return builtBinary()
}

// MountBinary compiles goverlay-mount (C, cmd/goverlay-mount) beside
// Binary's goverlay, which it runs, once per test process, and returns its
// path. With GOVERLAY_TEST_BINARY it is the goverlay-mount beside that
// binary. $CC is the compiler (cc by default).
func MountBinary(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(filepath.Dir(Binary(t)), "goverlay-mount")
	mountOnce.Do(func() {
		if os.Getenv("GOVERLAY_TEST_BINARY") != "" {
			if _, err := os.Stat(bin); err != nil {
				mountErr = fmt.Sprintf("no goverlay-mount beside GOVERLAY_TEST_BINARY: %v", err)
			}
			return
		}
		root, err := moduleRoot()
		if err != nil {
			mountErr = err.Error()
			return
		}
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The Makefile's flags but -static, which needs libc.a; warnings
		// are errors here.
		cmd := exec.CommandContext(ctx, cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", bin, "cmd/goverlay-mount/goverlay-mount.c")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			mountErr = fmt.Sprintf("%s cmd/goverlay-mount/goverlay-mount.c (goverlay-mount is C: a C compiler is needed): %v\n%s", cc, err, out)
		}
	})
	if mountErr != "" {
		t.Fatal(mountErr)
	}
	return bin
}

func setBuilt(bin string) {
	buildMu.Lock()
	buildBin = bin
	buildMu.Unlock()
}

// builtBinary is the binary Binary built, or "" before it has.
func builtBinary() string {
	buildMu.Lock()
	defer buildMu.Unlock()
	return buildBin
}

// Help returns what `goverlay --help` prints (stdout and stderr).
func Help(t testing.TB) string {
	t.Helper()
	bin := Binary(t)
	helpOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var b bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, "--help")
		cmd.Stdout, cmd.Stderr = &b, &b
		_ = cmd.Run()
		helpText = b.String()
	})
	return helpText
}

// SupportsFlag reports whether --help mentions flag (e.g. "--log").
func SupportsFlag(t testing.TB, flag string) bool {
	t.Helper()
	return strings.Contains(Help(t), flag)
}

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts FUSE and kernel overlays, creates device nodes and trusted.* xattrs")
	}
}
