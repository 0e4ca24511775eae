package oracle_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The concurrency tests run one workload on goverlay (whose daemon is
// race-built by the harness: a data race makes it exit 66, a failure) and,
// as a control that the expectations are right, on the kernel overlay.
// Goroutines start together from a closed channel; nothing sleeps.

// overlays runs fn as two parallel subtests, one per overlay, each with
// its own copy of sc's lower layer and a fresh upper. unmount ends the
// overlay's mount (so the upper can be read at rest) and returns the
// stack's dirs.
func overlays(t *testing.T, sc wscenario, fn func(t *testing.T, kernel bool, mnt string, unmount func() wstack)) {
	for _, kernel := range []bool{true, false} {
		name := "goverlay"
		if kernel {
			name = "kernel"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := newWStack(t, sc)
			if kernel {
				mnt := st.kernel(t)
				fn(t, true, mnt, func() wstack { testutil.UnmountKernel(t, mnt); return st })
				return
			}
			g := st.goverlay(t)
			fn(t, false, g.Dir, func() wstack { g.Unmount(t); testutil.WorkEmpty(t, st.work); return st })
		})
	}
}

// together runs n goroutines that start at once and waits for them.
func together(n int, fn func(g int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(g)
		}()
	}
	close(start)
	wg.Wait()
}

// TestWriteConcurrentPwrite: 8 goroutines open the same 4 lower files for
// writing (no O_TRUNC) at once, so that their copy-ups race, and each
// pwrites its own ranges. Every write must be in the one upper copy and
// every other byte must be the lower file's.
func TestWriteConcurrentPwrite(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	t.Parallel()
	const (
		files   = 4
		writers = 8
		size    = 256 << 10
		chunk   = 3000 // not block aligned
	)
	lowerData := func(f int) []byte { return pattern(size, byte(10+f)) }
	// Writer g writes at two places in every file.
	offsets := func(g int) []int64 { return []int64{int64(g)*(size/writers) + 777, int64(g)*(size/writers) + 16000} }
	data := func(g, f, i int) []byte {
		return bytes.Repeat([]byte{byte('A' + g), byte('a' + f), byte('0' + i)}, chunk/3)
	}
	want := func(f int) []byte {
		b := lowerData(f)
		for g := range writers {
			for i, off := range offsets(g) {
				copy(b[off:], data(g, f, i))
			}
		}
		return b
	}
	sc := wscenario{name: "pwrite", lower: func(_ testing.TB, l *testutil.Layer) {
		for f := range files {
			l.File(fmt.Sprintf("dir/f%d", f), string(lowerData(f)), 0o644)
		}
	}}
	overlays(t, sc, func(t *testing.T, kernel bool, mnt string, unmount func() wstack) {
		together(writers, func(g int) {
			for k := range files {
				f := (g + k) % files // each writer starts with another file
				p := filepath.Join(mnt, fmt.Sprintf("dir/f%d", f))
				var fd int
				err := testutil.NoEINTR(func() (err error) {
					fd, err = unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
					return err
				})
				if err != nil {
					t.Errorf("writer %d: open %s: %v", g, p, err)
					continue
				}
				for i, off := range offsets(g) {
					if n, err := unix.Pwrite(fd, data(g, f, i), off); err != nil || n != chunk {
						t.Errorf("writer %d: pwrite f%d at %d: %d, %v", g, f, off, n, err)
					}
				}
				if err := unix.Close(fd); err != nil {
					t.Errorf("writer %d: close f%d: %v", g, f, err)
				}
			}
		})
		for f := range files {
			got, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("dir/f%d", f)))
			if err != nil {
				t.Error(err)
			} else if w := want(f); !bytes.Equal(got, w) {
				t.Errorf("f%d through the mount: %s", f, firstDiff(got, w))
			}
		}
		st := unmount()
		for f := range files {
			got, err := os.ReadFile(filepath.Join(st.upper, fmt.Sprintf("dir/f%d", f)))
			if err != nil {
				t.Error(err)
			} else if w := want(f); !bytes.Equal(got, w) {
				t.Errorf("f%d in the upper layer: %s", f, firstDiff(got, w))
			}
		}
	})
}

