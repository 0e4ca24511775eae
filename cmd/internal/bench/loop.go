package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// bencher holds one Run's state.
type bencher struct {
	ctx     context.Context
	cfg     Config
	cl      *cleanups
	rep     *Report
	root    string // the scratch tree
	lower   string // the shared lower layer, built once
	tarball []byte // the untar workload's archive, built once
	prog    *progress

	// The dircache workloads': their sizes, the three extra lower
	// layers (built once, below lower in every target's stack; none when
	// no workload walks or reads them), the native target's merged copy
	// of them, and the FUSE request counter.
	dc       dcLayout
	dcLowers []string
	dcNative string
	tracer   *fuseTracer

	// The containers workloads' tree (containers.go); nil when none runs.
	ct *ctState
	// The host workloads' image (host.go); nil when none runs.
	host *hostState
	// The build workloads' image and context (podbuild.go); nil when
	// none runs.
	build *buildState
	// rootless is what the rootless targets share (rootless.go).
	rootless *rootlessEnv
	// served counts, for each shared goverlay server (daemon=shared),
	// the instances it serves: it exits with the last one.
	served map[int]int
	// link, in the rootless agent, is the bench at the other end, which
	// counts the FUSE requests of each timed part (rootless.go).
	link *agentLink

	targets   []*targetState
	workloads []*workloadDef
	results   map[[2]string]*Result // (workload, target)
}

// targetState is one target across rounds.
type targetState struct {
	def    *targetDef
	status *TargetStatus
	// skip is set once the target cannot run; it stays skipped.
	skip string
}

func newBencher(ctx context.Context, c Config, cl *cleanups) (*bencher, error) {
	b := &bencher{ctx: ctx, cfg: c, cl: cl, results: map[[2]string]*Result{}}
	b.rep = newReport(c)
	for _, name := range c.Targets {
		ts := &targetState{def: findTarget(name)}
		ts.status = &TargetStatus{Name: name, Status: "ok"}
		if ts.def == nil {
			ts.def = &targetDef{name: name}
			ts.skip = "unknown target; known: " + strings.Join(targetNames(), ", ")
		} else {
			ts.status.Description = ts.def.desc
			ts.skip = ts.def.precheck(c)
		}
		b.targets = append(b.targets, ts)
		b.rep.Targets = append(b.rep.Targets, ts.status)
	}
	for _, name := range c.Workloads {
		b.workloads = append(b.workloads, findWorkload(name))
	}
	for _, w := range b.workloads {
		for _, t := range b.targets {
			why := w.whyNot(t.def)
			r := &Result{Workload: w.name, Target: t.def.name, Unit: w.unit, HigherIsBetter: w.higherIsBetter,
				NotApplicable: why != "", NotApplicableReason: why}
			b.results[[2]string{w.name, t.def.name}] = r
			b.rep.Results = append(b.rep.Results, r)
		}
	}

	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: scratch directory: %w", err)
	}
	root, err := os.MkdirTemp(c.Dir, "goverlay-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: scratch directory: %w", err)
	}
	// Mounts are only ever made below root; whatever is still mounted
	// there when we leave is detached before the tree is removed.
	cl.push(func() error { return removeScratch(root) })
	b.root = root
	b.rep.Scratch = root
	b.rep.Machine.ScratchFS = fsTypeName(root)

	b.lower = filepath.Join(root, "lower")
	if err := buildLower(b.lower); err != nil {
		return nil, fmt.Errorf("bench: build the lower layer: %w", err)
	}
	if b.wants("untar") {
		if b.tarball, err = buildTarball(); err != nil {
			return nil, fmt.Errorf("bench: build the tarball: %w", err)
		}
	}
	if err := b.setupDircache(); err != nil {
		return nil, err
	}
	if err := b.setupContainers(); err != nil {
		return nil, err
	}
	if err := b.setupHost(); err != nil {
		return nil, err
	}
	if err := b.setupBuild(); err != nil {
		return nil, err
	}
	if b.build != nil {
		b.rep.Build = b.build.line()
	}
	b.rep.Machine.fill(c.Binary)
	for _, ts := range b.targets {
		if ts.skip == "" {
			ts.status.Version = ts.def.version(c)
		}
	}
	unix.Sync()
	b.prog = newProgress(c.Progress, c.Runs*len(b.targets)*len(b.workloads))
	cl.push(func() error { b.prog.finish(); return nil })
	return b, nil
}

// setupDircache sizes the dircache workloads and builds their layers if a
// selected workload needs them, and gets the FUSE request counter ready
// (metadata counts requests too).
func (b *bencher) setupDircache() error {
	if b.wantsGroup(groupDircache) {
		if err := b.buildDircache(); err != nil {
			return err
		}
	}
	b.setupTracer()
	return nil
}

// buildDircache sizes the dircache workloads and builds the layers the
// selected ones need.
func (b *bencher) buildDircache() error {
	b.dc = newDCLayout(b.cfg.Scale)
	b.rep.Dircache = &b.dc
	withTree, withBig := b.wants("find-cold") || b.wants("mem-per-inode"), b.wants("readdir-100k")
	if withTree || withBig {
		for i := 0; i < dcLayers; i++ {
			b.dcLowers = append(b.dcLowers, dcLayerDir(b.root, i))
		}
		native := ""
		for _, t := range b.targets {
			if t.def.kind == kindNative && t.skip == "" {
				b.dcNative = filepath.Join(b.root, "native-dc")
				native = b.dcNative
			}
		}
		if err := buildDircacheLayers(b.root, b.dc, withTree, withBig, native); err != nil {
			return fmt.Errorf("bench: build the dircache layers: %w", err)
		}
	}
	return nil
}

