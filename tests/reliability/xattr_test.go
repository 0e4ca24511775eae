package reliability_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestPrivateXattrsUnreachable: the overlay's own xattrs (trusted.overlay.*,
// user.overlay.*) can be neither listed, read, set nor removed through the
// mount, by root or by an unprivileged user (setpriv --reuid=65534 running
// getfattr and setfattr), on files and directories, in the lower layer or
// already copied up; a copy-up does not carry them along; and the
// attempts leave the layers exactly as they were.
func TestPrivateXattrsUnreachable(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	const nobody = 65534
	s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("f", "f", 0o666).
			Xattr("f", "trusted.overlay.secret", "t-secret").Xattr("f", "user.overlay.secret", "u-secret").Xattr("f", "user.normal", "ok").
			File("mine", "owned by nobody", 0o644).Chown("mine", nobody, nobody).
			Xattr("mine", "user.overlay.redirect", "/x").Xattr("mine", "trusted.overlay.origin", "o").
			Dir("d", 0o777).Chown("d", nobody, nobody).Opaque("d").Xattr("d", "user.overlay.opaque", "y").File("d/in", "", 0o644).
			File("copied", "c", 0o644).Xattr("copied", "trusted.overlay.secret", "t").Xattr("copied", "user.overlay.secret", "u")
	})
	testutil.OpenUp(t, s.base)
	m := mountG(t, s)
	p := func(rel string) string { return filepath.Join(m.Dir, rel) }
	// A copy-up does not carry the private xattrs.
	if err := unix.Chmod(p("copied"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := testutil.UpperLayout(t, s.upper)["copied"]; n == nil {
		t.Fatalf("copied was not copied up")
	} else {
		for x := range n.Xattrs {
			if x == "trusted.overlay.secret" || x == "user.overlay.secret" {
				t.Errorf("the copy-up carried %s to the upper layer", x)
			}
		}
	}
	lowerBefore := testutil.UpperLayout(t, s.lower[0])
	upperBefore := testutil.UpperLayout(t, s.upper)

	private := []string{"trusted.overlay.secret", "user.overlay.secret", "trusted.overlay.opaque", "user.overlay.opaque",
		"trusted.overlay.redirect", "user.overlay.redirect", "trusted.overlay.origin", "trusted.overlay.goverlay.ino"}
	buf := make([]byte, 4096)
	for _, f := range []string{"f", "mine", "d", "copied", "."} {
		n, err := unix.Llistxattr(p(f), buf)
		if err != nil {
			t.Errorf("llistxattr %s: %v", f, err)
		}
		for _, x := range strings.Split(string(buf[:max(n, 0)]), "\x00") {
			if testutil.IsPrivateXattr(x) {
				t.Errorf("root: llistxattr %s lists %s", f, x)
			}
		}
		for _, x := range private {
			if n, err := unix.Lgetxattr(p(f), x, buf); err == nil {
				t.Errorf("root: lgetxattr %s %s = %q", f, x, buf[:n])
			}
			if err := unix.Lsetxattr(p(f), x, []byte("y"), 0); err == nil {
				t.Errorf("root: lsetxattr %s %s succeeded", f, x)
			}
			if err := unix.Lremovexattr(p(f), x); err == nil {
				t.Errorf("root: lremovexattr %s %s succeeded", f, x)
			}
		}
	}
	if n, err := unix.Lgetxattr(p("f"), "user.normal", buf); err != nil || string(buf[:n]) != "ok" {
		t.Errorf("control: user.normal of f = %q, %v", buf[:max(n, 0)], err)
	}

	// An unprivileged user, through setpriv and the attr tools.
	for _, tool := range []string{"setpriv", "getfattr", "setfattr"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	as := func(args ...string) testutil.Result {
		t.Helper()
		return testutil.Run(t, 30*time.Second, nil, "setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}, args...)...)
	}
	if r := as("getfattr", "-n", "user.normal", p("f")); r.Code != 0 {
		t.Fatalf("control: nobody cannot read user.normal of f: %s", r)
	}
	for _, f := range []string{"f", "mine", "d"} {
		r := as("getfattr", "-h", "-d", "-m", "-", "--absolute-names", p(f))
		if strings.Contains(r.Stdout, "overlay.") {
			t.Errorf("nobody: getfattr -d %s shows %q", f, r.Stdout)
		}
		for _, x := range private {
			if r := as("getfattr", "-h", "-n", x, "--absolute-names", p(f)); r.Code == 0 || strings.Contains(r.Stdout, "secret") {
				t.Errorf("nobody: getfattr -n %s %s: %s", x, f, r)
			}
			if r := as("setfattr", "-h", "-n", x, "-v", "y", p(f)); r.Code == 0 {
				t.Errorf("nobody: setfattr -n %s %s succeeded", x, f)
			}
			if r := as("setfattr", "-h", "-x", x, p(f)); r.Code == 0 {
				t.Errorf("nobody: setfattr -x %s %s succeeded", x, f)
			}
		}
	}
	// Control: nobody may set an ordinary user xattr on its own file.
	if r := as("setfattr", "-n", "user.mine", "-v", "1", p("mine")); r.Code != 0 {
		t.Errorf("control: nobody cannot set user.mine on its own file: %s", r)
	}
	m.Unmount(t)

	reportDiff(t, "the lower layer after the attempts", testutil.DiffWith(lowerBefore, testutil.UpperLayout(t, s.lower[0]), testutil.DiffOptions{A: "before", B: "after"}))
	// The upper layer changed only by the copy-up of mine for user.mine.
	upperAfter := testutil.UpperLayout(t, s.upper)
	for path, n := range upperAfter {
		before := upperBefore[path]
		for x, v := range n.Xattrs {
			if !testutil.IsPrivateXattr(x) || strings.HasPrefix(x, "trusted.overlay.goverlay.") {
				continue
			}
			if before == nil || before.Xattrs[x] != v {
				t.Errorf("upper %s: %s=%q appeared through the mount", path, x, v)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(s.upper, "mine")); err != nil {
		t.Errorf("control: the user.mine change did not copy mine up: %v", err)
	}
}
