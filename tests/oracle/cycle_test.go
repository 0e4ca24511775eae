package oracle_test

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

// The cycling oracle: layers stacked the way a container's layers are. A
// scenario is a lower layer and steps; each step runs on a fresh upper over
// the layers the steps before left, and once it is done its upper is
// pushed down as the topmost lower of the next step (containers/storage
// committing a layer). goverlay and the kernel overlay each build their own
// stack from the same lower. After every step:
//
//	the two transcripts of the step (each operation's outcome, each
//	listing) are the same;
//	the merged views are the same;
//	the uppers the step left are the same, overlay-private marks aside;
//	the kernel mounted read-only on goverlay's layers shows what goverlay
//	showed, and goverlay on the kernel's layers what the kernel showed.

// cscenario is one cycling scenario.
type cscenario struct {
	name  string
	lower func(t testing.TB, l *testutil.Layer)
	after func(t testing.TB, l *testutil.Layer)
	// first, if set, runs as the first step with the assertions of a
	// write scenario's script (kernel first: a failure there means the
	// script is wrong).
	first func(t *testing.T, mnt string)
	steps []cstep
	// redirect mounts both overlays with redirect_dir=on.
	redirect bool
	// metacopy mounts both overlays with metacopy=on (and
	// redirect_dir=on), the read-only ones over the other's layers too.
	metacopy bool
	// check makes claims on the kernel's final view, so that the
	// scenario provably tests what it says.
	check func(t testing.TB, kt testutil.Tree)
	// checkUpper, if set, makes claims on the upper layer the kernel
	// left at step i (from 0; overlay-private xattrs included but
	// origin, impure and uuid), for the same reason.
	checkUpper func(t testing.TB, i int, kl testutil.Tree)
}

// cstep is one step: operations whose outcomes go into a transcript.
type cstep func(c *cx)

// cx runs a step's operations on one mount and records what each gave.
type cx struct {
	mnt string
	out []string
}

func (c *cx) p(rel string) string { return filepath.Join(c.mnt, rel) }

// rec records the outcome of one operation.
func (c *cx) rec(what string, err error) {
	c.out = append(c.out, what+": "+errnoString(err))
}

// errnoString is err's errno, without the path an overlay's mount point
// puts in it.
func errnoString(err error) string {
	var e unix.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e):
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func (c *cx) mv(a, b string) { c.rec("mv "+a+" "+b, unix.Rename(c.p(a), c.p(b))) }

func (c *cx) exchange(a, b string) {
	c.rec("exchange "+a+" "+b, unix.Renameat2(unix.AT_FDCWD, c.p(a), unix.AT_FDCWD, c.p(b), unix.RENAME_EXCHANGE))
}

func (c *cx) mkdir(rel string) { c.rec("mkdir "+rel, unix.Mkdir(c.p(rel), 0o755)) }
func (c *cx) rmdir(rel string) { c.rec("rmdir "+rel, unix.Rmdir(c.p(rel))) }
func (c *cx) rm(rel string)    { c.rec("rm "+rel, unix.Unlink(c.p(rel))) }
func (c *cx) ln(a, b string)   { c.rec("ln "+a+" "+b, unix.Link(c.p(a), c.p(b))) }

// rmAll removes rel and everything below it, deepest first, as rm -r.
func (c *cx) rmAll(rel string) {
	ents, err := os.ReadDir(c.p(rel))
	if err != nil {
		c.rm(rel)
		return
	}
	for _, e := range ents {
		c.rmAll(filepath.Join(rel, e.Name()))
	}
	c.rmdir(rel)
}

// write creates or truncates rel and writes data.
func (c *cx) write(rel, data string) {
	c.rec("write "+rel, os.WriteFile(c.p(rel), []byte(data), 0o644))
}

