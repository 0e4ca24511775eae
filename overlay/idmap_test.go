package overlay

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func owner(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func TestParseIDMaps(t *testing.T) {
	for _, bad := range []string{"", "1:2", "a:b:c", "0:0:0", "4294967295:0:2", "1:2:3:4"} {
		if _, err := ParseIDMaps(bad); err == nil {
			t.Errorf("ParseIDMaps(%q) accepted", bad)
		}
	}
	m, err := ParseIDMaps(":0:100000:65536:65536:1:1") // containers/storage's form
	if err != nil || len(m) != 2 || m[1] != (IDMap{Disk: 65536, Shown: 1, Len: 1}) {
		t.Errorf("got %v %v", m, err)
	}
}

// TestUIDMapping follows fuse-overlayfs with containers/storage's
// uidmapping=0:100000:65536: on-disk 0 is shown as 100000, and an owner
// given through the mount is stored mapped back; an id outside the
// mapping is the overflow id.
func TestUIDMapping(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/root0", "x")
	write(t, lo+"/u5", "x")
	os.Chown(lo+"/u5", 5, 5)
	up, work := t.TempDir(), t.TempDir()
	m := []IDMap{{Disk: 0, Shown: 100000, Len: 65536}}
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work, Owners: Owners{UIDs: m, GIDs: m}})
	if u, g := owner(t, mnt+"/root0"); u != 100000 || g != 100000 {
		t.Errorf("root0 shown as %d:%d, want 100000:100000", u, g)
	}
	if u, _ := owner(t, mnt+"/u5"); u != 100005 {
		t.Errorf("u5 shown as %d, want 100005", u)
	}
	if err := os.Chown(mnt+"/root0", 100003, 100003); err != nil {
		t.Fatal(err)
	}
	if u, g := owner(t, up+"/root0"); u != 3 || g != 3 {
		t.Errorf("chown 100003 stored as %d:%d, want 3:3", u, g)
	}
	// The test runs as uid 0, which the mapping does not cover.
	if err := os.WriteFile(mnt+"/new", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if u, _ := owner(t, up+"/new"); u != overflowUID {
		t.Errorf("a file made by unmapped uid 0 stored as %d, want the overflow uid %d", u, overflowUID)
	}
}

func TestSquash(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/f", "x")
	os.Chown(lo+"/f", 5, 6)
	up, work := t.TempDir(), t.TempDir()
	uid := uint32(1000)
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work, Owners: Owners{SquashUID: &uid}})
	if u, g := owner(t, mnt+"/f"); u != 1000 || g != 6 {
		t.Errorf("f shown as %d:%d, want 1000:6", u, g)
	}
	// chown still happens on disk (fuse-overlayfs does it too), and the
	// file still shows the squashed owner.
	if err := os.Chown(mnt+"/f", 7, 8); err != nil {
		t.Errorf("chown on a squashed mount: %v, want success", err)
	}
	if u, g := owner(t, up+"/f"); u != 7 || g != 8 {
		t.Errorf("squashed chown stored %d:%d, want 7:8", u, g)
	}
	if u, g := owner(t, mnt+"/f"); u != 1000 || g != 8 {
		t.Errorf("f shown as %d:%d after chown, want 1000:8", u, g)
	}
}

// TestACLIDMapping: with uidmapping=/gidmapping=, the named entries of an
// ACL are shown and stored mapped, as owners are, so that the kernel, which
// checks callers against what the mount shows, lets in the user an ACL
// names (fuse-overlayfs 1.10 leaves ACL ids as they are on disk). An id no
// map covers shows as the overflow id and cannot be set.
func TestACLIDMapping(t *testing.T) {
	for _, tool := range []string{"setfacl", "getfacl", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	lo := openDir(t)
	write(t, lo+"/secret", "s")
	os.Chmod(lo+"/secret", 0o600) // owned 0:0 on disk: shown as 100000
	write(t, lo+"/odd", "o")
	os.Mkdir(lo+"/d", 0o755)
	for _, c := range [][]string{
		{"-m", "u:1000:r,g:2000:r", lo + "/secret"},
		{"-m", "u:70000:r", lo + "/odd"}, // beyond the mapping
		{"-d", "-m", "u:1000:rwx", lo + "/d"},
	} {
		if out, err := exec.Command("setfacl", c...).CombinedOutput(); err != nil {
			t.Skipf("setfacl %v: %v: %s", c, err, out)
		}
	}
	up, work := openDir(t), openDir(t)
	m := []IDMap{{Disk: 0, Shown: 100000, Len: 65536}}
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, AllowOther: true, Owners: Owners{UIDs: m, GIDs: m}})
	named := func(path string) string {
		t.Helper()
		out, err := exec.Command("getfacl", "-n", "-E", "--omit-header", path).CombinedOutput()
		if err != nil {
			t.Fatalf("getfacl %s: %v: %s", path, err, out)
		}
		var es []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "user:") || strings.HasPrefix(l, "group:") || strings.HasPrefix(l, "default:user:") {
				if f := strings.Split(l, ":"); f[len(f)-2] != "" {
					es = append(es, strings.Join(f[:len(f)-1], ":"))
				}
			}
		}
		return strings.Join(es, ",")
	}
	if got := named(mnt + "/secret"); got != "user:101000,group:102000" {
		t.Errorf("named entries of secret through the mount: %q, want user:101000,group:102000", got)
	}
	if got, want := named(mnt+"/odd"), fmt.Sprintf("user:%d", overflowUID); got != want {
		t.Errorf("an ACL naming an unmapped id shows %q, want %q", got, want)
	}
	if got := named(mnt + "/d"); got != "default:user:101000" {
		t.Errorf("default ACL of d through the mount: %q, want default:user:101000", got)
	}

	// The kernel checks callers against what the mount shows.
	cat := func(uid int) error {
		u := strconv.Itoa(uid)
		return exec.Command("setpriv", "--reuid="+u, "--regid="+u, "--clear-groups", "cat", mnt+"/secret").Run()
	}
	if err := cat(101000); err != nil {
		t.Errorf("uid 101000, named by secret's ACL (1000 on disk), reading it: %v", err)
	}
	if err := cat(101001); err == nil {
		t.Errorf("uid 101001, not in secret's ACL, could read it")
	}

	// Set through the mount: stored mapped back; an unmapped id refused.
	if out, err := exec.Command("setfacl", "-m", "u:101500:r", mnt+"/secret").CombinedOutput(); err != nil {
		t.Fatalf("setfacl u:101500 through the mount: %v: %s", err, out)
	}
	if got := named(up + "/secret"); got != "user:1000,user:1500,group:2000" {
		t.Errorf("secret's ACL on disk after setfacl u:101500: %q, want user:1000,user:1500,group:2000", got)
	}
	if got := named(mnt + "/secret"); got != "user:101000,user:101500,group:102000" {
		t.Errorf("secret's ACL through the mount after setfacl: %q", got)
	}
	if out, err := exec.Command("setfacl", "-m", "u:50:r", mnt+"/secret").CombinedOutput(); err == nil {
		t.Errorf("setfacl u:50 (no mapping) through the mount succeeded: %s", out)
	}

	// Inherited from the default ACL: ids copied on disk, shown mapped.
	write(t, mnt+"/d/new", "n")
	if got := named(up + "/d/new"); got != "user:1000" {
		t.Errorf("d/new's inherited ACL on disk: %q, want user:1000", got)
	}
	if got := named(mnt + "/d/new"); got != "user:101000" {
		t.Errorf("d/new's inherited ACL through the mount: %q, want user:101000", got)
	}
}
