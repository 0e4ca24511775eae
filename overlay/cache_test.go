package overlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestWarmLookupsStayInKernel: once looked up, a deep path and a miss are
// answered by the kernel's caches: repeated stats reach the daemon no more.
func TestWarmLookupsStayInKernel(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/a/b/c/d/e", "x")
	mnt, _, f := nosecMount(t, NoSecInherit, false, lo)
	stat := func() {
		if _, err := os.Stat(mnt + "/a/b/c/d/e"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(mnt + "/a/b/missing"); !os.IsNotExist(err) {
			t.Fatalf("missing: %v", err)
		}
	}
	// A drop_caches elsewhere on the machine (another package's tests)
	// costs the next stats their lookups: a few tries, one of them
	// without any.
	var l, g uint64
	for try := 0; try < 5; try++ {
		stat()
		lookups, getattrs := f.stats.lookups.Load(), f.stats.getattrs.Load()
		for i := 0; i < 100; i++ {
			stat()
		}
		if l, g = f.stats.lookups.Load()-lookups, f.stats.getattrs.Load()-getattrs; l == 0 && g == 0 {
			break
		}
	}
	if l != 0 || g != 0 {
		t.Errorf("100 warm stats and misses sent %d lookups and %d getattrs, want 0", l, g)
	}
	if f.stats.fastExecDirs.Load() == 0 {
		t.Errorf("no directory was found fast-exec")
	}
}

// TestNameCreatedAfterCachedMiss: a miss the kernel cached does not hide a
// name created through the mount.
func TestNameCreatedAfterCachedMiss(t *testing.T) {
	lo := openDir(t)
	mnt, _, _ := nosecMount(t, NoSecInherit, false, lo)
	for i := 0; i < 2; i++ {
		if _, err := os.Stat(mnt + "/later"); !os.IsNotExist(err) {
			t.Fatalf("later: %v", err)
		}
	}
	if err := os.WriteFile(mnt+"/later", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mnt + "/later"); err != nil {
		t.Errorf("created after a cached miss: %v", err)
	}
	// And gone at once after unlink, and renamed names move at once.
	if err := os.Rename(mnt+"/later", mnt+"/moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mnt + "/later"); !os.IsNotExist(err) {
		t.Errorf("old name after rename: %v", err)
	}
	if _, err := os.Stat(mnt + "/moved"); err != nil {
		t.Errorf("new name after rename: %v", err)
	}
	if err := os.Remove(mnt + "/moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mnt + "/moved"); !os.IsNotExist(err) {
		t.Errorf("after unlink: %v", err)
	}
}

// TestChmodDirTakesEffectAtOnce: the kernel's cached attributes of a
// fast-exec directory are updated by the chmod itself: another user is
// denied at once, and let in again at once.
func TestChmodDirTakesEffectAtOnce(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/d/f", "x")
	os.Chmod(lo+"/d", 0o755)
	os.Chmod(lo+"/d/f", 0o644)
	mnt, up, _ := nosecMount(t, NoSecInherit, false, lo)
	cat := func() error {
		return exec.Command("setpriv", append(asNobody[1:], "cat", mnt+"/d/f")...).Run()
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed")
	}
	if err := cat(); err != nil {
		t.Fatalf("cat as nobody through a 0755 dir: %v", err)
	}
	if err := os.Chmod(mnt+"/d", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := cat(); err == nil {
		t.Errorf("cat as nobody succeeded right after chmod 0700")
	}
	if err := os.Chmod(mnt+"/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cat(); err != nil {
		t.Errorf("cat as nobody right after chmod 0755: %v", err)
	}
	// An ACL that shuts nobody out, set through the mount.
	needACLs(t, filepath.Dir(up))
	if out, err := exec.Command("setfacl", "-m", "u:nobody:---", mnt+"/d").CombinedOutput(); err != nil {
		t.Fatalf("setfacl through the mount: %v %s", err, out)
	}
	if err := cat(); err == nil {
		t.Errorf("cat as nobody succeeded right after setfacl u:nobody:---")
	}
}
