package overlay

import (
	"bytes"
	"math/rand"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// patterned is n bytes that differ with seed.
func patterned(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// copyRangeT is copy_file_range(2) of n bytes of src at offIn to dst at
// offOut, through descriptors of its own; it returns what the call
// returned.
func copyRangeT(t *testing.T, src string, offIn int64, dst string, offOut int64, n int) (int, error) {
	t.Helper()
	in, err := unix.Open(src, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(out)
	return unix.CopyFileRange(in, &offIn, out, &offOut, n, 0)
}

// TestCopyFileRange: copy_file_range(2) inside the mount is served by the
// daemon (it would fail with EOPNOTSUPP otherwise) and gives what a
// read(2) and write(2) loop gives: a lower source, a lower destination
// copied up first, a short copy at the end of the source, a copy inside one
// file, data the writeback cache has not written back yet, and a
// destination whose pages the kernel holds.
func TestCopyFileRange(t *testing.T) {
	for _, c := range []struct {
		name                   string
		opens, passthrough, wb bool
	}{
		{name: "noopen", wb: true},
		{name: "opens", opens: true, wb: true},
		{name: "opens-writethrough", opens: true},
		{name: "passthrough", opens: true, passthrough: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			wb := WritebackOff
			if c.wb {
				wb = WritebackOn
			}
			testCopyFileRange(t, func(lo string) (string, string, *FS) {
				return nosecMountW(t, NoSecInherit, c.passthrough, wb, c.opens, lo)
			})
		})
	}
}

func testCopyFileRange(t *testing.T, mount func(lower string) (mnt, up string, f *FS)) {
	lo := t.TempDir()
	src := patterned(300000, 1)
	dst := patterned(20000, 2)
	if err := os.WriteFile(lo+"/src", src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lo+"/dst", dst, 0o644); err != nil {
		t.Fatal(err)
	}
	mnt, up, f := mount(lo)
	check := func(what, name string, want []byte) {
		t.Helper()
		if got := readFile(t, mnt+"/"+name); got != string(want) {
			t.Errorf("%s: %s through the mount is not the copy (%d bytes, want %d)", what, name, len(got), len(want))
		}
	}
	copied := func(what string, n int, err error, want int) {
		t.Helper()
		if err != nil || n != want {
			t.Fatalf("%s: copy_file_range = %d, %v; want %d", what, n, err, want)
		}
	}
	defer func() {
		// Served by the daemon each time: the kernel would otherwise
		// have copied through its page cache (EOPNOTSUPP).
		if got := f.Stats().CopyRanges; got != 6 {
			t.Errorf("%d copies served by copying in the layers, want 6", got)
		}
	}()

	n, err := copyRangeT(t, mnt+"/src", 0, mnt+"/new", 0, len(src))
	copied("lower to a new file", n, err, len(src))
	check("lower to a new file", "new", src)
	if got := readFile(t, up+"/new"); got != string(src) {
		t.Errorf("upper new: %d bytes, want the copy's %d", len(got), len(src))
	}

	// Into the lower file dst, past its end: copied up, bytes kept
	// around the range, the gap a hole of zeros.
	n, err = copyRangeT(t, mnt+"/src", 100, mnt+"/dst", 5000, 3000)
	copied("lower into a lower file", n, err, 3000)
	want := bytes.Clone(dst)
	copy(want[5000:], src[100:3100])
	check("lower into a lower file", "dst", want)
	n, err = copyRangeT(t, mnt+"/src", 0, mnt+"/dst", 30000, 10)
	copied("past the end of dst", n, err, 10)
	want = append(append(want, make([]byte, 10000)...), src[:10]...)
	check("past the end of dst", "dst", want)
	if got := readFile(t, lo+"/dst"); got != string(dst) {
		t.Errorf("the lower dst changed")
	}

	n, err = copyRangeT(t, mnt+"/src", int64(len(src)-10), mnt+"/short", 0, 100)
	copied("from 10 bytes before the end", n, err, 10)
	check("from 10 bytes before the end", "short", src[len(src)-10:])

	// Inside one file (copied up by the copy into it).
	n, err = copyRangeT(t, mnt+"/dst", 0, mnt+"/dst", 40000, 1000)
	copied("inside dst", n, err, 1000)
	head := bytes.Clone(want[:1000])
	want = append(append(want, make([]byte, 40000-len(want))...), head...)
	check("inside dst", "dst", want)

	// Data still in the writeback cache is written back before the copy;
	// the destination's cached pages are dropped after it.
	fn, err := os.OpenFile(mnt+"/new", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fn.Close()
	if _, err := fn.WriteAt([]byte("fresh bytes"), 7); err != nil {
		t.Fatal(err)
	}
	readFile(t, mnt+"/short")
	n, err = copyRangeT(t, mnt+"/new", 0, mnt+"/short", 0, 20)
	copied("cached data", n, err, 20)
	wantShort := append([]byte(nil), src[:7]...)
	wantShort = append(wantShort, "fresh bytes"...)
	wantShort = append(wantShort, src[18:20]...)
	check("cached data", "short", wantShort)
}

// TestCopyFileRangeSetuid: the daemon refuses a copy into a setuid or
// setgid file (EOPNOTSUPP): the request carries no word on whether the
// caller may keep those bits (FUSE_WRITE_KILL_SUIDGID is a WRITE's). The
// kernel then copies through the page cache itself (vfs_copy_file_range()
// falls back to do_splice_direct() inside one filesystem), with WRITEs:
// the copy succeeds, and root, who holds CAP_FSETID, keeps the bits (the
// privilege tests cover the other callers).
func TestCopyFileRangeSetuid(t *testing.T) {
	lo := t.TempDir()
	if err := os.WriteFile(lo+"/src", []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	mnt, up := rwMount(t, lo)
	for _, mode := range []uint32{0o4755, 0o2755} {
		name := mnt + "/priv"
		os.Remove(name)
		if err := os.WriteFile(name, []byte("old!"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(name, mode); err != nil {
			t.Fatal(err)
		}
		if n, err := copyRangeT(t, mnt+"/src", 0, name, 0, 4); err != nil || n != 4 {
			t.Errorf("mode %#o: copy_file_range = %d, %v; want 4", mode, n, err)
		}
		for _, p := range []string{name, up + "/priv"} {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&0o7777 != mode {
				t.Errorf("mode %#o: %s is now %#o", mode, p, st.Mode&0o7777)
			}
		}
		if got := readFile(t, name); got != "data" {
			t.Errorf("mode %#o: content %q, want the copy", mode, got)
		}
	}
}

// TestCopyFileRangeTimes: the copy changes the destination's mtime as a
// write does, and the upper file ends with the time and size the mount
// shows (with the writeback cache the kernel keeps the times and sends
// them after the copy).
func TestCopyFileRangeTimes(t *testing.T) {
	lo := t.TempDir()
	if err := os.WriteFile(lo+"/src", patterned(10000, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lo+"/dst", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(lo+"/dst", old, old); err != nil {
		t.Fatal(err)
	}
	mnt, up := rwMount(t, lo)
	if n, err := copyRangeT(t, mnt+"/src", 0, mnt+"/dst", 0, 10000); err != nil || n != 10000 {
		t.Fatalf("copy_file_range = %d, %v", n, err)
	}
	var m, u unix.Stat_t
	if err := unix.Stat(mnt+"/dst", &m); err != nil {
		t.Fatal(err)
	}
	if time.Unix(m.Mtim.Unix()).Before(old.Add(time.Hour)) {
		t.Errorf("mtime through the mount is still %v", time.Unix(m.Mtim.Unix()))
	}
	fd, err := unix.Open(mnt+"/dst", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Syncfs(fd)
	unix.Close(fd)
	if err := unix.Stat(up+"/dst", &u); err != nil {
		t.Fatal(err)
	}
	if u.Mtim != m.Mtim || u.Size != 10000 {
		t.Errorf("upper: mtime %v size %d; the mount shows %v and 10000", time.Unix(u.Mtim.Unix()), u.Size, time.Unix(m.Mtim.Unix()))
	}
}
