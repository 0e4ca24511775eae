package oracle_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestStackedRenameBack: a directory renamed in one layer and renamed back
// in the next keeps its contents once that second upper becomes a lower
// too. Each cycle's upper is pushed down as the topmost lower of the next
// mount, as containers/storage commits a container's layer. The redirect
// the second rename writes must lead, layer by layer, through the first
// rename's redirect to the bottom instance: the path the merged view had
// before the rename, not the bottom instance's own (Linux:
// fs/overlayfs/dir.c ovl_get_redirect()). The kernel overlay mounted on
// goverlay's layers must read them the same way.
func TestStackedRenameBack(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	base := testutil.Tmpfs(t)
	p := func(rel string) string { return filepath.Join(base, rel) }
	for _, d := range []string{"L/a/dir100", "U1", "W1", "U2", "W2", "U3", "W3"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(p("L/a/dir100/a"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cycle := func(lower []string, up, work, from, to string) {
		t.Helper()
		m := testutil.Mount(t, testutil.Options{Lower: lower, Upper: p(up), Work: p(work)})
		if err := os.Rename(filepath.Join(m.Dir, from), filepath.Join(m.Dir, to)); err != nil {
			t.Fatalf("mv %s %s: %v", from, to, err)
		}
		m.Unmount(t)
	}
	cycle([]string{p("L")}, "U1", "W1", "a/dir100", "a/no_dir100")
	cycle([]string{p("U1"), p("L")}, "U2", "W2", "a/no_dir100", "a/dir100")

	lower := []string{p("U2"), p("U1"), p("L")}
	want := func(who, mnt string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(mnt, "a/dir100/a"))
		if err != nil || string(got) != "x\n" {
			ents, _ := os.ReadDir(filepath.Join(mnt, "a/dir100"))
			t.Errorf("%s: a/dir100/a: %q, %v; a/dir100 lists %v", who, got, err, ents)
		}
		if _, err := os.Stat(filepath.Join(mnt, "a/no_dir100")); !os.IsNotExist(err) {
			t.Errorf("%s: a/no_dir100: %v, want ENOENT", who, err)
		}
	}
	m := testutil.Mount(t, testutil.Options{Lower: lower, Upper: p("U3"), Work: p("W3")})
	want("goverlay", m.Dir)
	m.Unmount(t)
	k := testutil.KernelOverlay(t, lower, "", "", "redirect_dir=follow", "index=off", "metacopy=off", "xino=off")
	want("the kernel overlay on goverlay's layers", k)
}
