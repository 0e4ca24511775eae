package fuseserve

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil/uringswitch"
)

// mountOffered mounts dir with mountLoopback, over io_uring, while the
// kernel offers FUSE over io_uring, and puts enable_uring back as it was.
// It skips the test where the kernel has no FUSE over io_uring.
func mountOffered(t *testing.T, dir string, wrap func(fuse.RawFileSystem) fuse.RawFileSystem) (mnt string, s *Server) {
	t.Helper()
	if ok, why := uringswitch.Available(); !ok {
		t.Skip(why)
	}
	uringswitch.Offered(t, func() { mnt, s = mountLoopback(t, dir, Options{Uring: true}, wrap) })
	return mnt, s
}

func TestParseCPUList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"0\n", 1}, {"0-1\n", 2}, {"0-3,8-11", 12}, {"0,2,5", 6}, {"0-63", 64},
	} {
		if got, err := parseCPUList(c.in); err != nil || got != c.want {
			t.Errorf("parseCPUList(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "x", "0-", "-1", "0-a"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %d, want an error", bad, got)
		}
	}
}

// uringDir is a directory to serve, with one file.
func uringDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestUringServes(t *testing.T) {
	mnt, s := mountOffered(t, uringDir(t), nil)
	if tr := s.Transport(); !strings.HasPrefix(tr, "io_uring") {
		t.Fatalf("transport %q, want io_uring", tr)
	}
	before := s.RingRequests()
	uringswitch.Workload(t, mnt, "file", "content")
	if after := s.RingRequests(); after < before+600 {
		t.Errorf("%d requests over io_uring during the workload, want hundreds", after-before)
	}
}

// TestUringOverFusermount: the queues register with the descriptor
// fusermount3 sent.
func TestUringOverFusermount(t *testing.T) {
	needFusermount(t)
	if ok, why := uringswitch.Available(); !ok {
		t.Skip(why)
	}
	var mnt string
	var s *Server
	uringswitch.Offered(t, func() { mnt, s = mountLoopback(t, uringDir(t), Options{Uring: true, fusermount: true}, nil) })
	if tr := s.Transport(); s.direct || !strings.HasPrefix(tr, "io_uring") {
		t.Fatalf("transport %q (mounted directly: %v), want io_uring through fusermount3's descriptor", tr, s.direct)
	}
	before := s.RingRequests()
	uringswitch.Workload(t, mnt, "file", "content")
	if after := s.RingRequests(); after < before+600 {
		t.Errorf("%d requests over io_uring during the workload, want hundreds", after-before)
	}
}

func TestUringNotAskedFor(t *testing.T) {
	if ok, why := uringswitch.Available(); !ok {
		t.Skip(why)
	}
	var mnt string
	var s *Server
	uringswitch.Offered(t, func() { mnt, s = mountLoopback(t, uringDir(t), Options{}, nil) })
	uringswitch.Workload(t, mnt, "file", "content")
	if tr := s.Transport(); s.RingRequests() != 0 || tr != "/dev/fuse" {
		t.Errorf("io_uring not asked for: transport %q, %d requests over io_uring", tr, s.RingRequests())
	}
}

func TestUringRefusedFallsBack(t *testing.T) {
	// When the rings cannot serve after INIT took io_uring, the kernel
	// must be told (refuse), or it holds every request of the mount.
	fail := errors.New("injected")
	uringFailure.Store(&fail)
	t.Cleanup(func() { uringFailure.Store(nil) })
	mnt, s := mountOffered(t, uringDir(t), nil)
	uringswitch.Workload(t, mnt, "file", "content")
	if tr := s.Transport(); s.RingRequests() != 0 || !strings.Contains(tr, "injected") {
		t.Errorf("transport %q, %d requests over io_uring; want /dev/fuse after the injected failure", tr, s.RingRequests())
	}
}

// onCPU0 runs fn on a thread pinned to CPU 0, so that the requests it
// makes go to CPU 0's queue.
func onCPU0(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Not unlocked: the pinned thread ends with the goroutine.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// gatedChmods holds every SETATTR that changes a mode until open is
// closed, and tells arrived of each.
type gatedChmods struct {
	fuse.RawFileSystem
	arrived chan struct{}
	open    chan struct{}
}

func (g *gatedChmods) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.Valid&fuse.FATTR_MODE != 0 {
		g.arrived <- struct{}{}
		<-g.open
	}
	return g.RawFileSystem.SetAttr(cancel, in, out)
}

func TestUringSlowRequestDoesNotStallItsCPU(t *testing.T) {
	// Requests that wait (here: chmods the filesystem holds) take all
	// but one of CPU 0's queue threads; lookups from CPU 0 must still be
	// answered, by the last one.
	dir := t.TempDir()
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("o%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const slowN = threadsPerCPU - 1
	for i := range slowN {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("slow%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gate := &gatedChmods{arrived: make(chan struct{}, slowN), open: make(chan struct{})}
	opened := false
	release := func() {
		if !opened {
			opened = true
			close(gate.open)
		}
	}
	defer release()
	mnt, s := mountOffered(t, dir, func(raw fuse.RawFileSystem) fuse.RawFileSystem {
		gate.RawFileSystem = raw
		return gate
	})
	if tr := s.Transport(); !strings.HasPrefix(tr, "io_uring") {
		t.Fatalf("transport %q, want io_uring", tr)
	}
	chmodDone := make(chan error, slowN)
	for i := range slowN {
		slow := filepath.Join(mnt, fmt.Sprintf("slow%d", i))
		go func() { chmodDone <- onCPU0(func() error { return unix.Chmod(slow, 0o600) }) }()
	}
	for range slowN {
		select {
		case <-gate.arrived:
		case err := <-chmodDone:
			t.Fatalf("a chmod ended (%v) before the filesystem let it", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("the chmods did not all reach the filesystem")
		}
	}
	// Twenty lookups of new names from CPU 0 while the chmods wait in
	// the filesystem.
	looked := make(chan error, 1)
	go func() {
		looked <- onCPU0(func() error {
			for i := range 20 {
				if _, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("o%d", i))); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	stalled := false
	select {
	case err := <-looked:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(30 * time.Second):
		stalled = true
		t.Errorf("lookups from CPU 0 waited behind %d requests that wait", slowN)
	}
	select {
	case err := <-chmodDone:
		t.Errorf("a chmod ended (%v) while the filesystem held it", err)
	default:
	}
	release()
	for range slowN {
		if err := <-chmodDone; err != nil {
			t.Error(err)
		}
	}
	if stalled {
		<-looked
	}
}
