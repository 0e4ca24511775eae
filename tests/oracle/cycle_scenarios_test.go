package oracle_test

import (
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// cycleScenarios are the scenarios of TestCycleScenarios written for it:
// what a stack of layers does to directories renamed, removed and made
// again from one layer to the next.
var cycleScenarios = []cscenario{
	{
		// A directory renamed in one layer and back in the next, then
		// moved to another parent and changed.
		name: "rename-back", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) { l.File("a/dir100/a", "x\n", 0o644) },
		steps: []cstep{
			func(c *cx) { c.mv("a/dir100", "a/no_dir100") },
			func(c *cx) { c.mv("a/no_dir100", "a/dir100"); c.ls("a/dir100") },
			func(c *cx) { c.ls("a/dir100"); c.mkdir("b"); c.mv("a/dir100", "b/dir100") },
			func(c *cx) { c.append("b/dir100/a", "more\n"); c.mv("b/dir100", "a/dir100"); c.ls("a/dir100") },
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["a/dir100/a"] != nil && kt["b/dir100"] == nil && kt["a/no_dir100"] == nil, "a/dir100/a back in place")
		},
	},
	{
		// Lower, merged and already redirected directories moved within
		// their parent and to other parents, and back; a child of a
		// redirected directory moved out (an ancestor's redirect in its
		// path).
		name: "dir-moves", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) {
			l.File("p/d/f", "f", 0o644).File("p/d/sub/g", "g", 0o644).File("p/d/sub/deep/h", "h", 0o644)
			l.File("q/keep", "k", 0o644)
			l.File("r/s/t/u", "u", 0o644)
		},
		steps: []cstep{
			func(c *cx) {
				c.mv("p/d", "p/d1")       // lower dir, same parent: relative
				c.write("p/d1/new", "n")  // merged now
				c.mv("p/d1/sub", "q/sub") // child of a redirected dir, other parent
				c.mv("r/s/t", "r/t")      // two levels up
				c.ls("p/d1")
			},
			func(c *cx) {
				c.mv("p/d1", "q/d2")              // redirected below, other parent
				c.mv("q/sub/deep", "q/sub/deep2") // inside a dir redirected below
				c.mv("q/sub", "q/d2/sub")         // into a redirected dir
				c.mv("r/t", "r/s/t2")
				c.ls("q/d2")
			},
			func(c *cx) {
				c.mv("q/d2", "p/d")                   // back where it was
				c.mv("p/d/sub/deep2", "p/d/sub/deep") // and its child
				c.mv("r/s/t2", "r/s/t")
				c.append("p/d/sub/deep/h", "+")
				c.ls("p/d")
				c.ls("p/d/sub")
			},
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["p/d/f"] != nil && kt["p/d/new"] != nil && kt["p/d/sub/g"] != nil && kt["p/d/sub/deep/h"] != nil && kt["r/s/t/u"] != nil, "moved back")
		},
	},
	{
		// Into and out of opaque directories.
		name: "opaque", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) {
			l.File("o/x", "x", 0o644).File("d/y", "y", 0o644).File("e/z", "z", 0o644)
		},
		steps: []cstep{
			func(c *cx) { c.rmAll("o"); c.mkdir("o"); c.write("o/new", "n") }, // o: opaque now
			func(c *cx) { c.mv("d", "o/d"); c.ls("o") },                       // a lower dir into it
			func(c *cx) { c.mv("o/d", "d2"); c.mv("o", "o2"); c.mv("e", "o2/e"); c.ls("o2"); c.ls("d2") },
			func(c *cx) { c.mv("o2", "o"); c.mv("o/e", "e"); c.mv("d2", "d"); c.ls("o"); c.ls("d") },
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["o/new"] != nil && kt["o/x"] == nil && kt["d/y"] != nil && kt["e/z"] != nil, "opaque o, d and e back")
		},
	},
	{
		// Whiteouts over renamed directories, and names made again over
		// them.
		name: "whiteouts", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) {
			l.File("w/a/f", "f", 0o644).File("w/b/g", "g", 0o644).File("w/c/h", "h", 0o644)
		},
		steps: []cstep{
			func(c *cx) { c.mv("w/a", "w/a2"); c.mv("w/c", "w/c2") },
			func(c *cx) { c.rmAll("w/a2"); c.mkdir("w/a"); c.mv("w/c2", "w/c") },
			func(c *cx) { c.mv("w/b", "w/a2"); c.rmAll("w/a"); c.mv("w/c", "w/a"); c.ls("w") },
			func(c *cx) { c.ls("w/a"); c.ls("w/a2"); c.mkdir("w/c"); c.write("w/c/new", "n") },
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["w/a2/g"] != nil && kt["w/a/h"] != nil && kt["w/a/f"] == nil && kt["w/c/new"] != nil && kt["w/c/h"] == nil, "whiteouts")
		},
	},
	{
		// rmdir and mkdir of one name, layer after layer.
		name: "rmdir-recreate", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) {
			l.Dir("r/e", 0o755).File("r/f/x", "x", 0o644)
		},
		steps: []cstep{
			func(c *cx) { c.rmdir("r/e"); c.rmAll("r/f") },
			func(c *cx) { c.mkdir("r/e"); c.write("r/e/n", "n"); c.mkdir("r/f") },
			func(c *cx) { c.rmAll("r/e"); c.mkdir("r/e"); c.mv("r/f", "r/g"); c.ls("r") },
			func(c *cx) { c.mv("r/g", "r/f"); c.ls("r/e"); c.ls("r/f") },
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["r/e"] != nil && kt["r/e/n"] == nil && kt["r/f"] != nil && kt["r/f/x"] == nil, "recreated")
		},
	},
	{
		// Hard links, and files copied up in one layer and changed in
		// the next.
		name: "links-copyup", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) {
			l.File("h/f", "f", 0o644).Link("h/f", "h/f2").File("c/file", "c", 0o640)
		},
		steps: []cstep{
			func(c *cx) { c.append("c/file", "1"); c.ln("c/file", "c/file.ln"); c.ln("h/f", "h/f3") },
			func(c *cx) { c.append("c/file", "2"); c.append("h/f2", "2"); c.mv("h", "h2") },
			func(c *cx) { c.rm("c/file.ln"); c.append("c/file", "3"); c.ln("h2/f3", "h2/f4"); c.mv("h2", "h") },
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["c/file"] != nil && kt["c/file"].Size == 4 && kt["h/f4"] != nil && kt["h/f4"].Link != "", "links")
		},
	},
	{
		// RENAME_EXCHANGE of directories, and back, in the next layers.
		name: "exchange", redirect: true,
		lower: func(_ testing.TB, l *testutil.Layer) {
			l.File("x/a/fa", "a", 0o644).File("y/b/fb", "b", 0o644)
		},
		steps: []cstep{
			func(c *cx) { c.exchange("x/a", "y/b"); c.ls("x/a") },
			func(c *cx) { c.exchange("x", "y"); c.ls("x/b"); c.ls("y/a") },
			func(c *cx) { c.exchange("x", "y"); c.exchange("x/a", "y/b"); c.ls("x/a"); c.ls("y/b") },
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["x/a/fa"] != nil && kt["y/b/fb"] != nil, "exchanged back")
		},
	},
}