// copyUpTree is a lower tree t/pI/qJ/fK whose directories all carry their
// own mode, owner, xattr and mtime.
func copyUpTree(_ testing.TB, l *testutil.Layer) {
	for i := range 4 {
		for j := range 4 {
			for k := range 4 {
				l.File(fmt.Sprintf("t/p%d/q%d/f%d", i, j, k), fmt.Sprintf("file %d.%d.%d", i, j, k), 0o644)
			}
			q := fmt.Sprintf("t/p%d/q%d", i, j)
			l.Dir(q, 0o750).Chown(q, 100+i, 200+j).Xattr(q, "user.q", q)
		}
		p := fmt.Sprintf("t/p%d", i)
		l.Dir(p, 0o711).Chown(p, 300+i, 400).Xattr(p, "user.p", p)
	}
	l.Dir("t", 0o755).Chown("t", 7, 8).Xattr("t", "trusted.t", "t")
}

// copyUpOp changes file number n (0..63) of copyUpTree; which change
// depends on n.
func copyUpOp(t *testing.T, mnt string, n int) {
	p := filepath.Join(mnt, fmt.Sprintf("t/p%d/q%d/f%d", n/16, n/4%4, n%4))
	err := testutil.NoEINTR(func() (err error) {
		switch n % 5 {
		case 0:
			var fd int
			if fd, err = unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
				_, err = unix.Pwrite(fd, []byte("W"), 2)
				unix.Close(fd)
			}
		case 1:
			err = unix.Chmod(p, 0o600)
		case 2:
			err = unix.Setxattr(p, "user.n", []byte(fmt.Sprint(n)), 0)
		case 3:
			err = unix.Truncate(p, 3)
		case 4:
			err = unix.Lchown(p, 55, 66)
		}
		return err
	})
	if err != nil {
		t.Errorf("op on %s: %v", p, err)
	}
}

// TestWriteConcurrentCopyUp: 8 goroutines change the 64 files of one deep
// lower tree at once, so the copy-ups of the shared parent directories
// race. The outcome does not depend on the order: the merged view and
// the upper layer must be the kernel's.
//
// Directory mtimes are not compared here: a copy-up stats its parent
// before it moves the new file in and puts those times back after (the
// kernel's ovl_copy_up_one(), "best effort"; goverlay's upper.CopyUp the
// same way). Concurrent copy-ups into one directory can
// take that stat between another one's rename and its restore, so the
// directory may keep a new mtime, on either overlay. TestWriteScenarios/
// deep-copy-up compares them for a copy-up alone.
func TestWriteConcurrentCopyUp(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	t.Parallel()
	sc := wscenario{name: "copy-up", lower: copyUpTree}
	ks, gs := newWStack(t, sc), newWStack(t, sc)
	kmnt := ks.kernel(t)
	g := gs.goverlay(t)
	since := time.Now().Add(-time.Second)
	const workers = 8
	for _, mnt := range []string{kmnt, g.Dir} {
		together(workers, func(w int) {
			for n := w; n < 64; n += workers {
				copyUpOp(t, mnt, n)
			}
		})
	}
	kt, gt := normTimes(testutil.Snapshot(t, kmnt), since, true), normTimes(testutil.Snapshot(t, g.Dir), since, true)
	claim(t, kt["t/p0/q1/f0"].UID == 55 && kt["t/p0/q0/f1"].Mode == 0o600 && kt["t/p1/q2"].UID == 101, "kernel view")
	compareW(t, "merged views", kt, gt, testutil.DiffOptions{A: "kernel", B: "goverlay"})
	compareUppers(t, ks, gs, g, since, true)
}

