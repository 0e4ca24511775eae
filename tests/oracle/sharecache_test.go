package oracle_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// sharedLower is the lower layer of the sharecache tests: files to open
// across a copy-up, a larger one to read, and a binary to run.
func sharedLower(t testing.TB, l *testutil.Layer) {
	l.File("meta", "lower meta\n", 0o644)
	l.File("data", "lower data\n", 0o644)
	l.File("later", "lower later\n", 0o644)
	l.File("big", strings.Repeat("0123456789abcdef", 64<<10), 0o644)
	bin, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	l.File("true", string(bin), 0o755)
}

// openedBeforeCopyUp runs the steps of TestShareCacheCopyUp on mnt and
// logs what each shows. shared says the mount is goverlay's with
// sharecache=on: an open for writing or a truncate of a file that is
// still open from its lower layer then fails with ETXTBSY, and the write
// is made once the reader has closed. mapSeesWrites says it is goverlay's
// without: a mapping made before a write shows it, which is checked
// here, and logged as the kernel overlay's lower pages.
func openedBeforeCopyUp(t *testing.T, mnt string, shared, mapSeesWrites bool) []string {
	var log []string
	logf := func(format string, a ...any) { log = append(log, fmt.Sprintf(format, a...)) }
	path := func(name string) string { return filepath.Join(mnt, name) }
	read := func(fd int) string {
		b := make([]byte, 64)
		n, err := unix.Pread(fd, b, 0)
		if err != nil {
			return "read: " + err.Error()
		}
		return string(b[:n])
	}
	mapped := func(fd int, size int) ([]byte, func()) {
		m, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("mmap: %v", err)
		}
		return m, func() { unix.Munmap(m) }
	}
	open := func(name string, flags int) int {
		fd, err := unix.Open(path(name), flags|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		return fd
	}

	// A copy-up of the metadata alone: the reader's descriptor and
	// mapping, and a reader's that opens after it, show the data, which
	// did not change.
	r := open("meta", unix.O_RDONLY)
	m, unmap := mapped(r, 11)
	if err := os.Chmod(path("meta"), 0o600); err != nil {
		t.Fatal(err)
	}
	logf("meta after chmod: read %q, mapped %q", read(r), m)
	r2 := open("meta", unix.O_RDONLY)
	m2, unmap2 := mapped(r2, 11)
	logf("meta opened after chmod: read %q, mapped %q", read(r2), m2)
	unmap2()
	unix.Close(r2)

	// A copy-up for writing while a reader has the file open: on the
	// kernel overlay the reader's read(2) follows the copy-up, its
	// mapping keeps the lower file's pages.
	d := open("data", unix.O_RDONLY)
	dm, dunmap := mapped(d, 11)
	w, err := unix.Open(path("data"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if shared {
		if !errors.Is(err, syscall.ETXTBSY) {
			t.Errorf("sharecache: open for writing while the lower file is open: %v, want ETXTBSY", err)
		}
		if err == nil {
			unix.Close(w)
		}
		if err := os.Truncate(path("data"), 0); !errors.Is(err, syscall.ETXTBSY) {
			t.Errorf("sharecache: truncate while the lower file is open: %v, want ETXTBSY", err)
		}
		if got := read(d); got != "lower data\n" {
			t.Errorf("sharecache: data after the refused writes: %q", got)
		}
		dunmap()
		unix.Close(d)
		// As the reader would have, had it opened after the write.
		w = open("data", unix.O_WRONLY)
		d = open("data", unix.O_RDONLY)
		dm, dunmap = mapped(d, 11)
		if _, err := unix.Pwrite(w, []byte("UPPER"), 0); err != nil {
			t.Fatal(err)
		}
		unix.Close(w)
		logf("data written: old descriptor reads %q", read(d))
		logf("data written: old mapping shows %q", "lower data\n")
	} else {
		if err != nil {
			t.Fatalf("open data for writing: %v", err)
		}
		if _, err := unix.Pwrite(w, []byte("UPPER"), 0); err != nil {
			t.Fatal(err)
		}
		unix.Close(w)
		logf("data written: old descriptor reads %q", read(d))
		if mapSeesWrites {
			// One page cache per FUSE inode, as on a local
			// filesystem (man page, DIFFERENCES).
			if string(dm) != "UPPER data\n" {
				t.Errorf("data written: old mapping shows %q, want the written data", dm)
			}
			logf("data written: old mapping shows %q", "lower data\n")
		} else {
			logf("data written: old mapping shows %q", dm)
		}
	}
	dunmap()
	unix.Close(d)
	d = open("data", unix.O_RDONLY)
	dm, dunmap = mapped(d, 11)
	logf("data opened after the write: read %q, mapped %q", read(d), dm)
	dunmap()
	unix.Close(d)

	// The reader of "meta" is still open: a write now waits for it on
	// sharecache, and is then what it is on the kernel overlay.
	unmap()
	unix.Close(r)
	if err := os.WriteFile(path("meta"), []byte("upper meta\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A lower file opened, closed, then written: nothing holds it.
	if b, err := os.ReadFile(path("later")); err != nil || string(b) != "lower later\n" {
		t.Fatalf("later: %q %v", b, err)
	}
	if err := os.WriteFile(path("later"), []byte("upper later\n"), 0o644); err != nil {
		t.Fatalf("later, written once its reader closed: %v", err)
	}
	out, err := exec.Command(path("true")).CombinedOutput()
	logf("exec of a lower binary: %q %v", out, err)
	return log
}

// TestShareCacheCopyUp: what a descriptor opened before a copy-up reads,
// and what its mapping shows, on the kernel overlay and on goverlay with
// and without -o sharecache=on; and the merged views and upper layers
// they leave. With sharecache, writing a file that is open from its lower
// layer is refused (ETXTBSY) until the reader closes; without, a mapping
// made before a write shows it; the rest is the kernel's.
func TestShareCacheCopyUp(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	sc := wscenario{name: "sharecache", lower: sharedLower}
	ks := newWStack(t, sc)
	kmnt := ks.kernel(t)
	since := time.Now().Add(-time.Second)
	want := openedBeforeCopyUp(t, kmnt, false, false)
	kt := normTimes(testutil.Snapshot(t, kmnt), since, false)
	for _, c := range []struct {
		name   string
		opts   []string
		shared bool
	}{
		{"default", nil, false},
		{"noopen=0", []string{"-o", "noopen=0"}, false},
		{"sharecache=on", []string{"-o", "sharecache=on"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.shared {
				testutil.SkipIfMasked(t, "passthrough", "sharecache=on")
			} else {
				testutil.SkipIfOptions(t, "this case")
			}
			gs := newWStack(t, sc)
			extra := append(goverlayWriteOpts(false), c.opts...)
			g := testutil.Mount(t, testutil.Options{Lower: []string{gs.lower}, Upper: gs.upper, Work: gs.work, Extra: extra})
			if st := testutil.ReadStats(t, g); st.ShareCache != c.shared {
				t.Fatalf("sharecache %v, want %v: %s", st.ShareCache, c.shared, st.IOReason)
			}
			got := openedBeforeCopyUp(t, g.Dir, c.shared, !c.shared)
			for _, d := range testutil.DiffLines(want, got, "kernel", "goverlay") {
				t.Error(d)
			}
			gt := normTimes(testutil.Snapshot(t, g.Dir), since, false)
			compareW(t, "merged views", kt, gt, testutil.DiffOptions{A: "kernel", B: "goverlay"})
			compareUppers(t, ks, gs, g, since, false)
		})
	}
}

// TestShareCachePages: with -o sharecache=on a file still in its lower
// layer leaves no pages in the mount's own page cache after a read or a
// mapping (cachestat(2) of the mount's file), where the default mount
// caches what it read. A binary of the lower layer runs in each.
func TestShareCachePages(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	sc := wscenario{name: "pages", lower: sharedLower}
	for _, c := range []struct {
		name string
		opts []string
		// readCached and mapCached: whether the mount's page cache
		// holds the file after a read, and after a mapping too.
		readCached, mapCached bool
	}{
		{"default", nil, true, true},
		{"sharecache=on", []string{"-o", "sharecache=on"}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.opts != nil {
				testutil.SkipIfMasked(t, "passthrough", "sharecache=on")
			} else {
				testutil.SkipIfOptions(t, "this case")
			}
			gs := newWStack(t, sc)
			g := testutil.Mount(t, testutil.Options{Lower: []string{gs.lower}, Upper: gs.upper, Work: gs.work, Extra: c.opts})
			f, err := os.Open(filepath.Join(g.Dir, "big"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cached := func(what string, want bool) {
				t.Helper()
				var cs unix.Cachestat_t
				if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
					t.Skipf("cachestat: %v", err)
				}
				if got := cs.Cache != 0; got != want {
					t.Errorf("after %s the mount's own page cache holds %d pages of the lower file; want some: %v", what, cs.Cache, want)
				}
			}
			b, err := os.ReadFile(f.Name())
			if err != nil || len(b) != 1<<20 {
				t.Fatalf("read big: %d bytes, %v", len(b), err)
			}
			cached("a read", c.readCached)
			m, err := unix.Mmap(int(f.Fd()), 0, 1<<20, unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				t.Fatalf("mmap big: %v", err)
			}
			for i := 0; i < len(m); i += 4096 {
				if m[i] != '0' {
					t.Errorf("big, mapped: byte %d is %q, want '0'", i, m[i])
					break
				}
			}
			unix.Munmap(m)
			cached("a read and a mapping", c.mapCached)
			cmd := exec.Command(filepath.Join(g.Dir, "true"))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("exec of a lower binary: %v %s", err, out)
			}
		})
	}
}

// TestShareCacheStackedLower: a lower layer on a kernel overlay is stacked
// too deep for a backing file (fuse_backing_open() refuses it with
// ELOOP): with -o sharecache=on its files open cached, and the upper
// layer's files still get passthrough.
func TestShareCacheStackedLower(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	testutil.SkipIfMasked(t, "passthrough", "sharecache=on")
	sc := wscenario{name: "stacked", lower: sharedLower}
	ks := newWStack(t, sc)
	lower := ks.kernel(t)
	gs := newWStack(t, sc)
	g := testutil.Mount(t, testutil.Options{Lower: []string{lower}, Upper: gs.upper, Work: gs.work, Extra: []string{"-o", "sharecache=on"}})
	for range 2 {
		if b, err := os.ReadFile(filepath.Join(g.Dir, "meta")); err != nil || string(b) != "lower meta\n" {
			t.Fatalf("read a lower file: %q %v", b, err)
		}
	}
	if err := os.WriteFile(filepath.Join(g.Dir, "new"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(g.Dir, "new")); err != nil || string(b) != "new\n" {
		t.Fatalf("read back: %q %v", b, err)
	}
	st := testutil.ReadStats(t, g)
	if !st.Passthrough || st.OpensPassthrough == 0 || st.OpensCached == 0 {
		t.Errorf("passthrough %v, opens with passthrough %d, cached %d: want passthrough on, the upper file's write with it, the lower file's reads cached",
			st.Passthrough, st.OpensPassthrough, st.OpensCached)
	}
}
