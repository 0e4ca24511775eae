package overlay

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestPrefetchDuringReadWalk: LOOKUPs that no READ follows (a stat walk)
// start no reads; once the kernel reads the file it looked up last, the
// LOOKUPs of the next files start reading their data, and what is read is
// the lower files' data, with OPEN requests or without.
func TestPrefetchDuringReadWalk(t *testing.T) {
	for _, opens := range []bool{false, true} {
		t.Run(fmt.Sprintf("opens=%v", opens), func(t *testing.T) {
			lo := t.TempDir()
			const files = 12
			content := func(i int) string { return strings.Repeat(fmt.Sprintf("%d.", i), 4000+i) }
			for i := range files {
				write(t, fmt.Sprintf("%s/d/f%d", lo, i), content(i))
			}
			mnt, _, f := nosecMountW(t, NoSecInherit, false, WritebackOff, opens, lo)
			prefetches := func() uint64 { return f.Stats().Prefetches }
			// A stat walk of the first half: no data read.
			for i := range files / 2 {
				if _, err := os.Lstat(fmt.Sprintf("%s/d/f%d", mnt, i)); err != nil {
					t.Fatal(err)
				}
			}
			if got := prefetches(); got != 0 {
				t.Errorf("a stat walk started reading %d files, want none", got)
			}
			// A read walk of the second half: its first READ starts
			// it, and each later lookup reads ahead.
			for i := files / 2; i < files; i++ {
				got, err := os.ReadFile(fmt.Sprintf("%s/d/f%d", mnt, i))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != content(i) {
					t.Fatalf("f%d: read %d bytes that differ from the lower file's %d", i, len(got), len(content(i)))
				}
			}
			if got, want := prefetches(), uint64(files/2-1); got < want {
				t.Errorf("a read walk of %d files started reading %d at their lookup, want at least %d (all but the first)", files/2, got, want)
			}
		})
	}
}
