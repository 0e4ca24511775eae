package lower

import (
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCachesPerMount: two mounts' caches are apart: what one caches, and
// its bounds, do not touch the other's.
func TestCachesPerMount(t *testing.T) {
	a, b := newStack(t, 1), newStack(t, 1)
	if a.caches == b.caches {
		t.Fatal("two stacks share caches")
	}
	for _, s := range []*stack{a, b} {
		s.dir(t, 0, "d/e")
	}
	b.caches.SetListingBudget(0)
	b.caches.SetFDCacheSize(1)
	for _, s := range []*stack{a, b} {
		e, err := s.chain().Lookup("d", s.layers)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Chain.Close() })
		if _, err := e.Chain.Lookup("e", s.layers); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.caches.CachedListingEntries(); n == 0 {
		t.Errorf("a cached no listing")
	}
	if n := b.caches.CachedListingEntries(); n != 0 {
		t.Errorf("b, with a budget of 0, holds %d listing entries", n)
	}
	if a.caches.fds.max == b.caches.fds.max {
		t.Errorf("resizing b's fd cache resized a's")
	}
}

// TestCachesBudget: a mount given an fd budget keeps a quarter of it for
// directory fds, within the same bounds as a quarter of RLIMIT_NOFILE, and
// holds no more open than that; without one it sizes from RLIMIT_NOFILE as
// before.
func TestCachesBudget(t *testing.T) {
	for _, c := range []struct{ budget, want int }{
		{1, 64}, {256, 64}, {400, 100}, {4096, 1024}, {1 << 20, 1 << 16},
	} {
		if got := NewCachesBudget(c.budget).fds.max; got != c.want {
			t.Errorf("NewCachesBudget(%d): %d directory fds, want %d", c.budget, got, c.want)
		}
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	want := int(min(max(rl.Cur/4, 64), 1<<16))
	for _, c := range []*Caches{NewCaches(), NewCachesBudget(0), NewCachesBudget(-1)} {
		if got := c.fds.max; got != want {
			t.Errorf("without a budget: %d directory fds, want %d (RLIMIT_NOFILE %d)", got, want, rl.Cur)
		}
	}

	testCaches = NewCachesBudget(256)
	t.Cleanup(func() { testCaches = nil })
	s := newStack(t, 1)
	const n = 100
	for i := 0; i < n; i++ {
		s.dir(t, 0, "d"+strconv.Itoa(i))
	}
	for i := 0; i < n; i++ {
		d, err := s.layers[0].Root().OpenDir("d" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
	}
	if got := s.caches.OpenDirFDs(); got > 64 {
		t.Errorf("%d directory fds open after %d directories, with a budget of 256 (64 for directories)", got, n)
	}
}
