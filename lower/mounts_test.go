package lower

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs on dir with one file, mounted, in it.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(dir, "mounted"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLayerMounts: a lower layer is a clone of its mount without the
// mounts inside it (its own sub is seen); a layer opened in place does
// not enter them (EXDEV); the upper layer and its workdir share one
// clone, so that a rename between them works.
func TestLayerMounts(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{"l/sub", "u/sub", "w"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "l/sub/own"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mountTmpfs(t, filepath.Join(base, "l/sub"))
	mountTmpfs(t, filepath.Join(base, "u/sub"))

	l, err := OpenLayer(filepath.Join(base, "l"), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Cloned() {
		t.Fatalf("a lower layer opened by root is not a clone of its mount")
	}
	sub, err := l.Root().OpenDir("sub")
	if err != nil {
		t.Fatalf("sub of the cloned layer: %v", err)
	}
	ents, err := sub.ReadDirRaw()
	sub.Close()
	if err != nil || len(ents) != 1 || ents[0].Name != "own" {
		t.Errorf("sub of the cloned layer lists %v (%v), want the layer's own sub: own", ents, err)
	}

	in, err := OpenLayer(filepath.Join(base, "l"), 1, true) // in place
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if in.Cloned() {
		t.Fatalf("OpenLayer(upper) cloned the layer")
	}
	if d, err := in.Root().OpenDir("sub"); err != unix.EXDEV {
		if err == nil {
			d.Close()
		}
		t.Errorf("sub of a layer opened in place, a mount point: %v, want EXDEV", err)
	}

	u, wfd, err := OpenUpper(filepath.Join(base, "u"), filepath.Join(base, "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	defer unix.Close(wfd)
	if !u.Cloned() {
		t.Fatalf("the upper layer opened by root is not a clone of its mount")
	}
	if err := unix.Mkdirat(wfd, "tmp", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := u.Root().Do(func(fd int) error { return unix.Renameat(wfd, "tmp", fd, "moved") }); err != nil {
		t.Errorf("rename from the workdir into the upper layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "u/moved")); err != nil {
		t.Errorf("the rename did not land in the upper layer: %v", err)
	}
	sub, err = u.Root().OpenDir("sub")
	if err != nil {
		t.Fatal(err)
	}
	ents, err = sub.ReadDirRaw()
	sub.Close()
	if err != nil || len(ents) != 0 {
		t.Errorf("sub of the upper layer lists %v (%v), want its own, empty", ents, err)
	}
}

// TestLayerMountsMasked: where open_tree(2) is taken for absent (-o
// mask=), as before Linux 5.2, a layer is opened in place: a mount inside
// it is not entered (EXDEV). Where mount_setattr(2) is, as before 5.12,
// the clone is kept, though not made private: the layer's own sub shows.
// Either way the upper layer and its workdir still rename into each
// other, and each fallback is counted.
func TestLayerMountsMasked(t *testing.T) {
	for _, masked := range []Features{OpenTree, MountSetattr} {
		t.Run(masked.String(), func(t *testing.T) {
			base := t.TempDir()
			for _, d := range []string{"l/sub", "u/sub", "w"} {
				if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(base, "l/sub/own"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			mountTmpfs(t, filepath.Join(base, "l/sub"))
			mountTmpfs(t, filepath.Join(base, "u/sub"))
			cloned := masked != OpenTree
			l, err := OpenLayerMasked(filepath.Join(base, "l"), 1, false, masked)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.Cloned() != cloned || l.Counters.Fallbacks.Of(masked) != 1 {
				t.Errorf("%s masked: the layer is a clone %v, %d fallbacks counted; want %v, 1", masked, l.Cloned(), l.Counters.Fallbacks.Of(masked), cloned)
			}
			sub, err := l.Root().OpenDir("sub")
			switch {
			case cloned && err != nil:
				t.Errorf("sub of the cloned layer: %v", err)
			case cloned:
				ents, err := sub.ReadDirRaw()
				sub.Close()
				if err != nil || len(ents) != 1 || ents[0].Name != "own" {
					t.Errorf("sub of the cloned layer lists %v (%v), want the layer's own sub: own", ents, err)
				}
			case err != unix.EXDEV:
				if err == nil {
					sub.Close()
				}
				t.Errorf("sub of a layer opened in place, a mount point: %v, want EXDEV", err)
			}
			u, wfd, err := OpenUpperMasked(filepath.Join(base, "u"), filepath.Join(base, "w"), masked)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			defer unix.Close(wfd)
			if u.Cloned() != cloned || u.Counters.Fallbacks.Of(masked) != 1 {
				t.Errorf("%s masked: upper a clone %v, %d fallbacks counted; want %v, 1", masked, u.Cloned(), u.Counters.Fallbacks.Of(masked), cloned)
			}
			if err := unix.Mkdirat(wfd, "tmp", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := u.Root().Do(func(fd int) error { return unix.Renameat(wfd, "tmp", fd, "moved") }); err != nil {
				t.Errorf("rename from the workdir into the upper layer: %v", err)
			}
		})
	}
}

// TestStatxMntIDMasked: with STATX_MNT_ID masked the layer is taken for
// not id-mapped without asking (the answer of every kernel before Linux
// 5.8, which had no id-mapped mounts either), and the fallback is counted.
func TestStatxMntIDMasked(t *testing.T) {
	l, err := OpenLayerMasked(t.TempDir(), 1, false, StatxMntID)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.IDMapped || l.Counters.Fallbacks.Of(StatxMntID) != 1 {
		t.Errorf("id-mapped %v, %d fallbacks counted; want false, 1", l.IDMapped, l.Counters.Fallbacks.Of(StatxMntID))
	}
}
