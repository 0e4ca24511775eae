package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// TestChmodAtNoFollow: a chmod by name in a layer never changes what a
// symlink there points to (the name may have been replaced by one since
// the node was located); a symlink has no mode of its own: EOPNOTSUPP.
func TestChmodAtNoFollow(t *testing.T) {
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
	l, err := lower.OpenLayer(layer, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := chmodAt(l.Root(), "link", 0o777); err != unix.EOPNOTSUPP {
		t.Errorf("chmod of a symlink: %v, want EOPNOTSUPP", err)
	}
	if st, err := os.Stat(canary); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the symlink's target changed: %v %v, want 0600", st.Mode(), err)
	}
	if err := chmodAt(l.Root(), "file", 0o640); err != nil {
		t.Errorf("chmod of a file: %v", err)
	}
	if st, err := os.Stat(filepath.Join(layer, "file")); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("chmod of a file gave %v %v, want 0640", st.Mode(), err)
	}
	if err := chmodAt(l.Root(), "", 0o750); err != nil {
		t.Errorf("chmod of the directory itself: %v", err)
	}
	if st, err := os.Stat(layer); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("chmod of the directory gave %v %v, want 0750", st.Mode(), err)
	}
}
