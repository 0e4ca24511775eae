package overlay

import (
	"os"
	"testing"
)

// TestKeptIDsGoWithDirectories: the identity kept for a directory moved
// with a redirect goes when the directory is removed, and moving it again
// does not add one: the table does not grow with what no longer exists.
func TestKeptIDsGoWithDirectories(t *testing.T) {
	lo := t.TempDir()
	for _, d := range []string{"a", "b"} {
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
}
