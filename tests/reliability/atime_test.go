package reliability_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The steps of TestAtime (atimeRun), in order; each says whether it
// changed an access time. The mount is fresh: nothing is cached, and a
// read reaches the daemon until its pages are cached.
const (
	stepReadUpper = "read upper file"             // its atime is its mtime: relatime updates it
	stepRereadNow = "reread upper file at once"   // pages dropped: relatime does not update it twice
	stepReadLower = "read lower file"             // never updated
	stepListUpper = "list upper dir"              // its atime is its mtime; nodiratime keeps it
	stepListLower = "list lower dir"              // never updated
	stepWriteRead = "read upper file after write" // written and synced, pages dropped: relatime updates it
	stepReread    = "reread upper file"           // atime set ahead, pages dropped: strictatime only
	stepReopen    = "reopen upper file"           // the same with the pages cached: seen by goverlay with noopen=0 only
	stepRelist    = "relist upper dir"            // atime set ahead, listing cached but with strictatime: strictatime only
	stepReadRW    = "read upper file read-write"  // atime set back, through a read-write fd (passthrough), pages dropped
)

// atimeOrder lists the steps in the order they are made.
var atimeOrder = []string{stepReadUpper, stepRereadNow, stepReadLower, stepListUpper, stepListLower, stepWriteRead, stepReread, stepReopen, stepRelist, stepReadRW}

// atimeWant is what each policy does at each step, as the kernel overlay
// does it (ovl_update_time(): upper files only). strictatime makes no
// stepRereadNow: whether it updates depends on the clock having moved.
var atimeWant = map[string]map[string]bool{
	"relatime":    {stepReadUpper: true, stepListUpper: true, stepWriteRead: true, stepReadRW: true},
	"strictatime": {stepReadUpper: true, stepListUpper: true, stepReread: true, stepReopen: true, stepRelist: true, stepWriteRead: true, stepReadRW: true},
	"noatime":     {},
	"nodiratime":  {stepReadUpper: true, stepWriteRead: true, stepReadRW: true},
}

// TestAtime: the access-time options noatime, relatime (the default),
// strictatime and nodiratime, with noopen=1 (the writeback cache),
// noopen=0 (passthrough where the kernel grants it) and noopen=0 with
// passthrough=off, step for step as the kernel overlay applies them on
// the same layers, wherever a read reaches goverlay: an upper file's and
// directory's atime changes as the policy says, on disk and through the
// mount alike, and a lower one's never. A reread reaches the daemon once
// the mount's cached pages are dropped (POSIX_FADV_DONTNEED), or as an
// open with noopen=0. An atime set ahead or back through the mount tells
// an update from none; where relatime compares times the kernel stamps,
// the step waits for the kernel's clock to pass the earlier one
// (clockPast), so that the two differ.
func TestAtime(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	modes := [][]string{nil, {"noopen=0"}, {"noopen=0", "passthrough=off"}}
	for _, policy := range []string{"relatime", "strictatime", "noatime", "nodiratime"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			s := atimeStack(t)
			kmnt := testutil.KernelOverlay(t, s.lower, s.upper, kernelWork(t, s), append(slices.Clone(kernelOpts), policy)...)
			kernel := atimeRun(t, kmnt, s, policy, true)
			for step, changed := range kernel {
				if changed != atimeWant[policy][step] {
					t.Errorf("kernel overlay -o %s, %s: atime changed %v, want %v", policy, step, changed, !changed)
				}
			}
			for _, mode := range modes {
				opts := strings.Join(append([]string{policy}, mode...), ",")
				s := atimeStack(t)
				m := mountG(t, s, "-o", opts)
				got := atimeRun(t, m.Dir, s, policy, slices.Contains(mode, "noopen=0"))
				for _, step := range atimeOrder {
					if g, ok := got[step]; ok && g != kernel[step] {
						t.Errorf("goverlay -o %s, %s: atime changed %v, the kernel overlay's %v", opts, step, g, kernel[step])
					}
				}
			}
		})
	}
}

// atimeStack is an upper file and directory over a lower file and
// directory, every atime equal to its mtime (testutil.FixedTime).
func atimeStack(t *testing.T) stack {
	t.Helper()
	return newStack(t, 1, func(l []*testutil.Layer, u *testutil.Layer) {
		l[0].File("lf", "lower\n", 0o644)
		l[0].File("ld/x", "x\n", 0o644)
		u.File("uf", "upper\n", 0o644)
		u.File("ud/x", "x\n", 0o644)
	})
}

