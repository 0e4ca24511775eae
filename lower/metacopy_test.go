package lower

import (
	"errors"
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// metacopy makes rel of layer i a metacopy file of size bytes (a hole),
// with redirect r unless it is "".
func (s *stack) metacopy(t *testing.T, i int, rel string, size int64, r string) {
	t.Helper()
	s.file(t, i, rel, "")
	if err := os.Truncate(s.path(i, rel), size); err != nil {
		t.Fatal(err)
	}
	s.setxattr(t, i, rel, TrustedPrefix+MetacopyXattr, "")
	if r != "" {
		s.setxattr(t, i, rel, TrustedPrefix+"redirect", r)
	}
}

// dataOf reads the data a lookup of rel found.
func dataOf(t *testing.T, e *Entry) string {
	t.Helper()
	if e.Data == nil {
		t.Fatalf("no data file")
	}
	fd, err := e.Data.Open(unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "data")
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLookupMetacopy(t *testing.T) {
	lookup := func(t *testing.T, s *stack, name string, follow bool) (*Entry, error) {
		t.Helper()
		for _, l := range s.layers {
			l.Metacopy = follow
		}
		c := s.chain()
		if d, ok := dirOf(name); ok {
			e, err := c.Lookup(d, s.layers)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close)
			c, name = e.Chain, name[len(d)+1:]
		}
		e, err := c.Lookup(name, s.layers)
		if err == nil {
			t.Cleanup(e.Close)
		}
		return e, err
	}
	t.Run("same name below", func(t *testing.T) {
		s := newStack(t, 2)
		s.metacopy(t, 0, "f", 5, "")
		s.file(t, 1, "f", "data\n")
		e, err := lookup(t, s, "f", true)
		if err != nil {
			t.Fatal(err)
		}
		if got := dataOf(t, e); got != "data\n" || e.Parent.Layer.Index != 0 {
			t.Errorf("data %q from layer %d's entry", got, e.Parent.Layer.Index)
		}
		if st := lstat(t, s.path(1, "f")); e.LowerIno != st.Ino || e.Stat.Blocks != st.Blocks {
			t.Errorf("ino %d blocks %d, want the lower file's %d %d", e.LowerIno, e.Stat.Blocks, st.Ino, st.Blocks)
		}
	})
	t.Run("redirects through stacked layers", func(t *testing.T) {
		// Layer 0 moved d/f to g/h (absolute), layer 1 had renamed
		// its d/f from d/e (relative), whose data layer 2 holds.
		s := newStack(t, 3)
		s.dir(t, 0, "g")
		s.metacopy(t, 0, "g/h", 5, "/d/f")
		s.dir(t, 1, "d")
		s.metacopy(t, 1, "d/f", 5, "e")
		s.dir(t, 2, "d")
		s.file(t, 2, "d/e", "deep\n")
		s.file(t, 2, "d/f", "wrong")
		e, err := lookup(t, s, "g/h", true)
		if err != nil {
			t.Fatal(err)
		}
		if got := dataOf(t, e); got != "deep\n" {
			t.Errorf("data %q", got)
		}
		if st := lstat(t, s.path(1, "d/f")); e.LowerIno != st.Ino {
			t.Errorf("ino %d, want the first lower file's %d", e.LowerIno, st.Ino)
		}
		if e.Redirect != "/d/f" {
			t.Errorf("redirect %q", e.Redirect)
		}
	})
	t.Run("refused without metacopy=on", func(t *testing.T) {
		s := newStack(t, 2)
		s.metacopy(t, 0, "f", 5, "")
		s.file(t, 1, "f", "data\n")
		_, err := lookup(t, s, "f", false)
		var me *MetacopyError
		if !errors.As(err, &me) || !errors.Is(err, unix.EPERM) {
			t.Errorf("got %v, want a MetacopyError EPERM", err)
		}
	})
	for _, tc := range []struct {
		name  string
		below func(t *testing.T, s *stack)
	}{
		{"no lower data", func(t *testing.T, s *stack) {}},
		{"a directory below", func(t *testing.T, s *stack) { s.dir(t, 1, "f") }},
		{"a whiteout below", func(t *testing.T, s *stack) { s.whiteout(t, 1, "f") }},
		{"only metacopy files below", func(t *testing.T, s *stack) { s.metacopy(t, 1, "f", 5, "") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, 2)
			s.metacopy(t, 0, "f", 5, "")
			tc.below(t, s)
			for _, follow := range []bool{true, false} {
				_, err := lookup(t, s, "f", follow)
				want := unix.EIO
				if !follow {
					want = unix.EPERM // refused before anything is looked for
				}
				if !errors.Is(err, want) {
					t.Errorf("follow %v: got %v, want %v", follow, err, want)
				}
			}
		})
	}
	t.Run("a plain file is not one", func(t *testing.T) {
		s := newStack(t, 2)
		s.file(t, 0, "f", "top\n")
		s.file(t, 1, "f", "below\n")
		e, err := lookup(t, s, "f", false)
		if err != nil || e.Data != nil {
			t.Errorf("got %v, data %v", err, e.Data)
		}
	})
}

// dirOf splits the directory off a path with one.
func dirOf(p string) (string, bool) {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i], true
		}
	}
	return "", false
}
