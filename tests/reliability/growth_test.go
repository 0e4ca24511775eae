package reliability_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestNoGrowth runs the same workload three times on fresh names of one
// mount (round 0 warms up: the Go heap, go-fuse's buffers and the fd
// cache's bookkeeping reach their working size) and measures the daemon
// after rounds 1 and 2, each time after `echo 2 > drop_caches` (the kernel
// forgets every inode it can, and the daemon must let go of what it held
// for them). Open fds may grow by at most 16 from round 1 to round 2.
//
// RSS is noisy: the Go runtime returns freed memory to the kernel lazily
// (scavenger), the race detector's shadow memory grows with the addresses
// touched, and a GC cycle may or may not have run before the measurement.
// So RSS may grow by at most 50% from round 1 to round 2: a leak of what
// a round allocates per file (nodes, Dirs, buffers) would grow it by about
// as much as round 1 did, far more than the noise.
func TestNoGrowth(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	const rounds = 3
	const nDirs, nFiles, nNew = 40, 100, 200
	s := newStack(t, 2, func(l []*testutil.Layer, _ *testutil.Layer) {
		for r := range rounds {
			for k := range nDirs {
				d := fmt.Sprintf("r%d/dirs/D%02d", r, k)
				l[1].File(d+"/x", d, 0o644)
				if k%2 == 0 {
					l[0].File(d+"/y", d, 0o644) // merged across two layers
				}
			}
			for k := range nFiles {
				l[1].File(fmt.Sprintf("r%d/files/f%03d", r, k), fmt.Sprintf("file %d of round %d\n", k, r), 0o644)
			}
		}
	})
	m := mountG(t, s)
	type sample struct {
		fds     int
		rss     int64
		targets map[string]int
	}
	measure := func() sample {
		t.Helper()
		// The kernel sends its FORGETs after drop_caches returns: drop
		// and count again until the count settles (bounded), so that a
		// FORGET still in flight is not taken for a leak.
		// Settled is the same count three times in a row: on a loaded
		// machine FORGETs trickle in.
		fds, same := -1, 0
		for try := 0; try < 40 && same < 2; try++ {
			if err := testutil.DropCaches(); err != nil {
				t.Fatalf("drop_caches: %v", err)
			}
			n, err := testutil.ProcFDs(m.PID)
			if err != nil {
				t.Fatal(err)
			}
			if n == fds {
				same++
			} else {
				fds, same = n, 0
			}
			time.Sleep(100 * time.Millisecond)
		}
		rss, err := testutil.ProcRSS(m.PID)
		if err != nil {
			t.Fatal(err)
		}
		return sample{fds, rss, fdTargets(m.PID)}
	}
	var got []sample
	for r := range rounds {
		growthRound(t, m.Dir, r, nDirs, nFiles, nNew)
		got = append(got, measure())
		t.Logf("after round %d: %d fds, VmRSS %d KiB", r, got[r].fds, got[r].rss)
	}
	one, two := got[1], got[2]
	if two.fds > one.fds+16 {
		t.Errorf("the daemon's open fds grew from %d after round 1 to %d after round 2 (round 0: %d): more than 16 for the same work on new names; new after round 2 (layer-relative path: count):\n%s",
			one.fds, two.fds, got[0].fds, newTargets(one.targets, two.targets, s))
	}
	if two.rss > one.rss*3/2 {
		t.Errorf("the daemon's VmRSS grew from %d KiB after round 1 to %d KiB after round 2 (round 0: %d KiB): more than 50%%", one.rss, two.rss, got[0].rss)
	}
}

// growthRound renames lower directories (redirects), copies lower files up,
// creates, reads and removes new files, and walks the whole round's tree,
// before and after the kernel dropped its caches (so that every lookup,
// through the redirects too, reaches the daemon again).
func growthRound(t *testing.T, mnt string, r, nDirs, nFiles, nNew int) {
	t.Helper()
	root := filepath.Join(mnt, fmt.Sprintf("r%d", r))
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("round %d: %s: %v", r, what, err)
		}
	}
	for k := range nDirs {
		from, to := filepath.Join(root, fmt.Sprintf("dirs/D%02d", k)), filepath.Join(root, fmt.Sprintf("dirs/E%02d", k))
		must("rename", unix.Rename(from, to))
	}
	for k := range nFiles {
		p := filepath.Join(root, fmt.Sprintf("files/f%03d", k))
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		must("open", err)
		_, err = f.WriteString("appended\n")
		must("append", err)
		must("close", f.Close())
	}
	must("mkdir", os.Mkdir(filepath.Join(root, "new"), 0o755))
	for k := range nNew {
		p := filepath.Join(root, fmt.Sprintf("new/n%03d", k))
		must("create", os.WriteFile(p, []byte(p), 0o644))
		_, err := os.ReadFile(p)
		must("read", err)
		if k%2 == 0 {
			must("unlink", os.Remove(p))
		}
	}
	walk := func() {
		t.Helper()
		n := 0
		must("walk", filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			n++
			if !d.IsDir() {
				_, err = os.ReadFile(p)
			}
			return err
		}))
		if want := 1 + 1 + nDirs*2 + nDirs/2 + 1 + nFiles + 1 + nNew/2; n != want {
			t.Errorf("round %d: the walk met %d entries, want %d", r, n, want)
		}
	}
	walk()
	must("drop_caches", testutil.DropCaches())
	walk()
}

// fdTargets counts the open fds of pid by what they point at.
func fdTargets(pid int) map[string]int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	out := map[string]int{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil {
			out[l]++
		}
	}
	return out
}

// newTargets describes the fds in b beyond those in a, with paths shown
// relative to s's layers.
func newTargets(a, b map[string]int, s stack) string {
	var lines []string
	for l, n := range b {
		if d := n - a[l]; d > 0 {
			rel := l
			for i, lo := range s.lower {
				if r, ok := strings.CutPrefix(l, lo); ok {
					rel = fmt.Sprintf("lower%d:%s", i, r)
				}
			}
			if r, ok := strings.CutPrefix(l, s.upper); ok {
				rel = "upper:" + r
			}
			lines = append(lines, fmt.Sprintf("  %s: +%d", rel, d))
		}
	}
	sort.Strings(lines)
	if len(lines) > 30 {
		lines = append(lines[:30:30], fmt.Sprintf("  ... and %d more", len(lines)-30))
	}
	return strings.Join(lines, "\n")
}
