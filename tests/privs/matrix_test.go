package privs_test

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// kind is a lower file that privilege removal may change. Every kind is
// owned by the test user and writable by everyone, so every writer may do
// every operation but chown (root only).
type kind struct {
	name string
	mode uint32
	// groupRoot: the file's group is root's (0), not the test user's.
	groupRoot bool
	cap       bool // setcap cap_net_raw+ep
}

var kinds = []kind{
	{name: "suid", mode: 0o4777},
	{name: "sgid-gx", mode: 0o2777},
	// setgid without group execute: the kernel drops it only for writers
	// without CAP_FSETID outside the file's group
	// (setattr_should_drop_sgid); one of each group so that each writer
	// meets a file of its group and one of another.
	{name: "sgid-nogx", mode: 0o2766},
	{name: "sgid-nogx-grp0", mode: 0o2766, groupRoot: true},
	{name: "cap", mode: 0o777, cap: true},
	{name: "plain", mode: 0o777},
}

// ops are the helper's operations; rootOnly ones are skipped for the
// unprivileged writer.
var ops = []struct {
	name     string
	rootOnly bool
}{
	// Copy-up alone: what the other operations start from.
	{name: "openrw"},
	{name: "write"},
	{name: "otrunc"},
	{name: "truncate"},
	{name: "ftruncate"},
	{name: "chown", rootOnly: true},
	{name: "fallocate"},
	{name: "mmap"},
	{name: "copyrange"},
}

// cell is one (writer, operation, file kind) of the matrix: one file.
type cell struct {
	w  writer
	op string
	k  kind
	// gid is the file's group.
	gid int
}

func (c cell) name() string { return "w-" + c.w.name + "__op-" + c.op + "__f-" + c.k.name }

// fuseCannotKnow reports whether the cell is the one FUSE cannot match
// (goverlay(1), DIFFERENCES FROM THE KERNEL OVERLAY): setgid without group
// execute, changed by a writer without CAP_FSETID who is not in the file's group. ext4 (and so the
// kernel overlay) drops setgid there because of the writer's groups;
// FUSE sends only uid, gid and pid, and the KILLPRIV_V2 contract (and
// FUSE's own non-killpriv SETATTR path) keeps setgid without g+x.
func (c cell) fuseCannotKnow() bool {
	return c.k.mode&unix.S_ISGID != 0 && c.k.mode&unix.S_IXGRP == 0 &&
		!c.w.fsetid && c.w.diskGid != c.gid
}

// cells lists the matrix; userGid is the test user's group, the group of
// every file but the groupRoot ones.
func cells(ws []writer, userGid int) []cell {
	var out []cell
	for _, w := range ws {
		for _, o := range ops {
			if o.rootOnly && !w.root {
				continue
			}
			for _, k := range kinds {
				g := userGid
				if k.groupRoot {
					g = 0
				}
				out = append(out, cell{w: w, op: o.name, k: k, gid: g})
			}
		}
	}
	return out
}

// TestPrivMatrix runs every cell on goverlay and on the kernel overlay
// over identical lowers (so the operation also copies the file up) and
// compares mode and security.capability through both mounts and in both
// upper dirs. One mount pair per {nosec, passthrough} combination.
func TestPrivMatrix(t *testing.T) {
	testutil.RequireRoot(t)
	ws := writers(t)
	helper(t)
	for _, opts := range combos {
		t.Run(subtestName(opts), func(t *testing.T) {
			t.Parallel()
			runMatrix(t, opts, ws)
		})
	}
}

// row is one cell's outcome, for the summary.
type row struct {
	name, verdict string
}

func runMatrix(t *testing.T, goOpts string, ws []writer) {
	uid, gid := testutil.TestUser(t)
	cs := cells(ws, gid)
	p := mountPair(t, goOpts, matrixLower(t, cs, uid))
	e := matrixEnv{
		gDir: p.g.Dir, kDir: p.k, gs: p.gs, ks: p.ks,
		stats: func() testutil.Stats { return testutil.ReadStats(t, p.g) },
		state: func(paths []string) map[string]fileState {
			m := map[string]fileState{}
			for _, path := range paths {
				m[path] = stateOf(path)
			}
			return m
		},
	}
	runMatrixIn(t, goOpts, ws, cs, e)
}

