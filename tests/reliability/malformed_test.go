package reliability_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// Malformed or hostile overlay metadata in the layers.

// oddOpaque are overlay.opaque values that do not mark a directory opaque:
// only "y" does (and "x", which means "may hold xattr whiteouts"; Linux:
// ovl_get_opaquedir_val()).
var oddOpaque = []string{"Y", "yes", "", "yy", "n", strings.Repeat("y", 100), "y\n", " y", "y\x00"}

// TestMalformedFormatLikeKernel: layers whose metadata the kernel reads
// too, mounted read-only by goverlay and by the kernel overlay, must look
// the same:
//   - a character device that is not 0/0 is a device, not a whiteout;
//   - overlay.opaque values other than "y" (trusted and user namespace) do
//     not make a directory opaque;
//   - redirects that loop (a directory naming itself, relative or
//     absolute; two directories naming each other in every layer) end, as
//     a redirect only ever continues in the layers below;
//   - an absolute redirect whose path crosses, in a middle layer, an
//     opaque directory, a whiteout or a file stops there: what those hide
//     in the layers below stays hidden (Linux: ovl_lookup_single() sets
//     d->stop).
func TestMalformedFormatLikeKernel(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	s := newStack(t, 3, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[1].File("cdev", "a file under a device", 0o644)
		l[0].Mknod("cdev", unix.S_IFCHR|0o644, 1, 3).Mknod("cdev5", unix.S_IFCHR|0o600, 5, 1).Mknod("blk", unix.S_IFBLK|0o600, 7, 0)
		l[1].File("blkdir/below", "b", 0o644)
		l[0].Mknod("blkdir", unix.S_IFCHR|0o600, 0, 1) // minor 1: not a whiteout, hides the directory below
		for i, v := range oddOpaque {
			for _, ns := range []string{"trusted", "user"} {
				d := fmt.Sprintf("%s-odd%d", ns, i)
				l[0].File(d+"/own", v, 0o644).Xattr(d, ns+".overlay.opaque", v)
				l[1].File(d+"/below", "below", 0o644)
			}
		}
		// Loops.
		for i := range 3 {
			l[i].File(fmt.Sprintf("rself/m%d", i), "", 0o644).Xattr("rself", "trusted.overlay.redirect", "rself")
			l[i].File(fmt.Sprintf("aself/m%d", i), "", 0o644).Xattr("aself", "trusted.overlay.redirect", "/aself")
			l[i].File(fmt.Sprintf("r7/m%d", i), "", 0o644).Xattr("r7", "trusted.overlay.redirect", "r8")
			l[i].File(fmt.Sprintf("r8/m%d", i), "", 0o644).Xattr("r8", "trusted.overlay.redirect", "r7")
			l[i].File(fmt.Sprintf("a7/m%d", i), "", 0o644).Xattr("a7", "trusted.overlay.redirect", "/a8")
			l[i].File(fmt.Sprintf("a8/m%d", i), "", 0o644).Xattr("a8", "trusted.overlay.redirect", "/a7")
			l[i].File(fmt.Sprintf("deep/x/m%d", i), "", 0o644).Xattr("deep/x", "trusted.overlay.redirect", "/deep/x")
		}
		// Redirect paths crossing what hides the layers below.
		l[0].File("c-opaque/top", "", 0o644).Xattr("c-opaque", "trusted.overlay.redirect", "/a1/b")
		l[1].File("a1/b/mid", "", 0o644).Opaque("a1")
		l[2].File("a1/b/bottom", "hidden by the opaque a1 above", 0o644)
		l[0].File("c-whiteout/top", "", 0o644).Xattr("c-whiteout", "trusted.overlay.redirect", "/a2/b")
		l[1].Whiteout("a2")
		l[2].File("a2/b/bottom", "hidden by the whiteout a2 above", 0o644)
		l[0].File("c-file/top", "", 0o644).Xattr("c-file", "trusted.overlay.redirect", "/a3/b")
		l[1].File("a3", "a file over the directory a3", 0o644)
		l[2].File("a3/b/bottom", "hidden by the file a3 above", 0o644)
		l[0].File("c-direct/top", "", 0o644).Xattr("c-direct", "trusted.overlay.redirect", "/a4")
		l[1].File("a4", "a file", 0o644)
		l[2].File("a4/bottom", "hidden by the file a4 above", 0o644)
	})
	m := testutil.MountWith(t, testutil.Options{Lower: s.lower}, testutil.MountConfig{})
	var gt testutil.Tree
	m.Watchdog(t, 60*time.Second, func() { gt = testutil.Snapshot(t, m.Dir) })
	k := testutil.KernelOverlay(t, s.lower, "", "", "redirect_dir=follow", "index=off", "metacopy=off", "xino=off")
	kt := testutil.Snapshot(t, k)
	// Claims on the kernel's view, so that the test tests what it says.
	for _, c := range []struct {
		path string
		want bool
	}{{"cdev", true}, {"trusted-odd0/below", true}, {"user-odd3/below", true}, {"a7/m0", true}, {"c-opaque/mid", true}, {"c-opaque/bottom", false}, {"c-whiteout/bottom", false}, {"c-file/bottom", false}} {
		if _, got := kt[c.path]; got != c.want {
			t.Fatalf("control: the kernel view has %s: %v, want %v\n%s", c.path, got, c.want, kt)
		}
	}
	if n := kt["cdev"]; n.Type != "chardev" || n.Rdev != unix.Mkdev(1, 3) {
		t.Fatalf("control: the kernel shows cdev as %s %d:%d", n.Type, unix.Major(n.Rdev), unix.Minor(n.Rdev))
	}
	reportDiff(t, "goverlay vs the kernel overlay on malformed metadata", diffTrees(normalize(gt, never), normalize(kt, never), "goverlay", "kernel"))
}

