package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil/uringswitch"
)

// mountOffered mounts o with mountFS while the kernel offers FUSE over
// io_uring, and puts enable_uring back as it was. It skips the test where
// the kernel has no FUSE over io_uring.
func mountOffered(t *testing.T, o Options) (mnt string, f *FS) {
	t.Helper()
	if ok, why := uringswitch.Available(); !ok {
		t.Skip(why)
	}
	uringswitch.Offered(t, func() { mnt, f = mountFS(t, o) })
	return mnt, f
}

// uringLayers is a lower layer with one file, lowerfile, and empty upper
// and work directories.
func uringLayers(t *testing.T) Options {
	base := t.TempDir()
	o := Options{Lower: []string{filepath.Join(base, "lower")}, Upper: filepath.Join(base, "upper"), Work: filepath.Join(base, "work")}
	write(t, filepath.Join(o.Lower[0], "lowerfile"), "lower")
	for _, d := range []string{o.Upper, o.Work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// TestUringServes: the overlay's requests, a copy-up among them, are
// answered over io_uring where the kernel offers it (the transport's own
// tests are fuseserve's).
func TestUringServes(t *testing.T) {
	mnt, f := mountOffered(t, uringLayers(t))
	if s := f.Stats(); !strings.HasPrefix(s.Transport, "io_uring") {
		t.Fatalf("transport %q, want io_uring", s.Transport)
	}
	before := f.Stats().RingRequests
	uringswitch.Workload(t, mnt, "lowerfile", "lower")
	if after := f.Stats().RingRequests; after < before+600 {
		t.Errorf("%d requests over io_uring during the workload, want hundreds", after-before)
	}
}

// TestUringOff: -o uring=0 keeps every request on /dev/fuse, and says so.
func TestUringOff(t *testing.T) {
	o := uringLayers(t)
	o.NoUring = true
	mnt, f := mountOffered(t, o)
	uringswitch.Workload(t, mnt, "lowerfile", "lower")
	if s := f.Stats(); s.RingRequests != 0 || s.Transport != "/dev/fuse (uring=0)" {
		t.Errorf("uring=0: transport %q, %d requests over io_uring", s.Transport, s.RingRequests)
	}
}