// matrixLower builds the matrix's lower: one file per cell.
func matrixLower(t *testing.T, cs []cell, uid int) func(l *testutil.Layer) {
	return func(l *testutil.Layer) {
		for _, c := range cs {
			n := c.name()
			l.File(n, "0123456789\n", 0o644)
			l.Chown(n, uid, c.gid)
			// After the chown, which clears setuid.
			if err := unix.Chmod(l.P(n), c.k.mode); err != nil {
				t.Fatal(err)
			}
			if c.k.cap {
				setcap(t, l.P(n))
			}
		}
	}
}

// matrixEnv is where a matrix runs: the two mounts, their stacks, and how
// to see through them (the mounts of a rootless run are in another mount
// namespace).
type matrixEnv struct {
	gDir, kDir string
	gs, ks     stack
	stats      func() testutil.Stats
	// state reads the files at paths through the mounts.
	state func(paths []string) map[string]fileState
	// rootless: the writers are root of a user namespace, which has
	// CAP_FSETID there but not where the kernel's privilege checks
	// look (capable(), the initial namespace).
	rootless bool
}

func runMatrixIn(t *testing.T, goOpts string, ws []writer, cs []cell, p matrixEnv) {
	// The lowers are never written: they show the starting state.
	for _, c := range cs {
		for _, lower := range []string{p.gs.lower, p.ks.lower} {
			want := fileState{exists: true, mode: c.k.mode, cap: c.k.cap}
			if got := stateOf(filepath.Join(lower, c.name())); got != want {
				t.Fatalf("lower file %s/%s is %v, want %v", lower, c.name(), got, want)
			}
		}
	}
	before := p.stats()
	checkMountMode(t, before, goOpts, p.rootless)

	// One process per writer and mount. Results keyed by path.
	res := map[string]opResult{}
	for _, w := range ws {
		for _, root := range []string{p.gDir, p.kDir} {
			var pairs [][2]string
			for _, c := range cs {
				if c.w.name == w.name {
					pairs = append(pairs, [2]string{c.op, filepath.Join(root, c.name())})
				}
			}
			for path, r := range runOps(t, w, pairs) {
				res[path] = r
			}
		}
	}

	after := p.stats()
	if passthroughOn(goOpts) && !p.rootless {
		if after.OpensPassthrough <= before.OpensPassthrough {
			t.Errorf("-o %s: opens_passthrough %d → %d after %d cells: passthrough was not used",
				goOpts, before.OpensPassthrough, after.OpensPassthrough, len(cs))
		}
	} else if after.OpensPassthrough != before.OpensPassthrough {
		t.Errorf("-o %s: opens_passthrough %d → %d: passthrough used although off",
			goOpts, before.OpensPassthrough, after.OpensPassthrough)
	}
	t.Logf("-o %s: stats delta: priv_checks +%d, skipped +%d, killed suid +%d sgid +%d caps +%d, getxattr(security.capability) +%d, opens passthrough +%d cached +%d",
		goOpts, after.PrivChecks-before.PrivChecks, after.PrivSkipped-before.PrivSkipped,
		after.KilledSuid-before.KilledSuid, after.KilledSgid-before.KilledSgid, after.KilledCaps-before.KilledCaps,
		after.CapGetxattr-before.CapGetxattr, after.OpensPassthrough-before.OpensPassthrough, after.OpensCached-before.OpensCached)

	var through []string
	for _, c := range cs {
		through = append(through, filepath.Join(p.gDir, c.name()), filepath.Join(p.kDir, c.name()))
	}
	seen := p.state(through)
	kernelState := map[string]fileState{}
	var rows []row
	for _, c := range cs {
		n := c.name()
		gOp, kOp := res[filepath.Join(p.gDir, n)], res[filepath.Join(p.kDir, n)]
		gm, km := seen[filepath.Join(p.gDir, n)], seen[filepath.Join(p.kDir, n)]
		gu, ku := stateOf(filepath.Join(p.gs.upper, n)), stateOf(filepath.Join(p.ks.upper, n))
		kernelState[n] = km
		group, sub := "as-kernel", n
		if c.fuseCannotKnow() {
			group = "fuse-cannot-know-groups"
		}
		t.Run(group+"/"+sub, func(t *testing.T) {
			var bad []string
			// Rootless, some operations are refused (chown of a
			// file whose group the namespace does not map): then
			// both must refuse alike, and neither copies up.
			bothRefuse := p.rootless && !kOp.ok && !gOp.ok && sameRefusal(kOp.err, gOp.err)
			if !kOp.ok && !bothRefuse {
				bad = append(bad, "the operation failed on the kernel overlay: "+kOp.err)
			}
			if !gOp.ok && !bothRefuse {
				bad = append(bad, "the operation failed on goverlay: "+gOp.err)
			}
			// An open for writing that writes nothing copies up
			// on the kernel overlay (ovl_open()), not where files
			// open without a request (goverlay(1), DIFFERENCES FROM
			// THE KERNEL OVERLAY): the file is left in its lower
			// layer.
			openOnly := c.op == "openrw" && noOpen(goOpts)
			if ku.exists != gu.exists && !openOnly {
				bad = append(bad, fmt.Sprintf("copied up: kernel overlay %v, goverlay %v", ku.exists, gu.exists))
			}
			if openOnly && gu.exists {
				bad = append(bad, "an open for writing alone copied the file up; with noopen=1 the first change does")
			}
			if !ku.exists && !bothRefuse {
				bad = append(bad, "kernel overlay: not copied up")
			}
			wantM, wantU := km, ku
			if c.fuseCannotKnow() {
				// goverlay's documented behaviour: the kernel's
				// result, but setgid kept.
				wantM.mode |= unix.S_ISGID
				wantU.mode |= unix.S_ISGID
			}
			if openOnly {
				wantU = gu // asserted absent above
			}
			if gm != wantM {
				bad = append(bad, fmt.Sprintf("through the mount: goverlay %v, want %v (kernel overlay %v)", gm, wantM, km))
			}
			if gu != wantU {
				bad = append(bad, fmt.Sprintf("in the upper dir: goverlay %v, want %v (kernel overlay %v)", gu, wantU, ku))
			}
			verdict := fmt.Sprintf("ok: %v", gm)
			if c.fuseCannotKnow() {
				verdict = fmt.Sprintf("ok (documented): goverlay %v, kernel %v", gm, km)
			}
			if len(bad) > 0 {
				verdict = "FAIL: " + strings.Join(bad, "; ")
				t.Errorf("%s (lower mode %04o, cap %v):\n  %s", n, c.k.mode, c.k.cap, strings.Join(bad, "\n  "))
			}
			rows = append(rows, row{n, verdict})
		})
	}
	if p.rootless {
		rootlessControls(t, kernelState)
	} else {
		kernelControls(t, kernelState)
	}

	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	var b strings.Builder
	fails := 0
	for _, r := range rows {
		if strings.HasPrefix(r.verdict, "FAIL") {
			fails++
		}
		fmt.Fprintf(&b, "  %-44s %s\n", r.name, r.verdict)
	}
	t.Logf("-o %s: %d cells, %d failing:\n%s", goOpts, len(rows), fails, b.String())
}

