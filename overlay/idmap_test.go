package overlay

import (
	"os"
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