// TestWriteConcurrentCreateUnlink: 8 goroutines create (O_CREAT|O_EXCL)
// and unlink the same 8 names in one directory, half of which exist in
// the lower layer. Each name must end as a sequential history of the
// operations that succeeded says: existing at the start, then alternately
// created and unlinked, so it exists at the end iff start + creates -
// unlinks = 1 (which must be 0 or 1), and if it was ever unlinked what
// exists is a created (empty) file. The upper layer must hold a file for
// a name that exists, a whiteout for a lower name that does not, nothing
// for another name; and the kernel over goverlay's upper must agree.
func TestWriteConcurrentCreateUnlink(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	t.Parallel()
	const (
		names   = 8
		workers = 8
		rounds  = 60
	)
	inLower := func(i int) bool { return i < names/2 }
	sc := wscenario{name: "create-unlink", lower: func(_ testing.TB, l *testutil.Layer) {
		for i := range names {
			if inLower(i) {
				l.File(fmt.Sprintf("d/n%d", i), "lower", 0o644)
			}
		}
		l.File("d/other", "other", 0o644)
	}}
	overlays(t, sc, func(t *testing.T, kernel bool, mnt string, unmount func() wstack) {
		var creates, unlinks [names]atomic.Int64
		together(workers, func(w int) {
			x := uint32(w*7919 + 1)
			for r := range rounds {
				x = x*1103515245 + 12345
				i := int(x>>16) % names
				p := filepath.Join(mnt, fmt.Sprintf("d/n%d", i))
				if (x>>8)&1 == 0 || r%5 == 0 {
					var fd int
					err := testutil.NoEINTR(func() (err error) {
						fd, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o640)
						return err
					})
					switch {
					case err == nil:
						creates[i].Add(1)
						unix.Close(fd)
					case !errors.Is(err, unix.EEXIST):
						t.Errorf("create n%d: %v", i, err)
					}
				} else {
					switch err := testutil.NoEINTR(func() error { return unix.Unlink(p) }); {
					case err == nil:
						unlinks[i].Add(1)
					case !errors.Is(err, unix.ENOENT):
						t.Errorf("unlink n%d: %v", i, err)
					}
				}
			}
		})
		tr := testutil.Snapshot(t, filepath.Join(mnt, "d"))
		exists := map[string]bool{}
		for i := range names {
			name := fmt.Sprintf("n%d", i)
			start := 0
			if inLower(i) {
				start = 1
			}
			c, u := creates[i].Load(), unlinks[i].Load()
			end := int64(start) + c - u
			n := tr[name]
			switch {
			case end != 0 && end != 1:
				t.Errorf("%s: %d creates and %d unlinks succeeded from %d: no sequential history has that", name, c, u, start)
			case end == 1 && n == nil:
				t.Errorf("%s: %d creates and %d unlinks succeeded from %d, so it exists, but the mount does not show it", name, c, u, start)
			case end == 0 && n != nil:
				t.Errorf("%s: %d creates and %d unlinks succeeded from %d, so it is gone, but the mount shows a %s", name, c, u, start, n.Type)
			case n == nil:
			case n.Type != "file":
				t.Errorf("%s is a %s", name, n.Type)
			case u > 0 && (n.Size != 0 || n.Mode != 0o640):
				t.Errorf("%s was unlinked and made again, but is %d bytes, mode %#o (a created file is empty, 0640)", name, n.Size, n.Mode)
			case u == 0 && start == 1 && n.Size != int64(len("lower")):
				t.Errorf("%s was never unlinked, but is not the lower file: %d bytes", name, n.Size)
			}
			exists[name] = end == 1
			t.Logf("%s: start %d, %d creates, %d unlinks", name, start, c, u)
		}
		for p, n := range tr {
			if len(n.Errs) > 0 {
				t.Errorf("%s: %q", p, n.Errs)
			}
		}
		if tr["other"] == nil {
			t.Errorf("d/other is gone")
		}
		var view testutil.Tree
		if !kernel {
			view = testutil.Snapshot(t, mnt)
		}
		st := unmount()
		up := testutil.UpperLayout(t, filepath.Join(st.upper, "d"))
		for i := range names {
			name := fmt.Sprintf("n%d", i)
			n := up[name]
			switch {
			case exists[name] && (n == nil || n.Type != "file"):
				t.Errorf("upper d/%s: %v, want a file", name, n)
			case !exists[name] && inLower(i) && (n == nil || n.Type != "whiteout"):
				t.Errorf("upper d/%s: %v, want a whiteout", name, n)
			case !exists[name] && !inLower(i) && n != nil:
				t.Errorf("upper d/%s: a %s, want nothing (no lower %s to hide)", name, n.Type, name)
			}
		}
		if !kernel {
			rmnt := st.kernel(t)
			compareW(t, "the kernel over goverlay's upper", view, testutil.Snapshot(t, rmnt),
				testutil.DiffOptions{A: "goverlay (live)", B: "kernel over goverlay's upper"})
		}
	})
}
