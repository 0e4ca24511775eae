package bench

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

// The containers workloads: what a container does to its image, timed
// step by step on a tree that looks like one (ctree.go, or a real tree
// with --tree): walks, reads, an exec loop, creates, a copy, a removal
// and an untar. Each step reports its wall time, the FUSE requests it
// sent and the daemon's CPU time over it.
//
// The steps run in order on each target; the targets interleave step by
// step. A cold step drops every cache (root), which also drops the warm
// state the targets before it built: the warm steps therefore run once
// untimed before the timed run.

const groupContainers = "containers"

// The containers workloads' fixed sizes.
const (
	ctSeed    = 1
	ctExecs   = 1000
	ctCreates = 3000
	ctTreeDir = "ctree"          // the generated tree in the lowers, and in every target
	ctStatic  = "static/busybox" // the static binary the exec step runs, in the shared lower
	ctCopy    = "ct-copy"        // where cp -a copies the subtree, and rm -rf removes it from
	ctCreate  = "ct-create"      // where the create step creates its files
	ctUntar   = "ct-untar"       // where the untar step extracts
	ctBusybox = "/bin/busybox"   // the static binary, when it is one
	ctTarball = "ct-subtree.tar" // in the scratch tree
)

// ctState is the containers workloads' tree, set up once per Run.
type ctState struct {
	// name is the tree's directory in each target's root; lowers are
	// the layers to stack below the shared one; source is the tree on
	// the host (the generated tree merged, or the real one), which the
	// native target gets a symlink to.
	name   string
	lowers []string
	source string
	// tree is the generated tree, nil for a real one (--tree).
	tree *ctTree
	idx  *ctIndex
	// tarball is the untar step's archive, of idx.Subtree.
	tarball string
	// static says why the exec step cannot run, or "".
	static string
}

// ContainersInfo describes the containers workloads' tree in the report.
type ContainersInfo struct {
	// Tree is the real tree (--tree), or "" for the generated one.
	Tree           string `json:"tree,omitempty"`
	Seed           uint64 `json:"seed,omitempty"`
	Lowers         int    `json:"lowers"`
	Entries        int    `json:"entries"`
	Dirs           int    `json:"dirs"`
	Files          int    `json:"files"`
	Symlinks       int    `json:"symlinks"`
	Bytes          int64  `json:"bytes"`
	Subtree        string `json:"subtree"`
	SubtreeEntries int    `json:"subtree_entries"`
}

func init() {
	steps := []*workloadDef{
		{name: "ct-find-cold", desc: "drop caches (root), then find(1) of the tree", run: ctFindCold, dropsCaches: true},
		{name: "ct-find-warm", desc: "find(1) of the tree again, warm (after two untimed walks)", run: ctFindWarm},
		{name: "ct-stat-walk", desc: "getdents64 and lstat of every entry of the tree, warm", run: ctStatWalk},
		{name: "ct-commit-walk", desc: "a fresh mount (drop caches, root), then getdents64, lstat, lgetxattr(security.capability) and llistxattr of every entry, as containers/storage's diff of a layer", run: ctCommitWalk, dropsCaches: true},
		{name: "ct-read-cold", desc: "drop caches (root), then open, read and close every file of the tree", run: ctReadCold, dropsCaches: true},
		{name: "ct-read-warm", desc: "read every file of the tree again, warm", run: ctReadWarm},
		{name: "ct-exec", desc: fmt.Sprintf("%d fork+exec of a small static binary in the lower, from a shell loop", ctExecs), run: ctExec},
		{name: "ct-create", desc: fmt.Sprintf("create %d small files (open, write a line, close) in a new directory", ctCreates), run: ctCreateFiles},
		{name: "ct-cp", desc: "cp -a of a subtree with about a tenth of the entries, into a new directory", run: ctCp},
		{name: "ct-rm", desc: "rm -rf of that copy", run: ctRm},
		{name: "ct-untar", desc: "tar -xf of a tar of the same subtree, into a new directory", run: ctUntarStep},
	}
	for _, w := range steps {
		w.unit, w.group, w.countsRequests = "s", groupContainers, true
	}
	allWorkloads = append(allWorkloads, steps...)
	workloadGroups = append(workloadGroups, groupContainers)
}

