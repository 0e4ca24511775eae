package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSmallFDCache runs a walk, copy-ups, renames and a redirect through a
// mount whose directory fd cache holds 2 fds: every directory fd is closed
// and reopened from its parent many times, and the view must not change.
func TestSmallFDCache(t *testing.T) {
	lo := t.TempDir()
	for i := 0; i < 20; i++ {
		write(t, fmt.Sprintf("%s/d%d/e/f", lo, i), fmt.Sprint(i))
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: t.TempDir(), Work: t.TempDir()})
	f.caches.SetFDCacheSize(2)
	count := 0
	err := filepath.Walk(mnt, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			count++
		}
		return nil
	})
	if err != nil || count != 20 {
		t.Fatalf("walk: %d files, %v", count, err)
	}
	for i := 0; i < 20; i += 2 {
		p := fmt.Sprintf("%s/d%d/e/f", mnt, i)
		if err := os.WriteFile(p, []byte("w"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(mnt+"/d1", mnt+"/moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt+"/new", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(mnt+"/new", mnt+"/d2/e/new"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mnt+"/d2/e/new/g", []byte("g"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("d%d", i)
		if i == 1 {
			name = "moved"
		}
		want := fmt.Sprint(i)
		if i%2 == 0 {
			want = "w"
		}
		if got := readFile(t, mnt+"/"+name+"/e/f"); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if got := readFile(t, mnt+"/d2/e/new/g"); got != "g" {
		t.Errorf("g: %q", got)
	}
	if got := strings.Join(names(t, mnt+"/moved/e"), " "); got != "f" {
		t.Errorf("moved/e: %q", got)
	}
	if n := f.caches.OpenDirFDs(); n > 2 {
		t.Errorf("%d idle directory fds open, cache holds 2", n)
	}
}
