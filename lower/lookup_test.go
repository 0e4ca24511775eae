package lower

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mustLookup looks name up in c and closes the entry's chain at the end of
// the test.
func mustLookup(t *testing.T, s *stack, c Chain, name string) *Entry {
	t.Helper()
	e, err := c.Lookup(name, s.layers)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", name, err)
	}
	t.Cleanup(e.Chain.Close)
	return e
}

func wantENOENT(t *testing.T, s *stack, c Chain, name string) {
	t.Helper()
	e, err := c.Lookup(name, s.layers)
	if err == nil {
		e.Chain.Close()
		t.Fatalf("Lookup(%q) = entry in layer %d (mode %#o), want ENOENT", name, e.Parent.Layer.Index, e.Stat.Mode)
	}
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("Lookup(%q) error = %v, want ENOENT", name, err)
	}
}

// chainLayers lists the layer indexes of a chain's members.
func chainLayers(c Chain) []int {
	var out []int
	for _, m := range c {
		out = append(out, m.Layer.Index)
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLookupNonDirectories(t *testing.T) {
	s := newStack(t, 3)
	s.file(t, 0, "top", "t")
	s.file(t, 2, "bottom", "bb")
	// "shadow" is in all three layers with different sizes.
	s.file(t, 0, "shadow", "0")
	s.file(t, 1, "shadow", "11")
	s.file(t, 2, "shadow", "222")
	s.file(t, 1, "mid", "11")
	s.file(t, 2, "mid", "222")
	// A device that is not a whiteout is an ordinary entry.
	s.mknod(t, 0, "null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	s.file(t, 1, "null", "below")
	c := s.chain()

	for _, tc := range []struct {
		name  string
		layer int
		size  int64
		mode  uint32
	}{
		{"top", 0, 1, unix.S_IFREG},
		{"bottom", 2, 2, unix.S_IFREG},
		{"shadow", 0, 1, unix.S_IFREG},
		{"mid", 1, 2, unix.S_IFREG},
		{"null", 0, 0, unix.S_IFCHR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustLookup(t, s, c, tc.name)
			if e.Parent.Layer != s.layers[tc.layer] {
				t.Errorf("Parent.Layer = %d, want %d", e.Parent.Layer.Index, tc.layer)
			}
			if e.Parent.Dir != s.layers[tc.layer].Root() {
				t.Errorf("Parent.Dir is not layer %d's root", tc.layer)
			}
			want := lstat(t, s.path(tc.layer, tc.name))
			if e.Stat.Ino != want.Ino || e.Stat.Dev != want.Dev {
				t.Errorf("Stat is ino %d, want the layer %d file's ino %d", e.Stat.Ino, tc.layer, want.Ino)
			}
			if e.Stat.Mode&unix.S_IFMT != tc.mode || (tc.mode == unix.S_IFREG && e.Stat.Size != tc.size) {
				t.Errorf("Stat mode %#o size %d, want type %#o size %d", e.Stat.Mode, e.Stat.Size, tc.mode, tc.size)
			}
			if e.IsDir() || len(e.Chain) != 0 || e.Opaque {
				t.Errorf("non-directory: IsDir %v, Chain %v, Opaque %v", e.IsDir(), chainLayers(e.Chain), e.Opaque)
			}
		})
	}
	t.Run("absent", func(t *testing.T) { wantENOENT(t, s, c, "nothing") })
}

func TestLookupWhiteouts(t *testing.T) {
	s := newStack(t, 3)
	// Kernel whiteouts.
	s.whiteout(t, 0, "kw")
	s.file(t, 1, "kw", "x")
	s.file(t, 2, "kw", "x")
	s.whiteout(t, 1, "kwmid")
	s.file(t, 2, "kwmid", "x")
	s.whiteout(t, 0, "kwdir")
	s.dir(t, 1, "kwdir")
	s.whiteout(t, 0, "kwonly")
	// AUFS whiteouts.
	s.file(t, 1, ".wh.aw", "")
	s.file(t, 2, "aw", "x")
	s.file(t, 0, ".wh.awdir", "")
	s.dir(t, 1, "awdir")
	s.dir(t, 2, "awdir")
	// ".wh.NAME" beside NAME in one layer hides only below.
	s.file(t, 1, ".wh.beside", "")
	s.file(t, 1, "beside", "11")
	s.file(t, 2, "beside", "222")
	s.file(t, 1, ".wh.besidedir", "")
	s.dir(t, 1, "besidedir")
	s.dir(t, 2, "besidedir")
	s.file(t, 2, "besidedir/lowfile", "")
	// A whiteout below the topmost instance changes nothing.
	s.file(t, 0, "above", "0")
	s.whiteout(t, 1, "above")
	c := s.chain()

	for _, name := range []string{"kw", "kwmid", "kwdir", "kwonly", "aw", "awdir"} {
		t.Run("hidden/"+name, func(t *testing.T) { wantENOENT(t, s, c, name) })
	}
	t.Run("aufs whiteout beside its name", func(t *testing.T) {
		e := mustLookup(t, s, c, "beside")
		if e.Parent.Layer.Index != 1 || e.Stat.Size != 2 {
			t.Errorf("got layer %d size %d, want layer 1 size 2", e.Parent.Layer.Index, e.Stat.Size)
		}
	})
	t.Run("aufs whiteout beside a dir hides the dirs below", func(t *testing.T) {
		// ".wh.besidedir" hides besidedir in the layers below layer
		// 1, as ReadDir has it: the layer-1 directory shows, its
		// lower namesakes do not merge into it.
		e := mustLookup(t, s, c, "besidedir")
		if e.Parent.Layer.Index != 1 {
			t.Errorf("Parent layer %d, want 1", e.Parent.Layer.Index)
		}
		if got := chainLayers(e.Chain); !equalInts(got, []int{1}) {
			t.Errorf("Chain layers = %v, want [1]", got)
		}
		if f, err := e.Chain.Lookup("lowfile", s.layers); err == nil {
			t.Errorf("Lookup(besidedir/lowfile) found it in layer %d, under a whiteout", f.Parent.Layer.Index)
		}
		ents, err := e.Chain.ReadDir()
		if err != nil {
			t.Fatal(err)
		}
		for _, de := range ents {
			if de.Name == "lowfile" {
				t.Errorf("ReadDir lists %q from layer %d, under a whiteout", de.Name, de.Layer.Index)
			}
		}
	})
	t.Run("whiteout below the top", func(t *testing.T) {
		e := mustLookup(t, s, c, "above")
		if e.Parent.Layer.Index != 0 {
			t.Errorf("layer %d, want 0", e.Parent.Layer.Index)
		}
	})
}

func TestLookupOpaque(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mark   func(t *testing.T, s *stack, i int)
		opaque bool
	}{
		{"trusted.overlay.opaque=y", func(t *testing.T, s *stack, i int) {
			s.setxattr(t, i, "d", TrustedPrefix+"opaque", "y")
		}, true},
		{"user.overlay.opaque=y", func(t *testing.T, s *stack, i int) {
			s.setxattr(t, i, "d", UserPrefix+"opaque", "y")
		}, true},
		{"aufs marker", func(t *testing.T, s *stack, i int) {
			s.file(t, i, "d/"+OpaqueMarker, "")
		}, true},
		{"trusted.overlay.opaque=n", func(t *testing.T, s *stack, i int) {
			s.setxattr(t, i, "d", TrustedPrefix+"opaque", "n")
		}, false},
		{"trusted.overlay.opaque=yes", func(t *testing.T, s *stack, i int) {
			s.setxattr(t, i, "d", TrustedPrefix+"opaque", "yes")
		}, false},
		{"user.overlay.opaque=x", func(t *testing.T, s *stack, i int) {
			s.setxattr(t, i, "d", UserPrefix+"opaque", "x")
		}, false},
		{"trusted x, user y", func(t *testing.T, s *stack, i int) {
			s.setxattr(t, i, "d", TrustedPrefix+"opaque", "x")
			s.setxattr(t, i, "d", UserPrefix+"opaque", "y")
		}, true},
		{"unmarked", func(t *testing.T, s *stack, i int) {}, false},
	} {
		for _, at := range []int{0, 1} {
			t.Run(tc.name+"/layer"+string(rune('0'+at)), func(t *testing.T) {
				s := newStack(t, 3)
				for i := 0; i < 3; i++ {
					s.dir(t, i, "d")
				}
				tc.mark(t, s, at)
				e := mustLookup(t, s, s.chain(), "d")
				want := []int{0, 1, 2}
				if tc.opaque {
					want = want[:at+1]
				}
				if got := chainLayers(e.Chain); !equalInts(got, want) {
					t.Errorf("Chain layers = %v, want %v", got, want)
				}
				if e.Opaque != tc.opaque {
					t.Errorf("Opaque = %v, want %v", e.Opaque, tc.opaque)
				}
				if !e.IsDir() || e.Parent.Layer.Index != 0 {
					t.Errorf("IsDir %v, Parent layer %d; want a dir from layer 0", e.IsDir(), e.Parent.Layer.Index)
				}
			})
		}
	}
	t.Run("opaque at the bottom is still reported", func(t *testing.T) {
		s := newStack(t, 2)
		s.dir(t, 1, "d")
		s.setxattr(t, 1, "d", TrustedPrefix+"opaque", "y")
		e := mustLookup(t, s, s.chain(), "d")
		if !e.Opaque || len(e.Chain) != 1 {
			t.Errorf("Opaque %v, chain %v; want true, [1]", e.Opaque, chainLayers(e.Chain))
		}
	})
}

func TestLookupXattrWhiteouts(t *testing.T) {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		t.Run(strings.TrimSuffix(prefix, "."), func(t *testing.T) {
			s := newStack(t, 3)
			for i := 0; i < 3; i++ {
				s.dir(t, i, "x")
				s.dir(t, i, "plain")
			}
			s.setxattr(t, 0, "x", prefix+"opaque", "x")
			// An xattr whiteout: zero-size file with overlay.whiteout.
			s.file(t, 0, "x/gone", "")
			s.setxattr(t, 0, "x/gone", prefix+"whiteout", "y")
			s.file(t, 1, "x/gone", "below")
			s.file(t, 2, "x/gone", "bottom")
			// Zero size without the xattr: an ordinary empty file.
			s.file(t, 0, "x/empty", "")
			s.file(t, 1, "x/empty", "below")
			// The xattr on a file with data: not a whiteout.
			s.file(t, 0, "x/data", "d")
			s.setxattr(t, 0, "x/data", prefix+"whiteout", "y")
			s.file(t, 1, "x/data", "below")
			// The same whiteout in a directory not marked "x" is a file.
			s.file(t, 0, "plain/gone", "")
			s.setxattr(t, 0, "plain/gone", prefix+"whiteout", "y")
			s.file(t, 1, "plain/gone", "below")

			e := mustLookup(t, s, s.chain(), "x")
			if got := chainLayers(e.Chain); !equalInts(got, []int{0, 1, 2}) || e.Opaque {
				t.Fatalf("x: chain %v opaque %v; want [0 1 2], not opaque", got, e.Opaque)
			}
			if !e.Chain[0].XWhiteouts || e.Chain[1].XWhiteouts {
				t.Fatalf("XWhiteouts = %v, %v; want true, false", e.Chain[0].XWhiteouts, e.Chain[1].XWhiteouts)
			}
			wantENOENT(t, s, e.Chain, "gone")
			if f := mustLookup(t, s, e.Chain, "empty"); f.Parent.Layer.Index != 0 || f.Stat.Size != 0 {
				t.Errorf("empty: layer %d size %d, want layer 0 size 0", f.Parent.Layer.Index, f.Stat.Size)
			}
			if f := mustLookup(t, s, e.Chain, "data"); f.Parent.Layer.Index != 0 {
				t.Errorf("data: layer %d, want 0", f.Parent.Layer.Index)
			}

			p := mustLookup(t, s, s.chain(), "plain")
			if p.Chain[0].XWhiteouts {
				t.Fatalf("plain: XWhiteouts set without opaque=x")
			}
			if f := mustLookup(t, s, p.Chain, "gone"); f.Parent.Layer.Index != 0 || f.Stat.Size != 0 {
				t.Errorf("plain/gone: layer %d size %d, want the layer 0 empty file", f.Parent.Layer.Index, f.Stat.Size)
			}
		})
	}
}

