package overlay

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLinkOfPartedHardLink: a link made through the mount to one name of
// a lower hard link copies that name up, which parts it from the others
// (as the kernel overlay does without index=on), and the new name shares
// the copy's inode: the same st_ino as the copied-up name, never the lower
// file's, which the other lower names keep.
func TestLinkOfPartedHardLink(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lo+"/a", "data")
	if err := os.Link(lo+"/a", lo+"/b"); err != nil {
		t.Fatal(err)
	}
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn})
	stat := lstatIn(t, mnt)
	lowerIno := stat("a").Ino
	if stat("b").Ino != lowerIno {
		t.Fatal("the lower hard links show different inode numbers")
	}
	if err := os.Link(mnt+"/a", mnt+"/c"); err != nil {
		t.Fatal(err)
	}
	c, b := stat("c"), stat("b")
	if c.Ino == lowerIno || c.Nlink != 2 {
		t.Errorf("c: inode %d (the lower file's: %v), nlink %d; want the copy's inode and 2", c.Ino, c.Ino == lowerIno, c.Nlink)
	}
	if b.Ino != lowerIno || b.Nlink != 2 {
		t.Errorf("b: inode %d, nlink %d; want the lower file's %d and 2", b.Ino, b.Nlink, lowerIno)
	}
	// a shows c's inode at once (node.part), before the kernel looks it
	// up again.
	if a := stat("a"); a.Ino != c.Ino || a.Nlink != 2 {
		t.Errorf("a: inode %d nlink %d; want c's %d and 2", a.Ino, a.Nlink, c.Ino)
	}
	if got := readFile(t, mnt+"/c"); got != "data" {
		t.Errorf("c: %q", got)
	}
}

// TestPartedHardLinkIdentity: once a change through one name of a lower
// hard link has copied it up, that name shows the copy's inode number at
// once, as on the kernel overlay, not only after the kernel has looked it
// up again (the notification that makes it do so is held here), and a
// listing does not bring back the lower file's number. Without that, a
// stat right after the change, or a listing before the kernel forgot the
// node, grouped the copy with the other lower names.
func TestPartedHardLinkIdentity(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lo+"/g1", "g")
	for _, n := range []string{"g2", "g3"} {
		if err := os.Link(lo+"/g1", lo+"/"+n); err != nil {
			t.Fatal(err)
		}
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn})
	held := make(chan struct{})
	f.hooks.partedNotify.set(func(string) { <-held })
	released := false
	release := func() {
		if !released {
			released = true
			close(held)
		}
	}
	t.Cleanup(release)
	stat := lstatIn(t, mnt)
	lowerIno := stat("g1").Ino
	if stat("g2").Ino != lowerIno || stat("g3").Ino != lowerIno {
		t.Fatal("the lower hard links show different inode numbers")
	}
	// A change that answers with attributes (SETATTR) and one that
	// does not (the WRITE of the writeback cache, at close).
	if err := unix.Chmod(mnt+"/g2", 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(mnt+"/g1", unix.O_WRONLY|unix.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, []byte("+")); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	check := func(when string) (g1, g2 uint64) {
		t.Helper()
		s1, s2, s3 := stat("g1"), stat("g2"), stat("g3")
		if s1.Ino == lowerIno || s2.Ino == lowerIno || s1.Ino == s2.Ino {
			t.Errorf("%s: g1 inode %d, g2 %d, the lower file's %d: want the copies' own", when, s1.Ino, s2.Ino, lowerIno)
		}
		if s1.Nlink != 1 || s2.Nlink != 1 || s2.Mode&0o777 != 0o600 || s1.Size != 2 {
			t.Errorf("%s: g1 nlink %d size %d, g2 nlink %d mode %#o: want 1, 2, 1, 0600", when, s1.Nlink, s1.Size, s2.Nlink, s2.Mode&0o777)
		}
		if s3.Ino != lowerIno || s3.Nlink != 3 {
			t.Errorf("%s: g3 inode %d nlink %d: want the lower file's %d and 3", when, s3.Ino, s3.Nlink, lowerIno)
		}
		return s1.Ino, s2.Ino
	}
	g1, g2 := check("right after the changes")
	if _, err := os.ReadDir(mnt); err != nil {
		t.Fatal(err)
	}
	check("after a listing")
	release()
	// Once the kernel has looked the names up again, they are nodes of
	// the copies' own, with the same numbers.
	deadline := time.Now().Add(5 * time.Second)
	before := f.stats.lookups.Load()
	for {
		stat("g1")
		stat("g2")
		if f.stats.lookups.Load()-before >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kernel did not look g1 and g2 up again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h1, h2 := check("after the kernel looked them up again"); h1 != g1 || h2 != g2 {
		t.Errorf("inode numbers changed: g1 %d → %d, g2 %d → %d", g1, h1, g2, h2)
	}
}

// lstatIn returns an lstat of names in directory dir that fails the test
// on an error.
func lstatIn(t *testing.T, dir string) func(name string) unix.Stat_t {
	return func(name string) unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(dir+"/"+name, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
}
