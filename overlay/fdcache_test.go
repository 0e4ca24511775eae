package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// TestFDBudget: a mount given an fd budget sizes its caches from it, not
// from RLIMIT_NOFILE: a walk through more directories, and reads of more
// files opened without a request, than its share allows keep no more of
// either open than the share.
func TestFDBudget(t *testing.T) {
	const budget, dirFDs, fileFDs = 256, 64, 32
	lo := t.TempDir()
	for i := 0; i < 3*dirFDs; i++ {
		write(t, fmt.Sprintf("%s/d%03d/f", lo, i), fmt.Sprint(i))
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: t.TempDir(), Work: t.TempDir(), FDBudget: budget})
	if !f.io.noOpen {
		t.Fatalf("files open with a request (%s); the test reads through the ring of noopen.go", f.io.why)
	}
	for i := 0; i < 3*dirFDs; i++ {
		if got, want := readFile(t, fmt.Sprintf("%s/d%03d/f", mnt, i)), fmt.Sprint(i); got != want {
			t.Fatalf("d%03d/f: %q, want %q", i, got, want)
		}
	}
	if n := f.caches.OpenDirFDs(); n > dirFDs {
		t.Errorf("%d directory fds open with a budget of %d (a quarter for directories)", n, budget)
	}
	f.fds.mu.Lock()
	ring := len(f.fds.nodes)
	f.fds.mu.Unlock()
	if ring != fileFDs {
		t.Errorf("room for %d files' fds with a budget of %d, want an eighth: %d", ring, budget, fileFDs)
	}
}

// TestRingSize: the ring of files opened without a request takes an eighth
// of the budget, within 16 and 1,024; without a budget, as before, an
// eighth of RLIMIT_NOFILE.
func TestRingSize(t *testing.T) {
	for _, c := range []struct{ budget, want int }{{1, 16}, {128, 16}, {800, 100}, {16 << 10, 1024}} {
		if got := ringSize(c.budget); got != c.want {
			t.Errorf("ringSize(%d) = %d, want %d", c.budget, got, c.want)
		}
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if got, want := ringSize(0), int(min(max(rl.Cur/8, 16), 1024)); got != want {
		t.Errorf("ringSize(0) = %d, want %d (RLIMIT_NOFILE %d)", got, want, rl.Cur)
	}
	if _, err := New(Options{Lower: []string{t.TempDir()}, FDBudget: -1}); err == nil {
		t.Error("New took a negative fd budget")
	}
}