// setupTracer gets the FUSE request counter ready when a selected workload
// counts requests on a FUSE target.
func (b *bencher) setupTracer() {
	fuse, counts := false, false
	for _, t := range b.targets {
		fuse = fuse || (t.skip == "" && hasDaemon(t.def))
	}
	for _, w := range b.workloads {
		counts = counts || w.countsRequests
	}
	if fuse && counts {
		b.tracer = newFuseTracer()
		b.rep.RequestCounting = "fuse:fuse_request_send tracepoint (perf_event_open on every CPU, filtered on the mount's connection)"
		if b.tracer.err != nil {
			b.rep.RequestCounting = "unavailable: " + b.tracer.err.Error() + "; goverlay targets: daemon counters only"
		}
	}
}

// wantsGroup says whether a workload of group is selected.
func (b *bencher) wantsGroup(group string) bool {
	for _, w := range b.workloads {
		if w.group == group {
			return true
		}
	}
	return false
}

func (b *bencher) wants(workload string) bool {
	for _, w := range b.workloads {
		if w.name == workload {
			return true
		}
	}
	return false
}

// loop runs the rounds. Each round mounts every target over fresh layers,
// runs each workload on each target in turn, and unmounts.
func (b *bencher) loop() {
	for round := 1; round <= b.cfg.Runs && b.ctx.Err() == nil; round++ {
		b.round(round)
	}
	for _, ts := range b.targets {
		if ts.skip != "" {
			ts.status.Status, ts.status.Reason = "skipped", ts.skip
		}
	}
}

// rotated is ts starting at its k-th element (modulo its length).
func rotated[T any](ts []T, k int) []T {
	if len(ts) == 0 {
		return ts
	}
	k %= len(ts)
	return append(append([]T(nil), ts[k:]...), ts[:k]...)
}

func (b *bencher) round(round int) {
	var cl cleanups
	defer func() {
		if err := cl.run(); err != nil {
			b.rep.Errors = append(b.rep.Errors, fmt.Sprintf("round %d cleanup: %v", round, err))
		}
	}()
	var live []*instance
	for _, ts := range b.targets {
		if ts.skip != "" || b.ctx.Err() != nil {
			continue
		}
		b.prog.describe(fmt.Sprintf("run %d/%d: mounting %s", round, b.cfg.Runs, ts.def.name))
		dir := filepath.Join(b.root, fmt.Sprintf("r%d-%s", round, ts.def.name))
		inst, err := ts.def.setup(b.ctx, b, dir, &cl)
		if err != nil {
			if b.ctx.Err() != nil {
				return
			}
			// A target that mounted in an earlier round and fails now
			// is a failure; one that never mounted is skipped.
			if round == 1 {
				ts.skip = err.Error()
			} else {
				ts.status.Errors = append(ts.status.Errors, fmt.Sprintf("round %d: %v", round, err))
			}
			continue
		}
		inst.state = ts
		live = append(live, inst)
	}
	// Each round starts with the next target: whatever a workload leaves
	// on the shared scratch filesystem for the one after it (ext4's
	// inode allocator, for one, searches past the inodes that the
	// previous target's rm or cleanup freed, recently_deleted()) falls on
	// every target in turn, not always on the same one.
	order := rotated(b.targets, round-1)
	for _, w := range b.workloads {
		for _, ts := range order {
			if b.ctx.Err() != nil {
				return
			}
			inst := findInstance(live, ts)
			if inst == nil || !w.applies(ts.def) {
				b.prog.add()
				continue
			}
			b.prog.describe(fmt.Sprintf("run %d/%d: %s on %s", round, b.cfg.Runs, w.name, ts.def.name))
			r := b.results[[2]string{w.name, ts.def.name}]
			unix.Sync() // fstime syncs before each phase; so do we, before each workload
			s, err := inst.run(b.ctx, w, b)
			b.prog.add()
			if b.ctx.Err() != nil {
				return // a partial sample is no sample
			}
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("round %d: %v", round, err))
				continue
			}
			r.Samples = append(r.Samples, s.value)
			if s.getxattr != nil {
				r.GetxattrPer1000Writes = append(r.GetxattrPer1000Writes, *s.getxattr)
			}
			if s.reqs != nil {
				r.Requests = append(r.Requests, *s.reqs)
			}
		}
	}
	// The daemons' own view of what happened: NOSEC decision, passthrough
	// opens. The last round's counters are kept.
	for _, inst := range live {
		if inst.def.kind == kindGoverlay {
			if st, err := inst.stats(); err == nil {
				inst.state.status.Stats = &st
			} else {
				inst.state.status.Notes = appendOnce(inst.state.status.Notes, err.Error())
			}
		}
	}
}

func findInstance(live []*instance, ts *targetState) *instance {
	for _, i := range live {
		if i.state == ts {
			return i
		}
	}
	return nil
}

func appendOnce(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// since is time.Since in seconds.
func since(t time.Time) float64 { return time.Since(t).Seconds() }