func TestLookupTypeChanges(t *testing.T) {
	s := newStack(t, 3)
	// A non-directory above a directory ends the walk.
	s.file(t, 0, "n", "0")
	s.dir(t, 1, "n")
	s.dir(t, 2, "n")
	// A directory above a non-directory: the non-directory is hidden
	// and the merge stops there, even with a directory further down.
	s.dir(t, 0, "m")
	s.file(t, 1, "m", "1")
	s.dir(t, 2, "m")
	s.file(t, 2, "m/below", "")
	// A symlink to a directory above a directory.
	s.dir(t, 1, "target")
	s.symlink(t, 0, "l", "target")
	s.dir(t, 1, "l")
	c := s.chain()

	t.Run("non-dir above dir", func(t *testing.T) {
		e := mustLookup(t, s, c, "n")
		if e.IsDir() || len(e.Chain) != 0 || e.Parent.Layer.Index != 0 {
			t.Errorf("IsDir %v chain %v layer %d; want a layer-0 file, no chain", e.IsDir(), chainLayers(e.Chain), e.Parent.Layer.Index)
		}
	})
	t.Run("dir above non-dir", func(t *testing.T) {
		e := mustLookup(t, s, c, "m")
		if got := chainLayers(e.Chain); !equalInts(got, []int{0}) {
			t.Errorf("Chain layers = %v, want [0]", got)
		}
		if e.Opaque {
			t.Errorf("Opaque set: the chain was cut by a non-directory, not a marker")
		}
		wantENOENT(t, s, e.Chain, "below")
	})
	t.Run("symlink above dir", func(t *testing.T) {
		e := mustLookup(t, s, c, "l")
		if e.Stat.Mode&unix.S_IFMT != unix.S_IFLNK || len(e.Chain) != 0 {
			t.Errorf("mode %#o chain %v; want a symlink, no chain", e.Stat.Mode, chainLayers(e.Chain))
		}
	})
}

