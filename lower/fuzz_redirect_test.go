package lower

import (
	"strings"
	"testing"
)

// FuzzRedirect: validRedirect never panics and never accepts a value a
// lookup could follow out of the layers or into a loop of "." steps: no
// empty, "." or ".." component, no NUL, at most 4096 bytes; a relative
// value is a single name. An accepted absolute value splits into a parent
// and a name that rejoin into it, the parent being the root ("") or an
// accepted absolute value itself.
//
//	go test -run '^$' -fuzz FuzzRedirect -fuzztime 30s ./lower/
func FuzzRedirect(f *testing.F) {
	for _, s := range []string{
		"/a/b", "/a", "name", "/", "", ".", "..", "/..", "/../x", "../../etc", "/./x", "/a//b", "//a",
		"/a/", "a/b", "/a/./b", "/a/../b", "/a/b/..", "/.hidden", "/..x", "/x..", "...", "/a\x00b",
		"/" + strings.Repeat("x/", 2047) + "x", "/" + strings.Repeat("y", 4095), "/" + strings.Repeat("y", 4096),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, r string) {
		ok := validRedirect(r)
		if !ok {
			return
		}
		if r == "" || len(r) > 4096 || strings.IndexByte(r, 0) >= 0 {
			t.Fatalf("validRedirect(%q) accepted an empty, over-long or NUL-holding value", r)
		}
		if r[0] != '/' {
			if strings.Contains(r, "/") || r == "." || r == ".." {
				t.Fatalf("validRedirect(%q) accepted a relative value that is not one name", r)
			}
			return
		}
		for _, c := range strings.Split(r[1:], "/") {
			if c == "" || c == "." || c == ".." {
				t.Fatalf("validRedirect(%q) accepted a component %q", r, c)
			}
		}
		parent, name := splitRedirect(r)
		if parent+"/"+name != r {
			t.Fatalf("splitRedirect(%q) = %q, %q: they do not rejoin", r, parent, name)
		}
		if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
			t.Fatalf("splitRedirect(%q) name %q", r, name)
		}
		if parent != "" && (parent[0] != '/' || !validRedirect(parent)) {
			t.Fatalf("splitRedirect(%q) parent %q is neither the root nor a valid absolute path", r, parent)
		}
	})
}
