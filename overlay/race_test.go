package overlay

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCopyUpRacingRenameOver: a rename over a lower file whose copy-up
// (started by a written-back page of a descriptor opened for writing) has
// chosen its upper name but not yet published it. The rename waits for the
// copy-up, and then replaces the copied-up file: the name shows the file
// renamed there, in the mount and in the upper layer, and the writes
// through the descriptor stay with the open file, not with the file now
// under its old name.
func TestCopyUpRacingRenameOver(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lo+"/a", "lower a")
	write(t, lo+"/b", "lower b")
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work})

	reached, proceed := make(chan struct{}), make(chan struct{})
	f.hooks.beforePublish.set(func(name string) {
		if name == "a" {
			close(reached)
			<-proceed
		}
	})
	rw, err := os.OpenFile(mnt+"/a", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if _, err := rw.WriteAt([]byte("OPEN"), 0); err != nil {
		t.Fatal(err)
	}
	// Starts the write-back of the page; its WRITE copies a up.
	wb := make(chan error, 1)
	go func() {
		wb <- unix.SyncFileRange(int(rw.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		close(proceed)
		t.Fatal("the write-back did not copy a up")
	}
	renamed := make(chan error, 1)
	go func() { renamed <- os.Rename(mnt+"/b", mnt+"/a") }()
	// Time for the rename to reach the daemon and, without the copy-up's
	// lock, to replace the name the copy-up is about to publish.
	time.Sleep(300 * time.Millisecond)
	close(proceed)
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
	if err := <-wb; err != nil {
		t.Fatal(err)
	}
	if _, err := rw.WriteAt([]byte("MORE"), 8); err != nil {
		t.Fatal(err)
	}
	if err := rw.Sync(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	n, err := rw.ReadAt(buf, 0)
	if got := string(buf[:n]); got != "OPENr a\x00MORE" {
		t.Errorf("the open file reads %q (%v), want its own data", got, err)
	}
	if got := readFile(t, mnt+"/a"); got != "lower b" {
		t.Errorf("a in the mount: %q, want the file renamed there", got)
	}
	if got := readFile(t, up+"/a"); got != "lower b" {
		t.Errorf("a in the upper layer: %q, want the file renamed there", got)
	}
	if _, err := os.Lstat(mnt + "/b"); !os.IsNotExist(err) {
		t.Errorf("b after the rename: %v", err)
	}
}

// TestDataCopyInAfterTimesKeepsThem: with the writeback cache, the kernel
// keeps a file's mtime and flushes it in a SETATTR which, without waiting
// for the write-back (syncfs's first pass, the flusher), is in flight
// together with the WRITE of the pages. Here the WRITE of a metacopy file,
// which copies its data in, is held until that SETATTR has been served:
// the copy-in must keep the mtime it set, so that the upper file ends with
// the time the mount shows.
func TestDataCopyInAfterTimesKeepsThem(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lo+"/f", strings.Repeat("lower data ", 1000))
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, Metacopy: true, Writeback: WritebackOn})
	if !f.io.writeback {
		t.Skipf("no writeback cache: %s", f.io.why)
	}
	if err := os.Chmod(mnt+"/f", 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Lgetxattr(up+"/f", "trusted.overlay.metacopy", nil); err != nil {
		t.Fatalf("the chmod made no metacopy file: %v", err)
	}
	var once sync.Once
	f.hooks.beforeDataIn.set(func(name string) {
		once.Do(func() { time.Sleep(300 * time.Millisecond) })
	})
	fd := openT(t, mnt+"/f", unix.O_RDWR)
	defer unix.Close(fd)
	pwriteT(t, fd, "written", 0)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
	// syncfs returns with the WRITE still in flight; fsync waits for it.
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	var live, disk unix.Stat_t
	if err := unix.Fstat(fd, &live); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(up+"/f", &disk); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Lgetxattr(up+"/f", "trusted.overlay.metacopy", nil); err == nil {
		t.Fatal("the write did not copy the data in")
	}
	if live.Mtim != disk.Mtim {
		t.Errorf("mtime shown %d.%09d, upper file's %d.%09d", live.Mtim.Sec, live.Mtim.Nsec, disk.Mtim.Sec, disk.Mtim.Nsec)
	}
}