func TestLookupMergedDirectory(t *testing.T) {
	s := newStack(t, 3)
	for i := 0; i < 3; i++ {
		s.dir(t, i, "d/sub")
	}
	s.file(t, 0, "d/a", "0")
	s.file(t, 2, "d/a", "222")
	s.file(t, 2, "d/sub/deep", "x")
	e := mustLookup(t, s, s.chain(), "d")
	if got := chainLayers(e.Chain); !equalInts(got, []int{0, 1, 2}) {
		t.Fatalf("chain %v, want [0 1 2]", got)
	}
	if e.Opaque {
		t.Errorf("Opaque set although the chain reached the bottom")
	}
	want := lstat(t, s.path(0, "d"))
	if e.Stat.Ino != want.Ino {
		t.Errorf("Stat is not the topmost instance's")
	}
	// The chain members are the directories themselves.
	for i, m := range e.Chain {
		var st unix.Stat_t
		if err := m.StatSelf(&st); err != nil {
			t.Fatal(err)
		}
		if w := lstat(t, s.path(i, "d")); st.Ino != w.Ino {
			t.Errorf("member %d is ino %d, want %d", i, st.Ino, w.Ino)
		}
	}
	if a := mustLookup(t, s, e.Chain, "a"); a.Parent.Layer.Index != 0 || a.Parent.Dir != e.Chain[0].Dir {
		t.Errorf("d/a: layer %d; want layer 0, parent the chain's first member", a.Parent.Layer.Index)
	}
	sub := mustLookup(t, s, e.Chain, "sub")
	if deep := mustLookup(t, s, sub.Chain, "deep"); deep.Parent.Layer.Index != 2 {
		t.Errorf("d/sub/deep: layer %d, want 2", deep.Parent.Layer.Index)
	}
}

