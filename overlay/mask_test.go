package overlay

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

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

// maskOf parses s, failing the test on an error.
func maskOf(t *testing.T, s string) Mask {
	t.Helper()
	m, err := ParseMask(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMaskedPassthrough: with passthrough masked, a mount that asks for
// it opens no file in passthrough: writes go through the writeback cache,
// and goverlay stats says why. The same mount without the mask does use
// passthrough here.
func TestMaskedPassthrough(t *testing.T) {
	if ok, why := passthroughGrantable(); !ok {
		t.Skipf("passthrough cannot be granted here: %s", why)
	}
	for _, masked := range []bool{false, true} {
		lo, up, work := openDir(t), openDir(t), openDir(t)
		write(t, lo+"/f", "lower")
		o := Options{Lower: []string{lo}, Upper: up, Work: work, OpenRequests: true, Passthrough: true}
		if masked {
			o.Mask = maskOf(t, "passthrough")
		}
		mnt, f := mountFS(t, o)
		if err := os.WriteFile(mnt+"/f", []byte("written"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, mnt+"/f"); got != "written" {
			t.Errorf("masked %v: read back %q", masked, got)
		}
		s := f.Stats()
		switch {
		case !masked && (s.OpensPassthrough == 0 || !s.Passthrough):
			t.Errorf("without the mask: passthrough %v, %d opens in passthrough (%s); want it used", s.Passthrough, s.OpensPassthrough, s.IOReason)
		case masked && (s.OpensPassthrough != 0 || s.Passthrough || s.OpensCached == 0):
			t.Errorf("passthrough masked: passthrough %v, %d opens in passthrough, %d through goverlay; want none in passthrough", s.Passthrough, s.OpensPassthrough, s.OpensCached)
		case masked && (!s.Writeback || !strings.Contains(s.IOReason, "passthrough masked by mask=passthrough")):
			t.Errorf("passthrough masked: writeback cache %v (%s); want it, saying why", s.Writeback, s.IOReason)
		case masked && !slices.Equal(s.MaskedFeatures, []string{"passthrough"}):
			t.Errorf("passthrough masked: goverlay stats says %q are masked", s.MaskedFeatures)
		}
		if slices.Contains(s.KernelFeatures, "passthrough") == masked {
			t.Errorf("masked %v: kernel features %q", masked, s.KernelFeatures)
		}
	}
}

// TestMaskedUring: with io_uring masked, a mount made while the kernel
// offers it serves /dev/fuse, and says why.
func TestMaskedUring(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "lower")
	mnt, f := mountOffered(t, Options{Lower: []string{lo}, Mask: maskOf(t, "uring")})
	if got := readFile(t, mnt+"/f"); got != "lower" {
		t.Errorf("read %q", got)
	}
	s := f.Stats()
	if s.RingRequests != 0 || s.Transport != "/dev/fuse (uring masked by mask=uring)" {
		t.Errorf("transport %q, %d requests over io_uring; want /dev/fuse alone, saying why", s.Transport, s.RingRequests)
	}
}

// TestMaskedWriteback: with the writeback cache masked, a mount that
// would take it by default does not, and each write(2) is a WRITE
// request: the upper file has the data before the file is closed.
func TestMaskedWriteback(t *testing.T) {
	lo, up, work := openDir(t), openDir(t), openDir(t)
	write(t, lo+"/f", "lower")
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, Mask: maskOf(t, "writeback_cache")})
	s := f.Stats()
	if s.Writeback || s.Passthrough || !strings.Contains(s.IOReason, "writeback_cache masked by mask=writeback_cache") {
		t.Fatalf("writeback cache %v, passthrough %v (%s); want neither, saying why", s.Writeback, s.Passthrough, s.IOReason)
	}
	fd := openT(t, mnt+"/f", unix.O_WRONLY|unix.O_TRUNC)
	defer unix.Close(fd)
	pwriteT(t, fd, "through", 0)
	if got := readFile(t, up+"/f"); got != "through" {
		t.Errorf("upper file before close: %q, want %q (each write a request)", got, "through")
	}
}

// TestMaskedFchmodat2: with fchmodat2 masked, chmod through the mount
// still changes the file, never a symlink's target, and the fallback ran;
// without the mask it does not run here (Linux 6.6+).
func TestMaskedFchmodat2(t *testing.T) {
	needKernel(t, 6, 6, "fchmodat2")
	for _, masked := range []bool{false, true} {
		lo, up, work := openDir(t), openDir(t), openDir(t)
		write(t, lo+"/f", "lower")
		o := Options{Lower: []string{lo}, Upper: up, Work: work}
		if masked {
			o.Mask = maskOf(t, "fchmodat2")
		}
		mnt, f := mountFS(t, o)
		if err := os.Chmod(mnt+"/f", 0o640); err != nil {
			t.Fatal(err)
		}
		// Again, now that the file is in the upper layer.
		if err := os.Chmod(mnt+"/f", 0o604); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(up+"/f", &st); err != nil || st.Mode&0o7777 != 0o604 {
			t.Errorf("masked %v: upper file mode %#o, %v; want 0604", masked, st.Mode&0o7777, err)
		}
		n := f.Stats().Fallbacks["fchmodat2"]
		if masked && n == 0 || !masked && n != 0 {
			t.Errorf("masked %v: the fchmodat2 fallback ran %d times", masked, n)
		}
	}
}

