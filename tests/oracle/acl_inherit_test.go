package oracle_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// ACL inheritance: objects created in a directory with a default ACL get
// it (narrowed by the mode asked for) as their access ACL, directories as
// their default ACL too, and the umask does not apply; without a default
// ACL the umask does. The directories are all lower-only, so every first
// create copies its directory up, default ACL and all.

const (
	aclAccess  = "system.posix_acl_access"
	aclDefault = "system.posix_acl_default"
)

// aclDirs are the lower directories the script creates in: dm has a
// default ACL with a named user and group (and so a mask), dmr one whose
// mask is narrower than its group entry, dn one of the base entries only
// (no mask), plain none; deep/sub has one, deep not.
var aclDirs = []string{"dm", "dmr", "dn", "plain", "deep/sub"}

func aclLower(_ testing.TB, l *testutil.Layer) {
	for _, d := range aclDirs {
		l.Dir(d, 0o777)
	}
	l.Dir("deep", 0o755)
	l.Setfacl("dm", "-d", "-m", "u::rwx,g::r-x,o::r-x,u:1234:rwx,g:5678:r-x")
	l.Setfacl("dmr", "-n", "-d", "-m", "u::rwx,u:1234:rwx,g::rwx,m::r-x,o::rwx")
	l.Setfacl("dn", "-d", "-m", "u::rwx,g::r-x,o::---")
	l.Setfacl("deep/sub", "-d", "-m", "u::rwx,u:1234:r-x,g::rwx,o::---")
	l.File("deep/sub/old", "o", 0o644)
}

// aclCallers are who runs the creating shell, and with which umask: the
// name prefixes what each one creates.
var aclCallers = []struct {
	prefix string
	argv   []string
	umask  string
}{
	{"r022", []string{"env"}, "022"},
	{"r077", []string{"env"}, "077"},
	{"n022", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, "022"},
	{"n077", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, "077"},
}

// aclShell is what each caller runs in every directory: a file, a
// directory and a file in it, a FIFO, a symlink, and a directory asked for
// with restricted modes.
const aclShell = `set -e
for d in %s; do
	: > "$d/${P}f"
	mkdir "$d/${P}d"
	: > "$d/${P}d/f"
	mkfifo "$d/${P}p"
	ln -s target "$d/${P}l"
	(umask 0; mkdir "$d/${P}d0")
	mkdir -p "$d/${P}d0/x"
done`

func aclScript(t *testing.T, mnt string) {
	s := sh{t, mnt}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed (package util-linux)")
	}
	searchable(t, mnt)
	for _, c := range aclCallers {
		script := "umask " + c.umask + " && cd " + mnt + " && P=" + c.prefix + " && " + fmt.Sprintf(aclShell, strings.Join(aclDirs, " "))
		out, err := exec.Command(c.argv[0], append(c.argv[1:], "sh", "-c", script)...).CombinedOutput()
		s.ok(fmt.Sprintf("%s (umask %s): %s", c.argv[0], c.umask, out), err)
	}
	// O_TMPFILE, linked: it gets what a created file gets (the test
	// process's umask is 022). Not under a profile without FUSE_TMPFILE
	// (before Linux 6.0), where goverlay's O_TMPFILE fails as the
	// kernel's FUSE does then (EOPNOTSUPP): on neither mount, so that
	// the two trees still compare.
	for _, d := range tmpfileDirs(t) {
		fd, err := unix.Open(s.p(d), unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		if !s.ok("O_TMPFILE in "+d, err) {
			continue
		}
		s.ok("linkat "+d+"/tmpf", unix.Linkat(fd, "", unix.AT_FDCWD, s.p(d+"/tmpf"), unix.AT_EMPTY_PATH))
		unix.Close(fd)
	}
	// A later chmod narrows the ACL's mask, as on any filesystem.
	s.ok("chmod dm/r022f", unix.Chmod(s.p("dm/r022f"), 0o640))
}

// searchable lets every user through the directories above mnt, which
// t.TempDir() makes 0700.
func searchable(t *testing.T, mnt string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for d := filepath.Dir(mnt); strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(d, st.Mode&0o7777|0o011); err != nil {
			t.Fatal(err)
		}
	}
}

