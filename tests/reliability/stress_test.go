package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The stress test: workers doing random operations on a small name space
// that spans three lower layers and the upper, so that they collide all
// the time. The errors a collision can legitimately cause are counted;
// any other fails the test. Afterwards the merged view must be what the
// kernel overlay makes of the same layers (the model), and what goverlay
// itself shows after a remount.

// stressDirs and stressNames make the paths the workers use: dir/name.
var (
	stressDirs  = []string{".", "d0", "d1", "d2", "d3", "n0", "n1", "d0/s0", "d1/s0", "d2/s1", "d3/s0", "n0/s0"}
	stressNames = []string{"f0", "f1", "f2", "f3", "f4", "f5", "s0", "s1", "n0", "n1"}
)

// buildStress makes three lower layers and an upper with whiteouts, an
// opaque directory, and directories merged across two, three and four
// layers.
func buildStress(l []*testutil.Layer, up *testutil.Layer) {
	l[2].File("d0/f0", "l2 d0/f0", 0o644).File("d0/f1", "l2 d0/f1", 0o644).File("d0/s0/f2", "l2 d0/s0/f2", 0o600).
		File("d1/f0", "l2 d1/f0", 0o644).File("d1/f3", "l2 d1/f3", 0o755).
		File("d2/f1", "l2 d2/f1", 0o644).File("d2/f4", "l2 d2/f4", 0o644).File("d2/s1/f0", "l2 d2/s1/f0", 0o644).
		File("f0", "l2 f0", 0o644).File("f5", "l2 f5", 0o640).
		File("d3/f3", "l2 d3/f3 (under an opaque d3)", 0o644).
		Xattr("d0/f0", "user.origin", "l2")
	l[1].File("d0/f1", "l1 d0/f1", 0o644).File("d0/f3", "l1 d0/f3", 0o644).
		File("d1/s0/f1", "l1 d1/s0/f1", 0o644).
		File("d3/f0", "l1 d3/f0", 0o644).File("d3/f2", "l1 d3/f2", 0o644).Opaque("d3").
		Whiteout("d2/f4").Dir("d2", 0o755)
	l[0].File("d0/f4", "l0 d0/f4", 0o644).File("d3/f1", "l0 d3/f1", 0o644).File("n0/f0", "l0 n0/f0", 0o644).
		Whiteout("d0/f0").Dir("d1", 0o755).Dir("d2/s1", 0o700)
	up.File("d3/f5", "up d3/f5", 0o644).File("d0/s0/f5", "up d0/s0/f5", 0o644).File("f4", "up f4", 0o644)
}

// legitErrs are the errors that concurrent random operations on one name
// space cause by themselves, per operation: a name gone or taken, a
// directory not empty, a file where a directory is expected and the
// reverse, a directory moved into itself (EINVAL), a hard link to a
// directory (EPERM). Not EXDEV: with redirect_dir=on every rename works
// in the kernel overlay; not ESTALE, EIO or ENOTCONN.
var legitErrs = map[string][]unix.Errno{
	"create":   {unix.ENOENT, unix.EEXIST, unix.ENOTDIR, unix.EISDIR},
	"write":    {unix.ENOENT, unix.ENOTDIR, unix.EISDIR},
	"read":     {unix.ENOENT, unix.ENOTDIR, unix.EISDIR},
	"rename":   {unix.ENOENT, unix.ENOTDIR, unix.EISDIR, unix.ENOTEMPTY, unix.EEXIST, unix.EINVAL},
	"unlink":   {unix.ENOENT, unix.ENOTDIR, unix.EISDIR},
	"mkdir":    {unix.ENOENT, unix.EEXIST, unix.ENOTDIR},
	"rmdir":    {unix.ENOENT, unix.ENOTDIR, unix.ENOTEMPTY},
	"link":     {unix.ENOENT, unix.EEXIST, unix.ENOTDIR, unix.EPERM},
	"chmod":    {unix.ENOENT, unix.ENOTDIR},
	"setxattr": {unix.ENOENT, unix.ENOTDIR},
}

var stressOps = []string{"create", "write", "read", "rename", "unlink", "mkdir", "rmdir", "link", "chmod", "setxattr"}

// stressStats counts outcomes.
type stressStats struct {
	mu     sync.Mutex
	counts map[string]map[unix.Errno]int // op -> errno (0: OK) -> n
	bad    []string
}

func (s *stressStats) add(op, what string, e unix.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]map[unix.Errno]int{}
	}
	if s.counts[op] == nil {
		s.counts[op] = map[unix.Errno]int{}
	}
	s.counts[op][e]++
	if e == 0 {
		return
	}
	for _, l := range legitErrs[op] {
		if e == l {
			return
		}
	}
	if len(s.bad) < 50 {
		s.bad = append(s.bad, fmt.Sprintf("%s: %s", what, errName(e)))
	}
}

func (s *stressStats) String() string {
	var b strings.Builder
	for _, op := range stressOps {
		var parts []string
		for e, n := range s.counts[op] {
			parts = append(parts, fmt.Sprintf("%s=%d", errName(e), n))
		}
		sort.Strings(parts)
		fmt.Fprintf(&b, "  %-8s %s\n", op, strings.Join(parts, " "))
	}
	return b.String()
}