// setupContainers builds (or indexes) the tree when a containers
// workload is selected.
func (b *bencher) setupContainers() error {
	if !b.wantsGroup(groupContainers) {
		return nil
	}
	ct := &ctState{name: ctTreeDir}
	info := &ContainersInfo{Lowers: ctLayers}
	if b.cfg.Tree != "" {
		tree, err := filepath.Abs(b.cfg.Tree)
		if err != nil {
			return fmt.Errorf("bench: --tree: %w", err)
		}
		if st, err := os.Stat(tree); err != nil || !st.IsDir() {
			return fmt.Errorf("bench: --tree %s is not a directory", b.cfg.Tree)
		}
		// The tree's parent is the lower layer, so that the tree is a
		// directory in every target's root, as the generated one is.
		parent := filepath.Dir(tree)
		if parent == tree {
			return fmt.Errorf("bench: --tree cannot be /: its parent directory is used as a lower layer")
		}
		if b.root == parent || strings.HasPrefix(b.root, parent+"/") {
			return fmt.Errorf("bench: --tree %s: its parent %s (the lower layer) contains the scratch directory; choose a --dir outside it", tree, parent)
		}
		ct.name, ct.source, ct.lowers = filepath.Base(tree), tree, []string{parent}
		info.Tree, info.Lowers = tree, 1
		if strings.ContainsAny(parent, ",:\\") {
			return fmt.Errorf("bench: --tree %s: overlay options cannot carry ',', ':' or '\\' in %s", tree, parent)
		}
	} else {
		tree := generateTree(ctSeed, ctEntriesAt(b.cfg.Scale))
		for i := 0; i < ctLayers; i++ {
			ct.lowers = append(ct.lowers, filepath.Join(b.root, fmt.Sprintf("lower-ct%d", i+1)))
		}
		ct.source = filepath.Join(b.root, "ct-merged")
		layers := make([]string, ctLayers)
		for i := range layers {
			layers[i] = filepath.Join(ct.lowers[i], ctTreeDir)
		}
		if err := tree.buildLayers(layers, ct.source); err != nil {
			return fmt.Errorf("bench: containers tree: %w", err)
		}
		info.Seed = tree.Seed
		ct.tree = tree
	}
	// The shared lower's names are taken.
	if ents, err := os.ReadDir(b.lower); err == nil {
		for _, e := range ents {
			if e.Name() == ct.name {
				return fmt.Errorf("bench: --tree's name %q is taken by the bench's own lower layer; rename or copy the tree", ct.name)
			}
		}
	}
	if ct.name == dcTreeDir || ct.name == dcBigDir || ct.name == ctCopy || ct.name == ctCreate || ct.name == ctUntar {
		return fmt.Errorf("bench: --tree's name %q is taken by another workload; rename or copy the tree", ct.name)
	}
	idx, err := indexTree(ct.source)
	if err != nil {
		return fmt.Errorf("bench: index the containers tree: %w", err)
	}
	ct.idx = idx
	ct.tarball = filepath.Join(b.root, ctTarball)
	if out, err := exec.Command("tar", "-C", ct.source, "-cf", ct.tarball, idx.Subtree).CombinedOutput(); err != nil {
		return fmt.Errorf("bench: tar of the containers subtree: %v: %s", err, oneLine(string(out)))
	}
	if ct.static, err = copyStatic(filepath.Join(b.lower, ctStatic)); err != nil {
		return err
	}
	info.Entries, info.Dirs, info.Files, info.Symlinks, info.Bytes = idx.Entries, idx.Dirs, idx.Files, idx.Symlinks, idx.Bytes
	info.Subtree, info.SubtreeEntries = idx.Subtree, idx.SubtreeEntries
	b.ct = ct
	b.rep.Containers = info
	return nil
}

// staticBinary says why path is not a statically linked executable, or
// "" when it is.
func staticBinary(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Sprintf("%s: %v (the exec workloads need a static busybox)", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return path + " is dynamically linked (the exec workloads need a static busybox)"
		}
	}
	return ""
}

