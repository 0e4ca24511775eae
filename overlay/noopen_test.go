package overlay

import (
	"fmt"
	stdlog "log"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNoOpen: with files opening without a request (the default), one OPEN
// reaches the daemon and no RELEASE; an open for writing copies nothing up
// and the first write does, with the data; a reader opened before that
// copy-up reads the written data; an open(O_TRUNC) empties the upper copy;
// an upper file unlinked while open is read to the end through its
// descriptor and leaves nothing in the workdir after the last close; and
// created files leave no fd open in the daemon once the kernel forgets
// them.
func TestNoOpen(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/a", "lower a")
	write(t, lo+"/b", "lower b")
	var log syncBuffer
	up, work := t.TempDir(), t.TempDir()
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn, Debug: true, Logger: stdlog.New(&log, "", 0)})
	if !f.io.noOpen || !f.Stats().NoOpen {
		t.Fatalf("noOpen %v (%s): the default must be on", f.io.noOpen, f.io.why)
	}

	reader, err := os.Open(mnt + "/a")
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	rw, err := os.OpenFile(mnt+"/a", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(up + "/a"); !os.IsNotExist(err) {
		t.Errorf("an open for writing copied a up: %v", err)
	}
	if _, err := rw.WriteAt([]byte("UPPER"), 0); err != nil {
		t.Fatal(err)
	}
	if err := rw.Close(); err != nil { // writes the page back
		t.Fatal(err)
	}
	if got := readFile(t, up+"/a"); got != "UPPER a" {
		t.Errorf("upper a after the write: %q", got)
	}
	buf := make([]byte, 16)
	if n, err := reader.ReadAt(buf, 0); string(buf[:n]) != "UPPER a" {
		t.Errorf("reader opened before the copy-up: %q, %v", buf[:n], err)
	}

	if err := os.WriteFile(mnt+"/b", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, up+"/b"); got != "new" {
		t.Errorf("upper b after open(O_TRUNC) and a write: %q", got)
	}

	write(t, mnt+"/gone", "still readable")
	g, err := os.Open(mnt + "/gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(mnt + "/gone"); err != nil {
		t.Fatal(err)
	}
	if n, err := g.ReadAt(buf, 0); string(buf[:n]) != "still readable" {
		t.Errorf("unlinked open file: %q, %v", buf[:n], err)
	}
	g.Close()
	// The kernel forgets the inode after the close returns.
	if left := waitWorkEmpty(t, work); len(left) != 0 {
		t.Errorf("workdir/work holds %v after the last close of the unlinked file", left)
	}

	fds := openFDs(t)
	for i := range 50 {
		write(t, mnt+"/new"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)), "c")
	}
	// The node keeps each new file's fd for the writes that follow, until
	// the kernel forgets the inode: drop the kernel's inodes.
	grown := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
			t.Fatal(err)
		}
		if grown = openFDs(t) - fds; grown <= 10 {
			break
		}
	}
	if grown > 10 {
		t.Errorf("the daemon holds %d fds more after 50 files were created and closed, and their inodes dropped", grown)
	}

	lines := log.String()
	// go-fuse's own poll probe at mount (node ^0) is not ours.
	if opens := grepLines(lines, ": OPEN ", "OPEN n18446744073709551615 "); strings.Count(opens, "\n") > 0 {
		t.Errorf("OPEN requests after the first was answered ENOSYS:\n%s", opens)
	}
	if fl := grepLines(lines, ": RELEASE ", "RELEASE n18446744073709551615 "); fl != "" {
		t.Errorf("RELEASE requests sent:\n%s", fl)
	}
}

// TestNoOpenTaughtAtMount: a mount whose first use creates files (an
// untar, a shell loop of `echo > f`) sends no RELEASE for them: the mount
// opened one regular file (two directories down here) before it was
// handed over, so the kernel already knows that it opens files by itself.
// A mount with no regular file to open (an empty lower) learns it at the
// first OPEN, as before, and works the same.
func TestNoOpenTaughtAtMount(t *testing.T) {
	for _, c := range []struct {
		name     string
		lower    func(dir string)
		releases bool
	}{
		{"deep file", func(lo string) {
			if err := os.MkdirAll(lo+"/etc/ssl", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("etc/ssl", lo+"/link"); err != nil {
				t.Fatal(err)
			}
			write(t, lo+"/etc/ssl/cert", "c")
		}, false},
		{"no file", func(lo string) {
			if err := os.MkdirAll(lo+"/empty/dir", 0o755); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			lo := t.TempDir()
			c.lower(lo)
			var log syncBuffer
			up, work := t.TempDir(), t.TempDir()
			mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work, Debug: true, Logger: stdlog.New(&log, "", 0)})
			for i := range 5 {
				name := fmt.Sprintf("%s/f%d", mnt, i)
				if err := os.WriteFile(name, []byte(name), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 5 {
				if got, want := readFile(t, fmt.Sprintf("%s/f%d", up, i)), fmt.Sprintf("%s/f%d", mnt, i); got != want {
					t.Errorf("upper f%d: %q, want %q", i, got, want)
				}
			}
			if c.releases {
				// Nothing opened before the creates: each
				// created file is released (RELEASE is sent
				// after close(2) returns).
				n := 0
				for deadline := time.Now().Add(5 * time.Second); n < 5 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					n = strings.Count(log.String(), ": RELEASE n") - strings.Count(log.String(), ": RELEASE n18446744073709551615 ")
				}
				if n != 5 {
					t.Errorf("%d RELEASE requests for 5 created files in a mount with nothing to open, want 5", n)
				}
				return
			}
			lines := log.String()
			rel := grepLines(lines, ": RELEASE ", "RELEASE n18446744073709551615 ")
			if rel != "" {
				t.Errorf("RELEASE requests for files created in a fresh mount:\n%s", rel)
			}
			opens := grepLines(lines, ": OPEN ", "OPEN n18446744073709551615 ")
			if strings.Count(opens, "\n") != 0 || opens == "" {
				t.Errorf("want one OPEN (at mount), got:\n%s", opens)
			}
		})
	}
}

