package lower

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// memberInos lists the inode numbers of a chain's directories.
func memberInos(t *testing.T, c Chain) []uint64 {
	t.Helper()
	var out []uint64
	for _, m := range c {
		var st unix.Stat_t
		if err := m.StatSelf(&st); err != nil {
			t.Fatal(err)
		}
		out = append(out, st.Ino)
	}
	return out
}

// wantMembers checks that c is exactly the directories at the given
// (layer, path) places.
func wantMembers(t *testing.T, s *stack, c Chain, want ...struct {
	layer int
	path  string
},
) {
	t.Helper()
	got := memberInos(t, c)
	if len(got) != len(want) {
		t.Fatalf("chain layers %v, want %d members %v", chainLayers(c), len(want), want)
	}
	for i, w := range want {
		if c[i].Layer.Index != w.layer {
			t.Errorf("member %d in layer %d, want %d", i, c[i].Layer.Index, w.layer)
		}
		if st := lstat(t, s.path(w.layer, w.path)); got[i] != st.Ino {
			t.Errorf("member %d is not layer %d's %s", i, w.layer, w.path)
		}
	}
}

type place = struct {
	layer int
	path  string
}

func TestLookupRedirect(t *testing.T) {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		t.Run("absolute/"+prefix, func(t *testing.T) {
			s := newStack(t, 3)
			s.dir(t, 0, "x")
			s.file(t, 0, "x/top", "")
			s.setxattr(t, 0, "x", prefix+"redirect", "/a/b")
			s.dir(t, 1, "a/b")
			s.file(t, 1, "a/b/f1", "")
			s.dir(t, 1, "x") // the old name's place: not merged
			s.file(t, 1, "x/stale", "")
			s.dir(t, 2, "a/b")
			s.file(t, 2, "a/b/f2", "")
			e := mustLookup(t, s, s.chain(), "x")
			wantMembers(t, s, e.Chain, place{0, "x"}, place{1, "a/b"}, place{2, "a/b"})
			if e.Redirect != "/a/b" {
				t.Errorf("Redirect = %q, want /a/b", e.Redirect)
			}
			if e.Opaque {
				t.Errorf("Opaque set")
			}
			if f := mustLookup(t, s, e.Chain, "f2"); f.Parent.Layer.Index != 2 {
				t.Errorf("f2 from layer %d", f.Parent.Layer.Index)
			}
			wantENOENT(t, s, e.Chain, "stale")
		})
		t.Run("relative/"+prefix, func(t *testing.T) {
			s := newStack(t, 3)
			s.dir(t, 0, "p/x")
			s.setxattr(t, 0, "p/x", prefix+"redirect", "old")
			s.dir(t, 1, "p/old")
			s.dir(t, 1, "p/x")
			s.dir(t, 2, "p/old")
			p := mustLookup(t, s, s.chain(), "p")
			e := mustLookup(t, s, p.Chain, "x")
			wantMembers(t, s, e.Chain, place{0, "p/x"}, place{1, "p/old"}, place{2, "p/old"})
			if e.Redirect != "old" {
				t.Errorf("Redirect = %q, want old", e.Redirect)
			}
		})
	}
	t.Run("to a root entry", func(t *testing.T) {
		s := newStack(t, 2)
		s.dir(t, 0, "d/x")
		s.setxattr(t, 0, "d/x", TrustedPrefix+"redirect", "/top")
		s.dir(t, 1, "top")
		d := mustLookup(t, s, s.chain(), "d")
		e := mustLookup(t, s, d.Chain, "x")
		wantMembers(t, s, e.Chain, place{0, "d/x"}, place{1, "top"})
		// Following "/top" went through layer 1's root: closing the
		// chain must not close the layer's own root Dir.
		e.Chain.Close()
		for _, l := range s.layers {
			var st unix.Stat_t
			if err := l.Root().StatSelf(&st); err != nil {
				t.Fatalf("layer %d's root was closed by the lookup: %v", l.Index, err)
			}
		}
	})
	t.Run("in a middle layer", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "x")
		s.dir(t, 1, "x")
		s.setxattr(t, 1, "x", TrustedPrefix+"redirect", "/y")
		s.dir(t, 2, "x")
		s.dir(t, 2, "y")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"}, place{1, "x"}, place{2, "y"})
		if e.Redirect != "" {
			t.Errorf("Redirect = %q, want \"\" (only the topmost instance's)", e.Redirect)
		}
	})
	t.Run("target missing", func(t *testing.T) {
		s := newStack(t, 2)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/gone/away")
		s.dir(t, 1, "x")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"})
	})
	t.Run("target a non-directory", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/f")
		s.file(t, 1, "f", "")
		s.dir(t, 2, "f")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"})
	})
	t.Run("target whited out", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/y")
		s.whiteout(t, 1, "y")
		s.dir(t, 2, "y")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"})
	})
	t.Run("through a symlink", func(t *testing.T) {
		s := newStack(t, 2)
		outside := t.TempDir()
		if err := unix.Mkdir(outside+"/b", 0o755); err != nil {
			t.Fatal(err)
		}
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/a/b")
		s.symlink(t, 1, "a", outside)
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"})
	})
	// Malformed values fail the lookup as the kernel's does: EINVAL when
	// the value is read (ovl_get_redirect_xattr()), EACCES when a "." or
	// ".." is looked up (lookup_one_len()). A NUL ends the value.
	for _, tc := range []struct {
		value string
		err   unix.Errno
	}{
		{"", unix.EINVAL}, {"/", unix.EINVAL}, {"../y", unix.EINVAL}, {"a/y", unix.EINVAL},
		{"/a//y", unix.EINVAL}, {"//y", unix.EINVAL}, {"/y/", unix.EINVAL},
		{"/a/../y", unix.EACCES}, {"/a/./y", unix.EACCES}, {"/../y", unix.EACCES}, {".", unix.EACCES},
		{"..", unix.EACCES}, {"\x00y", unix.EACCES}, {"y\x00", 0}, {"/y\x00/..", 0},
	} {
		t.Run("malformed "+tc.value, func(t *testing.T) {
			s := newStack(t, 2)
			s.dir(t, 0, "x")
			s.setxattr(t, 0, "x", TrustedPrefix+"redirect", tc.value)
			s.dir(t, 1, "x")
			s.dir(t, 1, "y")
			s.dir(t, 1, "a/y")
			e, err := s.chain().Lookup("x", s.layers)
			if tc.err == 0 {
				if err != nil {
					t.Fatalf("Lookup: %v", err)
				}
				defer e.Chain.Close()
				wantMembers(t, s, e.Chain, place{0, "x"}, place{1, "y"})
				return
			}
			var re *RedirectError
			if !errors.As(err, &re) || !errors.Is(err, tc.err) {
				t.Fatalf("Lookup: %v, want a RedirectError with %v", err, tc.err)
			}
		})
	}
	t.Run("malformed in the bottom layer", func(t *testing.T) {
		// The kernel never reads the bottom layer's redirects.
		s := newStack(t, 2)
		s.dir(t, 1, "x")
		s.setxattr(t, 1, "x", TrustedPrefix+"redirect", "a/b")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{1, "x"})
	})
	t.Run("malformed on an absolute path's way", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/p/q")
		s.dir(t, 1, "p/q")
		s.setxattr(t, 1, "p", TrustedPrefix+"redirect", "//")
		s.dir(t, 2, "p/q")
		if _, err := s.chain().Lookup("x", s.layers); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("Lookup: %v, want EINVAL", err)
		}
	})
	t.Run("opaque wins over redirect", func(t *testing.T) {
		s := newStack(t, 2)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/y")
		s.setxattr(t, 0, "x", TrustedPrefix+"opaque", "y")
		s.dir(t, 1, "y")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"})
		if !e.Opaque {
			t.Errorf("Opaque not set")
		}
	})
}