func TestLookupNameTooLong(t *testing.T) {
	s := newStack(t, 3)
	long255 := strings.Repeat("n", 255)
	s.file(t, 2, long255, "x")
	c := s.chain()

	_, err := c.Lookup(strings.Repeat("n", 256), s.layers)
	if !errors.Is(err, unix.ENAMETOOLONG) {
		t.Errorf("256-byte name: error %v, want ENAMETOOLONG", err)
	}
	// The ".wh." form of a 255-byte name is too long: it counts as
	// absent, it does not fail the lookup.
	e := mustLookup(t, s, c, long255)
	if e.Parent.Layer.Index != 2 {
		t.Errorf("255-byte name: layer %d, want 2", e.Parent.Layer.Index)
	}
}

func TestLookupNeverFollowsSymlinks(t *testing.T) {
	for _, target := range []string{"/", "../../..", "..", ".", "real", "/proc/self/cwd", "OUTSIDE"} {
		t.Run(target, func(t *testing.T) {
			s := newStack(t, 3)
			if target == "OUTSIDE" {
				target = t.TempDir()
			}
			s.dir(t, 0, "real")
			s.file(t, 0, "real/inside", "")
			s.symlink(t, 0, "d", target)
			s.dir(t, 1, "d")
			s.file(t, 1, "d/inside", "")
			s.dir(t, 2, "d")
			c := s.chain()
			e := mustLookup(t, s, c, "d")
			want := lstat(t, s.path(0, "d"))
			if e.Stat.Mode&unix.S_IFMT != unix.S_IFLNK || e.Stat.Ino != want.Ino {
				t.Errorf("Stat mode %#o ino %d, want the symlink (ino %d)", e.Stat.Mode, e.Stat.Ino, want.Ino)
			}
			if e.IsDir() || len(e.Chain) != 0 {
				t.Errorf("symlink treated as a directory: chain %v", chainLayers(e.Chain))
			}
			if e.Parent.Layer.Index != 0 {
				t.Errorf("layer %d, want 0", e.Parent.Layer.Index)
			}
		})
	}
	t.Run("symlink in a lower member of a chain", func(t *testing.T) {
		s := newStack(t, 3)
		s.dir(t, 0, "d")
		s.symlink(t, 1, "d", "/")
		s.dir(t, 2, "d")
		e := mustLookup(t, s, s.chain(), "d")
		// The symlink is a non-directory below a directory: the
		// merge stops, nothing of "/" comes in.
		if got := chainLayers(e.Chain); !equalInts(got, []int{0}) {
			t.Errorf("chain %v, want [0]", got)
		}
		wantENOENT(t, s, e.Chain, "proc")
	})
}

