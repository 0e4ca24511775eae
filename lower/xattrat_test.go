package lower

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// TestSetxattrAt: SetxattrAt and RemovexattrAt act on the entry itself
// (a symlink's own attributes, user.* refused on it as by lsetxattr(2)),
// honour XATTR_CREATE and XATTR_REPLACE, and on a kernel without the
// calls do nothing and say so, for the caller to go through /proc.
func TestSetxattrAt(t *testing.T) {
	s := newStack(t, 1)
	s.file(t, 0, "f", "f")
	if err := os.Symlink("f", s.path(0, "sym")); err != nil {
		t.Fatal(err)
	}
	d := s.layers[0].Root()
	if ok, err := d.SetxattrAt("f", "user.a", []byte("v"), 0); !ok || err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skip("no user xattrs here")
		}
		t.Fatalf("set user.a: ok %v, %v", ok, err)
	}
	if ok, _ := d.SetxattrAt("f", "user.b", nil, 0); !ok {
		t.Skip("no setxattrat(2) on this kernel")
	}
	for _, c := range []struct {
		attr  string
		want  string
		flags int
		err   error
	}{
		{"user.a", "w", unix.XATTR_REPLACE, nil},
		{"user.a", "", unix.XATTR_CREATE, unix.EEXIST},
		{"user.none", "", unix.XATTR_REPLACE, unix.ENODATA},
	} {
		if _, err := d.SetxattrAt("f", c.attr, []byte(c.want), c.flags); !errors.Is(err, c.err) {
			t.Errorf("set %s flags %d: %v, want %v", c.attr, c.flags, err, c.err)
		}
	}
	if v, err := xattr.Get(s.path(0, "f"), "user.a"); err != nil || string(v) != "w" {
		t.Errorf("user.a: %q, %v", v, err)
	}
	if v, err := xattr.Get(s.path(0, "f"), "user.b"); err != nil || len(v) != 0 {
		t.Errorf("user.b (empty value): %q, %v", v, err)
	}
	if _, err := d.SetxattrAt("sym", "user.x", []byte("x"), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("user.x on a symlink: %v, want EPERM", err)
	}
	if os.Geteuid() == 0 {
		if _, err := d.SetxattrAt("sym", "trusted.x", []byte("on the link"), 0); err != nil {
			t.Fatal(err)
		}
		if v, err := xattr.LGet(s.path(0, "sym"), "trusted.x"); err != nil || !bytes.Equal(v, []byte("on the link")) {
			t.Errorf("trusted.x of the link: %q, %v", v, err)
		}
		if _, err := xattr.Get(s.path(0, "f"), "trusted.x"); err == nil {
			t.Errorf("trusted.x went to the target")
		}
	}
	if _, err := d.RemovexattrAt("f", "user.a"); err != nil {
		t.Fatal(err)
	}
	if _, err := xattr.Get(s.path(0, "f"), "user.a"); err == nil {
		t.Errorf("user.a still there after RemovexattrAt")
	}
	if _, err := d.RemovexattrAt("f", "user.a"); !errors.Is(err, unix.ENODATA) {
		t.Errorf("remove a missing xattr: %v, want ENODATA", err)
	}
	// Without the calls: nothing done, ok false.
	s.layers[0].Caches.noXattrAt.Store(true)
	if ok, err := d.SetxattrAt("f", "user.c", []byte("c"), 0); ok || err != nil {
		t.Errorf("without setxattrat: ok %v, %v", ok, err)
	}
	if _, err := xattr.Get(s.path(0, "f"), "user.c"); err == nil {
		t.Errorf("user.c set although the call was taken for missing")
	}
	if ok, err := d.RemovexattrAt("f", "user.b"); ok || err != nil {
		t.Errorf("without removexattrat: ok %v, %v", ok, err)
	}
}

// TestXattrAtMasked: with the *xattrat calls masked (-o mask=), as on a
// kernel before Linux 6.13, an entry's attributes are still read, its own
// and not a symlink's target's, through /proc; SetxattrAt does nothing and
// says so; each fallback is counted.
func TestXattrAtMasked(t *testing.T) {
	base := t.TempDir()
	if err := os.WriteFile(base+"/f", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := xattr.Set(base+"/f", "user.a", []byte("v")); err != nil {
		t.Skipf("no user xattrs here: %v", err)
	}
	if err := os.Symlink("f", base+"/sym"); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLayerMasked(base, 1, false, XattrAt)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := l.Root()
	if v, err := d.Getxattr("f", "user.a"); err != nil || string(v) != "v" {
		t.Errorf("user.a of f: %q, %v", v, err)
	}
	if _, err := d.Getxattr("sym", "user.a"); !errors.Is(err, unix.ENODATA) {
		t.Errorf("user.a of the symlink itself: %v, want ENODATA", err)
	}
	if names, err := d.Listxattr("f"); err != nil || len(names) != 1 || names[0] != "user.a" {
		t.Errorf("list of f: %q, %v", names, err)
	}
	if ok, err := d.SetxattrAt("f", "user.b", []byte("b"), 0); ok || err != nil {
		t.Errorf("setxattrat masked: ok %v, %v; want false, nil", ok, err)
	}
	if n := l.Counters.Fallbacks.Of(XattrAt); n != 4 {
		t.Errorf("%d fallbacks counted, want 4 (three reads, one set)", n)
	}
	if l.Caches.noXattrAt.Load() {
		t.Errorf("the mask was taken for the kernel's answer")
	}
}
