package oracle_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

const reflinkSize = 8 << 20

func reflinkLower(t testing.TB, l *testutil.Layer) {
	for _, n := range []string{"opened", "written"} {
		l.File(n, string(pattern(reflinkSize, byte(len(n)))), 0o644)
	}
	fd, err := unix.Open(l.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil { // allocate the extents
		t.Fatal(err)
	}
}

// TestWriteReflinkCopyUp: on a filesystem that shares extents (btrfs, XFS
// with reflink), a copy-up clones the data: the upper file's extents are
// the lower file's, flagged FIEMAP_EXTENT_SHARED. "opened" is only opened
// for writing (goverlay with noopen=0, whose OPEN copies up, as the
// kernel's does); "written" gets one byte at its start, so all but its
// first extent stay shared. The kernel overlay, on the same filesystem, is the
// control.
func TestWriteReflinkCopyUp(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	t.Parallel()
	for _, fs := range []struct {
		name string
		mkfs []string
	}{
		{"btrfs", []string{"mkfs.btrfs", "-q"}},
		{"xfs", []string{"mkfs.xfs", "-q", "-m", "reflink=1"}},
	} {
		// One after the other: parallel losetup -f can pick one device.
		t.Run(fs.name, func(t *testing.T) {
			root := testutil.LoopFS(t, fs.name, 512<<20, fs.mkfs...)
			sc := wscenario{name: "reflink", lower: reflinkLower}
			for _, kernel := range []bool{true, false} {
				label := "goverlay"
				if kernel {
					label = "kernel"
				}
				t.Run(label, func(t *testing.T) {
					base := filepath.Join(root, label)
					if err := os.Mkdir(base, 0o755); err != nil {
						t.Fatal(err)
					}
					st := newWStackIn(t, sc, base)
					// "opened" is copied up at the open only
					// where the open is a request.
					st.opens = true
					var mnt string
					var unmount func()
					if kernel {
						mnt = st.kernel(t)
						unmount = func() { testutil.UnmountKernel(t, mnt) }
					} else {
						g := st.goverlay(t)
						mnt, unmount = g.Dir, func() { g.Unmount(t) }
					}
					fd, err := unix.Open(filepath.Join(mnt, "opened"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
					if err != nil {
						t.Fatal(err)
					}
					unix.Close(fd)
					fd, err = unix.Open(filepath.Join(mnt, "written"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := unix.Pwrite(fd, []byte("!"), 0); err != nil {
						t.Error(err)
					}
					unix.Close(fd)
					unmount()
					checkShared(t, st, "opened", 0)
					checkShared(t, st, "written", 128<<10)
				})
			}
		})
	}
}

// checkShared checks that the upper copy of name has the lower file's
// content (but for the byte written at 0 if written > 0) and shares its
// extents with it, but for at most written bytes.
func checkShared(t *testing.T, st wstack, name string, written uint64) {
	t.Helper()
	lp, up := filepath.Join(st.lower, name), filepath.Join(st.upper, name)
	want := pattern(reflinkSize, byte(len(name)))
	if written > 0 {
		want[0] = '!'
	}
	if got, err := os.ReadFile(up); err != nil {
		t.Fatal(err)
	} else if !bytes.Equal(got, want) {
		t.Errorf("%s: upper content: %s", name, firstDiff(got, want))
	}
	le, err := testutil.Fiemap(lp)
	if err != nil {
		t.Fatal(err)
	}
	ue, err := testutil.Fiemap(up)
	if err != nil {
		t.Fatal(err)
	}
	var shared, total uint64
	for _, e := range ue {
		total += e.Length
		if !e.Shared() {
			continue
		}
		// The same physical blocks at the same file offsets.
		p, ok := physAt(le, e.Logical)
		q, ok2 := physAt(le, e.Logical+e.Length-1)
		if !ok || !ok2 || p != e.Physical || q != e.Physical+e.Length-1 {
			t.Errorf("%s: upper extent %v is shared but not with the lower file's %v", name, e, le)
			continue
		}
		shared += e.Length
	}
	if total < reflinkSize || shared+written < reflinkSize {
		t.Errorf("%s: %d of the upper copy's %d mapped bytes are shared with the lower file, want at least %d\nupper: %v\nlower: %v",
			name, shared, total, reflinkSize-written, ue, le)
	}
}

// physAt is the physical address of file offset off in extents.
func physAt(extents []testutil.Extent, off uint64) (uint64, bool) {
	for _, e := range extents {
		if off >= e.Logical && off < e.Logical+e.Length {
			return e.Physical + off - e.Logical, true
		}
	}
	return 0, false
}
