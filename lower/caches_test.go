package lower

import "testing"

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