// TestMalformedFormat: metadata only goverlay reads (the AUFS format), and
// redirects through a symlink. Every lookup must end, list and stat agree,
// no ".wh." name is ever listed, and nothing outside the layers shows: a
// redirect through a symlink merges nothing below. (Malformed redirects:
// TestMalformedRedirectLikeKernel.)
//   - A ".wh.NAME" entry hides NAME below whatever its type: a directory
//     ".wh.foo" hides foo as a file would. goverlay decides so (the kernel
//     does not read the AUFS format at all).
//   - A directory ".wh..wh..opq" inside a directory makes it opaque, as
//     the marker file does.
func TestMalformedFormat(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	base := t.TempDir()
	outside := filepath.Join(base, "x")
	for _, d := range []string{"x/ESCAPED-x", "etc/ESCAPED-etc", "x/sub/ESCAPED-sub"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := newStackIn(t, base, 3, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[1].File("foo", "hidden by the directory .wh.foo above", 0o644)
		l[0].Dir(".wh.foo", 0o755).File(".wh.foo/inside", "", 0o644)
		l[1].File("q/below", "hidden by the opaque marker directory", 0o644)
		l[0].File("q/own", "", 0o644).Dir("q/.wh..wh..opq", 0o755)
		l[0].File(".wh.", "", 0o644).File(".wh."+strings.Repeat("w", 251), "", 0o644)
		l[1].File("bar", "visible: .wh.bar is in the same layer", 0o644).File(".wh.bar", "", 0o644)
		l[2].File("x/m2", "", 0o644) // what "/../x" and "/./x" would reach inside the layers
		l[1].Symlink("lnk", outside)
		l[0].File("r-symlink/m0", "", 0o644).Xattr("r-symlink", "trusted.overlay.redirect", "/lnk/sub")
		l[2].File("r-symlink/m2", "", 0o644)
		l[0].File("r-dots/m0", "", 0o644).Xattr("r-dots", "trusted.overlay.redirect", "...")
		l[1].File(".../m1", "", 0o644)
	})
	for _, withUpper := range []bool{false, true} {
		t.Run(map[bool]string{false: "read-only", true: "with-upper"}[withUpper], func(t *testing.T) {
			o := testutil.Options{Lower: s.lower}
			if withUpper {
				o.Upper, o.Work = s.upper, s.work
			}
			m := testutil.MountWith(t, o, testutil.MountConfig{})
			var tr testutil.Tree
			m.Watchdog(t, 60*time.Second, func() { tr = testutil.Snapshot(t, m.Dir) })
			for _, p := range tr.Paths() {
				if strings.HasPrefix(filepath.Base(p), ".wh.") {
					t.Errorf("%q is listed", p)
				}
				if strings.Contains(p, "ESCAPED") {
					t.Errorf("%q is listed: a lookup left the layers", p)
				}
				for _, e := range tr[p].Errs {
					t.Errorf("%q: %s", p, e)
				}
			}
			names := func(dir string) string {
				var out []string
				for p := range subtree(tr, dir) {
					if p != "." && !strings.Contains(p, "/") {
						out = append(out, p)
					}
				}
				sort.Strings(out)
				return strings.Join(out, " ")
			}
			want := map[string]string{
				"q":         "own",
				"r-symlink": "m0",
				"r-dots":    "m0 m1",
			}
			for d, w := range want {
				if got := names(d); got != w {
					t.Errorf("%s lists %q, want %q", d, got, w)
				}
			}
			for _, p := range []string{"foo", ".wh.foo", ".wh.foo/inside", ".wh.", "q/below", ".wh..wh..opq"} {
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(m.Dir, p), &st); !errors.Is(err, unix.ENOENT) {
					t.Errorf("lstat %s: %v, want ENOENT", p, err)
				}
			}
			if tr["bar"] == nil {
				t.Errorf("bar is hidden by a .wh.bar beside it, in its own layer")
			}
			if withUpper {
				// Writes into the redirected directories: copy-up
				// must not carry a lower redirect up, nor follow it.
				for _, name := range []string{"r-symlink", "r-dots"} {
					if err := os.WriteFile(filepath.Join(m.Dir, name, "new"), []byte("new"), 0o644); err != nil {
						t.Errorf("create in %s: %v", name, err)
					}
				}
				up := testutil.UpperLayout(t, s.upper)
				for p, n := range up {
					if _, ok := n.Xattrs["trusted.overlay.redirect"]; ok {
						t.Errorf("upper %s has a redirect %q copied up", p, n.Xattrs["trusted.overlay.redirect"])
					}
				}
			}
			m.Unmount(t)
		})
	}
	// Nothing outside the layers was touched.
	for _, d := range []string{"x/ESCAPED-x", "etc/ESCAPED-etc", "x/sub/ESCAPED-sub"} {
		ents, err := os.ReadDir(filepath.Join(base, d))
		if err != nil || len(ents) != 0 {
			t.Errorf("%s changed: %v %v", d, ents, err)
		}
	}
}

