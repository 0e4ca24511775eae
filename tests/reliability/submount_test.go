package reliability_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// mountAt mounts with mount(8) args... on dir, and detaches it when the
// test ends if it is still there.
func mountAt(t *testing.T, dir string, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", append(args, dir)...).CombinedOutput(); err != nil {
		t.Fatalf("mount %v %s: %v %s", args, dir, err, out)
	}
	t.Cleanup(func() {
		if testutil.IsMounted(dir) {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
}

// names lists dir, sorted, or gives the error.
func names(dir string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	var ns []string
	for _, e := range ents {
		ns = append(ns, e.Name())
	}
	slices.Sort(ns)
	return strings.Join(ns, " ")
}

// TestMountInLayer: a filesystem mounted inside a layer is not part of
// the layer. The overlay shows the layer's own directory under it, in a
// lower layer (a tmpfs, a bind mount) and in the upper one, where a write
// goes to the upper's own directory; the kernel overlay, which takes each
// layer as a private clone of its mount, runs the same steps.
func TestMountInLayer(t *testing.T) {
	testutil.RequireRoot(t)
	build := func(l []*testutil.Layer, up *testutil.Layer) {
		l[0].File("sub/own", "lower's own\n", 0o644)
		up.File("usub/own", "upper's own\n", 0o644)
	}
	for _, how := range []string{"tmpfs", "bind"} {
		run := func(t *testing.T, kind string) (lower, upper, after string) {
			s := newStack(t, 1, build)
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "mounted"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, dir := range []string{filepath.Join(s.lower[0], "sub"), filepath.Join(s.upper, "usub")} {
				if how == "tmpfs" {
					mountAt(t, dir, "-t", "tmpfs", "tmpfs")
					if err := os.WriteFile(filepath.Join(dir, "mounted"), []byte("x"), 0o644); err != nil {
						t.Fatal(err)
					}
				} else {
					mountAt(t, dir, "--bind", src)
				}
			}
			var mnt string
			var g *testutil.Mounted
			if kind == "kernel" {
				mnt = mountK(t, s)
			} else {
				g = mountG(t, s)
				mnt = g.Dir
			}
			lower, upper = names(filepath.Join(mnt, "sub")), names(filepath.Join(mnt, "usub"))
			if err := os.WriteFile(filepath.Join(mnt, "usub/new"), []byte("new\n"), 0o644); err != nil {
				upper += " (write: " + err.Error() + ")"
			}
			if g != nil {
				g.Unmount(t)
			} else {
				testutil.UnmountKernel(t, mnt)
			}
			usub := filepath.Join(s.upper, "usub")
			for _, dir := range []string{usub, filepath.Join(s.lower[0], "sub")} {
				if err := unix.Unmount(dir, 0); err != nil {
					t.Fatal(err)
				}
			}
			return lower, upper, names(usub)
		}
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			kl, ku, ka := run(t, "kernel")
			gl, gu, ga := run(t, "goverlay")
			for _, c := range []struct{ what, g, k string }{
				{"a lower's sub", gl, kl}, {"the upper's usub", gu, ku}, {"the upper's own usub afterwards", ga, ka},
			} {
				if c.g != c.k {
					t.Errorf("%s with a %s mount on it: goverlay shows %q, the kernel overlay %q", c.what, how, c.g, c.k)
				}
			}
		})
	}
}

// TestOwnMountInLower: the overlay's mountpoint bound into its own lower
// layer is not walked into (the overlay would contain itself without
// end), and once the bind is detached and the overlay unmounted, the
// daemon exits; with the bind still there, SIGTERM ends it, also when
// the mount serves its requests over io_uring (whose entries the kernel
// ends only with the connection, which outlives the unmount here).
func TestOwnMountInLower(t *testing.T) {
	testutil.RequireRoot(t)
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("sub/own", "lower's own\n", 0o644)
	}
	for _, end := range []string{"umount", "sigterm", "sigterm-io_uring"} {
		t.Run(end, func(t *testing.T) {
			uring := end == "sigterm-io_uring"
			if uring {
				testutil.NeedUring(t)
			}
			t.Parallel()
			s := newStack(t, 1, build)
			g := testutil.MountWith(t, s.opts(), testutil.MountConfig{Uring: uring})
			sub := filepath.Join(s.lower[0], "sub")
			mountAt(t, sub, "--bind", g.Dir)
			if got := names(filepath.Join(g.Dir, "sub")); got != "own" {
				t.Errorf("sub in the overlay shows %q, want the lower's own sub (own)", got)
			}
			if _, err := os.Lstat(filepath.Join(g.Dir, "sub/sub/sub")); err == nil {
				t.Errorf("sub/sub/sub exists: the overlay walked into its own mount")
			}
			switch end {
			case "umount":
				if err := unix.Unmount(sub, unix.MNT_DETACH); err != nil {
					t.Fatal(err)
				}
				g.Unmount(t)
			case "sigterm", "sigterm-io_uring":
				if err := g.Proc().Signal(unix.SIGTERM); err != nil {
					t.Fatal(err)
				}
				g.WaitDaemon(t)
				// The bind is what is left of the mount: dead now.
				if err := unix.Unmount(sub, unix.MNT_DETACH); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
