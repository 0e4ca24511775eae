package overlay

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDirFactsGeneration: a reading taken before a change and remembered
// after it is dropped; one taken after it is kept.
func TestDirFactsGeneration(t *testing.T) {
	var n node
	known, w := n.dirFact(factNoSetgid)
	if known {
		t.Fatal("a new node knows a fact")
	}
	n.forgetDirFacts()
	n.rememberDirFact(w, factNoSetgid)
	if known, _ := n.dirFact(factNoSetgid); known {
		t.Error("a reading from before forgetDirFacts was kept")
	}
	_, w = n.dirFact(factNoSetgid)
	n.rememberDirFact(w, factNoSetgid)
	n.rememberDirFact(w, factNoDefaultACL)
	if known, _ := n.dirFact(factNoSetgid); !known {
		t.Error("factNoSetgid not kept")
	}
	if known, _ := n.dirFact(factNoDefaultACL); !known {
		t.Error("factNoDefaultACL not kept beside factNoSetgid")
	}
	n.rememberDirFact(w, factMadeHere)
	n.forgetDirFacts()
	if n.dirFacts.Load()&(factNoSetgid|factNoDefaultACL) != 0 {
		t.Error("forgetDirFacts left a fact")
	}
	if known, _ := n.dirFact(factMadeHere); !known {
		t.Error("forgetDirFacts dropped factMadeHere")
	}
}

// TestDirFactsFollowChanges: files created in a directory before and after
// it becomes setgid, gets a default ACL, and loses both, through the
// mount, take the group and ACL the directory has at that moment.
func TestDirFactsFollowChanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown to another group")
	}
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Skip("setfacl not installed")
	}
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.Mkdir(lo+"/d", 0o755); err != nil {
		t.Fatal(err)
	}
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn})
	d := mnt + "/d"
	check := func(name string, gid uint32, acl bool) {
		t.Helper()
		if err := os.WriteFile(d+"/"+name, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(d+"/"+name+".d", 0o755); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{up + "/d/" + name, up + "/d/" + name + ".d"} {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			if st.Gid != gid {
				t.Errorf("%s: group %d, want %d", p, st.Gid, gid)
			}
			isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
			if sgid := st.Mode&unix.S_ISGID != 0; isDir && sgid != (gid != 0) {
				t.Errorf("%s: setgid %v, want %v", p, sgid, gid != 0)
			}
			_, err := unix.Lgetxattr(p, "system.posix_acl_access", nil)
			if has := err == nil; has != acl {
				t.Errorf("%s: access ACL %v (%v), want %v", p, has, err, acl)
			}
		}
	}
	setfacl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("setfacl", append(args, d)...).CombinedOutput(); err != nil {
			t.Fatalf("setfacl %v: %v: %s", args, err, out)
		}
	}
	check("plain1", 0, false)
	check("plain2", 0, false) // facts remembered
	if err := os.Chown(d, 0, 4321); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(d, 0o2755); err != nil {
		t.Fatal(err)
	}
	check("setgid", 4321, false)
	if err := unix.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, 0, 0); err != nil {
		t.Fatal(err)
	}
	check("plain3", 0, false)
	setfacl("-d", "-m", "u:1234:rwx")
	check("acl", 0, true)
	setfacl("-k")
	check("plain4", 0, false)
}