// copyStatic copies the static busybox (ctBusybox) to to, in a lower
// layer, for the exec workloads. It returns why it did not, when the
// busybox here is not a static one; the exec workloads then fail with
// that reason.
func copyStatic(to string) (why string, err error) {
	if why = staticBinary(ctBusybox); why != "" {
		return why, nil
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return "", err
	}
	if err := copyFile(ctBusybox, to, 0o755); err != nil {
		return "", fmt.Errorf("bench: copy %s into the lower: %w", ctBusybox, err)
	}
	return "", nil
}

// linkNativeTree gives the native target the tree, as a symlink to the
// tree on the host: the steps never write into the tree itself.
func (b *bencher) linkNativeTree(upperDir string) error {
	if b.ct == nil {
		return nil
	}
	return os.Symlink(b.ct.source, filepath.Join(upperDir, b.ct.name))
}

// ctLowers are the containers tree's layers, for the overlays' stacks.
func (b *bencher) ctLowers() []string {
	if b.ct == nil {
		return nil
	}
	return b.ct.lowers
}

// ctPath is p in the tree on inst, with a trailing slash so that find
// and cp follow the native target's symlink.
func (b *bencher) ctPath(inst *instance, p string) string {
	return filepath.Join(inst.root, b.ct.name, p) + "/"
}

// procCPU is a process's utime+stime in seconds, from /proc/PID/stat.
func procCPU(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcCPU(data)
}

// parseProcCPU reads utime and stime (fields 14 and 15, in clock ticks
// of USER_HZ, 100 on Linux) from a /proc/PID/stat line; the command
// name in parentheses may hold spaces.
func parseProcCPU(data []byte) (float64, error) {
	f, err := statFields(data)
	if err != nil {
		return 0, err
	}
	// f[0] is field 3 (state): utime is f[11], stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/PID/stat: %d fields after the name", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/PID/stat: utime %q stime %q", f[11], f[12])
	}
	return float64(u+s) / 100, nil
}

// statFields are the fields of a /proc/PID/stat line after the command
// name, which is in parentheses and may hold spaces: the first is field
// 3, the state.
func statFields(data []byte) ([]string, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, errors.New("no ')' in /proc/PID/stat")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) == 0 {
		return nil, errors.New("nothing after the name in /proc/PID/stat")
	}
	return f, nil
}

// ctMeasure times fn, a step's timed part that does ops operations, and
// counts the FUSE requests it sent and the daemon's CPU time.
func (b *bencher) ctMeasure(inst *instance, ops int, fn func() error) (sample, error) {
	pid := 0
	if hasDaemon(inst.def) {
		pid, _ = daemonPID(inst)
	}
	var elapsed, cpu float64
	cpuOK := false
	reqs, err := b.countRequests(inst, true, func() (float64, error) {
		c0, err0 := procCPU(pid)
		start := time.Now()
		err := fn()
		elapsed = since(start)
		if pid > 0 {
			c1, err1 := procCPU(pid)
			cpu, cpuOK = c1-c0, err0 == nil && err1 == nil
		}
		return float64(ops), err
	})
	if err != nil {
		return sample{}, err
	}
	if reqs != nil && cpuOK {
		reqs.DaemonCPU = &cpu
	}
	return sample{value: elapsed, reqs: reqs}, nil
}

// run runs a command, with its output to out (nil: discarded).
func ctRun(ctx context.Context, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, oneLine(stderr.String()))
	}
	return nil
}

// lineCounter counts the newlines written to it.
type lineCounter int

func (c *lineCounter) Write(p []byte) (int, error) {
	*c += lineCounter(bytes.Count(p, []byte{'\n'}))
	return len(p), nil
}

func ctFind(ctx context.Context, inst *instance, b *bencher) error {
	var n lineCounter
	if err := ctRun(ctx, &n, "find", b.ctPath(inst, "")); err != nil {
		return err
	}
	if want := b.ct.idx.Entries + 1; int(n) != want {
		return fmt.Errorf("find printed %d names, want %d", n, want)
	}
	return nil
}

func dropAll() error {
	unix.Sync()
	return dropCaches(3)
}

