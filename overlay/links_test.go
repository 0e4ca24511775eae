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
	stat := func(name string) unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(mnt+"/"+name, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
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
	// a is looked up again once the kernel has dropped the entry it
	// had (copyUp notifies it), and then shows c's inode.
	deadline := time.Now().Add(5 * time.Second)
	for stat("a").Ino != c.Ino && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if a := stat("a"); a.Ino != c.Ino || a.Nlink != 2 {
		t.Errorf("a: inode %d nlink %d; want c's %d and 2", a.Ino, a.Nlink, c.Ino)
	}
	if got := readFile(t, mnt+"/c"); got != "data" {
		t.Errorf("c: %q", got)
	}
}
