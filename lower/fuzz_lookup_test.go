package lower

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// FuzzLookupXattrs sets fuzzed overlay.opaque, overlay.redirect and
// overlay.whiteout values (trusted or user namespace) on a small tree of
// three layers and resolves names through it. Lookup must not panic, must
// end (a redirect loop must not make it spin), must return chains whose
// layers go strictly down the stack, and every directory of a chain must
// be inside its own layer: the path of its fd (/proc/self/fd readlink)
// under that layer's root, never in the directory beside the layers that
// holds the same names.
//
//	go test -run '^$' -fuzz FuzzLookupXattrs -fuzztime 60s ./lower/
func FuzzLookupXattrs(f *testing.F) {
	f.Add([]byte("y"), "/p/a", []byte(""), uint8(0))
	f.Add([]byte("x"), "a", []byte("y"), uint8(7))
	f.Add([]byte("Y"), "../outside/p", []byte{}, uint8(2))
	f.Add([]byte("yes"), "/../outside", []byte("x"), uint8(3))
	f.Add([]byte(strings.Repeat("y", 100)), "d", []byte("\x00"), uint8(4))
	f.Add([]byte(""), "/p/d", []byte(""), uint8(5))
	f.Add([]byte("n"), "/lnk/p", []byte(""), uint8(6))
	f.Add([]byte("y"), "/p/file/x", []byte(""), uint8(9))
	root := os.Geteuid() == 0
	f.Fuzz(func(t *testing.T, opaque []byte, redirect string, whiteout []byte, sel uint8) {
		base := t.TempDir()
		prefix := TrustedPrefix
		if !root || sel&8 != 0 {
			prefix = UserPrefix
		}
		mk := func(p string, dir bool) {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if dir {
				if err := os.MkdirAll(p, 0o755); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// "outside" holds the same names as the layers: a lookup that
		// wandered out of them would find something there.
		for _, top := range []string{"l0", "l1", "l2", "outside"} {
			for _, d := range []string{"p/d", "p/a/b", "p/d/b", "p/x"} {
				mk(filepath.Join(base, top, d), true)
			}
			mk(filepath.Join(base, top, "p/file"), false)
		}
		mk(filepath.Join(base, "l0/p/w"), false)
		mk(filepath.Join(base, "l1/p/w"), true)
		if err := os.Symlink(filepath.Join(base, "outside"), filepath.Join(base, "l1/lnk")); err != nil {
			t.Fatal(err)
		}
		set := func(rel, name string, v []byte) {
			// Values the filesystem refuses (too large) leave the
			// attribute unset: the input then tests less, no harm.
			_ = xattr.LSet(filepath.Join(base, rel), prefix+name, v)
		}
		set("l0/p", "opaque", opaque)
		set("l0/p/w", "whiteout", whiteout)
		set("l0/p/d", "redirect", []byte(redirect))
		if sel&1 != 0 {
			set("l1/p/d", "redirect", []byte(redirect))
		}
		if sel&2 != 0 {
			set("l0/p/x", "redirect", []byte(redirect))
			set("l1/p/x", "redirect", []byte("x"))
		}
		if sel&4 != 0 {
			set("l1/p", "opaque", opaque)
			set("l2/p/d", "opaque", opaque)
		}

		var layers []*Layer
		for i := range 3 {
			l, err := OpenLayer(filepath.Join(base, "l"+strconv.Itoa(i)), i, false)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			layers = append(layers, l)
		}
		// check runs on the lookup goroutine: it reports with Errorf.
		check := func(what string, c Chain) {
			t.Helper()
			prev := -1
			for k, m := range c {
				if m.Layer.Index <= prev {
					t.Errorf("%s: chain layers %v do not go strictly down", what, chainIndexes(c))
					return
				}
				prev = m.Layer.Index
				var where string
				err := m.Do(func(fd int) error {
					var err error
					where, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
					return err
				})
				if err != nil {
					t.Errorf("%s: member %d: %v", what, k, err)
					return
				}
				// The layer root as /proc shows it: "/" for a
				// layer opened through a clone of its mount.
				var root string
				m.Layer.Root().Do(func(fd int) error {
					root, _ = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
					return nil
				})
				if where != root && !strings.HasPrefix(where, strings.TrimSuffix(root, "/")+"/") {
					t.Errorf("%s: member %d of layer %d is %s, outside its layer %s (redirect %q)", what, k, m.Layer.Index, where, root, redirect)
					return
				}
			}
		}

		done := make(chan struct{})
		go func() {
			defer close(done)
			rc := RootChain(layers)
			p, err := rc.Lookup("p", layers)
			if err != nil {
				return // p hidden (opaque values cannot hide it; no error expected, but no harm)
			}
			defer p.Chain.Close()
			check("p", p.Chain)
			for _, name := range []string{"d", "w", "a", "x", "file", "lnk", redirect} {
				if name == "" || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
					continue
				}
				e, err := p.Chain.Lookup(name, layers)
				if err != nil {
					continue
				}
				check("p/"+name, e.Chain)
				if e.IsDir() {
					if b, err := e.Chain.Lookup("b", layers); err == nil {
						check("p/"+name+"/b", b.Chain)
						b.Chain.Close()
					}
					if _, err := e.Chain.ReadDir(); err != nil && !errors.Is(err, unix.EACCES) {
						t.Errorf("readdir p/%s: %v", name, err)
					}
				}
				e.Chain.Close()
			}
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("lookups did not end within 20s (opaque %q, redirect %q, whiteout %q, sel %d)", opaque, redirect, whiteout, sel)
		}
	})
}

func chainIndexes(c Chain) []int {
	var out []int
	for _, m := range c {
		out = append(out, m.Layer.Index)
	}
	return out
}
