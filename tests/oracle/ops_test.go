package oracle_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestStatfs: f_namelen, f_bsize and f_blocks are those of the upper (or
// top lower) layer's filesystem, as on the kernel overlay.
func TestStatfs(t *testing.T) {
	testutil.RequireRoot(t)
	simple := func(_ testing.TB, l []*testutil.Layer) {
		for _, layer := range l {
			layer.File("f", "f", 0o644)
		}
	}
	cases := []scenario{
		{name: "lowers", layers: 2, build: simple},
		{name: "upper", layers: 2, upper: true, build: simple},
		{name: "tmpfs-top", layers: 2, build: simple, roots: func(t testing.TB) []string {
			return []string{filepath.Join(testutil.Tmpfs(t), "layer"), filepath.Join(t.TempDir(), "layer")}
		}},
	}
	for _, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			ks := buildStack(t, sc)
			gs := buildStack(t, sc)
			kmnt := testutil.KernelOverlay(t, ks.lower, ks.upper, ks.work)
			g := testutil.Mount(t, testutil.Options{Lower: gs.lower, Upper: gs.upper, Work: gs.work})
			var k, o, top unix.Statfs_t
			must(t, unix.Statfs(kmnt, &k))
			must(t, unix.Statfs(g.Dir, &o))
			topDir := gs.upper
			if topDir == "" {
				topDir = gs.lower[0]
			}
			must(t, unix.Statfs(topDir, &top))
			if top.Blocks != k.Blocks {
				t.Fatalf("control: kernel f_blocks %d, top layer's %d", k.Blocks, top.Blocks)
			}
			if o.Namelen != k.Namelen || o.Bsize != k.Bsize || o.Blocks != k.Blocks {
				t.Errorf("statfs: goverlay namelen=%d bsize=%d blocks=%d, kernel namelen=%d bsize=%d blocks=%d",
					o.Namelen, o.Bsize, o.Blocks, k.Namelen, k.Bsize, k.Blocks)
			}
		})
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestSparseSeek: SEEK_DATA and SEEK_HOLE find the same holes as on the
// kernel overlay.
func TestSparseSeek(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	sc := scenario{name: "sparse", layers: 2, build: buildSparse}
	kmnt, g := mountBoth(t, sc)
	for _, name := range []string{"holey", "allhole", "dense"} {
		for _, whence := range []int{unix.SEEK_DATA, unix.SEEK_HOLE} {
			kOff, kErr := seekIn(filepath.Join(kmnt, name), whence)
			gOff, gErr := seekIn(filepath.Join(g.Dir, name), whence)
			if kOff != gOff || !errors.Is(gErr, kErr) {
				t.Errorf("%s: lseek(0, %s): kernel %d (%v), goverlay %d (%v)", name, whenceName(whence), kOff, kErr, gOff, gErr)
			}
		}
	}
}

func seekIn(path string, whence int) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	off, err := unix.Seek(int(f.Fd()), 0, whence)
	var errno unix.Errno
	if errors.As(err, &errno) {
		return off, errno
	}
	return off, err
}

func whenceName(w int) string {
	if w == unix.SEEK_DATA {
		return "SEEK_DATA"
	}
	return "SEEK_HOLE"
}

// TestPrivateXattrs: listxattr never shows trusted.overlay.* (nor, on
// goverlay, user.overlay.*), and reading one fails as on the kernel.
func TestPrivateXattrs(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	sc := scenario{name: "private-xattrs", layers: 2, upper: true, build: func(_ testing.TB, l []*testutil.Layer) {
		l[0].File("f", "f", 0o644).Xattr("f", "trusted.overlay.custom", "x").Xattr("f", "user.visible", "v")
		l[0].Dir("d", 0o755).Opaque("d").Xattr("d", "trusted.overlay.origin", "")
		l[1].File("g", "g", 0o644).Xattr("g", "trusted.overlay.custom", "").Xattr("g", "user.overlay.redirect", "/x")
	}}
	kmnt, g := mountBoth(t, sc)
	for _, p := range []string{"f", "d", "g", "."} {
		for label, root := range map[string]string{"kernel": kmnt, "goverlay": g.Dir} {
			names := listXattrs(t, filepath.Join(root, p))
			for _, n := range names {
				if strings.HasPrefix(n, "trusted.overlay.") || (label == "goverlay" && strings.HasPrefix(n, "user.overlay.")) {
					t.Errorf("%s: listxattr %q shows the private %q", label, p, n)
				}
			}
			if p == "f" && !contains(names, "user.visible") {
				t.Errorf("%s: listxattr %q lacks user.visible: %q", label, p, names)
			}
		}
	}
	for _, c := range []struct{ path, name string }{{"f", "trusted.overlay.custom"}, {"d", "trusted.overlay.opaque"}, {"g", "trusted.overlay.custom"}} {
		_, kErr := unix.Lgetxattr(filepath.Join(kmnt, c.path), c.name, make([]byte, 64))
		_, gErr := unix.Lgetxattr(filepath.Join(g.Dir, c.path), c.name, make([]byte, 64))
		if kErr == nil {
			t.Fatalf("control: the kernel reads %s of %s", c.name, c.path)
		}
		if !errors.Is(gErr, kErr) {
			t.Errorf("getxattr %s %s: goverlay %v, kernel %v", c.path, c.name, gErr, kErr)
		}
	}
	if _, err := unix.Lgetxattr(filepath.Join(g.Dir, "g"), "user.overlay.redirect", make([]byte, 64)); err == nil {
		t.Errorf("goverlay reads user.overlay.redirect of g")
	}
}

func listXattrs(t testing.TB, path string) []string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", path, err)
	}
	var out []string
	for _, x := range strings.Split(string(buf[:n]), "\x00") {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
