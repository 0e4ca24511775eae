// Package reliability_test is goverlay's reliability and security suite,
// run against the real binary: crash safety (SIGKILL of the daemon in the
// middle of copy-ups, renames, whiteouts and redirects), load (random
// concurrent operations checked against the kernel overlay, no resource
// growth, no deadlock), hostile input (names, symlinks, a lower layer
// changed under the mount, malformed whiteouts, opaque marks and
// redirects, the overlay's private xattrs), permission checks for
// unprivileged users against the kernel overlay, and a fuzzer of operation
// sequences.
//
// Randomness is seeded with a fixed seed that every test prints; random
// delays are chaos input (when to kill a daemon), never a way to wait for
// something. Set GOVERLAY_LONG=1 for the long variants:
//
//	go test -race ./tests/reliability/                      # ~1 min
//	GOVERLAY_LONG=1 go test -race -timeout 40m ./tests/reliability/
//	go test -run '^$' -fuzz FuzzOps -fuzztime 60s ./tests/reliability/
package reliability_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

func TestMain(m *testing.M) {
	if arg := os.Getenv(typeRaceEnv); arg != "" {
		// A worker process of TestTypeRace or TestNameRace, not a
		// test run.
		os.Exit(raceWorkerMain(arg))
	}
	testutil.Main(m)
}

// long reports whether the long variants were asked for.
func long() bool { return os.Getenv("GOVERLAY_LONG") == "1" }

// pick returns normal, or longer under GOVERLAY_LONG=1.
func pick[T any](normal, longer T) T {
	if long() {
		return longer
	}
	return normal
}

// kernelOpts make the kernel overlay the model of goverlay's defaults:
// redirect_dir=on (goverlay's default; this machine's module default is
// off), and none of the features goverlay does not implement.
var kernelOpts = []string{"redirect_dir=on", "index=off", "metacopy=off", "xino=off"}

// stack is a set of layers: lowers topmost first, an upper and its work
// dir on the same filesystem.
type stack struct {
	base        string
	lower       []string
	upper, work string
}

// newStack makes n lower layers, an upper and a work dir under a new temp
// dir and runs build on the builders (lowers topmost first, then the
// upper). Every entry's mtime is then testutil.FixedTime.
func newStack(t testing.TB, n int, build func(lowers []*testutil.Layer, upper *testutil.Layer)) stack {
	t.Helper()
	return newStackIn(t, t.TempDir(), n, build)
}

func newStackIn(t testing.TB, base string, n int, build func(lowers []*testutil.Layer, upper *testutil.Layer)) stack {
	t.Helper()
	s := stack{base: base, upper: filepath.Join(base, "upper"), work: filepath.Join(base, "work")}
	var ls []*testutil.Layer
	for i := range n {
		l := testutil.NewLayer(t, filepath.Join(base, "lower"+strconv.Itoa(i)))
		ls = append(ls, l)
		s.lower = append(s.lower, l.Root)
	}
	up := testutil.NewLayer(t, s.upper)
	if build != nil {
		build(ls, up)
	}
	for _, l := range ls {
		l.Finish()
	}
	up.Finish()
	if err := os.Mkdir(s.work, 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s stack) opts(extra ...string) testutil.Options {
	return testutil.Options{Lower: s.lower, Upper: s.upper, Work: s.work, Extra: extra}
}

// mountG mounts goverlay on s.
func mountG(t testing.TB, s stack, extra ...string) *testutil.Mounted {
	t.Helper()
	return testutil.MountWith(t, s.opts(extra...), testutil.MountConfig{})
}

// mountK mounts the kernel overlay on s's layers with a fresh work dir
// (the kernel wants its own, empty one) beside s.work.
func mountK(t testing.TB, s stack) string {
	t.Helper()
	work, err := os.MkdirTemp(s.base, "kwork")
	if err != nil {
		t.Fatal(err)
	}
	return testutil.KernelOverlay(t, s.lower, s.upper, work, kernelOpts...)
}

// errnoOf is err's errno, 0 for nil; an error that is not an errno fails
// the test.
func errnoOf(t testing.TB, err error) unix.Errno {
	t.Helper()
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	t.Fatalf("not an errno: %v", err)
	return 0
}

// errName names an errno ("OK" for 0).
func errName(e unix.Errno) string {
	if e == 0 {
		return "OK"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return strconv.Itoa(int(e))
}

// recent stands for every mtime set while the test ran: two overlays
// cannot agree on the clock, only on which entries changed.
const recent = -1

// normalize returns a copy of tr for comparing two overlays' views:
// directory mtimes left out, mtimes at or after since made recent, inode
// numbers (never compared by Diff) as they are.
func normalize(tr testutil.Tree, since time.Time) testutil.Tree {
	out := tr.Clone()
	s := since.UnixNano()
	for _, n := range out {
		switch {
		case n.Type == "dir":
			n.Mtime = 0
		case n.Mtime >= s:
			n.Mtime = recent
		}
	}
	return out
}

// never is a since for normalize that keeps every file's mtime: for two
// views of one upper layer, which must agree exactly.
var never = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// diffTrees returns the differences between a and b, labelled.
func diffTrees(a, b testutil.Tree, la, lb string) []string {
	return testutil.DiffWith(a, b, testutil.DiffOptions{A: la, B: lb})
}

// reportDiff fails t with d (at most 40 lines of it).
func reportDiff(t testing.TB, what string, d []string) {
	t.Helper()
	if len(d) == 0 {
		return
	}
	shown := d
	if len(shown) > 40 {
		shown = append(shown[:40:40], fmt.Sprintf("... and %d more", len(d)-40))
	}
	t.Errorf("%s: %d difference(s):\n  %s", what, len(d), strings.Join(shown, "\n  "))
}

// strayTemps lists the entries of the upper layer whose name starts with
// "#": the workdir's temporary names, which must never be published.
func strayTemps(t testing.TB, upper string) []string {
	t.Helper()
	var out []string
	for p := range testutil.UpperLayout(t, upper) {
		if strings.HasPrefix(filepath.Base(p), "#") {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// statSync stats path without the kernel's attribute cache, which would
// answer a dead FUSE mount's root from memory.
func statSync(path string) error {
	var stx unix.Statx_t
	return unix.Statx(unix.AT_FDCWD, path, unix.AT_STATX_FORCE_SYNC|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx)
}

// seed is the seed of a test's randomness, printed so that a failure can
// be replayed: GOVERLAY_SEED overrides it.
func seed(t testing.TB, def int64) int64 {
	t.Helper()
	s := def
	if v := os.Getenv("GOVERLAY_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("GOVERLAY_SEED=%q: %v", v, err)
		}
	}
	t.Logf("random seed %d (set GOVERLAY_SEED to change it)", s)
	return s
}
