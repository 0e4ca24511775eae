package reliability_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestDeadMountRefused: after its daemon died, a mount answers ENOTCONN
// until someone detaches it. goverlay must refuse to mount on it, or to
// use it as a layer, with exit code 2 and a message that says how to
// clear it, and leave the layers as they were. After the detach the same
// layers mount again with the data written before the crash.
func TestDeadMountRefused(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("f", "lower f\n", 0o644).File("d/g", "lower g\n", 0o600)
	})
	lowerBefore := testutil.UpperLayout(t, s.lower[0])
	m := mountG(t, s)
	if err := os.WriteFile(filepath.Join(m.Dir, "f"), []byte("written before the crash\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Dir, "d/new"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	upperBefore := testutil.UpperLayout(t, s.upper)
	m.Crash(t)
	if err := statSync(m.Dir); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("stat of the dead mount: %v, want ENOTCONN", err)
	}

	other := newStack(t, 1, nil)
	bin := testutil.Binary(t)
	env := []string{"GORACE=atexit_sleep_ms=0"}
	for _, c := range []struct {
		name string
		args []string
		role string
	}{
		{"mount over the dead mount", []string{"-o", s.opts().OptString(), m.Dir}, "mountpoint"},
		{"dead mount as lowerdir", []string{"-o", "lowerdir=" + m.Dir + ",upperdir=" + other.upper + ",workdir=" + other.work, filepath.Join(other.base, "mnt")}, "lowerdir"},
	} {
		if err := os.MkdirAll(filepath.Join(other.base, "mnt"), 0o755); err != nil {
			t.Fatal(err)
		}
		r := testutil.Run(t, 30*time.Second, env, bin, c.args...)
		if r.TimedOut {
			t.Fatalf("%s: goverlay hung", c.name)
		}
		if r.Code != 2 {
			t.Errorf("%s: exit %d, want 2 (a layer or the mountpoint is unusable)\n%s", c.name, r.Code, r)
		}
		if !strings.Contains(r.Stderr, "fusermount3 -u") && !strings.Contains(r.Stderr, "umount -l") {
			t.Errorf("%s: the message does not say how to clear the dead mount (fusermount3 -u or umount -l): %q", c.name, r.Stderr)
		}
		if !strings.Contains(r.Stderr, m.Dir) || !strings.Contains(r.Stderr, c.role) {
			t.Errorf("%s: the message does not name the %s %s: %q", c.name, c.role, m.Dir, r.Stderr)
		}
		if pids := testutil.FindProcsMentioning(bin, m.Dir); len(pids) > 0 {
			t.Errorf("%s: goverlay processes %v still run", c.name, pids)
		}
	}
	if testutil.IsMounted(filepath.Join(other.base, "mnt")) {
		t.Errorf("a refused mount left %s mounted", filepath.Join(other.base, "mnt"))
		unix.Unmount(filepath.Join(other.base, "mnt"), unix.MNT_DETACH)
	}

	reportDiff(t, "the lower layer after the crash and the refused mounts", testutil.DiffWith(lowerBefore, testutil.UpperLayout(t, s.lower[0]), testutil.DiffOptions{A: "before", B: "after"}))
	reportDiff(t, "the upper layer after the crash and the refused mounts", testutil.DiffWith(upperBefore, testutil.UpperLayout(t, s.upper), testutil.DiffOptions{A: "before", B: "after"}))

	if err := unix.Unmount(m.Dir, unix.MNT_DETACH); err != nil {
		t.Fatalf("umount2(MNT_DETACH): %v", err)
	}
	m2 := mountG(t, s)
	for p, want := range map[string]string{"f": "written before the crash\n", "d/new": "new\n", "d/g": "lower g\n"} {
		if got, err := os.ReadFile(filepath.Join(m2.Dir, p)); err != nil || string(got) != want {
			t.Errorf("after the remount %s = %q, %v; want %q", p, got, err, want)
		}
	}
	m2.Unmount(t)
}

// TestFsync: fsync and fdatasync through the mount return 0, and the data
// is in the upper file right after, without an unmount, for a new file
// and a copied-up one, with the kernel writing the upper file itself
// (passthrough, the default) and with every write going through the
// daemon (passthrough=off); fsync of a directory returns 0 too. With
// strace at hand, the test also sees the daemon's own fsync of the upper
// file when the kernel does not write it directly.
//
// This cannot show that the data survives a power loss: that needs a
// machine (or block device) that loses what was not flushed. It shows the
// fsync reaches the upper file.
func TestFsync(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.Binary(t)
	for _, pt := range []string{"on", "off"} {
		t.Run("passthrough="+pt, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) {
				l[0].File("lower", strings.Repeat("lower data\n", 1000), 0o644)
			})
			m := mountG(t, s, "-o", "passthrough="+pt)
			var tr *tracer
			if _, err := exec.LookPath("strace"); err == nil && pt == "off" {
				tr = startTracer(t, m.PID, "fsync,fdatasync")
			}
			for _, c := range []struct {
				name  string
				flags int
				data  func() []byte
			}{
				{"new", os.O_CREATE | os.O_EXCL | os.O_WRONLY, func() []byte { return []byte("new data, fsynced\n") }},
				{"lower", os.O_WRONLY | os.O_APPEND, func() []byte { return []byte("appended, fsynced\n") }},
			} {
				f, err := os.OpenFile(filepath.Join(m.Dir, c.name), c.flags, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				data := c.data()
				if _, err := f.Write(data); err != nil {
					t.Fatal(err)
				}
				if err := unix.Fsync(int(f.Fd())); err != nil {
					t.Errorf("fsync %s through the mount: %v", c.name, err)
				}
				up, err := os.ReadFile(filepath.Join(s.upper, c.name))
				if err != nil || !bytes.HasSuffix(up, data) {
					t.Errorf("right after fsync of %s the upper file holds %d bytes ending %q (%v), want the data written", c.name, len(up), tailOf(up), err)
				}
				more := []byte("more, fdatasynced\n")
				if _, err := f.Write(more); err != nil {
					t.Fatal(err)
				}
				if err := unix.Fdatasync(int(f.Fd())); err != nil {
					t.Errorf("fdatasync %s through the mount: %v", c.name, err)
				}
				if up, err := os.ReadFile(filepath.Join(s.upper, c.name)); err != nil || !bytes.HasSuffix(up, more) {
					t.Errorf("right after fdatasync of %s the upper file ends %q (%v)", c.name, tailOf(up), err)
				}
				if err := f.Close(); err != nil {
					t.Errorf("close %s: %v", c.name, err)
				}
			}
			d, err := os.Open(m.Dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Fsync(int(d.Fd())); err != nil {
				t.Errorf("fsync of the mount's root directory: %v", err)
			}
			d.Close()
			if tr != nil {
				// The daemon has answered every fsync by now; strace
				// printed each of its calls before the delay.
				tr.detach(t)
				calls := 0
				for _, l := range tr.seen {
					if completedCall(l, "fsync") || completedCall(l, "fdatasync") {
						calls++
					}
				}
				t.Logf("the daemon made %d fsync/fdatasync calls", calls)
				// One for the copy-up of "lower", four through the
				// mount; the directory's may not come.
				if calls < 5 {
					t.Errorf("the daemon made %d fsync/fdatasync calls, want at least 5: the copy-up's and the 4 made through the mount (passthrough=off):\n%s", calls, strings.Join(tr.seen, "\n"))
				}
			}
		})
	}
}

func tailOf(b []byte) []byte {
	if len(b) > 40 {
		return b[len(b)-40:]
	}
	return b
}
