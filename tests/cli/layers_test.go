package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestOverlappingLayers: a lowerdir inside the upperdir, the workdir or
// another lowerdir is refused with exit 2, as the kernel overlay refuses
// it (ELOOP); an upperdir inside a lowerdir is accepted by both.
func TestOverlappingLayers(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		name string
		// layers returns lowerdir, upperdir and workdir made under base.
		layers func(t *testing.T, base string) (lower, upper, work string)
		ok     bool
	}{
		{"lower-inside-upper", func(t *testing.T, base string) (string, string, string) {
			u, w := mkdirs(t, base, "upper", "work")
			lo, _ := mkdirs(t, u, "lo", "unused")
			return lo, u, w
		}, false},
		{"lower-inside-work", func(t *testing.T, base string) (string, string, string) {
			u, w := mkdirs(t, base, "upper", "work")
			lo, _ := mkdirs(t, w, "lo", "unused")
			return lo, u, w
		}, false},
		{"lower-inside-lower", func(t *testing.T, base string) (string, string, string) {
			u, w := mkdirs(t, base, "upper", "work")
			a, _ := mkdirs(t, base, "a", "unused")
			b, _ := mkdirs(t, a, "b", "unused")
			return a + ":" + b, u, w
		}, false},
		{"upper-inside-lower", func(t *testing.T, base string) (string, string, string) {
			a, _ := mkdirs(t, base, "a", "unused")
			u, w := mkdirs(t, a, "upper", "work")
			return a, u, w
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base := t.TempDir()
			lower, upper, work := c.layers(t, base)
			opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
			kmnt, _ := mkdirs(t, base, "kmnt", "mnt")
			mnt := filepath.Join(base, "mnt")
			kout, kerr := exec.Command("mount", "-t", "overlay", "overlay", "-o", opts, kmnt).CombinedOutput()
			if kerr == nil {
				testutil.UnmountKernel(t, kmnt)
			}
			if (kerr == nil) != c.ok {
				t.Fatalf("the kernel overlay: mount -o %s: %v %s (want ok=%v)", opts, kerr, kout, c.ok)
			}
			if c.ok {
				m := testutil.MountWith(t, testutil.Options{Lower: strings.Split(lower, ":"), Upper: upper, Work: work}, testutil.MountConfig{Mountpoint: mnt})
				m.Unmount(t)
				return
			}
			args := []string{"-o", opts, mnt}
			expectRefused(t, mnt, args, "lowerdir", "inside", "overlap")
			if r := goverlay(t, args...); r.Code != 2 {
				t.Errorf("exit %d, want 2", r.Code)
			}
		})
	}
}

