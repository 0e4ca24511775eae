package lower

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestIsWhiteout(t *testing.T) {
	s := newStack(t, 1)
	s.mknod(t, 0, "wh", unix.S_IFCHR|0o600, 0)
	s.mknod(t, 0, "null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	s.mknod(t, 0, "minor", unix.S_IFCHR|0o600, int(unix.Mkdev(0, 1)))
	s.mknod(t, 0, "blk00", unix.S_IFBLK|0o600, 0)
	s.mknod(t, 0, "fifo", unix.S_IFIFO|0o600, 0)
	s.file(t, 0, "reg", "")
	s.dir(t, 0, "dir")
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"wh", true},
		{"null", false},
		{"minor", false},
		{"blk00", false},
		{"fifo", false},
		{"reg", false},
		{"dir", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := lstat(t, s.path(0, tc.name))
			if got := IsWhiteout(&st); got != tc.want {
				t.Errorf("IsWhiteout(%s mode %#o rdev %#x) = %v, want %v", tc.name, st.Mode, st.Rdev, got, tc.want)
			}
		})
	}
}

func TestIsWhiteoutName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{".wh.foo", true},
		{".wh..wh..opq", true},
		{".wh.", true},
		{"foo", false},
		{"wh.foo", false},
		{".whfoo", false},
		{"foo.wh.", false},
		{"", false},
	} {
		if got := IsWhiteoutName(tc.name); got != tc.want {
			t.Errorf("IsWhiteoutName(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestIsPrivateXattr(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"trusted.overlay.opaque", true},
		{"trusted.overlay.goverlay.ino", true},
		{"user.overlay.opaque", true},
		{"user.overlay.whiteout", true},
		{"trusted.overlayx", false},
		{"trusted.other", false},
		{"user.foo", false},
		{"user.overlayfoo", false},
		{"security.capability", false},
		{"security.overlay.opaque", false},
		{"system.posix_acl_access", false},
	} {
		if got := IsPrivateXattr(tc.name); got != tc.want {
			t.Errorf("IsPrivateXattr(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestOpaqueValue(t *testing.T) {
	for _, tc := range []struct {
		v              string
		opaque, xwhite bool
	}{
		{"y", true, false},
		{"x", false, true},
		{"yes", false, false},
		{"", false, false},
		{"n", false, false},
		{"Y", false, false},
		{"yy", false, false},
	} {
		t.Run("value="+tc.v, func(t *testing.T) {
			o, x := opaqueValue([]byte(tc.v))
			if o != tc.opaque || x != tc.xwhite {
				t.Errorf("opaqueValue(%q) = %v, %v; want %v, %v", tc.v, o, x, tc.opaque, tc.xwhite)
			}
		})
	}
}
