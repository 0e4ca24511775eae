package overlay

import (
	"fmt"
	"os"
	"slices"
	"testing"
)

// lsl lists dir and stats every entry, as ls -l and find do.
func lsl(t *testing.T, dir string) []string {
	t.Helper()
	got := names(t, dir)
	for _, n := range got {
		if _, err := os.Lstat(dir + "/" + n); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestReaddirCached: a warm listing of a merged directory is served by the
// kernel's readdir cache, without a lookup per entry in the daemon, and a
// change through the mount (create, unlink, rename in and out, mkdir,
// rmdir, a copy-up that leaves the listing alone) is seen by the next
// listing at once.
func TestReaddirCached(t *testing.T) {
	l := listingLayers(t)
	for i := 0; i < 50; i++ {
		write(t, fmt.Sprintf("%s/d/many%02d", l[i%3], i), "x")
	}
	mnt, _, f := nosecMount(t, NoSecInherit, false, l...)
	d := mnt + "/d"
	want := lsl(t, d)
	var n uint64
	if !undisturbed(t, func() bool {
		lsl(t, d)
		before := f.Stats().Lookups
		for i := 0; i < 3; i++ {
			if got := lsl(t, d); !slices.Equal(got, want) {
				t.Fatalf("warm listing %q, want %q", got, want)
			}
		}
		n = f.Stats().Lookups - before
		return true
	}) {
		t.Skip("other tests dropped the caches during every try: nothing to measure")
	}
	if n != 0 {
		t.Errorf("3 warm listings of %d entries cost %d lookups in the daemon, want 0 (the kernel's readdir cache)", len(want), n)
	}

	change := func(what string, fn func() error, add, remove []string) {
		t.Helper()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, n := range remove {
			want = slices.DeleteFunc(want, func(s string) bool { return s == n })
		}
		want = append(want, add...)
		slices.Sort(want)
		if got := names(t, d); !slices.Equal(got, want) {
			t.Errorf("after %s: %q, want %q", what, got, want)
		}
	}
	change("create", func() error { return os.WriteFile(d+"/new", nil, 0o644) }, []string{"new"}, nil)
	change("unlink of a lower file", func() error { return os.Remove(d + "/many07") }, nil, []string{"many07"})
	change("rename within", func() error { return os.Rename(d+"/many08", d+"/moved") }, []string{"moved"}, []string{"many08"})
	change("rename out", func() error { return os.Rename(d+"/many09", mnt+"/out") }, nil, []string{"many09"})
	change("rename in", func() error { return os.Rename(mnt+"/out", d+"/back") }, []string{"back"}, nil)
	change("mkdir", func() error { return os.Mkdir(d+"/newdir", 0o755) }, []string{"newdir"}, nil)
	change("rmdir of a lower directory", func() error { return os.RemoveAll(d + "/sub") }, nil, []string{"sub"})
	change("symlink", func() error { return os.Symlink("x", d+"/sl") }, []string{"sl"}, nil)
	change("link", func() error { return os.Link(d+"/new", d+"/hl") }, []string{"hl"}, nil)
	change("copy-up", func() error { return os.WriteFile(d+"/many10", []byte("y"), 0o644) }, nil, nil)
}
