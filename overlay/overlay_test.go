package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil/uringswitch"
)

// mountT mounts an overlay in-process, so that -race sees both the test and
// the filesystem, and unmounts it when the test ends.
func mountT(t testing.TB, o Options) string {
	t.Helper()
	mnt, _ := mountFS(t, o)
	return mnt
}

// mountFS is mountT that also returns the FS, for its counters.
func mountFS(t testing.TB, o Options) (string, *FS) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	mnt := t.TempDir()
	os.Chmod(mnt, 0o755)
	f, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	var srv *Server
	uringswitch.Withheld(t, func() { srv, err = f.Mount(mnt) })
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	// Registered first, so it runs after the unmount below.
	t.Cleanup(func() {
		if n := f.guard.panics.Load(); n > 0 {
			t.Errorf("%d requests panicked in the daemon (logged above)", n)
		}
	})
	t.Cleanup(func() {
		var st, pst unix.Stat_t
		if unix.Stat(mnt, &st) == nil && unix.Stat(filepath.Dir(mnt), &pst) == nil && st.Dev == pst.Dev {
			// The test unmounted it already.
			srv.Wait()
			f.Close()
			return
		}
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		srv.Wait()
		f.Close()
	})
	return mnt, f
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func whiteout(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR|0, 0); err != nil {
		t.Fatal(err)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestMergedView(t *testing.T) {
	l1, l2, l3 := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, l3+"/a", "a3")
	write(t, l2+"/a", "a2")
	write(t, l3+"/b", "b3")
	whiteout(t, l2+"/b")
	write(t, l3+"/c", "c3")
	write(t, l1+"/.wh.c", "")
	write(t, l3+"/d/x", "x3")
	write(t, l1+"/d/y", "y1")
	write(t, l3+"/opq/hidden", "h")
	write(t, l2+"/opq/.wh..wh..opq", "")
	write(t, l2+"/opq/seen", "s")
	write(t, l3+"/xopq/hidden", "h")
	write(t, l1+"/xopq/seen", "s")
	if err := unix.Setxattr(l1+"/xopq", "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	write(t, l3+"/shadow/below", "s")
	write(t, l1+"/shadow", "file")

	mnt := mountT(t, Options{Lower: []string{l1, l2, l3}})

	if got, want := strings.Join(names(t, mnt), " "), "a d opq shadow xopq"; got != want {
		t.Errorf("root: got %q, want %q", got, want)
	}
	if got, want := strings.Join(names(t, mnt+"/d"), " "), "x y"; got != want {
		t.Errorf("merged dir: got %q, want %q", got, want)
	}
	if got, want := strings.Join(names(t, mnt+"/opq"), " "), "seen"; got != want {
		t.Errorf(".wh..wh..opq dir: got %q, want %q", got, want)
	}
	if got, want := strings.Join(names(t, mnt+"/xopq"), " "), "seen"; got != want {
		t.Errorf("opaque xattr dir: got %q, want %q", got, want)
	}
	if b, err := os.ReadFile(mnt + "/a"); err != nil || string(b) != "a2" {
		t.Errorf("read a: %q %v, want a2 from the higher layer", b, err)
	}
	for _, hidden := range []string{"b", "c", ".wh.c", "opq/hidden", "xopq/hidden", "shadow/below"} {
		if _, err := os.Lstat(mnt + "/" + hidden); !os.IsNotExist(err) && !errorsIsNotDir(err) {
			t.Errorf("%s: got %v, want ENOENT", hidden, err)
		}
	}
	if fi, err := os.Lstat(mnt + "/shadow"); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("shadow: %v %v, want a regular file hiding the directory below", fi, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(mnt+"/d", &st); err != nil || st.Nlink != 1 {
		t.Errorf("merged dir nlink: %d %v, want 1", st.Nlink, err)
	}
}

func errorsIsNotDir(err error) bool {
	return errors.Is(err, syscall.ENOTDIR)
}

func TestStaticNlink(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/d/a/x", "x")
	write(t, lo+"/d/b/x", "x")
	for _, static := range []bool{false, true} {
		mnt := mountT(t, Options{Lower: []string{lo}, StaticNlink: static})
		var st syscall.Stat_t
		if err := syscall.Stat(mnt+"/d", &st); err != nil {
			t.Fatal(err)
		}
		want := uint64(4) // ., .., a, b: a directory of one layer keeps its count
		if static {
			want = 1
		}
		if uint64(st.Nlink) != want {
			t.Errorf("static_nlink=%v: nlink %d, want %d", static, st.Nlink, want)
		}
	}
}
