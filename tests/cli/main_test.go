// Package cli_test runs the real goverlay binary: bad input, the mount
// lifecycle, the mount-helper forms and permission checks.
package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// cmdTimeout bounds every run of the binary: a refused mount must not
// hang.
const cmdTimeout = 30 * time.Second

// layers makes a lower layer with a few files and an empty mount point
// under one temp dir, and returns their paths.
func layers(t *testing.T) (lower, mnt string) {
	t.Helper()
	base := t.TempDir()
	l := testutil.NewLayer(t, filepath.Join(base, "lower"))
	l.File("file", "hello\n", 0o644).File("dir/inner", "inner\n", 0o644)
	mnt = filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	return l.Root, mnt
}

// goverlay runs the binary with args and a deadline.
func goverlay(t *testing.T, args ...string) testutil.Result {
	t.Helper()
	return testutil.Run(t, cmdTimeout, nil, testutil.Binary(t), args...)
}

// expectRefused runs goverlay with args and checks that it fails without
// hanging, prints one line on stderr that mentions every key group (a
// group is alternatives separated by "|", matched case-insensitively),
// and leaves nothing mounted on mnt (nor any daemon serving it).
func expectRefused(t *testing.T, mnt string, args []string, keys ...string) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	bin := testutil.Binary(t)
	r := goverlay(t, args...)
	if r.TimedOut {
		t.Fatalf("goverlay %q hung (killed after %v)", args, cmdTimeout)
	}
	if r.Code == 0 {
		t.Errorf("goverlay %q exited 0, want a failure", args)
	}
	t.Logf("exit %d, stderr: %s", r.Code, r.Stderr)
	lines := r.StderrLines()
	if len(lines) != 1 {
		t.Errorf("goverlay %q printed %d lines on stderr, want 1:\n%s", args, len(lines), r.Stderr)
	}
	low := strings.ToLower(r.Stderr)
	for _, k := range keys {
		found := false
		for _, alt := range strings.Split(k, "|") {
			if strings.Contains(low, strings.ToLower(alt)) {
				found = true
			}
		}
		if !found {
			t.Errorf("goverlay %q: stderr does not mention %q: %q", args, k, r.Stderr)
		}
	}
	if mnt != "" && testutil.IsMounted(mnt) {
		t.Errorf("goverlay %q failed but left %s mounted", args, mnt)
		testutil.Adopt(t, mnt) // unmounts it at the end
	}
	if pids := testutil.FindProcs(bin, mnt); mnt != "" && len(pids) > 0 {
		t.Errorf("goverlay %q failed but processes %v still run for %s", args, pids, mnt)
		for _, pid := range pids {
			if p, err := testutil.Track(pid, t.Name()); err == nil {
				p.Kill()
			}
		}
	}
}