func aclCheck(t testing.TB, kt testutil.Tree) {
	mode := func(p string) uint32 {
		if kt[p] == nil {
			return 0xffff
		}
		return kt[p].Mode
	}
	has := func(p, x string) bool { return kt[p] != nil && kt[p].Xattrs[x] != "" }
	for _, p := range []string{"r022", "r077", "n022", "n077"} {
		// The ACL, not the umask: u::rw-, m::rw-, o::r--.
		claim(t, mode("dm/"+p+"f") == 0o664 || p == "r022", "dm/%sf: mode %#o, want 0664", p, mode("dm/"+p+"f"))
		claim(t, has("dm/"+p+"f", aclAccess) && !has("dm/"+p+"f", aclDefault), "dm/%sf: ACLs %q", p, kt["dm/"+p+"f"].Xattrs)
		claim(t, has("dm/"+p+"d", aclAccess) && has("dm/"+p+"d", aclDefault) && mode("dm/"+p+"d") == 0o775, "dm/%sd: %#o %q", p, mode("dm/"+p+"d"), kt["dm/"+p+"d"].Xattrs)
		claim(t, has("dm/"+p+"d/f", aclAccess), "dm/%sd/f has no ACL", p)
		claim(t, has("dm/"+p+"p", aclAccess), "dm/%sp has no ACL", p)
		claim(t, kt["dm/"+p+"l"] != nil && len(kt["dm/"+p+"l"].Xattrs) == 0, "dm/%sl has xattrs", p)
		// The mask narrows the group bits: m::r-x & rw- = r--.
		claim(t, mode("dmr/"+p+"f") == 0o646, "dmr/%sf: mode %#o, want 0646", p, mode("dmr/"+p+"f"))
		// Base entries only: no access ACL, the ACL's modes all the same.
		claim(t, mode("dn/"+p+"f") == 0o640 && !has("dn/"+p+"f", aclAccess), "dn/%sf: %#o %q", p, mode("dn/"+p+"f"), kt["dn/"+p+"f"].Xattrs)
		claim(t, mode("dn/"+p+"d") == 0o750 && has("dn/"+p+"d", aclDefault), "dn/%sd: %#o", p, mode("dn/"+p+"d"))
		claim(t, has("deep/sub/"+p+"f", aclAccess), "deep/sub/%sf has no ACL", p)
		claim(t, mode("plain/"+p+"d0") == 0o777, "plain/%sd0: mode %#o, want 0777 (umask 0)", p, mode("plain/"+p+"d0"))
	}
	claim(t, mode("dm/r022f") == 0o640, "dm/r022f after chmod 0640: %#o", mode("dm/r022f"))
	claim(t, mode("plain/r022f") == 0o644 && mode("plain/r077f") == 0o600 && mode("plain/r077d") == 0o700, "plain: the umask applies")
	claim(t, len(kt["plain/r022f"].Xattrs) == 0, "plain/r022f: %q", kt["plain/r022f"].Xattrs)
	claim(t, kt["dm/n077f"] != nil && kt["dm/n077f"].UID == 65534, "dm/n077f not nobody's")
	if len(tmpfileDirs(t)) > 0 {
		claim(t, has("dm/tmpf", aclAccess) && mode("dm/tmpf") == 0o664 && mode("plain/tmpf") == 0o644, "tmpf: %#o %#o", mode("dm/tmpf"), mode("plain/tmpf"))
	}
}

// tmpfileDirs are the directories the script makes an O_TMPFILE file in:
// none where GOVERLAY_TEST_MASK hides FUSE_TMPFILE.
func tmpfileDirs(t testing.TB) []string {
	if testutil.Masked(t, "tmpfile") {
		return nil
	}
	return []string{"dm", "plain"}
}

// TestACLInherit runs the ACL script on the kernel overlay and on
// goverlay, both ways (TestWriteScenarios): merged views, upper layouts,
// and each overlay over the other's upper.
func TestACLInherit(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	sc := wscenario{name: "acl-inherit", lower: aclLower, run: aclScript, check: aclCheck}
	t.Run("A", func(t *testing.T) { directionA(t, sc) })
	t.Run("B", func(t *testing.T) { directionB(t, sc) })
}

// TestACLInheritNoACL: with -o noacl nothing is inherited and the umask
// applies everywhere; every create still works.
func TestACLInheritNoACL(t *testing.T) {
	testutil.RequireRoot(t)
	sc := wscenario{name: "acl-noacl", lower: aclLower}
	st := newWStack(t, sc)
	g := testutil.Mount(t, testutil.Options{Lower: []string{st.lower}, Upper: st.upper, Work: st.work, Extra: []string{"-o", "noacl"}})
	aclScript(t, g.Dir)
	gt := testutil.Snapshot(t, g.Dir)
	for _, d := range aclDirs {
		for _, c := range aclCallers {
			u, err := strconv.ParseUint(c.umask, 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			for name, asked := range map[string]uint32{"f": 0o666, "d": 0o777, "d/f": 0o666, "p": 0o666, "d0": 0o777} {
				p := d + "/" + c.prefix + name
				n := gt[p]
				if n == nil {
					t.Errorf("%s missing", p)
					continue
				}
				want := asked &^ uint32(u)
				if name == "d0" {
					want = asked
				}
				if p == "dm/r022f" {
					want = 0o640
				}
				if n.Mode != want || n.Xattrs[aclAccess] != "" || n.Xattrs[aclDefault] != "" {
					t.Errorf("%s: mode %#o, xattrs %q; want %#o and no ACL", p, n.Mode, n.Xattrs, want)
				}
			}
		}
	}
	if n := gt["dm/tmpf"]; len(tmpfileDirs(t)) > 0 && (n == nil || n.Mode != 0o644 || len(n.Xattrs) != 0) {
		t.Errorf("dm/tmpf: %+v, want 0644 without ACL", n)
	}
}