// withFDCache makes the stacks of one test share caches whose fd cache
// holds n fds.
func withFDCache(t *testing.T, n int) {
	t.Helper()
	c := NewCaches()
	c.SetFDCacheSize(n)
	testCaches = c
	t.Cleanup(func() { testCaches = nil })
}

// Redirected lookups open the directories on the redirect's path, which
// stay as the parents of the chain's members: the fds they keep are
// bounded by the fd cache, whatever the number of lookups.
func TestLookupRedirectFDsBounded(t *testing.T) {
	const cacheSize = 8
	withFDCache(t, cacheSize)
	s := newStack(t, 3)
	s.dir(t, 0, "x")
	s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/a/b/c")
	s.dir(t, 0, "r")
	s.setxattr(t, 0, "r", TrustedPrefix+"redirect", "/top")
	for i := 1; i < 3; i++ {
		s.dir(t, i, "a/b/c")
		s.dir(t, i, "top")
	}
	s.dir(t, 1, "a/b/m") // a redirect to a leaf missing in layer 2
	s.dir(t, 0, "m")
	s.setxattr(t, 0, "m", TrustedPrefix+"redirect", "/a/b/m")
	c := s.chain()
	before := openFDs(t)
	for i := 0; i < 100; i++ {
		for _, tc := range []struct {
			name string
			n    int
		}{{"x", 3}, {"r", 3}, {"m", 2}} {
			e, err := c.Lookup(tc.name, s.layers)
			if err != nil {
				t.Fatal(err)
			}
			if len(e.Chain) != tc.n {
				t.Fatalf("%s: chain %v, want %d members", tc.name, chainLayers(e.Chain), tc.n)
			}
			// Every member usable, even with its fd evicted.
			for _, m := range e.Chain {
				var st unix.Stat_t
				if err := m.StatSelf(&st); err != nil {
					t.Fatalf("%s: member in layer %d: %v", tc.name, m.Layer.Index, err)
				}
			}
			e.Chain.Close()
		}
	}
	if after := openFDs(t); after > before+cacheSize {
		t.Errorf("open fds %d after 300 redirected lookups, %d before; the cache holds at most %d", after, before, cacheSize)
	}
}

