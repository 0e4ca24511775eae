package overlay

import (
	"os"
	"syscall"
	"testing"
)

// TestKeptIDsGoWithDirectories: the identity kept for a directory moved
// with a redirect goes when the directory is removed or a rename replaces
// it, and moving it again does not add one: the table does not grow with
// what no longer exists.
func TestKeptIDsGoWithDirectories(t *testing.T) {
	lo := t.TempDir()
	for _, d := range []string{"a", "b", "c", "d"} {
		if err := os.Mkdir(lo+"/"+d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: t.TempDir(), Work: t.TempDir()})
	for _, mv := range [][2]string{{"a", "a2"}, {"a2", "a3"}, {"b", "b2"}} {
		if err := os.Rename(mnt+"/"+mv[0], mnt+"/"+mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if n := syncMapLen(&f.keptIDs); n != 2 {
		t.Fatalf("%d identities kept after moving two directories (one twice), want 2", n)
	}
	for _, d := range []string{"a3", "b2"} {
		if err := os.Remove(mnt + "/" + d); err != nil {
			t.Fatal(err)
		}
	}
	if n := syncMapLen(&f.keptIDs); n != 0 {
		t.Errorf("%d identities kept after removing the moved directories, want 0", n)
	}
	// c, moved, is replaced by d, moved over it: only d's identity
	// stays. (rename(2) itself: os.Rename refuses a directory target.)
	for _, mv := range [][2]string{{"c", "c2"}, {"d", "c2"}} {
		if err := syscall.Rename(mnt+"/"+mv[0], mnt+"/"+mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if n := syncMapLen(&f.keptIDs); n != 1 {
		t.Errorf("%d identities kept after a moved directory replaced another, want 1", n)
	}
	if err := os.Remove(mnt + "/c2"); err != nil {
		t.Fatal(err)
	}
	if n := syncMapLen(&f.keptIDs); n != 0 {
		t.Errorf("%d identities kept after removing the last moved directory, want 0", n)
	}
}