// dropCold drops every cache before a cold step; in the rootless agent
// (not root) the bench has done it before sending the step.
func (b *bencher) dropCold() error {
	if b.link != nil {
		return nil
	}
	return dropAll()
}

func ctFindCold(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	if err := b.dropCold(); err != nil {
		return sample{}, err
	}
	return b.ctMeasure(inst, b.ct.idx.Entries, func() error { return ctFind(ctx, inst, b) })
}

// ctFindWarm walks twice before the timed walk. Targets are interleaved,
// so the cold step of the targets after this one dropped the caches since
// this one's own cold step: the first walk then reads every listing again
// with READDIR, after which the kernel marks each directory's atime stale
// (fuse_readdir_uncached(): fuse_invalidate_atime()), and the second
// walk's lstat of it fetches the attributes once more. The third is what a
// warm walk costs.
func ctFindWarm(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	for range 2 {
		if err := ctFind(ctx, inst, b); err != nil {
			return sample{}, err
		}
	}
	return b.ctMeasure(inst, b.ct.idx.Entries, func() error { return ctFind(ctx, inst, b) })
}

// ctWalk reads the names of every directory of the tree with getdents64
// and lstats every entry, calling each (if not nil) with the entry's path
// after its lstat, and checks the count of entries.
func ctWalk(ctx context.Context, inst *instance, b *bencher, each func(path string) error) error {
	dir := filepath.Join(inst.root, b.ct.name)
	fd, err := sysOpen(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	n, err := walkDir(ctx, fd, dir, make([]byte, direntBuf), each)
	if err == nil && int(n) != b.ct.idx.Entries {
		err = fmt.Errorf("the walk found %d entries, want %d", n, b.ct.idx.Entries)
	}
	return err
}

func ctStatWalk(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	walk := func() error { return ctWalk(ctx, inst, b, nil) }
	if err := walk(); err != nil {
		return sample{}, err
	}
	return b.ctMeasure(inst, b.ct.idx.Entries, walk)
}

// ctCommitWalk is what containers/storage does at every commit of a layer
// when a mount program is set: drivers/overlay's Diff with useNaiveDiff
// mounts the layer freshly, and pkg/archive's ChangesDirs walks the whole
// merged tree (collectFileInfoForChanges): getdents64 of each directory,
// then lstat of each entry and lgetxattr(path, "security.capability") of
// it (walkchunk), ENODATA being the usual answer. containers/storage
// recurses into each directory as it meets it and lstats by path; this
// walk lstats a directory's entries by its fd first, then goes down:
// every entry gets the same calls, in another order. walkchunk then
// lists each entry's xattrs (llistxattr), as this step does, to read the
// user.* ones. ChangesDirs walks the parent layer's mount the same way;
// this step leaves that out.
//
// The fresh mount is had by dropping every cache first, as ct-find-cold
// does, rather than by a remount: the targets are mounted once per round
// (bencher.round) by their setup, which also builds the upper and work
// directories and, rootless, runs the agent in its own namespace, and
// the steps after this one run on that same mount. Dropping the caches
// evicts the mount's dentries and inodes with their attributes (the
// kernel FORGETs them to a FUSE daemon), so that the kernel learns every
// name again (READDIRPLUS or LOOKUP); it also drops the lower layers'
// caches, which a fresh mount would find warm, alike for every target.
func ctCommitWalk(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	if err := b.dropCold(); err != nil {
		return sample{}, err
	}
	buf, list := make([]byte, 128), make([]byte, 64<<10)
	capability := func(path string) error {
		err := eintr(func() error {
			_, err := unix.Lgetxattr(path, "security.capability", buf)
			return err
		})
		if err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("lgetxattr %s security.capability: %w", path, err)
		}
		err = eintr(func() error {
			_, err := unix.Llistxattr(path, list)
			return err
		})
		if err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("llistxattr %s: %w", path, err)
		}
		return nil
	}
	return b.ctMeasure(inst, b.ct.idx.Entries, func() error { return ctWalk(ctx, inst, b, capability) })
}

