package lower

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// FuzzRedirect: a lookup through a directory with any overlay.redirect
// value never panics, never merges a directory from outside the layers
// (the layers sit beside a directory "outside" that ".." steps would
// reach, and layer 1 holds a symlink to it), and fails only with the
// kernel's answers: EINVAL for a malformed value, EACCES for a "." or ".."
// it had to look up (Linux: ovl_get_redirect_xattr(), lookup_one_len()).
//
//	go test -run '^$' -fuzz FuzzRedirect -fuzztime 30s ./lower/
func FuzzRedirect(f *testing.F) {
	for _, s := range []string{
		"/a/b", "/a", "name", "/", "", ".", "..", "/..", "/../x", "../../etc", "/./x", "/a//b", "//a",
		"/a/", "a/b", "/a/./b", "/a/../b", "/a/b/..", "/.hidden", "/..x", "/x..", "...", "/a\x00b", "\x00",
		"/lnk/in", "/r/in", "/r/b", "r", "bad", "/bad/x", "/" + strings.Repeat("x/", 2047) + "x", "/" + strings.Repeat("y", 4095),
	} {
		f.Add(s)
	}
	root := f.TempDir()
	outside := filepath.Join(root, "outside")
	var paths []string
	for _, d := range []string{"outside/in", "l0/x", "l1/a/b", "l1/r", "l2/a/b", "l2/in", "l2/x"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "l1/lnk")); err != nil {
		f.Fatal(err)
	}
	// A redirect in the middle layer that a walk may cross, and one
	// that is malformed.
	if err := xattr.LSet(filepath.Join(root, "l1/r"), TrustedPrefix+"redirect", []byte("/a")); err != nil {
		f.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "l1/bad"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := xattr.LSet(filepath.Join(root, "l1/bad"), TrustedPrefix+"redirect", []byte("/")); err != nil {
		f.Fatal(err)
	}
	var layers []*Layer
	for i := range 3 {
		p := filepath.Join(root, "l"+string(rune('0'+i)))
		paths = append(paths, p)
		l, err := OpenLayer(p, i, false)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { l.Close() })
		layers = append(layers, l)
	}
	var outsideSt unix.Stat_t
	if err := unix.Stat(filepath.Join(outside, "in"), &outsideSt); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, r string) {
		if len(r) > 8192 {
			return
		}
		if err := xattr.LSet(filepath.Join(paths[0], "x"), TrustedPrefix+"redirect", []byte(r)); err != nil {
			t.Skipf("the filesystem refuses %q: %v", r, err)
		}
		e, err := RootChain(layers).Lookup("x", layers)
		if err != nil {
			var re *RedirectError
			if !errors.As(err, &re) || (re.Err != unix.EINVAL && re.Err != unix.EACCES) {
				t.Fatalf("redirect %q: %v, want a RedirectError with EINVAL or EACCES", r, err)
			}
			if re.Err == unix.EINVAL && re.Layer == paths[0] && validRedirect(r) {
				t.Fatalf("redirect %q: EINVAL for a well-formed value", r)
			}
			return
		}
		defer e.Chain.Close()
		for _, m := range e.Chain {
			var st unix.Stat_t
			if err := m.StatSelf(&st); err != nil {
				t.Fatalf("redirect %q: member in layer %d: %v", r, m.Layer.Index, err)
			}
			if st.Dev == outsideSt.Dev && st.Ino == outsideSt.Ino {
				t.Fatalf("redirect %q: the chain holds a directory outside the layers", r)
			}
		}
	})
}
