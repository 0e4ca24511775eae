package overlay

import (
	"slices"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/goverlay/goverlay/lower"
)

// TestMaskProfiles: each profile masks exactly what came after its
// release, and reads the kernel's protocol as that release's.
func TestMaskProfiles(t *testing.T) {
	for _, c := range []struct {
		mask   string
		masked []string
		minor  uint32
	}{
		// Ubuntu 24.04.
		{"linux-6.8", []string{"passthrough", "allow_idmap", "uring", "xattrat"}, 39},
		// Debian 12.
		{"linux-6.1", []string{"passthrough", "allow_idmap", "uring", "fchmodat2", "xattrat"}, 38},
		// Ubuntu 22.04, and RHEL 9 upstream.
		{"linux-5.15", []string{"init_ext", "passthrough", "allow_idmap", "uring", "noflush", "tmpfile", "fchmodat2", "xattrat"}, 34},
		{"linux-5.14", []string{"init_ext", "passthrough", "allow_idmap", "uring", "noflush", "tmpfile", "fchmodat2", "xattrat"}, 34},
		// MinKernel: mount_setattr too; FUSE_HANDLE_KILLPRIV_V2 is there.
		{"linux-5.11", []string{"init_ext", "passthrough", "allow_idmap", "uring", "noflush", "tmpfile", "mount_setattr", "fchmodat2", "xattrat"}, 33},
		{"linux-6.14", nil, 42},
		{"linux-6.18", nil, 0},
		{"linux-6.8+linux-5.15", []string{"init_ext", "passthrough", "allow_idmap", "uring", "noflush", "tmpfile", "fchmodat2", "xattrat"}, 34},
	} {
		m, err := ParseMask(c.mask)
		if err != nil {
			t.Errorf("%s: %v", c.mask, err)
			continue
		}
		if got := m.Names(); !slices.Equal(got, c.masked) {
			t.Errorf("%s masks %q, want %q", c.mask, got, c.masked)
		}
		if m.minor != c.minor {
			t.Errorf("%s: protocol minor %d, want %d", c.mask, m.minor, c.minor)
		}
		if m.String() != c.mask {
			t.Errorf("%s shows as %q", c.mask, m.String())
		}
	}
}

// TestMaskVersionsAgree: a FUSE feature's release and protocol minor
// agree with the minors profiles read INIT as, so that a profile never
// masks a feature of its own protocol or leaves one of a later one.
func TestMaskVersionsAgree(t *testing.T) {
	for _, f := range features {
		if f.since == [2]int{} || f.proto == 0 {
			continue
		}
		if got := profileMinor(f.since[0], f.since[1]); got != f.proto {
			t.Errorf("%s: Linux %d.%d has protocol 7.%d in profileMinors, the feature says 7.%d", f.name, f.since[0], f.since[1], got, f.proto)
		}
	}
	for i := 1; i < len(profileMinors); i++ {
		if a, b := profileMinors[i-1], profileMinors[i]; !olderThan(a.release[0], a.release[1], b.release) || a.minor >= b.minor {
			t.Errorf("profileMinors out of order at %v", b.release)
		}
	}
}

// TestMaskFeatures: a feature name masks it and what it implies; the
// flags, reply flags and system calls go where they belong.
func TestMaskFeatures(t *testing.T) {
	m, err := ParseMask("passthrough+uring+writeback_cache")
	if err != nil {
		t.Fatal(err)
	}
	if want := fuse.CAP_PASSTHROUGH | fuse.CAP_OVER_IO_URING | fuse.CAP_WRITEBACK_CACHE; m.initFlags() != uint64(want) {
		t.Errorf("INIT flags %#x, want %#x", m.initFlags(), want)
	}
	if m.minor != 0 || m.openFlags() != 0 || m.syscalls() != 0 {
		t.Errorf("features alone cap the protocol at %d, drop reply flags %#x, mask system calls %v", m.minor, m.openFlags(), m.syscalls())
	}
	for name, implied := range map[string][]string{
		"cache_dir":   {"no_opendir", "cache_dir"},
		"init_ext":    {"init_ext", "passthrough", "allow_idmap", "uring"},
		"readdirplus": {"readdirplus", "readdirplus_auto"},
		"open_tree":   {"open_tree", "mount_setattr"},
	} {
		m, err := ParseMask(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range implied {
			if !m.Masks(n) {
				t.Errorf("mask=%s does not mask %s", name, n)
			}
		}
	}
	m, _ = ParseMask("init_ext")
	if fl := m.initFlags(); fl&fuse.CAP_INIT_EXT == 0 || fl>>32 != 0xFFFFFFFF {
		t.Errorf("init_ext keeps INIT flags %#x", ^fl)
	}
	m, _ = ParseMask("noflush+cache_dir+fchmodat2+xattrat")
	if m.openFlags() != fuse.FOPEN_NOFLUSH|fuse.FOPEN_CACHE_DIR || m.syscalls() != lower.Fchmodat2|lower.XattrAt {
		t.Errorf("reply flags %#x, system calls %v", m.openFlags(), m.syscalls())
	}
	if !(Mask{}).Empty() || m.Empty() {
		t.Errorf("Empty: zero %v, masked %v", (Mask{}).Empty(), m.Empty())
	}
}

// TestMaskRefused: an unknown name, a malformed or too old profile and an
// empty name are refused with the names mask= takes.
func TestMaskRefused(t *testing.T) {
	for _, s := range []string{"", "passthru", "linux-4.19", "linux-5", "linux-5.15.2", "linux-x.y", "uring++passthrough", "uring+", "Linux-5.15"} {
		_, err := ParseMask(s)
		if err == nil {
			t.Errorf("mask=%s accepted", s)
			continue
		}
		for _, want := range []string{"linux-5.15 (Ubuntu 22.04)", "linux-6.8", "passthrough", "xattrat", `"+"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("mask=%s: %q does not name %s", s, err, want)
			}
		}
	}
}

// TestDecideIOMasked: what the mask hides is off whatever the options
// ask, and the reason says so.
func TestDecideIOMasked(t *testing.T) {
	mask := func(s string) Mask {
		m, err := ParseMask(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, c := range []struct {
		o              Options
		noOpen, pt, wb bool
		why            string
	}{
		{Options{Passthrough: true, OpenRequests: true, Mask: mask("passthrough")}, false, false, true, "passthrough masked by mask=passthrough"},
		{Options{Passthrough: true, OpenRequests: true, Mask: mask("linux-5.15")}, false, false, true, "passthrough masked by mask=linux-5.15"},
		{Options{Passthrough: true, Writeback: WritebackOn, Mask: mask("writeback_cache")}, true, false, false, "writeback_cache masked by mask=writeback_cache"},
		{Options{Passthrough: true, Mask: mask("no_open+writeback_cache+passthrough")}, false, false, false, "no_open masked by mask=no_open+writeback_cache+passthrough: every open is a request"},
	} {
		got := decideIO(c.o, false)
		if got.noOpen != c.noOpen || got.passthrough != c.pt || got.writeback != c.wb || !strings.Contains(got.why, c.why) {
			t.Errorf("mask=%s: noopen %v, passthrough %v, writeback %v (%s); want %v, %v, %v (%s)",
				c.o.Mask, got.noOpen, got.passthrough, got.writeback, got.why, c.noOpen, c.pt, c.wb, c.why)
		}
	}
}