// ctReadAll opens, reads and closes every file of the tree and checks
// the byte count.
func ctReadAll(ctx context.Context, inst *instance, b *bencher) error {
	buf := make([]byte, 128<<10)
	root := filepath.Join(inst.root, b.ct.name) + "/"
	var total int64
	for _, p := range b.ct.idx.FilePaths {
		n, err := readFile(ctx, root+p, buf)
		if err != nil {
			return err
		}
		total += n
	}
	if total != b.ct.idx.Bytes {
		return fmt.Errorf("read %d bytes, want %d", total, b.ct.idx.Bytes)
	}
	return nil
}

func ctReadCold(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	if err := b.dropCold(); err != nil {
		return sample{}, err
	}
	return b.ctMeasure(inst, b.ct.idx.Files, func() error { return ctReadAll(ctx, inst, b) })
}

func ctReadWarm(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	if err := ctReadAll(ctx, inst, b); err != nil {
		return sample{}, err
	}
	return b.ctMeasure(inst, b.ct.idx.Files, func() error { return ctReadAll(ctx, inst, b) })
}

func ctExec(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	if b.ct.static != "" {
		return sample{}, errors.New(b.ct.static)
	}
	bin := filepath.Join(inst.root, ctStatic)
	loop := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do "$0" true || exit 1; i=$((i+1)); done`, ctExecs)
	return b.ctMeasure(inst, ctExecs, func() error { return ctRun(ctx, nil, bin, "sh", "-c", loop, bin) })
}

func ctCreateFiles(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	dir := filepath.Join(inst.root, ctCreate)
	return b.ctMeasure(inst, ctCreates, func() error {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		dfd, err := sysOpen(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		for i := 0; i < ctCreates; i++ {
			fd, err := sysOpenat(dfd, "f"+strconv.Itoa(i), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			_, err = sysWrite(fd, []byte(strconv.Itoa(i)+"\n"))
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("write: %w", err)
			}
		}
		return nil
	})
}

func ctCp(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	to := filepath.Join(inst.root, ctCopy)
	return b.ctMeasure(inst, b.ct.idx.SubtreeEntries, func() error {
		if err := ctRun(ctx, nil, "cp", "-a", b.ctPath(inst, b.ct.idx.Subtree), to); err != nil {
			return err
		}
		_, err := os.Lstat(to)
		return err
	})
}

func ctRm(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	to := filepath.Join(inst.root, ctCopy)
	if _, err := os.Lstat(to); err != nil {
		return sample{}, fmt.Errorf("nothing to remove (ct-cp did not run first): %w", err)
	}
	return b.ctMeasure(inst, b.ct.idx.SubtreeEntries, func() error {
		if err := ctRun(ctx, nil, "rm", "-rf", to); err != nil {
			return err
		}
		if _, err := os.Lstat(to); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rm -rf left %s: %v", to, err)
		}
		return nil
	})
}

func ctUntarStep(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	dir := filepath.Join(inst.root, ctUntar)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return sample{}, err
	}
	return b.ctMeasure(inst, b.ct.idx.SubtreeEntries, func() error {
		return ctRun(ctx, nil, "tar", "-xf", b.ct.tarball, "-C", dir)
	})
}

// writeContainers writes the containers steps' table: per step and
// target the median time, the ratios to the kernel overlay and to
// fuse-overlayfs (above 1: faster), the FUSE requests, the daemon's CPU
// and its CPU per request; then the goals for goverlay.
func (r *Report) writeContainers(w io.Writer) {
	info := r.Containers
	if info == nil {
		return
	}
	tree := fmt.Sprintf("generated (seed %d) over %d lowers", info.Seed, info.Lowers)
	if info.Tree != "" {
		tree = info.Tree
	}
	fmt.Fprintf(w, "\nContainers: tree %s: %s entries (%s directories, %s files, %s symlinks), %s MB; cp/rm/untar subtree %s (%s entries)\n",
		tree, fmtInt(info.Entries), fmtInt(info.Dirs), fmtInt(info.Files), fmtInt(info.Symlinks),
		fmtNum(float64(info.Bytes)/1e6), info.Subtree, fmtInt(info.SubtreeEntries))
	fmt.Fprintf(w, "medians; VS: the other target's time / this one's (above 1: faster; a rootless target against the rootless one); REQS: FUSE requests; CPU: the daemon's utime+stime\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows := [][]string{{"STEP", "TARGET", "SECONDS", "VS KERNEL", "VS FUSE-OVERLAYFS", "REQS", "CPU S", "CPU µS/REQ"}}
	var goals [][]string
	prev := ""
	for _, res := range r.Results {
		if !strings.HasPrefix(res.Workload, "ct-") || res.Median == nil {
			continue
		}
		if prev != "" && prev != res.Workload {
			rows = append(rows, nil)
		}
		prev = res.Workload
		row := []string{res.Workload, res.Target, fmtNum(*res.Median), "-", "-", "-", "-", "-"}
		// A rootless target is compared with the rootless references.
		suffix := ""
		if strings.Contains(res.Target, "-rootless") {
			suffix = "-rootless"
		}
		vsK, vsF := r.relative(res, "kernel"+suffix), r.relative(res, "fuse-overlayfs"+suffix)
		if vsK != nil {
			row[3] = fmt.Sprintf("%.2f", *vsK)
		}
		if vsF != nil && res.Target != "fuse-overlayfs"+suffix {
			row[4] = fmt.Sprintf("%.2f", *vsF)
		}
		var reqs, cpus []float64
		for _, q := range res.Requests {
			if q.FuseRequests != nil {
				reqs = append(reqs, float64(*q.FuseRequests))
			}
			if q.DaemonCPU != nil {
				cpus = append(cpus, *q.DaemonCPU)
			}
		}
		if len(reqs) > 0 {
			row[5] = fmtInt(int(median(reqs)))
		}
		if len(cpus) > 0 {
			row[6] = fmtNum(median(cpus))
			if len(reqs) > 0 && median(reqs) > 0 {
				row[7] = fmtNum(median(cpus) / median(reqs) * 1e6)
			}
		}
		rows = append(rows, row)
		if strings.HasPrefix(res.Target, "goverlay") {
			goals = append(goals, ctGoals(res, suffix, vsK, vsF)...)
		}
	}
	writeRows(tw, rows, []bool{false, false, true, true, true, true, true, true})
	tw.Flush()
	if len(goals) > 0 {
		fmt.Fprintf(w, "\nContainers goals: read and walk steps ≥ 1.5× fuse-overlayfs and ≥ 0.67× kernel (within 1.5× its time); create, cp, rm, untar ≥ 1.5× fuse-overlayfs and ≥ 0.4× kernel\n\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		writeRows(tw, append([][]string{{"STEP", "TARGET", "GOAL", "MEDIAN RATIO", "MET"}}, goals...), nil)
		tw.Flush()
	}
}

// ctGoals checks one goverlay step's ratios against the containers goals;
// suffix names the references ("-rootless" for a rootless target).
func ctGoals(res *Result, suffix string, vsK, vsF *float64) [][]string {
	kernelMin := 1 / 1.5
	switch res.Workload {
	case "ct-create", "ct-cp", "ct-rm", "ct-untar":
		kernelMin = 1 / 2.5
	}
	var out [][]string
	check := func(goal string, v *float64, min float64) {
		if v == nil {
			return
		}
		met := "missed"
		if *v >= min {
			met = "met"
		}
		out = append(out, []string{res.Workload, res.Target, goal, fmt.Sprintf("%.2f", *v), met})
	}
	check("≥ 1.5× fuse-overlayfs"+suffix, vsF, 1.5)
	check(fmt.Sprintf("≥ %.2f× kernel%s", kernelMin, suffix), vsK, kernelMin)
	return out
}

func init() {
	allTargets = append(allTargets, &targetDef{name: "goverlay-baseline", kind: kindGoverlay, baseline: true,
		desc: "goverlay with the defaults, from the --baseline binary (only when named)"})
	allTargets = append(allTargets, &targetDef{name: "goverlay-baseline-uring", kind: kindGoverlay, baseline: true, uring: true,
		desc: "goverlay-uring from the --baseline binary (only when named)"})
}