func (s *stressStats) ok() int {
	n := 0
	for _, c := range s.counts {
		n += c[0]
	}
	return n
}

// stressWorker does random operations on mnt until ctx ends.
func stressWorker(ctx context.Context, mnt string, rng *rand.Rand, st *stressStats) {
	path := func() string {
		return filepath.Join(stressDirs[rng.Intn(len(stressDirs))], stressNames[rng.Intn(len(stressNames))])
	}
	abs := func(p string) string { return filepath.Join(mnt, p) }
	buf := make([]byte, 64<<10)
	for ctx.Err() == nil {
		op := stressOps[rng.Intn(len(stressOps))]
		p := path()
		what := op + " " + p
		var err error
		switch op {
		case "create":
			var fd int
			fd, err = unix.Open(abs(p), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err == nil {
				_, err = unix.Write(fd, []byte("created "+p))
				if cerr := unix.Close(fd); err == nil {
					err = cerr
				}
			}
		case "write":
			flags := unix.O_WRONLY | unix.O_CLOEXEC
			if rng.Intn(4) == 0 {
				flags |= unix.O_TRUNC
			}
			var fd int
			// Which step failed goes into the message: an open refused
			// by the kernel for the I/O mode the daemon chose is EIO,
			// as is a failed passthrough write.
			step := "open"
			if flags&unix.O_TRUNC != 0 {
				step = "open O_TRUNC"
			}
			fd, err = unix.Open(abs(p), flags, 0)
			if err == nil {
				data := []byte(fmt.Sprintf("<%d>", rng.Intn(1000)))
				step = "pwrite"
				_, err = unix.Pwrite(fd, data, int64(rng.Intn(64)))
				if cerr := unix.Close(fd); err == nil {
					err, step = cerr, "close"
				}
			}
			if err != nil {
				what += " (" + step + ")"
			}
		case "read":
			var fd int
			fd, err = unix.Open(abs(p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				for {
					n, rerr := unix.Read(fd, buf)
					if rerr != nil || n == 0 {
						err = rerr
						break
					}
				}
				if cerr := unix.Close(fd); err == nil {
					err = cerr
				}
			}
		case "rename":
			q := path()
			what += " " + q
			err = unix.Rename(abs(p), abs(q))
		case "unlink":
			err = unix.Unlink(abs(p))
		case "mkdir":
			err = unix.Mkdir(abs(p), 0o755)
		case "rmdir":
			err = unix.Rmdir(abs(p))
		case "link":
			q := path()
			what += " " + q
			err = unix.Link(abs(p), abs(q))
		case "chmod":
			modes := []uint32{0o600, 0o640, 0o644, 0o755, 0o700}
			err = unix.Chmod(abs(p), modes[rng.Intn(len(modes))])
		case "setxattr":
			err = unix.Setxattr(abs(p), fmt.Sprintf("user.k%d", rng.Intn(3)), []byte(fmt.Sprint(rng.Intn(100))), 0)
		}
		var e unix.Errno
		if err != nil && !errors.As(err, &e) {
			e = unix.EIO // not an errno: never legitimate
			what += " (" + err.Error() + ")"
		}
		st.add(op, what, e)
	}
}

// TestStress runs 8 workers for 10 s (60 s with GOVERLAY_LONG=1), once
// with the daemon's default GOMAXPROCS and once with GOMAXPROCS=1 (some
// races only show there), each within a watchdog that dumps the daemon's
// goroutines if it stops answering.
func TestStress(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.Binary(t)
	s := seed(t, 7)
	for i, v := range []struct {
		name string
		env  []string
	}{{"default", nil}, {"GOMAXPROCS=1", []string{"GOMAXPROCS=1"}}} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			stressRun(t, s+int64(i), v.env)
		})
	}
}

func stressRun(t *testing.T, seed int64, env []string) {
	dur := pick(10*time.Second, 60*time.Second)
	s := newStack(t, 3, buildStress)
	m := testutil.MountWith(t, s.opts(), testutil.MountConfig{Env: env})
	var st stressStats
	m.Watchdog(t, dur+2*time.Minute, func() {
		ctx, cancel := context.WithTimeout(context.Background(), dur)
		defer cancel()
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stressWorker(ctx, m.Dir, rand.New(rand.NewSource(seed*100+int64(w))), &st)
			}()
		}
		wg.Wait()
	})
	t.Logf("%d operations succeeded in %v:\n%s", st.ok(), dur, &st)
	for _, b := range st.bad {
		t.Errorf("not a legitimate error of concurrent operations: %s", b)
	}
	if st.ok() < 100 {
		t.Errorf("only %d operations succeeded: the workload is not doing anything", st.ok())
	}
	live := testutil.Snapshot(t, m.Dir)
	m.Unmount(t)
	testutil.WorkEmpty(t, s.work)

	again := mountG(t, s)
	remount := testutil.Snapshot(t, again.Dir)
	again.Unmount(t)
	reportDiff(t, "goverlay's view while mounted vs after a remount", diffTrees(normalize(live, never), normalize(remount, never), "live", "remounted"))

	kmnt := mountK(t, s)
	model := testutil.Snapshot(t, kmnt)
	testutil.UnmountKernel(t, kmnt)
	reportDiff(t, "goverlay vs the kernel overlay on the same layers", diffTrees(normalize(live, never), normalize(model, never), "goverlay", "kernel"))
}