// openFDs counts this process's open fds (the daemon's, in-process here).
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestNoOpenTruncatingOpen: an open(O_TRUNC) of a lower file by a caller
// without CAP_FSETID, without a write, copies the file up empty (the
// kernel sends it as a SETATTR of size 0, since atomic O_TRUNC is not
// negotiated) and clears its suid bit, as the kernel overlay does.
func TestNoOpenTruncatingOpen(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/s", "set-id")
	if err := os.Chmod(lo+"/s", 0o4777); err != nil {
		t.Fatal(err)
	}
	up, work := openDir(t), openDir(t)
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn, AllowOther: true})
	run(t, asNobody, ": > "+mnt+"/s")
	var st unix.Stat_t
	if err := unix.Stat(up+"/s", &st); err != nil {
		t.Fatalf("not copied up: %v", err)
	}
	if st.Size != 0 || st.Mode&07777 != 0o777 {
		t.Errorf("upper s: size %d mode %o, want 0 and 777", st.Size, st.Mode&07777)
	}
}

// TestNoOpenRing: with room for two shared fds in the mount, readers of
// ten files in turn, and a writer among them, each get their own file's
// data while the fds are replaced under them, and the daemon's fds stay
// bounded.
func TestNoOpenRing(t *testing.T) {
	lo := t.TempDir()
	want := map[int]string{}
	for i := range 10 {
		want[i] = strings.Repeat(string(rune('a'+i)), 300<<10)
		write(t, fmt.Sprintf("%s/f%d", lo, i), want[i])
	}
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: t.TempDir(), Work: t.TempDir()})
	// Under the ring's lock: the daemon's threads read it.
	f.fds.mu.Lock()
	f.fds.nodes = make([]*node, 2)
	f.fds.mu.Unlock()
	fds := openFDs(t)
	files := make([]*os.File, 10)
	for i := range files {
		var err error
		if files[i], err = os.OpenFile(fmt.Sprintf("%s/f%d", mnt, i), os.O_RDWR, 0); err != nil {
			t.Fatal(err)
		}
		defer files[i].Close()
	}
	if _, err := files[3].WriteAt([]byte("written"), 100<<10); err != nil {
		t.Fatal(err)
	}
	want[3] = want[3][:100<<10] + "written" + want[3][100<<10+7:]
	if err := files[3].Sync(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for off := int64(0); off < 300<<10; off += int64(len(buf)) {
		for i, fl := range files {
			n, err := fl.ReadAt(buf, off)
			if err != nil && n == 0 {
				t.Fatalf("f%d at %d: %v", i, off, err)
			}
			if got, w := string(buf[:n]), want[i][off:off+int64(n)]; got != w {
				t.Fatalf("f%d at %d: read %q..., want %q...", i, off, got[:8], w[:8])
			}
		}
	}
	// This process holds the ten files open, and is the daemon too.
	if grown := openFDs(t) - fds - len(files); grown > 4 {
		t.Errorf("the daemon holds %d fds more with room for 2 shared ones", grown)
	}
}

// TestWorkdirEmptiedAtUnmount: what the workdir still holds once the mount
// is gone goes with it. An orphan leaves at its FORGET (noopen.go), which
// the kernel does not send for an inode it still holds at the unmount; a
// name left in workdir/work stands for one here.
func TestWorkdirEmptiedAtUnmount(t *testing.T) {
	work := t.TempDir()
	// Registered before mountFS's cleanup, so it runs after the
	// unmount and FS.Close there.
	t.Cleanup(func() {
		if t.Skipped() {
			return
		}
		if left := names(t, work+"/work"); len(left) != 0 {
			t.Errorf("workdir/work holds %v after the unmount", left)
		}
	})
	mountFS(t, Options{Lower: []string{t.TempDir()}, Upper: t.TempDir(), Work: work})
	write(t, work+"/work/#kept", "orphan")
}
