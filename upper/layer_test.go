package upper

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

func TestOpenWorkdirOnAnotherFilesystem(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "goverlay-upper-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	upperPath := t.TempDir()
	if lstat(t, shm).Dev == lstat(t, upperPath).Dev {
		t.Skip("/dev/shm and the temp dir are on one filesystem")
	}
	u, err := lower.OpenLayer(upperPath, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	l, err := Open(u, shm, Options{XattrPrefix: lower.TrustedPrefix})
	if err == nil {
		l.Close()
		t.Fatal("Open succeeded with the workdir on another filesystem")
	}
	if !strings.Contains(err.Error(), shm) || !strings.Contains(err.Error(), upperPath) {
		t.Errorf("error %q does not name both %s and %s", err, shm, upperPath)
	}
	if exists(filepath.Join(shm, workName)) {
		t.Errorf("Open created %s/%s before refusing", shm, workName)
	}
}

func TestOpenMissingWorkdir(t *testing.T) {
	upperPath := t.TempDir()
	u, err := lower.OpenLayer(upperPath, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	missing := filepath.Join(upperPath, "no-such-workdir")
	if _, err := Open(u, missing, Options{}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Open with a missing workdir: %v", err)
	}
}

func TestOpenCleansWork(t *testing.T) {
	root := t.TempDir()
	upperPath, workPath := filepath.Join(root, "upper"), filepath.Join(root, "work")
	work := filepath.Join(workPath, workName)
	outside := filepath.Join(root, "outside")
	for _, d := range []string{upperPath, work, outside, work + "/dir/sub/deep", work + "/#1.2", work + "/locked/inner"} {
		mkdir(t, d)
	}
	writeFile(t, outside+"/keep", "keep", 0o644)
	writeFile(t, work+"/file", "x", 0o644)
	writeFile(t, work+"/dir/a", "a", 0o644)
	writeFile(t, work+"/dir/sub/b", "b", 0o644)
	writeFile(t, work+"/dir/sub/deep/c", "c", 0o000)
	writeFile(t, work+"/locked/inner/f", "f", 0o644)
	mknod(t, work+"/#1.2/whiteout", unix.S_IFCHR, 0)
	mknod(t, work+"/fifo", unix.S_IFIFO|0o600, 0)
	if err := os.Symlink(outside, work+"/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, work+"/dir/link"); err != nil {
		t.Fatal(err)
	}
	// A mode-0 directory, as the kernel makes work dirs.
	if err := os.Chmod(work+"/locked", 0); err != nil {
		t.Fatal(err)
	}
	u, err := lower.OpenLayer(upperPath, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	l, err := Open(u, workPath, Options{XattrPrefix: lower.TrustedPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if left := dirNames(t, work); len(left) != 0 {
		t.Errorf("left in work: %q", left)
	}
	if got := dirNames(t, outside); len(got) != 1 || got[0] != "keep" {
		t.Errorf("a symlink in work was followed: outside now holds %q", got)
	}
}

func TestOpenCreatesWorkAndProbes(t *testing.T) {
	e := newEnv(t)
	st := lstat(t, filepath.Join(e.workPath, workName))
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Fatalf("workdir/work mode %#o, want a directory", st.Mode)
	}
	if e.l.Whiteouts != KernelWhiteouts {
		t.Errorf("Whiteouts = %v as root on %s, want %v", e.l.Whiteouts, e.workPath, KernelWhiteouts)
	}
	e.wantWorkEmpty(t) // the probe's whiteout is gone
	if e.l.XattrPrefix() != lower.TrustedPrefix {
		t.Errorf("XattrPrefix() = %q", e.l.XattrPrefix())
	}
	if KernelWhiteouts.String() == AUFSWhiteouts.String() {
		t.Errorf("both formats print as %q", KernelWhiteouts.String())
	}
	// A second Open while the first holds the workdir is refused.
	if l2, err := Open(e.up, e.workPath, Options{XattrPrefix: lower.TrustedPrefix}); !errors.Is(err, ErrInUse) {
		if err == nil {
			l2.Close()
		}
		t.Errorf("second Open while the first is live: %v, want ErrInUse", err)
	}
	// Open again over an existing work dir.
	e.l.Close()
	l2, err := Open(e.up, e.workPath, Options{XattrPrefix: lower.TrustedPrefix})
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	l2.Close()
}

func TestTmpNameUnique(t *testing.T) {
	e := newEnv(t)
	seen := make(map[string]bool)
	for i := 0; i < 1000; i++ {
		n := e.l.tmpName()
		if seen[n] {
			t.Fatalf("tmpName repeated %q", n)
		}
		if !strings.HasPrefix(n, "#") || strings.Contains(n, "/") {
			t.Fatalf("tmpName %q", n)
		}
		seen[n] = true
	}
}