// TestUpperInUse: a second mount on an upperdir or workdir that a live
// goverlay or kernel overlay uses is refused with exit 2, and the first
// mount's workdir keeps what it holds (a second goverlay used to empty it
// under the first one's copy-ups). A goverlay stacked on a busy
// mountpoint with layers of its own still mounts.
func TestUpperInUse(t *testing.T) {
	testutil.RequireRoot(t)
	newLayers := func(t *testing.T) (base, lower, upper, work string) {
		lower, _ = layers(t)
		base = t.TempDir()
		upper, work = mkdirs(t, base, "upper", "work")
		return base, lower, upper, work
	}
	// inFlight stands for a copy-up the first mount has in progress.
	inFlight := func(t *testing.T, work string) string {
		must(t, os.MkdirAll(filepath.Join(work, "work"), 0o755))
		p := filepath.Join(work, "work", "#copy-up-in-flight")
		must(t, os.WriteFile(p, []byte("x"), 0o644))
		return p
	}
	t.Run("goverlay", func(t *testing.T) {
		for _, share := range []string{"upper", "work", "both"} {
			t.Run(share, func(t *testing.T) {
				t.Parallel()
				base, lower, upper, work := newLayers(t)
				m := testutil.MountWith(t, testutil.Options{Lower: []string{lower}, Upper: upper, Work: work}, testutil.MountConfig{})
				p := inFlight(t, work)
				u2, w2 := mkdirs(t, base, "upper2", "work2")
				switch share {
				case "upper":
					work = w2
				case "work":
					upper = u2
				}
				opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
				mnt2 := filepath.Join(base, "mnt2")
				must(t, os.Mkdir(mnt2, 0o755))
				expectRefused(t, mnt2, []string{"-o", opts, mnt2}, "in use")
				// On the first mount's own mountpoint: refused too.
				if r := goverlay(t, "-o", opts, m.Dir); r.Code != 2 || !strings.Contains(r.Stderr, "in use") && !strings.Contains(r.Stderr, "already holds") {
					t.Errorf("a second mount on %s: %v, want exit 2 saying the layer is in use", m.Dir, r)
				}
				if _, err := os.Stat(p); err != nil {
					t.Errorf("the first mount's workdir lost its content: %v", err)
				}
				// The first mount still works: a copy-up.
				must(t, os.WriteFile(filepath.Join(m.Dir, "file"), []byte("changed\n"), 0o644))
				m.Unmount(t)
			})
		}
	})
	t.Run("read-only", func(t *testing.T) {
		t.Parallel()
		lower, _ := layers(t)
		m := testutil.MountWith(t, testutil.Options{Lower: []string{lower}}, testutil.MountConfig{})
		if r := goverlay(t, "-o", "lowerdir="+lower, m.Dir); r.Code != 2 || !strings.Contains(r.Stderr, "already holds a goverlay mount of the same layers") {
			t.Errorf("a second read-only mount of the same layer on %s: %v, want exit 2 saying it is there already", m.Dir, r)
		}
		m.Unmount(t)
	})
	t.Run("kernel", func(t *testing.T) {
		t.Parallel()
		base, lower, upper, work := newLayers(t)
		testutil.KernelOverlay(t, []string{lower}, upper, work)
		u2, w2 := mkdirs(t, base, "upper2", "work2")
		for _, uw := range [][2]string{{upper, w2}, {u2, work}} {
			mnt := filepath.Join(base, "mnt")
			must(t, os.MkdirAll(mnt, 0o755))
			args := []string{"-o", "lowerdir=" + lower + ",upperdir=" + uw[0] + ",workdir=" + uw[1], mnt}
			expectRefused(t, mnt, args, "kernel overlay")
			if r := goverlay(t, args...); r.Code != 2 {
				t.Errorf("%q: exit %d, want 2", args, r.Code)
			}
		}
	})
	t.Run("stacked", func(t *testing.T) {
		t.Parallel()
		base, lower, upper, work := newLayers(t)
		m := testutil.MountWith(t, testutil.Options{Lower: []string{lower}, Upper: upper, Work: work}, testutil.MountConfig{})
		u2, w2 := mkdirs(t, base, "upper2", "work2")
		// Stacked on the same mountpoint, the harness cannot tell the
		// two mounts apart: the top one is mounted and unmounted here.
		pidfile := filepath.Join(base, "top.pid")
		r := goverlay(t, "-o", "lowerdir="+lower+",upperdir="+u2+",workdir="+w2, "--pidfile", pidfile, m.Dir)
		if r.Code != 0 {
			t.Fatalf("a goverlay with layers of its own stacked on a busy mountpoint: %v", r)
		}
		b, err := os.ReadFile(pidfile)
		must(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		must(t, err)
		top, err := testutil.Track(pid, t.Name())
		must(t, err)
		werr := os.WriteFile(filepath.Join(m.Dir, "new"), []byte("top\n"), 0o644)
		_, serr := os.Stat(filepath.Join(u2, "new"))
		var st unix.Stat_t
		must(t, unix.Stat(m.Dir, &st))
		if uerr := unix.Unmount(m.Dir, 0); uerr != nil {
			t.Errorf("umount of the stacked mount: %v", uerr)
			unix.Unmount(m.Dir, unix.MNT_DETACH)
		}
		// A copy of the mount in the namespace of another test's
		// process (podman, unshare) keeps its daemon alive, as the
		// kernel wants.
		if !top.Wait(testutil.DaemonExitTimeout) && testutil.DetachCopiesAt(t, m.Dir, st.Dev) {
			top.Wait(testutil.DaemonExitTimeout)
		}
		if top.Alive() {
			top.Kill()
			t.Errorf("the stacked mount's daemon outlived its mount: killed it")
		}
		if werr != nil || serr != nil {
			t.Errorf("a write to the stacked mount did not reach its upper: %v, %v", werr, serr)
		}
		m.Unmount(t)
	})
}

// TestMountOnLower: goverlay mounted on its own lower directory (a
// pattern of the kernel overlay and fuse-overlayfs) shows the lower's
// content and writes to the upper; the kernel overlay does the same.
func TestMountOnLower(t *testing.T) {
	testutil.RequireRoot(t)
	for _, kind := range []string{"kernel", "goverlay"} {
		t.Run(kind, func(t *testing.T) {
			lower, _ := layers(t)
			upper, work := mkdirs(t, t.TempDir(), "upper", "work")
			if kind == "kernel" {
				opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
				if out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o", opts, lower).CombinedOutput(); err != nil {
					t.Fatalf("mount -t overlay -o %s %s: %v %s", opts, lower, err, out)
				}
				defer testutil.UnmountKernel(t, lower)
			} else {
				m := testutil.MountWith(t, testutil.Options{Lower: []string{lower}, Upper: upper, Work: work}, testutil.MountConfig{Mountpoint: lower})
				defer m.Unmount(t)
			}
			if b, err := os.ReadFile(filepath.Join(lower, "dir/inner")); err != nil || string(b) != "inner\n" {
				t.Errorf("through the mount on the lower, dir/inner holds %q (%v)", b, err)
			}
			must(t, os.WriteFile(filepath.Join(lower, "file"), []byte("changed\n"), 0o644))
			if b, err := os.ReadFile(filepath.Join(upper, "file")); err != nil || string(b) != "changed\n" {
				t.Errorf("the upper's file holds %q (%v), want the write", b, err)
			}
		})
	}
}
