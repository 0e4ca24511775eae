package overlay

import (
	"os"
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