// kernelControls checks that the kernel overlay did what the notes say in
// a few cells, so that a broken setup (a writer that still has CAP_FSETID,
// a capability that was never set) fails instead of comparing two
// unchanged files.
func kernelControls(t *testing.T, k map[string]fileState) {
	t.Helper()
	want := []struct {
		cell string
		mode uint32
		cap  bool
	}{
		{"w-root__op-write__f-suid", 0o4777, false},
		{"w-root-nofsetid__op-write__f-suid", 0o777, false},
		{"w-user__op-write__f-suid", 0o777, false},
		{"w-user__op-write__f-sgid-gx", 0o777, false},
		{"w-root__op-write__f-sgid-gx", 0o2777, false},
		// Not in the file's group: dropped (ext4's setattr_should_drop_sgid).
		{"w-root-nofsetid__op-write__f-sgid-nogx", 0o766, false},
		{"w-user__op-write__f-sgid-nogx-grp0", 0o766, false},
		// In the file's group: kept.
		{"w-user__op-write__f-sgid-nogx", 0o2766, false},
		{"w-root-nofsetid__op-write__f-sgid-nogx-grp0", 0o2766, false},
		// Capabilities go whoever writes.
		{"w-root__op-write__f-cap", 0o777, false},
		{"w-root__op-chown__f-suid", 0o777, false},
	}
	for _, w := range want {
		got, ok := k[w.cell]
		if !ok {
			t.Errorf("control: no cell %s", w.cell)
			continue
		}
		if !got.exists || got.mode != w.mode || got.cap != w.cap {
			t.Errorf("control: %s on the kernel overlay is %v, expected %04o cap=%v: the setup does not test what it says",
				w.cell, got, w.mode, w.cap)
		}
	}
}

// sameRefusal compares two helper errors ("OP: ERROR"), which name the
// file through different mounts only in what precedes the error.
func sameRefusal(a, b string) bool {
	_, ea, _ := strings.Cut(a, ": ")
	_, eb, _ := strings.Cut(b, ": ")
	return ea == eb
}
