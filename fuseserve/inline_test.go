package fuseserve

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// waiting is a filesystem whose request named by blocks waits for a
// LOOKUP of "go", which only a reader other than the one serving it can
// read; it gives up after a deadlock's worth of time.
type waiting struct {
	fuse.RawFileSystem
	arrived chan struct{}
	// entered is closed when the blocked request begins to wait.
	entered chan struct{}
	// lookup blocks a LOOKUP of "wait"; fsync blocks an FSYNC.
	lookup, fsync bool
	// saw records whether the blocked request saw "go" arrive.
	saw chan bool
	// before, when set, is called by the blocked request before it
	// waits.
	before func()
}

const deadlockWait = 20 * time.Second

func (w *waiting) block() {
	if w.before != nil {
		w.before()
	}
	close(w.entered)
	select {
	case <-w.arrived:
		w.saw <- true
	case <-time.After(deadlockWait):
		w.saw <- false
	}
}

func (w *waiting) Lookup(cancel <-chan struct{}, in *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	switch {
	case name == "go":
		close(w.arrived)
	case name == "wait" && w.lookup:
		w.block()
	}
	return w.RawFileSystem.Lookup(cancel, in, name, out)
}

func (w *waiting) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if w.fsync {
		w.block()
	}
	return w.RawFileSystem.Fsync(cancel, in)
}

// waitFor runs op, which blocks the request w blocks, then, once that
// request waits, looks "go" up; it fails unless the blocked request saw
// that LOOKUP.
func waitFor(t *testing.T, mnt string, w *waiting, op func() error) {
	t.Helper()
	errs := make(chan error, 1)
	go func() { errs <- op() }()
	select {
	case <-w.entered:
	case <-time.After(deadlockWait):
		t.Fatal("the request to block never came")
	}
	go func() {
		var st unix.Stat_t
		unix.Lstat(filepath.Join(mnt, "go"), &st)
	}()
	if !<-w.saw {
		t.Fatalf("a request that waits for another was never joined by it: one reader served both")
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestInlineWatchdog: a request that waits for a later one (as an open
// waits for a RELEASE) gets it: the watchdog hands the reading to a new
// reader once the request has been served for two of its ticks.
func TestInlineWatchdog(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "wait"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w := &waiting{arrived: make(chan struct{}), entered: make(chan struct{}), saw: make(chan bool, 1), lookup: true}
	mnt, s := mountLoopback(t, dir, Options{}, func(raw fuse.RawFileSystem) fuse.RawFileSystem {
		w.RawFileSystem = raw
		return w
	})
	if s.inline == nil {
		t.Fatalf("transport %q: the inline readers do not serve", s.Transport())
	}
	before := s.inline.handoffs.Load()
	waitFor(t, mnt, w, func() error {
		_, err := os.Lstat(filepath.Join(mnt, "wait"))
		return err
	})
	if s.inline.handoffs.Load() == before {
		t.Errorf("no reader was started for the blocked LOOKUP")
	}
}

// TestWillWait: a request whose handler says it will wait
// (Server.WillWait) gets the later request it waits for read, without the
// watchdog (whose tick is here an hour).
func TestWillWait(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "wait"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The handler finds the server through an atomic: the race
	// detector cannot see that the request follows the mount.
	var srv atomic.Pointer[Server]
	w := &waiting{arrived: make(chan struct{}), entered: make(chan struct{}), saw: make(chan bool, 1), lookup: true,
		before: func() { srv.Load().WillWait() }}
	mnt, s := mountLoopback(t, dir, Options{stallTick: time.Hour}, func(raw fuse.RawFileSystem) fuse.RawFileSystem {
		w.RawFileSystem = raw
		return w
	})
	srv.Store(s)
	waitFor(t, mnt, w, func() error {
		_, err := os.Lstat(filepath.Join(mnt, "wait"))
		return err
	})
}

// TestInlineHandsOff: an FSYNC hands the reading off before it is served,
// without the watchdog (whose tick is here an hour): it may wait for other
// requests, as an LSEEK waits for the WRITEs of the pages it has the
// kernel write back.
func TestInlineHandsOff(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &waiting{arrived: make(chan struct{}), entered: make(chan struct{}), saw: make(chan bool, 1), fsync: true}
	mnt, _ := mountLoopback(t, dir, Options{stallTick: time.Hour}, func(raw fuse.RawFileSystem) fuse.RawFileSystem {
		w.RawFileSystem = raw
		return w
	})
	f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	waitFor(t, mnt, w, f.Sync)
}

// TestInlineConcurrent: many callers at once, each writing and reading its
// own file, all through the inline readers; -race watches the handoffs.
func TestInlineConcurrent(t *testing.T) {
	dir := t.TempDir()
	mnt, _ := mountLoopback(t, dir, Options{stallTick: 20 * time.Microsecond}, nil)
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			p := filepath.Join(mnt, "f"+string(rune('a'+i)))
			var err error
			for j := 0; j < 50 && err == nil; j++ {
				want := []byte{byte(i), byte(j)}
				if err = os.WriteFile(p, want, 0o644); err != nil {
					break
				}
				var got []byte
				if got, err = os.ReadFile(p); err == nil && string(got) != string(want) {
					err = &os.PathError{Op: "read back " + string(got), Path: p, Err: unix.EIO}
				}
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