// A redirect is resolved in the layers below the one that holds it, and a
// directory found there may redirect again (Linux: ovl_lookup(),
// ovl_lookup_layer()): renames in consecutive layers chain.
func TestLookupRedirectChain(t *testing.T) {
	t.Run("renamed and renamed back", func(t *testing.T) {
		// mv a/dir100 a/no_dir100 in one layer, back in the next.
		s := newStack(t, 3)
		s.dir(t, 0, "a/dir100")
		s.setxattr(t, 0, "a/dir100", TrustedPrefix+"redirect", "no_dir100")
		s.whiteout(t, 0, "a/no_dir100")
		s.dir(t, 1, "a/no_dir100")
		s.setxattr(t, 1, "a/no_dir100", TrustedPrefix+"redirect", "dir100")
		s.whiteout(t, 1, "a/dir100")
		s.dir(t, 2, "a/dir100")
		s.file(t, 2, "a/dir100/a", "x")
		a := mustLookup(t, s, s.chain(), "a")
		e := mustLookup(t, s, a.Chain, "dir100")
		wantMembers(t, s, e.Chain, place{0, "a/dir100"}, place{1, "a/no_dir100"}, place{2, "a/dir100"})
		mustLookup(t, s, e.Chain, "a")
		wantENOENT(t, s, a.Chain, "no_dir100")
	})
	t.Run("a relative rename in every layer", func(t *testing.T) {
		s := newStack(t, 4)
		for i := range 4 {
			n := "n" + string(rune('3'-i))
			s.dir(t, i, n)
			if i < 3 {
				s.setxattr(t, i, n, TrustedPrefix+"redirect", "n"+string(rune('2'-i)))
			}
		}
		e := mustLookup(t, s, s.chain(), "n3")
		wantMembers(t, s, e.Chain, place{0, "n3"}, place{1, "n2"}, place{2, "n1"}, place{3, "n0"})
	})
	t.Run("absolute through a relative rename on the way", func(t *testing.T) {
		// Layer 1 renamed a to b; layer 0 moved b/sub to c.
		s := newStack(t, 3)
		s.dir(t, 0, "c")
		s.setxattr(t, 0, "c", TrustedPrefix+"redirect", "/b/sub")
		s.dir(t, 1, "b/sub")
		s.setxattr(t, 1, "b", TrustedPrefix+"redirect", "a")
		s.whiteout(t, 1, "a")
		s.dir(t, 2, "a/sub")
		s.dir(t, 2, "b/sub") // not what layer 1's b stands for
		e := mustLookup(t, s, s.chain(), "c")
		wantMembers(t, s, e.Chain, place{0, "c"}, place{1, "b/sub"}, place{2, "a/sub"})
	})
	t.Run("absolute through an absolute rename on the way", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "c")
		s.setxattr(t, 0, "c", TrustedPrefix+"redirect", "/b/sub")
		s.dir(t, 1, "b/sub")
		s.setxattr(t, 1, "b", TrustedPrefix+"redirect", "/p/q")
		s.dir(t, 2, "p/q/sub")
		e := mustLookup(t, s, s.chain(), "c")
		wantMembers(t, s, e.Chain, place{0, "c"}, place{1, "b/sub"}, place{2, "p/q/sub"})
	})
	t.Run("absolute then relative at the end", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "c")
		s.setxattr(t, 0, "c", TrustedPrefix+"redirect", "/d/new")
		s.dir(t, 1, "d/new")
		s.setxattr(t, 1, "d/new", TrustedPrefix+"redirect", "old")
		s.dir(t, 2, "d/old")
		e := mustLookup(t, s, s.chain(), "c")
		wantMembers(t, s, e.Chain, place{0, "c"}, place{1, "d/new"}, place{2, "d/old"})
	})
	t.Run("opaque on the way, absolute redirect below it", func(t *testing.T) {
		// The opaque o hides the layers below, but o/d's absolute
		// redirect lifts that (ovl_check_redirect() resets d->stop).
		s := newStack(t, 3)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/o/d")
		s.dir(t, 1, "o/d")
		s.setxattr(t, 1, "o", TrustedPrefix+"opaque", "y")
		s.setxattr(t, 1, "o/d", TrustedPrefix+"redirect", "/z")
		s.dir(t, 2, "z")
		s.dir(t, 2, "o/d")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"}, place{1, "o/d"}, place{2, "z"})
	})
	t.Run("opaque on the way stops", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "x")
		s.setxattr(t, 0, "x", TrustedPrefix+"redirect", "/o/d")
		s.dir(t, 1, "o/d")
		s.setxattr(t, 1, "o", TrustedPrefix+"opaque", "y")
		s.dir(t, 2, "o/d")
		e := mustLookup(t, s, s.chain(), "x")
		wantMembers(t, s, e.Chain, place{0, "x"}, place{1, "o/d"})
	})
	t.Run("renames naming each other end", func(t *testing.T) {
		// Every layer has both, each naming the other: a redirect only
		// continues below, so the lookup ends at the bottom.
		s := newStack(t, 3)
		for i := range 3 {
			s.dir(t, i, "p")
			s.dir(t, i, "q")
			s.setxattr(t, i, "p", TrustedPrefix+"redirect", "q")
			s.setxattr(t, i, "q", TrustedPrefix+"redirect", "/p")
		}
		e := mustLookup(t, s, s.chain(), "p")
		wantMembers(t, s, e.Chain, place{0, "p"}, place{1, "q"}, place{2, "p"})
	})
}
