package oracle_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

const sparseSize = 64 << 20

// sparseSegs are the data ranges of the lower sparse file; the rest is
// holes. All are block aligned, so SEEK_DATA/SEEK_HOLE report them
// exactly.
var sparseSegs = [][2]int64{
	{0, 64 << 10},
	{5 << 20, 5<<20 + 128<<10},
	{32 << 20, 32<<20 + 64<<10},
	{sparseSize - 64<<10, sparseSize},
}

// sparseWrite is the 1-byte write, inside a data range.
const sparseWrite = 32<<20 + 1000

func sparseLower(t testing.TB, l *testutil.Layer) {
	f, err := os.OpenFile(l.P("big"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(sparseSize); err != nil {
		t.Fatal(err)
	}
	for i, s := range sparseSegs {
		if _, err := f.WriteAt(pattern(int(s[1]-s[0]), byte(20+i)), s[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func sparseWant() []byte {
	b := make([]byte, sparseSize)
	for i, s := range sparseSegs {
		copy(b[s[0]:], pattern(int(s[1]-s[0]), byte(20+i)))
	}
	b[sparseWrite] = '!'
	return b
}

// segmentsOf opens path and lists its data ranges.
func segmentsOf(t testing.TB, path string) ([][2]int64, unix.Stat_t) {
	t.Helper()
	var st unix.Stat_t
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	segs, err := testutil.DataSegments(fd)
	if err != nil {
		t.Errorf("%s: %v", path, err)
	}
	return segs, st
}

// chunk is the granularity at which the kernel's copy-up skips holes
// (OVL_COPY_UP_CHUNK_SIZE, 1 MiB): it copies a chunk that holds any data
// whole, and skips a chunk that is all hole. goverlay may keep holes more
// exactly, not less.
const chunk = 1 << 20

// checkSparseCopy checks that the data ranges of a copy are those of
// the original (lower) at chunk granularity: every lower range is data in
// the copy, every data range of the copy lies in chunks that hold lower
// data, so every all-hole chunk of the lower is a hole in the copy.
func checkSparseCopy(t testing.TB, what string, segs [][2]int64) {
	t.Helper()
	covered := func(s [2]int64, in [][2]int64) bool {
		for _, r := range in {
			if s[0] >= r[0] && s[1] <= r[1] {
				return true
			}
		}
		return false
	}
	var chunks [][2]int64
	for _, s := range sparseSegs {
		chunks = append(chunks, [2]int64{s[0] / chunk * chunk, (s[1] + chunk - 1) / chunk * chunk})
	}
	for _, s := range sparseSegs {
		if !covered(s, segs) {
			t.Errorf("%s: SEEK_DATA/SEEK_HOLE find %v: the lower's data range %v is (partly) a hole", what, segs, s)
		}
	}
	for _, s := range segs {
		if !covered(s, chunks) {
			t.Errorf("%s: SEEK_DATA/SEEK_HOLE find %v: %v is data but holds no lower data (the lower's data: %v)", what, segs, s, sparseSegs)
		}
	}
}

// TestWriteSparseCopyUp: a 1-byte write into a 64 MiB lower file that is
// mostly holes copies it up with its holes: SEEK_DATA/SEEK_HOLE find the
// lower file's data ranges in the upper file and through the mount (at
// the kernel's 1 MiB granularity at worst), the upper file takes about the
// lower's blocks, not 64 MiB, and the content is the lower's with the one
// byte changed.
func TestWriteSparseCopyUp(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	t.Parallel()
	sc := wscenario{name: "sparse", lower: sparseLower}
	want := sparseWant()
	overlays(t, sc, func(t *testing.T, kernel bool, mnt string, unmount func() wstack) {
		p := filepath.Join(mnt, "big")
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Pwrite(fd, []byte("!"), sparseWrite); err != nil {
			t.Error(err)
		}
		if err := unix.Close(fd); err != nil {
			t.Error(err)
		}
		segs, _ := segmentsOf(t, p)
		checkSparseCopy(t, "through the mount", segs)
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("content through the mount: %s", firstDiff(got, want))
		}
		st := unmount()
		lsegs, lst := segmentsOf(t, filepath.Join(st.lower, "big"))
		if !slices.Equal(lsegs, sparseSegs) {
			t.Fatalf("control: the lower file's data ranges are %v, not %v", lsegs, sparseSegs)
		}
		usegs, ust := segmentsOf(t, filepath.Join(st.upper, "big"))
		checkSparseCopy(t, "the upper copy", usegs)
		// At most the lower's data chunks, and one block of slack
		// (an xattr block).
		maxBlocks := int64(len(sparseSegs)*chunk/512 + 8)
		if ust.Size != sparseSize || ust.Blocks > maxBlocks || ust.Blocks < lst.Blocks {
			t.Errorf("the upper copy: size %d, %d blocks; want size %d and %d to %d blocks (the lower file has %d; a dense copy would have %d)",
				ust.Size, ust.Blocks, int64(sparseSize), lst.Blocks, maxBlocks, lst.Blocks, sparseSize/512)
		}
		t.Logf("upper copy: %d blocks, data ranges %v; lower: %d blocks", ust.Blocks, usegs, lst.Blocks)
		up, err := os.ReadFile(filepath.Join(st.upper, "big"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(up, want) {
			t.Errorf("content of the upper copy: %s", firstDiff(up, want))
		}
	})
}