func TestLookupChainClose(t *testing.T) {
	s := newStack(t, 3)
	for i := 0; i < 3; i++ {
		s.dir(t, i, "d")
	}
	s.file(t, 0, "f", "")
	s.whiteout(t, 0, "w")
	c := s.chain()

	// Warm up whatever the runtime opens lazily.
	if e, err := c.Lookup("d", s.layers); err == nil {
		e.Chain.Close()
	}
	before := openFDs(t)
	for i := 0; i < 100; i++ {
		e, err := c.Lookup("d", s.layers)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Chain) != 3 {
			t.Fatalf("chain of %d", len(e.Chain))
		}
		if i == 0 {
			// Each member holds an fd (idle, in the fd cache).
			if got := openFDs(t); got != before+3 {
				t.Errorf("open fds with a 3-member chain: %d, want %d", got, before+3)
			}
		}
		e.Chain.Close()
		for _, m := range e.Chain {
			if err := m.Do(func(int) error { return nil }); !errors.Is(err, unix.EBADF) {
				t.Fatalf("member still usable after Close: %v", err)
			}
		}
		if e, err := c.Lookup("f", s.layers); err != nil || len(e.Chain) != 0 {
			t.Fatalf("Lookup(f) = %v, %v", e, err)
		}
		if _, err := c.Lookup("w", s.layers); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("Lookup(w) = %v", err)
		}
	}
	if after := openFDs(t); after != before {
		t.Errorf("open fds %d after 100 lookups, %d before", after, before)
	}
}
