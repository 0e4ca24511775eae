package lower

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseOverride(t *testing.T) {
	tests := []struct {
		in   string
		want Override
	}{
		// containers/storage's format (pkg/idtools).
		{"0:0:0755:dir", Override{0, 0, unix.S_IFDIR | 0o755, 0}},
		{"1000:1000:0644:file", Override{1000, 1000, unix.S_IFREG | 0o644, 0}},
		{"1:2:4755:file", Override{1, 2, unix.S_IFREG | 0o4755, 0}},
		{"0:0:0666:char-1-3", Override{0, 0, unix.S_IFCHR | 0o666, unix.Mkdev(1, 3)}},
		{"0:6:0660:block-8-1-extra", Override{0, 6, unix.S_IFBLK | 0o660, unix.Mkdev(8, 1)}},
		{"0:0:0777:symlink", Override{0, 0, unix.S_IFLNK | 0o777, 0}},
		{"0:0:0644:pipe", Override{0, 0, unix.S_IFIFO | 0o644, 0}},
		{"0:0:0755:socket", Override{0, 0, unix.S_IFSOCK | 0o755, 0}},
		{"0:0:0644:file:future", Override{0, 0, unix.S_IFREG | 0o644, 0}},
		// fuse-overlayfs' "%d:%d:%o": no type, or the whole st_mode.
		{"33:44:640", Override{33, 44, 0o640, 0}},
		{"33:44:100640", Override{33, 44, unix.S_IFREG | 0o640, 0}},
		{"0:0:40755\x00", Override{0, 0, unix.S_IFDIR | 0o755, 0}},
	}
	for _, tc := range tests {
		got, err := ParseOverride([]byte(tc.in))
		if err != nil || got != tc.want {
			t.Errorf("ParseOverride(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "0:0", "x:0:0755", "0:y:0755", "0:0:0789", "0:0:0755:weird", "0:0:0666:char", "0:0:0666:char-1", "-1:0:0755"} {
		if o, err := ParseOverride([]byte(bad)); err == nil {
			t.Errorf("ParseOverride(%q) = %+v, want an error", bad, o)
		}
	}
}

func TestOverrideFormat(t *testing.T) {
	tests := []struct {
		o    Override
		mode OverrideMode
		want string
	}{
		{Override{0, 0, unix.S_IFDIR | 0o755, 0}, OverrideContainers, "0:0:0755:dir"},
		{Override{1000, 100, unix.S_IFREG | 0o4711, 0}, OverrideContainers, "1000:100:4711:file"},
		{Override{0, 0, unix.S_IFCHR | 0o620, unix.Mkdev(1, 3)}, OverrideContainers, "0:0:0620:char-1-3"},
		{Override{0, 0, unix.S_IFBLK | 0o600, unix.Mkdev(259, 70000)}, OverrideContainers, "0:0:0600:block-259-70000"},
		{Override{5, 6, 0o640, 0}, OverrideContainers, "5:6:0640:file"},
		{Override{5, 6, unix.S_IFREG | 0o640, 0}, OverridePrivileged, "5:6:640"},
	}
	for _, tc := range tests {
		if got := string(tc.o.Format(tc.mode)); got != tc.want {
			t.Errorf("%+v.Format(%d) = %q, want %q", tc.o, tc.mode, got, tc.want)
		}
		back, err := ParseOverride([]byte(tc.want))
		if err != nil || back.Uid != tc.o.Uid || back.Gid != tc.o.Gid || back.Mode&07777 != tc.o.Mode&07777 || back.Rdev != tc.o.Rdev {
			t.Errorf("ParseOverride(%q) = %+v, %v; does not give back %+v", tc.want, back, err, tc.o)
		}
	}
}

func TestOverrideApply(t *testing.T) {
	reg := unix.Stat_t{Mode: unix.S_IFREG | 0o600, Uid: 0, Gid: 0, Size: 10, Blocks: 8}
	dir := unix.Stat_t{Mode: unix.S_IFDIR | 0o700}
	tests := []struct {
		name string
		st   unix.Stat_t
		o    Override
		want unix.Stat_t
	}{
		{"owner and mode", reg, Override{1, 2, unix.S_IFREG | 0o4755, 0},
			unix.Stat_t{Mode: unix.S_IFREG | 0o4755, Uid: 1, Gid: 2, Size: 10, Blocks: 8}},
		{"a device kept as a plain file", reg, Override{0, 6, unix.S_IFCHR | 0o620, unix.Mkdev(1, 3)},
			unix.Stat_t{Mode: unix.S_IFCHR | 0o620, Gid: 6, Rdev: unix.Mkdev(1, 3)}},
		{"a type that contradicts a directory is ignored", dir, Override{3, 3, unix.S_IFREG | 0o755, 0},
			unix.Stat_t{Mode: unix.S_IFDIR | 0o755, Uid: 3, Gid: 3}},
		{"no type", dir, Override{3, 3, 0o751, 0},
			unix.Stat_t{Mode: unix.S_IFDIR | 0o751, Uid: 3, Gid: 3}},
	}
	for _, tc := range tests {
		st := tc.st
		tc.o.Apply(&st)
		if st != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, st, tc.want)
		}
	}
}