// append adds data at the end of rel (copying it up when it is lower).
func (c *cx) append(rel, data string) {
	f, err := os.OpenFile(c.p(rel), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = f.WriteString(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	c.rec("append "+rel, err)
}

// ls records rel's names, sorted.
func (c *cx) ls(rel string) {
	ents, err := os.ReadDir(c.p(rel))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	c.out = append(c.out, fmt.Sprintf("ls %s: %q %s", rel, names, errnoString(err)))
}

// cside is one overlay's stack: the lower dirs, topmost first.
type cside struct {
	base   string
	lowers []string
}

// newCside builds sc's lower under a fresh temp dir.
func newCside(t testing.TB, sc cscenario) *cside {
	t.Helper()
	s := &cside{base: t.TempDir()}
	l := testutil.NewLayer(t, filepath.Join(s.base, "lower"))
	if sc.lower != nil {
		sc.lower(t, l)
	}
	l.Finish()
	if sc.after != nil {
		sc.after(t, l)
	}
	s.lowers = []string{l.Root}
	return s
}

// freshUpper makes step i's upper and work dir.
func (s *cside) freshUpper(t testing.TB, i int) (upper, work string) {
	t.Helper()
	upper = filepath.Join(s.base, "upper"+strconv.Itoa(i))
	work = filepath.Join(s.base, "work"+strconv.Itoa(i))
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	setMtime(t, upper, testutil.FixedTime)
	return upper, work
}

// push makes upper the topmost lower.
func (s *cside) push(upper string) { s.lowers = append([]string{upper}, s.lowers...) }

// kernelROOpts mounts a stack without an upper; redirects are followed
// whatever the module's defaults.
var kernelROOpts = []string{"redirect_dir=follow", "index=off", "metacopy=off", "xino=off"}

// The options of a metacopy scenario: metacopy=on needs redirect_dir=on
// (the kernel refuses it with follow).
var (
	kernelMetacopyOpts   = []string{"redirect_dir=on", "index=off", "metacopy=on", "xino=off"}
	kernelMetacopyROOpts = kernelMetacopyOpts
	goverlayMetacopyOpts = []string{"-o", "redirect_dir=on,metacopy=on"}
)

func runCycles(t *testing.T, sc cscenario) {
	ks, gs := newCside(t, sc), newCside(t, sc)
	since := time.Now().Add(-time.Second)
	nsteps := len(sc.steps)
	if sc.first != nil {
		nsteps++
	}
	var kt testutil.Tree
	for i := range nsteps {
		ok := t.Run("step"+strconv.Itoa(i+1), func(t *testing.T) {
			ku, kw := ks.freshUpper(t, i)
			gu, gw := gs.freshUpper(t, i)
			kopts, gopts := kernelWriteOpts(sc.redirect), goverlayWriteOpts(sc.redirect)
			if sc.metacopy {
				kopts, gopts = kernelMetacopyOpts, goverlayMetacopyOpts
			}
			kmnt := testutil.KernelOverlay(t, ks.lowers, ku, kw, kopts...)
			g := testutil.Mount(t, testutil.Options{Lower: gs.lowers, Upper: gu, Work: gw, Extra: gopts})
			if sc.first != nil && i == 0 {
				if !runScript(t, wscenario{run: sc.first}, "kernel", kmnt) {
					t.Fatalf("the script fails on the kernel overlay: the scenario is wrong")
				}
				runScript(t, wscenario{run: sc.first}, "goverlay", g.Dir)
			} else {
				j := i
				if sc.first != nil {
					j--
				}
				step := sc.steps[j]
				kc, gc := &cx{mnt: kmnt}, &cx{mnt: g.Dir}
				step(kc)
				step(gc)
				if d := testutil.DiffWith(transcript(kc.out), transcript(gc.out), testutil.DiffOptions{}); len(d) > 0 {
					t.Errorf("the step's outcomes differ:\n  %s", strings.Join(testutil.DiffLines(kc.out, gc.out, "kernel", "goverlay"), "\n  "))
				}
			}
			kt = testutil.Snapshot(t, kmnt)
			gt := testutil.Snapshot(t, g.Dir)
			kraw := testutil.UpperLayout(t, ku)
			nk, ng := normTimes(kt, since, false), normTimes(gt, since, false)
			xattrBlocks(t, ku, kraw, nk, ng)
			compareW(t, "merged views", nk, ng, testutil.DiffOptions{A: "kernel", B: "goverlay"})
			testutil.UnmountKernel(t, kmnt)
			g.Unmount(t)
			testutil.WorkEmpty(t, gw)
			kl, gl := normTimes(layoutOf(t, ku), since, false), normTimes(layoutOf(t, gu), since, false)
			xattrBlocks(t, ku, kraw, kl, gl)
			compareW(t, "uppers", kl, gl, testutil.DiffOptions{A: "kernel's upper", B: "goverlay's upper"})
			if sc.checkUpper != nil {
				sc.checkUpper(t, i, kl)
			}
			ks.push(ku)
			gs.push(gu)

			// Each one's layers read by the other.
			kro, gro := kernelROOpts, []string(nil)
			if sc.metacopy {
				kro, gro = kernelMetacopyROOpts, []string{"-o", "metacopy=on"}
			}
			kx := testutil.KernelOverlay(t, gs.lowers, "", "", kro...)
			compareW(t, "the kernel on goverlay's layers", gt, testutil.Snapshot(t, kx),
				testutil.DiffOptions{A: "goverlay (live)", B: "kernel on goverlay's layers"})
			testutil.UnmountKernel(t, kx)
			gx := testutil.Mount(t, testutil.Options{Lower: ks.lowers, Extra: gro})
			compareW(t, "goverlay on the kernel's layers", kt, testutil.Snapshot(t, gx.Dir),
				testutil.DiffOptions{A: "kernel (live)", B: "goverlay on the kernel's layers"})
			gx.Unmount(t)
		})
		if !ok {
			// The next steps would run on layers already different.
			return
		}
	}
	if sc.check != nil {
		sc.check(t, kt)
	}
}

// transcript makes a transcript a tree, for DiffWith.
func transcript(lines []string) testutil.Tree {
	tr := testutil.Tree{}
	for i, l := range lines {
		tr[fmt.Sprintf("%04d", i)] = &testutil.Node{Type: "op", Target: l}
	}
	return tr
}

// TestCycleScenarios runs the cycling scenarios, written for it, and the
// write scenarios in cycling mode: each script as the first step, then
// churn steps that move, change, remove and recreate what it left.
func TestCycleScenarios(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	all := append(append([]cscenario(nil), cycleScenarios...), metacopyScenarios...)
	for _, w := range writeScenarios {
		if !cycledWrite[w.name] {
			continue
		}
		all = append(all, cscenario{
			name: "write-" + w.name, lower: w.lower, after: w.after, first: w.run,
			steps: []cstep{churnMove, churnBack}, redirect: w.redirect,
		})
	}
	for _, sc := range all {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runCycles(t, sc)
		})
	}
}