// TestMaskedTmpfile: with FUSE_TMPFILE masked, open(O_TMPFILE) fails with
// EOPNOTSUPP, as on a kernel before 6.0, and the mount goes on serving.
func TestMaskedTmpfile(t *testing.T) {
	lo, up, work := openDir(t), openDir(t), openDir(t)
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work, Mask: maskOf(t, "tmpfile")})
	for range 2 { // the second the kernel answers alone
		if fd, err := unix.Open(mnt, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); !errors.Is(err, unix.EOPNOTSUPP) {
			if err == nil {
				unix.Close(fd)
			}
			t.Errorf("O_TMPFILE with tmpfile masked: %v, want EOPNOTSUPP", err)
		}
	}
	write(t, mnt+"/f", "named")
	if got := readFile(t, up+"/f"); got != "named" {
		t.Errorf("a named file after: %q", got)
	}
}

// TestMaskedKillprivV2: with FUSE_HANDLE_KILLPRIV_V2 masked, NOSEC is off
// on an upper that would have it, saying the mask is why, and a write by
// a caller without CAP_FSETID still loses setuid (the kernel removes it,
// through SETATTR).
func TestMaskedKillprivV2(t *testing.T) {
	lo, up, work := openDir(t), openDir(t), openDir(t)
	write(t, lo+"/f", "lower")
	if err := os.Chmod(lo+"/f", 0o4777); err != nil {
		t.Fatal(err)
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn, AllowOther: true, Mask: maskOf(t, "killpriv_v2")})
	s := f.Stats()
	if s.NoSec || !strings.HasPrefix(s.NoSecReason, "killpriv_v2 masked by mask=killpriv_v2") {
		t.Errorf("NOSEC %v (%s); want off, the mask its reason", s.NoSec, s.NoSecReason)
	}
	run(t, asNobody, "echo x >> "+mnt+"/f")
	var st unix.Stat_t
	if err := unix.Stat(up+"/f", &st); err != nil || st.Mode&unix.S_ISUID != 0 {
		t.Errorf("upper file after a write by nobody: mode %#o, %v; want setuid gone", st.Mode&0o7777, err)
	}
}

// TestMaskedOpendir: with FOPEN_CACHE_DIR masked (and with it the
// kernel's own opens of directories), every opendir(3) is an OPENDIR
// request, the kernel keeps no listing, and listings are whole and right.
func TestMaskedOpendir(t *testing.T) {
	lo, up, work := openDir(t), openDir(t), openDir(t)
	for i := range 300 {
		write(t, fmt.Sprintf("%s/d/f%03d", lo, i), "x")
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, Mask: maskOf(t, "cache_dir")})
	write(t, mnt+"/d/new", "y")
	for range 3 {
		names := names(t, mnt+"/d")
		if len(names) != 301 || names[0] != "f000" || names[300] != "new" {
			t.Fatalf("listing of d: %d names, from %q", len(names), names[0])
		}
	}
	if n := f.raw.dirs.opendirs.Load(); n < 3 {
		t.Errorf("%d OPENDIR requests for three listings, want each one", n)
	}
	if n := f.raw.dirs.opened.Load(); n != 0 {
		t.Errorf("%d READDIRs opened a stream of their own: OPENDIR served them none", n)
	}
}

// TestMaskedXattrAt: with the *xattrat calls masked, a file's xattrs read
// through the mount are still its own, through the fallback, which ran.
func TestMaskedXattrAt(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "lower")
	if err := unix.Setxattr(lo+"/f", "user.x", []byte("v"), 0); err != nil {
		t.Skipf("no user xattrs here: %v", err)
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Mask: maskOf(t, "xattrat")})
	buf := make([]byte, 16)
	n, err := unix.Getxattr(mnt+"/f", "user.x", buf)
	if err != nil || string(buf[:n]) != "v" {
		t.Errorf("user.x through the mount: %q, %v", buf[:n], err)
	}
	if s := f.Stats(); s.Fallbacks["xattrat"] == 0 || !slices.Equal(s.MaskedFeatures, []string{"xattrat"}) {
		t.Errorf("fallbacks %v, masked %q; want the xattrat fallback run", s.Fallbacks, s.MaskedFeatures)
	}
}
