package upper

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// TestChmodNoFollow: a chmod by name in a layer never changes what a
// symlink there points to (the name may have been replaced by one since
// the node was located); a symlink has no mode of its own: EOPNOTSUPP.
// The same with fchmodat2(2) masked, as on a kernel before Linux 6.6:
// the fallback through /proc runs, and is counted.
func TestChmodNoFollow(t *testing.T) {
	for _, masked := range []lower.Features{0, lower.Fchmodat2} {
		t.Run("masked="+masked.String(), func(t *testing.T) { testChmodNoFollow(t, masked) })
	}
}

func testChmodNoFollow(t *testing.T, masked lower.Features) {
	base := t.TempDir()
	canary := filepath.Join(base, "canary")
	if err := os.WriteFile(canary, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(base, "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(canary, filepath.Join(layer, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := lower.OpenLayerMasked(layer, 0, true, masked)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := Chmod(l.Root(), "link", 0o777); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Errorf("chmod of a symlink: %v, want EOPNOTSUPP", err)
	}
	if st, err := os.Stat(canary); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the symlink's target changed: %v %v, want 0600", st.Mode(), err)
	}
	if err := Chmod(l.Root(), "file", 0o640); err != nil {
		t.Errorf("chmod of a file: %v", err)
	}
	if st, err := os.Stat(filepath.Join(layer, "file")); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("chmod of a file gave %v %v, want 0640", st.Mode(), err)
	}
	if err := Chmod(l.Root(), "", 0o750); err != nil {
		t.Errorf("chmod of the directory itself: %v", err)
	}
	if st, err := os.Stat(layer); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("chmod of the directory gave %v %v, want 0750", st.Mode(), err)
	}
	// Both named chmods took the fallback where it was masked; none
	// did where the kernel has the call (Linux 6.6+).
	n := l.Counters.Fallbacks.Of(lower.Fchmodat2)
	switch {
	case masked.Has(lower.Fchmodat2) && n != 2:
		t.Errorf("fchmodat2 masked: %d fallbacks counted, want 2", n)
	case !masked.Has(lower.Fchmodat2) && n != 0 && !l.Caches.NoFchmodat2():
		t.Errorf("fchmodat2 not masked: %d fallbacks counted on a kernel that has it", n)
	}
}

// TestAttrsNoFollow: chown, utimens and truncate by name change the entry
// itself, the directory for "", never a symlink's target.
func TestAttrsNoFollow(t *testing.T) {
	base := t.TempDir()
	canary := filepath.Join(base, "canary")
	if err := os.WriteFile(canary, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(base, "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(canary, filepath.Join(layer, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "file"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := lower.OpenLayer(layer, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := l.Root()
	if err := Chown(d, "link", 4242, 4343); err != nil {
		t.Fatalf("chown of a symlink: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(layer, "link"), &st); err != nil || st.Uid != 4242 || st.Gid != 4343 {
		t.Errorf("the symlink is owned by %d:%d (%v), want 4242:4343", st.Uid, st.Gid, err)
	}
	if err := unix.Stat(canary, &st); err != nil || st.Uid == 4242 {
		t.Errorf("the symlink's target was chowned to %d (%v)", st.Uid, err)
	}
	old := unix.NsecToTimespec(1e9)
	if err := SetTimes(d, "link", [2]unix.Timespec{old, old}); err != nil {
		t.Fatalf("utimens of a symlink: %v", err)
	}
	if err := unix.Lstat(filepath.Join(layer, "link"), &st); err != nil || st.Mtim != old {
		t.Errorf("the symlink's mtime is %v (%v), want %v", st.Mtim, err, old)
	}
	if err := unix.Stat(canary, &st); err != nil || st.Mtim == old {
		t.Errorf("the symlink's target got the mtime (%v)", err)
	}
	if err := SetTimes(d, "", [2]unix.Timespec{old, old}); err != nil {
		t.Fatalf("utimens of the directory: %v", err)
	}
	if err := unix.Stat(layer, &st); err != nil || st.Mtim != old {
		t.Errorf("the directory's mtime is %v (%v), want %v", st.Mtim, err, old)
	}
	if err := Truncate(d, "", 0); !errors.Is(err, unix.EISDIR) {
		t.Errorf("truncate of the directory: %v, want EISDIR", err)
	}
	if err := Truncate(d, "link", 0); !errors.Is(err, unix.ELOOP) {
		t.Errorf("truncate of a symlink: %v, want ELOOP", err)
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "data" {
		t.Errorf("the symlink's target holds %q (%v), want data", b, err)
	}
	if err := Truncate(d, "file", 2); err != nil {
		t.Fatalf("truncate of a file: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(layer, "file")); err != nil || string(b) != "da" {
		t.Errorf("the file holds %q (%v), want da", b, err)
	}
}