// cycledWrite are the write scenarios run in cycling mode: those whose
// layers hold what the churn steps exercise (renamed and redirected
// directories, whiteouts, hard links, copied-up files).
var cycledWrite = map[string]bool{
	"rename": true, "rename-dir-into-merged-redirect": true, "redirect-dir": true, "rmdir": true,
	"links": true, "lower-hard-links": true, "unlink": true, "over-whiteouts": true, "deep-copy-up": true,
}

// churnWalk lists the directories and regular files of the merged view,
// sorted, at most limit of each.
func churnWalk(c *cx, limit int) (dirs, files []string) {
	var walk func(rel string)
	walk = func(rel string) {
		ents, err := os.ReadDir(c.p(rel))
		if err != nil {
			return
		}
		for _, e := range ents {
			p := filepath.Join(rel, e.Name())
			switch {
			case e.IsDir():
				if len(dirs) < limit {
					dirs = append(dirs, p)
				}
				walk(p)
			case e.Type().IsRegular():
				if len(files) < limit {
					files = append(files, p)
				}
			}
		}
	}
	walk("")
	return dirs, files
}

const churnLimit = 40

// churnMove: every top-level directory D is renamed in place (D.c), its
// first subdirectory moved to the root (D~S.up: another parent), every
// regular file appended to (a copy-up of what the step before may have
// copied up already), and a hard link made to the first file of each
// top-level directory.
func churnMove(c *cx) {
	top, _ := os.ReadDir(c.mnt)
	for _, e := range top {
		if !e.IsDir() {
			continue
		}
		d := e.Name()
		c.mv(d, d+".c")
		subs, _ := os.ReadDir(c.p(d + ".c"))
		for _, s := range subs {
			if s.IsDir() {
				c.mv(d+".c/"+s.Name(), d+"~"+s.Name()+".up")
				break
			}
		}
		for _, s := range subs {
			if s.Type().IsRegular() {
				c.ln(d+".c/"+s.Name(), d+".c/"+s.Name()+".ln")
				break
			}
		}
	}
	_, files := churnWalk(c, churnLimit)
	for _, f := range files {
		c.append(f, "c2\n")
	}
	c.ls("")
}

// churnBack moves everything churnMove moved back where it was (a
// redirected directory renamed again, in the next layer), removes the
// links it made, removes and recreates every empty directory, appends to
// every file again and removes the first file of every directory (a
// whiteout over what an earlier layer copied up).
func churnBack(c *cx) {
	top, _ := os.ReadDir(c.mnt)
	for _, e := range top {
		n := e.Name()
		if d, ok := strings.CutSuffix(n, ".c"); ok && e.IsDir() {
			c.mv(n, d)
		}
	}
	for _, e := range top {
		n := e.Name()
		if up, ok := strings.CutSuffix(n, ".up"); ok && e.IsDir() {
			if d, s, ok := strings.Cut(up, "~"); ok {
				c.mv(n, d+"/"+s)
			}
		}
	}
	dirs, files := churnWalk(c, churnLimit)
	for _, f := range files {
		if strings.HasSuffix(f, ".ln") {
			c.rm(f)
		} else {
			c.append(f, "c3\n")
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(dirs))) // children first
	for _, d := range dirs {
		ents, err := os.ReadDir(c.p(d))
		if err != nil {
			continue
		}
		if len(ents) == 0 {
			c.rmdir(d)
			c.mkdir(d)
			continue
		}
		for _, e := range ents {
			if e.Type().IsRegular() {
				c.rm(filepath.Join(d, e.Name()))
				break
			}
		}
	}
	c.ls("")
}
