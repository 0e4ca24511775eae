package oracle_test

import (
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The kernel does not read AUFS whiteouts (".wh.NAME", ".wh..wh..opq"): it
// shows them as files. So goverlay on AUFS-format layers is compared with
// the kernel on the same layers written in the kernel's format.
type aufsScenario struct {
	name            string
	layers          int
	build           func(aufs bool) func(testing.TB, []*testutil.Layer)
	present, absent []string
}

var aufsScenarios = []aufsScenario{
	{
		name: "whiteouts", layers: 3, build: buildWhiteouts,
		present: []string{"b", "dir/z", "keep", "re/top"},
		absent:  []string{"a", "gone", "dir/x", "dir/y", "ghost", "re/bottom"},
	},
	{
		name: "opaque", layers: 3, build: buildOpaque,
		present: []string{"d/t", "d/m", "d2/y", "d2/sub/top", "newdir/n"},
		absent:  []string{"d/a", "d/sub", "d2/sub/x"},
	},
	{
		name: "mixed", layers: 3, build: buildAufsMixed,
		present: []string{"o/new", "o/sub/x", "w/keep", "plain"},
		absent:  []string{"o/old", "w/drop", "w/sub"},
	},
}

// buildAufsMixed: whiteouts inside an opaque directory, a whiteout of a
// directory, and (AUFS side only) AUFS bookkeeping names, which are
// never listed.
func buildAufsMixed(aufs bool) func(testing.TB, []*testutil.Layer) {
	return func(_ testing.TB, l []*testutil.Layer) {
		top, mid, bot := l[0], l[1], l[2]
		bot.File("o/old", "old", 0o644).File("o/sub/y", "y", 0o644)
		mid.File("o/sub/x", "x", 0o644).File("o/new", "n", 0o644)
		opq(mid, "o", aufs)
		wh(top, "o/sub/gone", aufs) // nothing to hide
		bot.File("w/keep", "k", 0o644).File("w/drop", "d", 0o644).File("w/sub/z", "z", 0o644)
		wh(mid, "w/drop", aufs)
		wh(top, "w/sub", aufs)
		top.File("plain", "p", 0o644)
		if aufs {
			// containers/storage and AUFS leave these; they are
			// never part of the view.
			bot.Dir(".wh..wh.plnk", 0o700).File(".wh..wh.plnk/1.2", "", 0o644)
			bot.File(".wh..wh.aufs", "", 0o644)
			top.File("w/.wh..wh.orph", "", 0o644)
		}
	}
}

func TestAufsFormat(t *testing.T) {
	testutil.RequireRoot(t)
	for _, as := range aufsScenarios {
		t.Run(as.name, func(t *testing.T) {
			t.Parallel()
			kernelFormat := scenario{name: as.name + "/kernel-format", layers: as.layers, build: as.build(false),
				present: as.present, absent: as.absent}
			aufsFormat := scenario{name: as.name + "/aufs-format", layers: as.layers, build: as.build(true)}
			ks := buildStack(t, kernelFormat)
			gs := buildStack(t, aufsFormat)
			kmnt := testutil.KernelOverlay(t, ks.lower, "", "")
			g := testutil.Mount(t, testutil.Options{Lower: gs.lower})
			kt := testutil.Snapshot(t, kmnt)
			checkExpect(t, kernelFormat, kt)
			gt := testutil.Snapshot(t, g.Dir)
			for p := range gt {
				if strings.HasPrefix(p, ".wh.") || strings.Contains(p, "/.wh.") {
					t.Errorf("goverlay lists the AUFS name %q", p)
				}
			}
			d := testutil.DiffWith(kt, gt, testutil.DiffOptions{A: "kernel(kernel-format)", B: "goverlay(aufs-format)"})
			if len(d) > 0 {
				t.Errorf("goverlay on AUFS layers differs from the kernel on the equivalent layers:\n  %s", strings.Join(d, "\n  "))
			}
		})
	}
}
