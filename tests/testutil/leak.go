package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	mountsMu sync.Mutex
	tracked  = map[string]bool{} // every mount point the harness mounted on

	leakChecked sync.Map // testing.TB → true
)

func trackMount(dir string) {
	mountsMu.Lock()
	tracked[canonical(dir)] = true
	mountsMu.Unlock()
}

// LeakCheck makes the end of t check that no mount remains under t's
// temporary directories and that no daemon the harness started for t is
// alive. Mount, KernelOverlay and Tmpfs call it; a test that runs the
// binary itself calls it first. A leak fails the test and is cleaned up
// (lazy unmount, SIGKILL by pidfd) so that the next test starts clean.
func LeakCheck(t testing.TB) {
	t.Helper()
	if _, dup := leakChecked.LoadOrStore(t, true); dup {
		return
	}
	// TempDir first: its RemoveAll is registered before, so it runs
	// after, the check (cleanups run last-in first-out).
	base := filepath.Dir(t.TempDir())
	name := t.Name()
	t.Cleanup(func() {
		leakChecked.Delete(t)
		if ms := MountsUnder(base); len(ms) > 0 {
			t.Errorf("mounts left behind under %s: %q", base, ms)
			detachAll(ms)
		}
		for _, p := range liveProcs(name) {
			t.Errorf("daemon %d started by %s is still alive at the end of the test: killed it", p.PID, name)
			p.Kill()
		}
		// Daemons the harness never learnt the PID of (a mount that
		// failed half-way): any goverlay naming this test's files.
		for _, pid := range FindProcsMentioning(builtBinary(), base+"/") {
			t.Errorf("goverlay process %d serving this test's files is still alive at its end: killed it", pid)
			if p, err := Track(pid, name); err == nil {
				p.Kill()
			}
		}
	})
}

// detachAll lazily unmounts ms, deepest first.
func detachAll(ms []string) {
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	for _, m := range ms {
		lazyUnmount(m)
	}
}

// Leftovers describes what the harness started and is still there: tracked
// mount points still mounted and tracked daemons still alive.
func Leftovers() []string {
	var out []string
	mountsMu.Lock()
	var pts []string
	for p := range tracked {
		pts = append(pts, p)
	}
	mountsMu.Unlock()
	ms, _ := Mounts()
	live := map[string]bool{}
	for _, m := range ms {
		live[m.Point] = true
	}
	sort.Strings(pts)
	for _, p := range pts {
		if live[p] {
			out = append(out, "still mounted: "+p)
		}
	}
	for _, p := range liveProcs("") {
		out = append(out, fmt.Sprintf("daemon %d (started by %s) still alive", p.PID, p.Name))
	}
	// Being the subreaper, we inherit every orphaned daemon we started.
	for _, pid := range childrenRunning(builtBinary()) {
		out = append(out, fmt.Sprintf("goverlay process %d (our child) still alive", pid))
	}
	return out
}

// Main runs the tests of a package (from TestMain) and fails the package if
// mounts or daemons are left behind at the end, after cleaning them up. It
// also removes the binary built by Binary.
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
func Main(m *testing.M) {
	becomeSubreaper()
	code := m.Run()
	if left := Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: left behind after the tests:\n  %s\n", strings.Join(left, "\n  "))
		var pts []string
		for _, l := range left {
			if p, ok := strings.CutPrefix(l, "still mounted: "); ok {
				pts = append(pts, p)
			}
		}
		detachAll(pts)
		for _, p := range liveProcs("") {
			p.Kill()
		}
		for _, pid := range childrenRunning(builtBinary()) {
			if p, err := Track(pid, "TestMain"); err == nil {
				p.Kill()
			}
		}
		if code == 0 {
			code = 1
		}
	}
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// childrenRunning lists our live children that run exe.
func childrenRunning(exe string) []int {
	me := os.Getpid()
	var out []int
	for _, pid := range findProcs(exe, func(string) bool { return true }) {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(me) {
			out = append(out, pid)
		}
	}
	return out
}
