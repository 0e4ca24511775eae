package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

// uringWorkload makes every kind of request the kernel sends over a ring
// and checks the answers: lookups, creates, writes and reads larger than
// one payload buffer, listings of several READDIRPLUS batches, xattrs,
// links, renames, removals and a copy-up.
func uringWorkload(t *testing.T, mnt string) {
	t.Helper()
	big := bytes.Repeat([]byte("0123456789abcdef"), (3<<20)/16+7) // 3 MiB and a bit
	if err := os.WriteFile(filepath.Join(mnt, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(big))
	}
	// Not from the page cache: through READ requests.
	fd, err := unix.Open(filepath.Join(mnt, "big"), unix.O_RDONLY|unix.O_DIRECT, 0)
	if err == nil {
		// Page-aligned, as O_DIRECT wants.
		al, err := unix.Mmap(-1, 0, 256<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(al)
		n, err := unix.Pread(fd, al, 1<<20)
		unix.Close(fd)
		if err != nil || n != len(al) || !bytes.Equal(al, big[1<<20:1<<20+n]) {
			t.Fatalf("O_DIRECT pread: %d, %v", n, err)
		}
	}
	dir := filepath.Join(mnt, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 600 {
		name := fmt.Sprintf("file-with-a-longish-name-%04d", i)
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != len(want) {
		t.Fatalf("listed %d entries (%v), want %d", len(ents), err, len(want))
	}
	for i, e := range ents {
		if e.Name() != want[i] {
			t.Fatalf("entry %d is %q, want %q", i, e.Name(), want[i])
		}
	}
	f := filepath.Join(mnt, "lowerfile")
	if err := unix.Setxattr(f, "user.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 16)
	if n, err := unix.Getxattr(f, "user.k", val); err != nil || string(val[:n]) != "v" {
		t.Fatalf("getxattr: %q, %v", val[:n], err)
	}
	if n, err := unix.Listxattr(f, val); err != nil || !strings.Contains(string(val[:n]), "user.k") {
		t.Fatalf("listxattr: %q, %v", val[:n], err)
	}
	if got, err := os.ReadFile(f); err != nil || string(got) != "lower" {
		t.Fatalf("copied-up file reads %q, %v", got, err)
	}
	if err := os.Symlink("big", filepath.Join(mnt, "link")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(mnt, "link")); err != nil || got != "big" {
		t.Fatalf("readlink: %q, %v", got, err)
	}
	if err := os.Rename(filepath.Join(mnt, "big"), filepath.Join(mnt, "big2")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(mnt, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lstat of a missing name: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
}

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
	uringWorkload(t, mnt)
	if after := f.Stats().RingRequests; after < before+600 {
		t.Errorf("%d requests over io_uring during the workload, want hundreds", after-before)
	}
}

// TestUringOff: -o uring=0 keeps every request on /dev/fuse, and says so.
func TestUringOff(t *testing.T) {
	o := uringLayers(t)
	o.NoUring = true
	mnt, f := mountOffered(t, o)
	uringWorkload(t, mnt)
	if s := f.Stats(); s.RingRequests != 0 || s.Transport != "/dev/fuse (uring=0)" {
		t.Errorf("uring=0: transport %q, %d requests over io_uring", s.Transport, s.RingRequests)
	}
}
