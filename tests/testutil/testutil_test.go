package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { Main(m) }

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a\040b`:       "/tmp/a b",
		`/tmp/x\012y\011z`:  "/tmp/x\ny\tz",
		`/tmp/back\134tick`: `/tmp/back\tick`,
		`/plain`:            "/plain",
		`/short\04`:         `/short\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescape %q = %q, want %q", in, got, want)
		}
	}
}

// TestSnapshotDiff: every recorded property shows up in Diff when it
// changes, and two builds of one tree compare equal.
func TestSnapshotDiff(t *testing.T) {
	RequireRoot(t)
	build := func(dir string) *Layer {
		l := NewLayer(t, dir)
		l.File("f", "content", 0o644).File("new\nline", "x", 0o600).Link("f", "f-link")
		l.File(strings.Repeat("n", 255), "long", 0o644).Symlink("sym", "f").Mknod("fifo", unix.S_IFIFO|0o644, 0, 0)
		l.Mknod("dev", unix.S_IFCHR|0o600, 1, 3).Whiteout("wh").Xattr("f", "user.a", "1").Opaque(".")
		l.Dir("d", 0o755).File("d/g", "g", 0o644)
		return l.Finish()
	}
	a, b := build(filepath.Join(t.TempDir(), "a")), build(filepath.Join(t.TempDir(), "b"))
	ta, tb := Snapshot(t, a.Root), Snapshot(t, b.Root)
	if d := Diff(ta, tb); len(d) > 0 {
		t.Fatalf("two builds differ: %q", d)
	}
	if ta["f"].Link != "f" || ta["f-link"].Link != "f" || ta["sym"].Target != "f" || ta["wh"].Type != "chardev" {
		t.Errorf("snapshot: %s", ta)
	}
	if _, ok := ta["."].Xattrs["trusted.overlay.opaque"]; ok {
		t.Errorf("Snapshot records the private trusted.overlay.opaque")
	}
	raw := UpperLayout(t, a.Root)
	if raw["wh"].Type != "whiteout" || raw["."].Xattrs["trusted.overlay.opaque"] != "y" {
		t.Errorf("UpperLayout: wh is %s, root xattrs %q", raw["wh"].Type, raw["."].Xattrs)
	}
	changes := map[string]func(){
		"mode":            func() { b.Chmod("f", 0o640) },
		"owner":           func() { b.Chown("new\nline", 1, 2) },
		"content sha256":  func() { os.WriteFile(b.P("d/g"), []byte("h"), 0o644) },
		"symlink target":  func() { os.Remove(b.P("sym")); b.Symlink("sym", "g") },
		"xattrs":          func() { b.Xattr("f", "user.a", "2") },
		"hard-link group": func() { os.Remove(b.P("f-link")); b.File("f-link", "content", 0o644) },
		"only in a":       func() { os.Remove(b.P(strings.Repeat("n", 255))) },
		"rdev":            func() { os.Remove(b.P("dev")); b.Mknod("dev", unix.S_IFCHR|0o600, 1, 5) },
		"type":            func() { os.Remove(b.P("fifo")); b.File("fifo", "", 0o644) },
	}
	for what, change := range changes {
		change()
		b.Finish()
		d := Diff(ta, Snapshot(t, b.Root))
		if !strings.Contains(strings.Join(d, "\n"), what) {
			t.Errorf("after a %s change, Diff says %q", what, d)
		}
		os.RemoveAll(b.Root)
		b = build(b.Root)
	}
}

// fakeTB records failures instead of failing, and runs its cleanups on
// demand, to test the harness's own checks.
type fakeTB struct {
	*testing.T
	dir string

	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (f *fakeTB) Errorf(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, a...))
}
func (f *fakeTB) Error(a ...any)                 { f.Errorf("%s", fmt.Sprint(a...)) }
func (f *fakeTB) Failed() bool                   { return len(f.errs) > 0 }
func (f *fakeTB) Logf(string, ...any)            {}
func (f *fakeTB) Cleanup(fn func())              { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Name() string                   { return f.T.Name() + "/fake" }
func (f *fakeTB) TempDir() string                { d, _ := os.MkdirTemp(f.dir, ""); return d }
func (f *fakeTB) Fatalf(format string, a ...any) { f.T.Fatalf(format, a...) }
func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func newFake(t *testing.T) *fakeTB {
	dir := filepath.Join(t.TempDir(), "fake")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &fakeTB{T: t, dir: dir}
}

// TestLeakCheckCatchesMount: a mount left under a test's temp dir fails
// the test and is detached.
func TestLeakCheckCatchesMount(t *testing.T) {
	RequireRoot(t)
	f := newFake(t)
	LeakCheck(f)
	leak := filepath.Join(f.TempDir(), "leak")
	if err := os.Mkdir(leak, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", leak).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	f.runCleanups()
	if len(f.errs) != 1 || !strings.Contains(f.errs[0], "left behind") {
		t.Errorf("leak check reported %q", f.errs)
	}
	if IsMounted(leak) {
		lazyUnmount(leak)
		t.Errorf("the leaked mount was not detached")
	}
}

// TestDaemonOutlivingMount: a daemon that does not exit after its unmount
// fails the test and is killed.
func TestDaemonOutlivingMount(t *testing.T) {
	RequireRoot(t)
	saved := DaemonExitTimeout
	DaemonExitTimeout = time.Second
	defer func() { DaemonExitTimeout = saved }()
	f := newFake(t)
	lower := NewLayer(t, filepath.Join(t.TempDir(), "lower")).File("f", "f", 0o644)
	m := Mount(f, Options{Lower: []string{lower.Root}})
	p := m.Proc()
	// A stopped daemon cannot notice the unmount.
	if err := p.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	f.runCleanups()
	if !strings.Contains(strings.Join(f.errs, "\n"), "outlived its mount") {
		t.Errorf("harness reported %q", f.errs)
	}
	if p.Alive() {
		t.Errorf("daemon %d still alive", p.PID)
		p.Kill()
	}
}
