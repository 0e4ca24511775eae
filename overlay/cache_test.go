package overlay

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cacheDrops counts the writes to /proc/sys/vm/drop_caches since boot
// (/proc/vmstat: drop_pagecache, drop_slab). Tests of what the kernel
// keeps cached run their measurement again when another test (another
// package's, running at the same time) dropped the caches meanwhile.
func cacheDrops(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), " ")
		if name == "drop_pagecache" || name == "drop_slab" {
			c, _ := strconv.ParseUint(v, 10, 64)
			n += c
		}
	}
	return n
}

// undisturbed runs measure until it runs without a drop of the caches
// by another test, up to 50 times, and reports whether one did. measure
// reports false when it saw a drop's effects itself.
func undisturbed(t *testing.T, measure func() bool) bool {
	t.Helper()
	for try := 0; try < 50; try++ {
		drops := cacheDrops(t)
		clean := measure()
		// A drop counts when it ends, and drop_slab goes on for as
		// long as there is much to free, which measure makes: one in
		// progress now ends shortly after, and is seen then.
		time.Sleep(250 * time.Millisecond)
		if clean && cacheDrops(t) == drops {
			return true
		}
	}
	return false
}

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
	var l, g uint64
	if !undisturbed(t, func() bool {
		stat()
		lookups, getattrs := f.stats.lookups.Load(), f.stats.getattrs.Load()
		for i := 0; i < 100; i++ {
			stat()
		}
		l, g = f.stats.lookups.Load()-lookups, f.stats.getattrs.Load()-getattrs
		return true
	}) {
		t.Skip("other tests dropped the caches during every try: nothing to measure")
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