// TestDetectOverride: a layer's mode comes from its root's xattrs, security
// before containers before user (fuse-overlayfs direct.c), and an object
// without an override keeps its real owner and mode.
func TestDetectOverride(t *testing.T) {
	s := newStack(t, 4)
	s.setxattr(t, 0, "", OverridePrivilegedXattr, "0:0:755")
	s.setxattr(t, 0, "", OverrideContainersXattr, "0:0:0755:dir")
	s.setxattr(t, 1, "", OverrideContainersXattr, "0:0:0755:dir")
	s.setxattr(t, 2, "", OverrideUserXattr, "0:0:755")
	want := []OverrideMode{OverridePrivileged, OverrideContainers, OverrideContainers, OverrideNone}
	for i, l := range s.layers {
		if got := l.DetectOverride(); got != want[i] {
			t.Errorf("layer %d: DetectOverride() = %d, want %d", i, got, want[i])
		}
		l.Override = want[i]
	}

	// Layer 2 keeps fuse-overlayfs' user name only: it is read too.
	s.file(t, 2, "f", "x")
	s.setxattr(t, 2, "f", OverrideUserXattr, "7:8:100640")
	s.file(t, 2, "g", "x")
	s.setxattr(t, 2, "g", OverrideUserXattr, "7:8:640")
	s.setxattr(t, 2, "g", OverrideContainersXattr, "9:9:0600:file")
	s.file(t, 2, "plain", "x")
	s.file(t, 2, "garbage", "x")
	s.setxattr(t, 2, "garbage", OverrideContainersXattr, "nonsense")
	for name, want := range map[string]string{"f": "7:8 100640", "g": "9:9 100600", "plain": "real", "garbage": "real"} {
		e, err := s.chain().Lookup(name, s.layers)
		if err != nil {
			t.Fatalf("Lookup(%s): %v", name, err)
		}
		real := lstat(t, s.path(2, name))
		got := "real"
		if e.Stat.Uid != real.Uid || e.Stat.Gid != real.Gid || e.Stat.Mode != real.Mode {
			got = unixOwnerMode(&e.Stat)
		}
		if got != want {
			t.Errorf("Lookup(%s): %s, want %s", name, got, want)
		}
	}
}

func unixOwnerMode(st *unix.Stat_t) string {
	return fmt.Sprintf("%d:%d %o", st.Uid, st.Gid, st.Mode)
}

// TestReadDirOverrideType: readdir gives a device, FIFO or socket kept as a
// plain file with an override naming its type the type stat shows, in a
// cached read-only layer and in one read each time (upper); a layer that
// keeps no overrides lists what is on disk, whatever xattrs its files
// carry.
func TestReadDirOverrideType(t *testing.T) {
	s := newStack(t, 3)
	s.layers[0].Upper = true
	s.layers[0].Override = OverrideContainers
	s.layers[1].Override = OverrideContainers
	// Layer 2 keeps no overrides: OverrideNone.
	kinds := map[string]struct {
		xattr string
		mode  uint32
	}{
		"null":  {"0:0:0666:char-1-3", unix.S_IFCHR},
		"sda":   {"0:6:0660:block-8-0", unix.S_IFBLK},
		"fifo":  {"0:0:0644:pipe", unix.S_IFIFO},
		"sock":  {"0:0:0755:socket", unix.S_IFSOCK},
		"plain": {"1:1:0600:file", unix.S_IFREG},
		"old":   {"0:0:020666", unix.S_IFCHR}, // fuse-overlayfs ≤1.13: the whole st_mode
		"bare":  {"", unix.S_IFREG},
		"bad":   {"0:0:0666:char", unix.S_IFREG}, // unreadable: the real type
	}
	want := map[string]uint32{}
	for i, prefix := range []string{"u-", "l-", "n-"} {
		for name, k := range kinds {
			s.file(t, i, prefix+name, "")
			if k.xattr != "" {
				s.setxattr(t, i, prefix+name, OverrideContainersXattr, k.xattr)
			}
			want[prefix+name] = k.mode
			if prefix == "n-" {
				want[prefix+name] = unix.S_IFREG
			}
		}
	}
	// A directory and a symlink keep their type whatever the xattr says.
	s.dir(t, 1, "l-dir")
	s.setxattr(t, 1, "l-dir", OverrideContainersXattr, "0:0:0755:file")
	want["l-dir"] = unix.S_IFDIR
	s.symlink(t, 1, "l-sl", "x")
	want["l-sl"] = unix.S_IFLNK

	for pass := range 2 { // the second pass reads layer 1's cached listing
		ents, err := s.chain().ReadDir()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint32{}
		for _, e := range ents {
			got[e.Name] = e.Mode
		}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("pass %d: %s listed with type %#o, want %#o", pass, name, got[name], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("pass %d: %d names listed, want %d", pass, len(got), len(want))
		}
	}
	// And stat agrees where the layer keeps overrides.
	for _, name := range []string{"u-null", "l-sda", "l-fifo", "u-sock", "l-plain", "l-old"} {
		i := 0
		if name[0] == 'l' {
			i = 1
		}
		st := lstat(t, s.path(i, name))
		s.layers[i].Root().ApplyOverride(name, &st)
		if st.Mode&unix.S_IFMT != want[name] {
			t.Errorf("stat %s: type %#o, readdir says %#o", name, st.Mode&unix.S_IFMT, want[name])
		}
	}
}
