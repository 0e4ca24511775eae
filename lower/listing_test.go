package lower

import (
	"fmt"
	"testing"
)

// TestListingBudget: cached listings never hold more entries than the
// budget, lookups stay right when theirs was dropped, and closing the
// directories frees the rest.
func TestListingBudget(t *testing.T) {
	s := newStack(t, 1)
	for d := 0; d < 10; d++ {
		s.dir(t, 0, fmt.Sprintf("d%d", d))
		for f := 0; f < 10; f++ {
			s.file(t, 0, fmt.Sprintf("d%d/f%d", d, f), "x")
		}
	}
	s.caches.SetListingBudget(35)
	base := s.caches.CachedListingEntries() // the root's, at most
	var chains []Chain
	for round := 0; round < 3; round++ {
		for d := 0; d < 10; d++ {
			if round == 0 {
				e, err := s.chain().Lookup(fmt.Sprintf("d%d", d), s.layers)
				if err != nil {
					t.Fatal(err)
				}
				chains = append(chains, e.Chain)
			}
			c := chains[d]
			if _, err := c.Lookup("f3", s.layers); err != nil {
				t.Errorf("d%d/f3: %v", d, err)
			}
			if _, err := c.Lookup("nope", s.layers); err == nil {
				t.Errorf("d%d/nope found", d)
			}
			if n := s.caches.CachedListingEntries(); n > 35 {
				t.Fatalf("%d entries cached, budget 35", n)
			}
		}
	}
	if s.caches.CachedListingEntries() <= base {
		t.Errorf("no listing cached")
	}
	for _, c := range chains {
		c.Close()
	}
	if n := s.caches.CachedListingEntries(); n > base {
		t.Errorf("%d entries cached after closing the directories, want %d", n, base)
	}
}
