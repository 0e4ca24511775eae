// Package oracle_test compares goverlay with the kernel's overlayfs: the
// same layers mounted by both must look the same, entry for entry.
package oracle_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// scenario is one stack of layers, built by build into layers (topmost
// first; with upper, layers[0] is the upper dir).
type scenario struct {
	name   string
	layers int
	upper  bool
	// kernelOpts are extra -o options for the kernel mount.
	kernelOpts []string
	build      func(t testing.TB, l []*testutil.Layer)
	// present and absent are paths the kernel view must (not) have: they
	// check that the scenario tests what it says.
	present, absent []string
	// check makes more claims on the kernel's view.
	check func(t testing.TB, kt testutil.Tree)
	// roots, when set, gives the directory each layer is built in (e.g.
	// a tmpfs); otherwise layers go under a temp dir.
	roots func(t testing.TB) []string
}

// stack is a built scenario, ready to mount.
type stack struct {
	lower       []string
	upper, work string
}

// buildStack builds sc under a fresh temporary directory.
func buildStack(t testing.TB, sc scenario) stack {
	t.Helper()
	var roots []string
	if sc.roots != nil {
		roots = sc.roots(t)
	} else {
		base := t.TempDir()
		for i := range sc.layers {
			roots = append(roots, filepath.Join(base, "layer"+strconv.Itoa(i)))
		}
	}
	ls := make([]*testutil.Layer, len(roots))
	for i, r := range roots {
		ls[i] = testutil.NewLayer(t, r)
	}
	sc.build(t, ls)
	var st stack
	for i, l := range ls {
		l.Finish()
		if sc.upper && i == 0 {
			st.upper = l.Root
			// The work dir must be on the upper's filesystem.
			st.work = filepath.Join(filepath.Dir(l.Root), "work-"+filepath.Base(l.Root))
			if err := os.Mkdir(st.work, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		st.lower = append(st.lower, l.Root)
	}
	return st
}

// mountBoth builds sc twice (the kernel may write to its upper and work
// dirs) and mounts one copy with the kernel, the other with goverlay.
func mountBoth(t testing.TB, sc scenario) (kernel string, g *testutil.Mounted) {
	t.Helper()
	ks := buildStack(t, sc)
	gs := buildStack(t, sc)
	kernel = testutil.KernelOverlay(t, ks.lower, ks.upper, ks.work, sc.kernelOpts...)
	g = testutil.Mount(t, testutil.Options{Lower: gs.lower, Upper: gs.upper, Work: gs.work})
	return kernel, g
}

// compareTrees fails t with every difference between the kernel's view and
// goverlay's.
func compareTrees(t testing.TB, kt, gt testutil.Tree) {
	t.Helper()
	d := testutil.DiffWith(kt, gt, testutil.DiffOptions{A: "kernel", B: "goverlay"})
	if len(d) == 0 {
		return
	}
	const maxShown = 60
	shown := d
	if len(shown) > maxShown {
		shown = shown[:maxShown]
	}
	t.Errorf("goverlay differs from the kernel overlay in %d place(s):\n  %s", len(d), strings.Join(shown, "\n  "))
	if testing.Verbose() {
		t.Logf("kernel view:\n%s\ngoverlay view:\n%s", kt, gt)
	}
}

// checkExpect verifies the scenario's own claims on the kernel's view.
func checkExpect(t testing.TB, sc scenario, kt testutil.Tree) {
	t.Helper()
	for _, p := range sc.present {
		if kt[p] == nil {
			t.Errorf("scenario %s is broken: the kernel overlay does not show %q", sc.name, p)
		}
	}
	for _, p := range sc.absent {
		if kt[p] != nil {
			t.Errorf("scenario %s is broken: the kernel overlay shows %q", sc.name, p)
		}
	}
	if sc.check != nil {
		sc.check(t, kt)
	}
}

// runOracle mounts sc both ways and compares the snapshots.
func runOracle(t *testing.T, sc scenario) (kt, gt testutil.Tree) {
	t.Helper()
	kmnt, g := mountBoth(t, sc)
	kt = testutil.Snapshot(t, kmnt)
	checkExpect(t, sc, kt)
	gt = testutil.Snapshot(t, g.Dir)
	compareTrees(t, kt, gt)
	return kt, gt
}

// listenSocket creates a unix socket the way a server does (bind), and
// keeps the socket file after closing the listener.
func listenSocket(t testing.TB, l *testutil.Layer, rel string) {
	t.Helper()
	ln, err := net.Listen("unix", l.P(rel))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
}

// sparse writes data at the end of a file of size bytes that is a hole
// otherwise.
func sparse(t testing.TB, path string, size int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 {
		if _, err := f.WriteAt(data, size-int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
}