// TestMalformedRedirectLikeKernel: redirects the kernel's format does not
// allow, answered as the kernel overlay answers them on the same layers:
// a lookup of the directory fails with EINVAL for a malformed value (empty,
// an empty component, a relative value with a "/"; Linux:
// ovl_get_redirect_xattr()) and EACCES for a "." or ".." it has to look up
// (lookup_one_len()), while its parent still lists it; a NUL ends the
// value; a redirect to a file merges nothing below; a malformed redirect
// in the bottom layer is never read. goverlay logs the failed lookups.
func TestMalformedRedirectLikeKernel(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	bad := map[string]string{
		"r-dotdot-rel":  "../../etc",
		"r-dotdot-abs":  "/../x",
		"r-dotdot-mid":  "/x/../x",
		"r-dotdot-only": "/..",
		"r-parent":      "..",
		"r-dot":         "/./x",
		"r-dot-rel":     ".",
		"r-double":      "//d",
		"r-subdir":      "d/sub",
		"r-trailing":    "/x/",
		"r-root":        "/",
		"r-empty":       "",
		"r-nul":         "/x\x00/../..",
		"r-nul-first":   "\x00x",
		"r-file":        "/f",
		"r-missing":     "/nowhere/../x", // ".." never looked up: the walk ends before
		"r-long":        "/" + strings.Repeat("y", 300),
	}
	build := func(l []*testutil.Layer, up *testutil.Layer) {
		l[1].File("f", "a file", 0o644)
		l[2].File("x/m2", "", 0o644)
		l[1].File("d/sub/s1", "", 0o644)
		for name, v := range bad {
			for i := range 3 {
				l[i].File(fmt.Sprintf("%s/m%d", name, i), "", 0o644)
			}
			if err := unix.Lsetxattr(l[0].P(name), "trusted.overlay.redirect", []byte(v), 0); err != nil {
				t.Fatalf("set redirect %q on %s: %v", v, name, err)
			}
		}
		// In the bottom layer, and in the middle of a chain.
		l[2].File("bottom/m2", "", 0o644).Xattr("bottom", "trusted.overlay.redirect", "a//b")
		l[0].File("chain/m0", "", 0o644).Xattr("chain", "trusted.overlay.redirect", "mid")
		l[1].File("mid/m1", "", 0o644).Xattr("mid", "trusted.overlay.redirect", "x/")
		// In the upper layer.
		up.File("u-bad/mu", "", 0o644).Xattr("u-bad", "trusted.overlay.redirect", "//u")
		up.File("u-dotdot/mu", "", 0o644).Xattr("u-dotdot", "trusted.overlay.redirect", "..")
		l[0].File("u-bad/m0", "", 0o644).File("u-dotdot/m0", "", 0o644)
	}
	s := newStack(t, 3, build)
	for _, withUpper := range []bool{false, true} {
		t.Run(map[bool]string{false: "read-only", true: "with-upper"}[withUpper], func(t *testing.T) {
			o := testutil.Options{Lower: s.lower}
			kopts := []string{"redirect_dir=follow", "index=off", "metacopy=off", "xino=off"}
			var kup, kwork string
			if withUpper {
				o.Upper, o.Work = s.upper, s.work
				kup, kwork = s.upper, t.TempDir()
				kopts[0] = "redirect_dir=on"
			}
			m := testutil.MountWith(t, o, testutil.MountConfig{})
			var gt testutil.Tree
			m.Watchdog(t, 60*time.Second, func() { gt = testutil.Snapshot(t, m.Dir) })
			m.Unmount(t)
			// Only the mounts' reads ran: the kernel may take the
			// same upper now.
			k := testutil.KernelOverlay(t, s.lower, kup, kwork, kopts...)
			kt := testutil.Snapshot(t, k)
			errOf := func(tr testutil.Tree, p string) string {
				if n := tr[p]; n != nil {
					return strings.Join(n.Errs, "; ")
				}
				return "absent"
			}
			// Claims on the kernel's view, so that the test tests what
			// it says.
			for p, want := range map[string]string{
				"r-dotdot-abs": "listed but lstat: permission denied",
				"r-parent":     "listed but lstat: permission denied",
				"r-double":     "listed but lstat: invalid argument",
				"r-subdir":     "listed but lstat: invalid argument",
				"r-empty":      "listed but lstat: invalid argument",
				"chain":        "listed but lstat: invalid argument",
				"r-file/m0":    "",
				"r-nul/m2":     "",
				"r-missing/m0": "",
				"bottom/m2":    "",
			} {
				if got := errOf(kt, p); got != want {
					t.Fatalf("control: the kernel view has %s: %q, want %q\n%s", p, got, want, kt)
				}
			}
			if withUpper && errOf(kt, "u-bad") != "listed but lstat: invalid argument" {
				t.Fatalf("control: the kernel view has u-bad: %q", errOf(kt, "u-bad"))
			}
			reportDiff(t, "goverlay vs the kernel overlay on malformed redirects", diffTrees(normalize(gt, never), normalize(kt, never), "goverlay", "kernel"))
			logged, _ := os.ReadFile(m.LogFile)
			if !strings.Contains(string(logged), "invalid redirect") && !strings.Contains(string(logged), "refused") {
				t.Errorf("no failed redirect in the log:\n%s", logged)
			}
		})
	}
}