// kernelWork makes a work dir for a kernel mount of s.
func kernelWork(t *testing.T, s stack) string {
	t.Helper()
	w, err := os.MkdirTemp(s.base, "kwork")
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// atimeRun makes the steps on the overlay mounted with -o policy at mnt
// over s and returns whether each changed the atime of its file in the
// layer; opens says that an open reaches the daemon (noopen=0; the
// kernel overlay sees every read), without which stepReopen is left out.
// Through the mount, each atime must be the layer's after each step.
func atimeRun(t *testing.T, mnt string, s stack, policy string, opens bool) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	// step runs prepare, if any, then do, on rel through the mount.
	step := func(name, layer, rel string, prepare, do func(p string)) {
		t.Helper()
		p, disk := filepath.Join(mnt, rel), filepath.Join(layer, rel)
		if prepare != nil {
			prepare(p)
		}
		before := atime(t, disk)
		do(p)
		after, shown := atime(t, disk), atime(t, p)
		if shown != after {
			t.Errorf("%s, %s: atime %v through the mount, %v in the layer", mnt, name, shown, after)
		}
		out[name] = after != before
	}
	read := func(flags int, drop bool) func(string) {
		return func(p string) { readVia(t, p, flags, drop) }
	}
	setTo := func(at time.Time) func(string) {
		return func(p string) { setAtime(t, p, at) }
	}
	// Read once its ctime (from the layer's build) is past, so that
	// relatime then finds the new atime after it.
	ctimePast := func(p string) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		clockPast(t, st.Ctim)
	}
	step(stepReadUpper, s.upper, "uf", ctimePast, read(unix.O_RDONLY, false))
	if policy != "strictatime" {
		step(stepRereadNow, s.upper, "uf", nil, read(unix.O_RDONLY, true))
	}
	step(stepReadLower, s.lower[0], "lf", nil, read(unix.O_RDONLY, false))
	step(stepListUpper, s.upper, "ud", nil, listDir(t))
	step(stepListLower, s.lower[0], "ld", nil, listDir(t))
	step(stepWriteRead, s.upper, "uf", func(p string) { writePage(t, p) }, read(unix.O_RDONLY, true))
	ahead := time.Now().Add(time.Hour)
	step(stepReread, s.upper, "uf", setTo(ahead), read(unix.O_RDONLY, true))
	if opens {
		step(stepReopen, s.upper, "uf", setTo(ahead), read(unix.O_RDONLY, false))
	}
	step(stepRelist, s.upper, "ud", setTo(ahead), listDir(t))
	step(stepReadRW, s.upper, "uf", setTo(testutil.FixedTime.Add(-time.Hour)), read(unix.O_RDWR, true))
	return out
}

// atime is path's atime.
func atime(t *testing.T, path string) unix.Timespec {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Atim
}

// clockPast returns once the clock the kernel stamps files with
// (current_time(), the coarse clock at its finest) is past ts: a time
// stamped from then on is after ts, which relatime compares with.
func clockPast(t *testing.T, ts unix.Timespec) {
	t.Helper()
	for {
		var now unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &now); err != nil {
			t.Fatal(err)
		}
		if now.Nano() > ts.Nano() {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// setAtime sets path's atime to at, leaving its mtime.
func setAtime(t *testing.T, path string, at time.Time) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), {Nsec: unix.UTIME_OMIT}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, 0); err != nil {
		t.Fatal(err)
	}
}

// readVia opens path with flags and reads it, after dropping its cached
// pages when drop says so.
func readVia(t *testing.T, path string, flags int, drop bool) {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if drop {
		if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := unix.Pread(fd, make([]byte, 64), 0); err != nil {
		t.Fatal(fmt.Errorf("read %s: %w", path, err))
	}
}

// listDir lists a directory.
func listDir(t *testing.T) func(path string) {
	return func(path string) {
		t.Helper()
		if _, err := os.ReadDir(path); err != nil {
			t.Fatal(err)
		}
	}
}

// writePage writes a whole page at the start of path, which the kernel
// need not read first, and syncs it, once the clock the kernel stamps
// files with has moved past path's atime: its mtime is then after it.
func writePage(t *testing.T, path string) {
	t.Helper()
	clockPast(t, atime(t, path))
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, make([]byte, unix.Getpagesize()), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
}
