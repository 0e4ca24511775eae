package cli_test

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

const testUser = "goverlaytest"

// unprivileged returns the uid and gid of the test user, creating it (no
// home directory) if needed.
func unprivileged(t *testing.T) (uid, gid int) {
	t.Helper()
	for _, tool := range []string{"setpriv", "useradd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	u, err := user.Lookup(testUser)
	if err != nil {
		if out, err := exec.Command("useradd", "-M", "-s", "/usr/sbin/nologin", testUser).CombinedOutput(); err != nil && !strings.Contains(string(out), "exists") {
			t.Fatalf("useradd %s: %v: %s", testUser, err, out)
		}
		if u, err = user.Lookup(testUser); err != nil {
			t.Fatal(err)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// readAs runs cat FILE as uid:gid without supplementary groups.
func readAs(t *testing.T, uid, gid int, file string) testutil.Result {
	t.Helper()
	return testutil.Run(t, cmdTimeout, nil, "setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(gid), "--clear-groups", "cat", file)
}

// openUp makes the directories above dir searchable by everyone
// (t.TempDir makes them 0700).
func openUp(t *testing.T, dir string) {
	t.Helper()
	for d := filepath.Dir(dir); d != "/" && strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
}

type access struct {
	file    string
	allowed bool
}

// TestUnprivilegedRead: the kernel checks the layers' modes for other
// users (default_permissions, allow_other as root), as on the kernel
// overlay: a 0644 file is readable, a 0600 one is not.
func TestUnprivilegedRead(t *testing.T) {
	checkAccess(t, []access{
		{"public", true},
		{"private", false},
		{"private-dir/file", false},
		{"owned", true},
	})
}

// TestUnprivilegedReadACL: an ACL entry grants access past the mode, as on
// the kernel overlay.
func TestUnprivilegedReadACL(t *testing.T) {
	checkAccess(t, []access{
		{"acl-granted", true},
		{"acl-denied", false},
	})
}

// checkAccess reads each file as the test user through a kernel overlay
// (the control) and through goverlay, over the same layers.
func checkAccess(t *testing.T, cases []access) {
	testutil.RequireRoot(t)
	t.Parallel()
	uid, gid := unprivileged(t)
	// Two layers: the kernel wants two lowers without an upper.
	build := func(dir string) []string {
		bottom := testutil.NewLayer(t, dir+"-bottom").File("bottom", "b\n", 0o644)
		l := testutil.NewLayer(t, dir)
		l.File("public", "public\n", 0o644)
		l.File("private", "private\n", 0o600)
		l.File("private-dir/file", "behind a 0700 dir\n", 0o644).Chmod("private-dir", 0o700)
		l.File("owned", "owned by the user\n", 0o600).Chown("owned", uid, gid)
		l.File("acl-granted", "granted by an ACL\n", 0o600).Setfacl("acl-granted", "-m", "u:"+strconv.Itoa(uid)+":r--")
		l.File("acl-denied", "denied by an ACL\n", 0o644).Setfacl("acl-denied", "-m", "u:"+strconv.Itoa(uid)+":---")
		return []string{l.Root, bottom.Root}
	}
	kernel := testutil.KernelOverlay(t, build(filepath.Join(t.TempDir(), "klower")), "", "")
	m := testutil.Mount(t, testutil.Options{Lower: build(filepath.Join(t.TempDir(), "glower"))})
	openUp(t, kernel)
	openUp(t, m.Dir)
	for _, c := range cases {
		k := readAs(t, uid, gid, filepath.Join(kernel, c.file))
		if (k.Code == 0) != c.allowed {
			t.Fatalf("control: %s on the kernel overlay as uid %d: %s", c.file, uid, k)
		}
		g := readAs(t, uid, gid, filepath.Join(m.Dir, c.file))
		switch {
		case c.allowed && g.Code != 0:
			t.Errorf("%s as uid %d: %s; want it readable, as on the kernel overlay", c.file, uid, g)
		case !c.allowed && g.Code == 0:
			t.Errorf("%s as uid %d: readable (%q); want permission denied, as on the kernel overlay", c.file, uid, g.Stdout)
		case !c.allowed && !strings.Contains(g.Stderr, "Permission denied"):
			t.Errorf("%s as uid %d: %s; want permission denied", c.file, uid, g)
		case c.allowed && g.Stdout != k.Stdout:
			t.Errorf("%s as uid %d: read %q, kernel %q", c.file, uid, g.Stdout, k.Stdout)
		}
	}
}
