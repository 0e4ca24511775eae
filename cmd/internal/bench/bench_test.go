package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// builtBinary is ./cmd/goverlay, built once per test binary run.
var builtBinary struct {
	path string
	err  error
	done bool
}

func goverlayBinary(t *testing.T) string {
	t.Helper()
	if !builtBinary.done {
		builtBinary.done = true
		_, file, _, _ := runtime.Caller(0)
		moduleRoot := filepath.Join(filepath.Dir(file), "..", "..", "..")
		dir, err := os.MkdirTemp("", "goverlay-bench-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "goverlay")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		// Both programs, as make builds them: the rootless agent is
		// goverlay-bench.
		cmd := exec.Command(goTool, "build", "-o", dir+"/", "./cmd/goverlay", "./cmd/goverlay-bench")
		cmd.Dir = moduleRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as make builds them
		out, err := cmd.CombinedOutput()
		builtBinary.path = bin
		if err != nil {
			builtBinary.err = errors.New(string(out))
		}
	}
	if builtBinary.err != nil {
		t.Fatalf("go build ./cmd/goverlay ./cmd/goverlay-bench: %v", builtBinary.err)
	}
	return builtBinary.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBinary.path != "" {
		os.RemoveAll(filepath.Dir(builtBinary.path))
	}
	os.Exit(code)
}

func TestParseFlags(t *testing.T) {
	c, err := ParseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	var defaults, dircache, containers, host, host10, build []string
	for _, w := range allWorkloads {
		switch w.group {
		case groupDefault:
			defaults = append(defaults, w.name)
		case groupDircache:
			dircache = append(dircache, w.name)
		case groupContainers:
			containers = append(containers, w.name)
		case groupHost:
			host = append(host, w.name)
			if !w.fullScale {
				host10 = append(host10, w.name)
			}
		case groupBuild:
			build = append(build, w.name)
		default:
			t.Errorf("workload %s is in no group (%q)", w.name, w.group)
		}
	}
	var rooted []string
	for _, t := range allTargets {
		if !t.rootless && !t.baseline && !t.named {
			rooted = append(rooted, t.name)
		}
	}
	if strings.Join(c.Targets, ",") != strings.Join(rooted, ",") || slices.Contains(c.Targets, "goverlay-baseline") || strings.Join(c.Workloads, ",") != strings.Join(defaults, ",") {
		t.Errorf("defaults: targets %v, workloads %v; want all targets but the rootless ones, the baseline and the kernel profiles', and the default group", c.Targets, c.Workloads)
	}
	// --rootless puts each target's rootless form in its place.
	if c, err := ParseFlags([]string{"--rootless", "--targets", "native,kernel,fuse-overlayfs,goverlay,goverlay-rootless"}); err != nil {
		t.Error(err)
	} else if got := strings.Join(c.Targets, ","); got != "native,kernel-rootless,fuse-overlayfs-rootless,goverlay-rootless" {
		t.Errorf("--rootless targets: %s", got)
	}
	if len(defaults) != 14 || len(dircache) != 7 || len(containers) != 11 || len(host) != 8 || len(build) != 5 {
		t.Errorf("groups: default %v, dircache %v, containers %v, host %v, build %v", defaults, dircache, containers, host, build)
	}
	if got := strings.Join(host10, ","); got != "host-pagecache-10,host-exec-10,host-pss-10,host-mount-10" {
		t.Errorf("host workloads at any scale: %s", got)
	}
	if c.Duration != DefaultDuration || c.Runs != DefaultRuns || c.Scale != DefaultScale {
		t.Errorf("defaults: duration %v runs %d scale %v", c.Duration, c.Runs, c.Scale)
	}

	// Groups: dircache alone, all is both, and "warm" is a prefix.
	// The mem-* workloads follow find-cold, before the other dircache ones.
	if strings.Join(dircache[:3], ",") != "find-cold,mem-per-inode,mem-idle" {
		t.Errorf("dircache order: %v", dircache)
	}

	for args, want := range map[string][]string{
		"dircache":           dircache,
		"all":                append(append(append(append(append([]string(nil), defaults...), dircache...), containers...), host10...), build...),
		"build":              build,
		"build-step":         build[1:],
		"containers":         containers,
		"host":               host10,
		"host-mount":         {"host-mount-10", "host-mount-100"},
		"host-pss-100":       {"host-pss-100"},
		"ct-read":            {"ct-read-cold", "ct-read-warm"},
		"ct-commit":          {"ct-commit-walk"},
		"warm,stat-deep":     {"stat-deep", "warm-stat", "warm-path-miss"},
		"path-miss":          {"path-miss"},
		"default,find-cold":  append(append([]string(nil), defaults...), "find-cold"),
		"readdir-100k,untar": {"untar", "readdir-100k"},
		"mem":                {"mem-per-inode", "mem-idle"},
		"mem-idle,find-cold": {"find-cold", "mem-idle"},
	} {
		c, err := ParseFlags([]string{"--workloads", args, "--scale", "0.5"})
		if err != nil {
			t.Errorf("--workloads %s: %v", args, err)
			continue
		}
		if strings.Join(c.Workloads, ",") != strings.Join(want, ",") {
			t.Errorf("--workloads %s = %v, want %v", args, c.Workloads, want)
		}
		if c.Scale != 0.5 {
			t.Errorf("--scale 0.5 = %v", c.Scale)
		}
	}

	// The host group's N=100 workloads come in at --scale 1.
	for scale, want := range map[string][]string{"0.99": host10, "1": host, "10": host} {
		c, err := ParseFlags([]string{"--workloads", "host", "--scale", scale})
		if err != nil {
			t.Errorf("--workloads host --scale %s: %v", scale, err)
		} else if strings.Join(c.Workloads, ",") != strings.Join(want, ",") {
			t.Errorf("--workloads host --scale %s = %v, want %v", scale, c.Workloads, want)
		}
	}

	c, err = ParseFlags([]string{"--targets", "goverlay,native", "--workloads", "stat-deep,fstime-1024", "--duration", "3s", "--runs", "5", "--dir", "/x", "--json", "j", "--svg", "s"})
	if err != nil {
		t.Fatal(err)
	}
	// Canonical order: native first; fstime before stat-deep, read after write.
	if got := strings.Join(c.Targets, ","); got != "native,goverlay" {
		t.Errorf("targets = %s", got)
	}
	if got := strings.Join(c.Workloads, ","); got != "fstime-1024-write,fstime-1024-read,fstime-1024-copy,stat-deep" {
		t.Errorf("workloads = %s", got)
	}
	if c.Duration != 3*time.Second || c.Runs != 5 || c.Dir != "/x" || c.JSON != "j" || c.SVG != "s" {
		t.Errorf("config = %+v", c)
	}

	for _, bad := range [][]string{
		{"--targets", "nfs"},
		{"--workloads", "fstime-512"},
		{"--duration", "0s"},
		{"--runs", "0"},
		{"--scale", "0"},
		{"--scale", "-1"},
		{"--scale", "NaN"},
		{"extra"},
		{"--no-such-flag"},
	} {
		if _, err := ParseFlags(bad); err == nil {
			t.Errorf("ParseFlags(%q) accepted", bad)
		}
	}
}

func TestUsageListsEverything(t *testing.T) {
	var b bytes.Buffer
	Usage(&b)
	for _, name := range append(targetNames(), workloadNames()...) {
		if !strings.Contains(b.String(), name) {
			t.Errorf("usage does not mention %s", name)
		}
	}
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{0: "0.00", 1.234: "1.23", 12.34: "12.3", 123.4: "123", 1234: "1,234", 2094611: "2,094,611"} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestTarball(t *testing.T) {
	tb, err := buildTarball()
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "x")
	n, err := extract(context.Background(), tb, dest)
	if err != nil || n != untarFiles {
		t.Fatalf("extract: %d files, %v", n, err)
	}
}

// TestShortRun mounts for real: native, goverlay (the real binary),
// fuse-overlayfs with PATH emptied and a bogus target, both of which must
// be skipped with a reason. Nothing about timings is asserted.
func TestShortRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	bin := goverlayBinary(t)
	t.Setenv("PATH", "")
	scratch := t.TempDir()
	out := t.TempDir()
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   []string{"native", "goverlay", "fuse-overlayfs", "bogus"},
		Workloads: []string{"fstime-1024-write", "fstime-1024-read", "stat-deep"},
		Duration:  50 * time.Millisecond,
		Runs:      1,
		Dir:       scratch,
		JSON:      filepath.Join(out, "bench.json"),
		SVG:       filepath.Join(out, "bench.svg"),
		Out:       &table,
		Progress:  io.Discard,
	}
	rep := mustRun(t, c, &table)

	// The table names every target, and has a row per workload of the
	// targets that ran.
	for _, name := range c.Targets {
		if !strings.Contains(table.String(), name) {
			t.Errorf("table does not mention target %s", name)
		}
	}
	for _, w := range c.Workloads {
		for _, target := range []string{"native", "goverlay"} {
			if !tableHasRow(table.String(), w, target) {
				t.Errorf("table has no row for %s on %s", w, target)
			}
		}
	}
	for _, res := range rep.Results {
		if (res.Target == "native" || res.Target == "goverlay") && (len(res.Samples) != 1 || len(res.Errors) > 0) {
			t.Errorf("%s on %s: samples %v, errors %v", res.Workload, res.Target, res.Samples, res.Errors)
		}
	}

	// JSON parses and says why the skipped targets were skipped.
	data, err := os.ReadFile(c.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Config struct {
			Runs int `json:"runs"`
		} `json:"config"`
		Machine struct {
			NProc     int    `json:"nproc"`
			Kernel    string `json:"kernel"`
			GoVersion string `json:"go_version"`
		} `json:"machine"`
		Targets []struct {
			Name, Status, Reason string
		} `json:"targets"`
		Results []struct {
			Workload, Target      string
			Samples               []float64
			GetxattrPer1000Writes []float64 `json:"getxattr_per_1000_writes"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &parsed); err != nil {
		t.Fatalf("JSON: %v\n%s", err, data)
	}
	if parsed.Config.Runs != 1 || parsed.Machine.NProc < 1 || parsed.Machine.Kernel == "" || parsed.Machine.GoVersion == "" {
		t.Errorf("JSON config/machine: %+v %+v", parsed.Config, parsed.Machine)
	}
	status := map[string]string{}
	for _, tg := range parsed.Targets {
		status[tg.Name] = tg.Status
		switch tg.Name {
		case "fuse-overlayfs", "bogus":
			if tg.Status != "skipped" || tg.Reason == "" {
				t.Errorf("JSON: %s should be skipped with a reason: %+v", tg.Name, tg)
			}
		default:
			if tg.Status != "ok" {
				t.Errorf("JSON: %s: %+v", tg.Name, tg)
			}
		}
	}
	if len(status) != 4 {
		t.Errorf("JSON targets: %v", status)
	}
	for _, res := range parsed.Results {
		if res.Workload == "fstime-1024-write" && res.Target == "goverlay" && len(res.GetxattrPer1000Writes) != 1 {
			t.Errorf("JSON: no GETXATTR count for goverlay's write phase: %+v", res)
		}
	}

	// The SVG is well-formed XML.
	f, err := os.Open(c.SVG)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	elems := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		if _, ok := tok.(xml.StartElement); ok {
			elems++
		}
	}
	if elems < 10 {
		t.Errorf("SVG has only %d elements", elems)
	}

	assertClean(t, scratch)
}

// tableHasRow looks for a line with the workload and target as its first
// two fields.
func tableHasRow(table, workload, target string) bool {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[0] == workload && f[1] == target {
			return true
		}
	}
	return false
}

// assertClean checks that nothing is mounted below dir and that the
// scratch tree is gone.
func assertClean(t *testing.T, dir string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, dir) {
			t.Errorf("still mounted: %s", line)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in %s: %s", dir, e.Name())
	}
}

// TestCancel stops a run half-way: everything is unmounted and removed,
// and the partial table is still written.
func TestCancel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	bin := goverlayBinary(t)
	scratch := t.TempDir()
	var table bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	c := Config{
		Binary:    bin,
		Targets:   []string{"native", "goverlay", "goverlay-nopassthrough"},
		Workloads: []string{"fstime-1024", "stat-deep"},
		Duration:  300 * time.Millisecond,
		Runs:      3,
		Dir:       scratch,
		JSON:      filepath.Join(t.TempDir(), "bench.json"),
		Out:       &table,
	}
	// Cancel once the goverlay mounts are live, in the middle of a phase.
	go func() {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if len(mountsUnder(scratch)) >= 2 {
				time.Sleep(400 * time.Millisecond)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	rep, err := Run(ctx, c)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel: err = %v", err)
	}
	if rep == nil || !rep.Interrupted {
		t.Errorf("report not marked interrupted")
	}
	if !strings.Contains(table.String(), "INTERRUPTED") {
		t.Errorf("no partial table:\n%s", table.String())
	}
	if _, err := os.Stat(c.JSON); err == nil {
		t.Errorf("JSON written for an interrupted run")
	}
	assertClean(t, scratch)
}

func TestHelp(t *testing.T) {
	// --help prints to stdout and returns flag.ErrHelp.
	old := os.Stdout
	r, w, _ := os.Pipe()
	os.Stdout = w
	_, err := ParseFlags([]string{"--help"})
	w.Close()
	os.Stdout = old
	text, _ := io.ReadAll(r)
	if !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: err = %v", err)
	}
	if !strings.Contains(string(text), "--workloads") {
		t.Errorf("--help printed:\n%s", text)
	}
}

func TestDircacheLayout(t *testing.T) {
	full := newDCLayout(1)
	if full.treeFiles() != 100_000 || full.TreeDirs != 1000 || full.BigEntries != 100_000 || full.BigUpper != 2500 || full.Creates != 100_000 {
		t.Errorf("full size: %+v", full)
	}
	if d := newDCLayout(DefaultScale); d.treeFiles() != 20_000 || d.BigEntries != 20_000 || d.Creates != 20_000 {
		t.Errorf("default scale: %+v", d)
	}

	// The three layers and the upper share of a small layout hold every
	// file once, and the native tree holds their union.
	l := newDCLayout(0.02)
	root := t.TempDir()
	native := filepath.Join(root, "native")
	if err := buildDircacheLayers(root, l, true, true, native); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(root, "upper")
	if err := buildDCLayer(upper, l, -1, false, true); err != nil {
		t.Fatal(err)
	}
	union := map[string]int{}
	layers := []string{upper, dcLayerDir(root, 0), dcLayerDir(root, 1), dcLayerDir(root, 2)}
	mergedDirs := 0
	for _, layer := range layers {
		filepath.WalkDir(layer, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(layer, p)
			if !d.IsDir() {
				union[rel]++
			}
			return nil
		})
	}
	for i := 0; i < l.TreeDirs; i++ {
		n := 0
		for _, layer := range layers[1:] {
			if _, err := os.Stat(filepath.Join(layer, dcTreeDir, dcDirName(i))); err == nil {
				n++
			}
		}
		if n == dcLayers {
			mergedDirs++
		} else if n != 1 {
			t.Errorf("tree directory %d is in %d layers", i, n)
		}
	}
	if mergedDirs != (l.TreeDirs+dcMergedEvery-1)/dcMergedEvery {
		t.Errorf("%d merged directories of %d", mergedDirs, l.TreeDirs)
	}
	if len(union) != l.treeFiles()+l.BigEntries {
		t.Errorf("layers hold %d distinct files, want %d", len(union), l.treeFiles()+l.BigEntries)
	}
	for name, n := range union {
		if n != 1 {
			t.Errorf("%s is in %d layers", name, n)
		}
	}

	// The walk and the readdir count what was built, on the native tree.
	fd, err := sysOpen(filepath.Join(native, dcTreeDir), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := walkFd(context.Background(), fd, make([]byte, 4096)); err != nil || n != int64(l.treeEntries()) {
		t.Errorf("walk: %d entries, %v; want %d", n, err, l.treeEntries())
	}
	// A small buffer takes several getdents calls.
	if n, err := readdirCount(filepath.Join(native, dcBigDir), make([]byte, 1024), l.BigEntries); err != nil || n != l.BigEntries {
		t.Errorf("readdir: %d, %v", n, err)
	}
	if _, err := readdirCount(filepath.Join(native, dcBigDir), make([]byte, 1024), l.BigEntries+1); err == nil {
		t.Errorf("readdir: a wrong count is not an error")
	}
}

func TestGoals(t *testing.T) {
	zero, three := uint64(0), uint64(3)
	r := &Report{
		Targets: []*TargetStatus{{Name: "kernel"}, {Name: "native"}, {Name: "fuse-overlayfs"}, {Name: "goverlay"}, {Name: "goverlay-nopassthrough"}},
		Results: []*Result{
			{Workload: "stat-deep", Target: "kernel", HigherIsBetter: true, Samples: []float64{100}},
			{Workload: "stat-deep", Target: "goverlay", HigherIsBetter: true, Samples: []float64{130}},
			{Workload: "stat-deep", Target: "goverlay-nopassthrough", HigherIsBetter: true, Samples: []float64{110}},
			{Workload: "path-miss", Target: "native", Samples: []float64{500}},
			{Workload: "path-miss", Target: "goverlay", Samples: []float64{700}},
			{Workload: "metadata", Target: "fuse-overlayfs", HigherIsBetter: true, Samples: []float64{1000}},
			{Workload: "metadata", Target: "goverlay", HigherIsBetter: true, Samples: []float64{3000}},
			{Workload: "warm-stat", Target: "goverlay", HigherIsBetter: true, Samples: []float64{1e6},
				Requests: []ReqSample{{Ops: 1000, FuseRequests: &zero, Daemon: &DaemonRequests{}}}},
			{Workload: "warm-path-miss", Target: "goverlay", HigherIsBetter: true, Samples: []float64{1e6},
				Requests: []ReqSample{{Ops: 7000, FuseRequests: &three, FuseRequestsByType: map[string]uint64{"GETATTR": 3}}}},
		},
	}
	r.finish()
	got := map[string]bool{}
	for _, g := range r.Goals {
		got[g.Target+" "+g.Workload] = g.Met
	}
	want := map[string]bool{
		"goverlay stat-deep": true, "goverlay-nopassthrough stat-deep": false,
		"goverlay path-miss": false, "goverlay metadata": true,
		"goverlay warm-stat": true, "goverlay warm-path-miss": false,
	}
	if len(got) != len(want) {
		t.Errorf("goals: %+v", r.Goals)
	}
	for k, v := range want {
		if m, ok := got[k]; !ok || m != v {
			t.Errorf("goal %s: met %v (present %v), want %v", k, m, ok, v)
		}
	}
	res := r.result("warm-path-miss", "goverlay")
	if res.FuseReqsMedian == nil || *res.FuseReqsMedian != 3000.0/7000 || res.FuseReqsByTypeMed["GETATTR"] != *res.FuseReqsMedian {
		t.Errorf("warm-path-miss requests: %v %v", res.FuseReqsMedian, res.FuseReqsByTypeMed)
	}
	var table bytes.Buffer
	r.WriteTable(&table)
	for _, s := range []string{"FUSE REQ/1000 OPS", "GETATTR 0.43", "Design targets", "missed"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
}

// TestDircacheShortRun runs every dircache workload at a tiny scale on
// native, the kernel overlay, fuse-overlayfs (when installed) and goverlay,
// and checks that the output is well-formed. Nothing about timings or
// request counts is asserted. find-cold drops the page cache, as it does
// in a real run.
func TestDircacheShortRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	bin := goverlayBinary(t)
	scratch := t.TempDir()
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   []string{"native", "kernel", "fuse-overlayfs", "goverlay"},
		Workloads: []string{groupDircache},
		Duration:  20 * time.Millisecond,
		Runs:      1,
		Scale:     0.002,
		Dir:       scratch,
		JSON:      filepath.Join(t.TempDir(), "bench.json"),
		Out:       &table,
	}
	rep := mustRun(t, c, &table)
	ran := map[string]bool{}
	for _, ts := range rep.Targets {
		if ts.Status == "ok" {
			ran[ts.Name] = true
		} else if ts.Name != "fuse-overlayfs" {
			t.Errorf("target %s: %s %s", ts.Name, ts.Status, ts.Reason)
		}
	}
	tracing := !strings.HasPrefix(rep.RequestCounting, "unavailable")
	if rep.RequestCounting == "" {
		t.Errorf("no request counting method in the report")
	}
	for _, res := range rep.Results {
		if !ran[res.Target] {
			continue
		}
		if !tableHasRow(table.String(), res.Workload, res.Target) {
			t.Errorf("table has no row for %s on %s", res.Workload, res.Target)
		}
		fuse := res.Target == "goverlay" || res.Target == "fuse-overlayfs"
		if strings.HasPrefix(res.Workload, "mem-") {
			// Only the FUSE daemons have a memory to measure; at
			// this scale the per-inode growth may round to 0.
			if !fuse {
				if !res.NotApplicable || len(res.Samples) != 0 || len(res.Errors) != 0 || res.VsKernel != nil {
					t.Errorf("%s on %s: want not applicable, got %+v", res.Workload, res.Target, res)
				}
				continue
			}
			if res.NotApplicable || len(res.Samples) != 1 || len(res.Errors) > 0 || len(res.Requests) != 0 || res.VsKernel != nil {
				t.Errorf("%s on %s: %+v", res.Workload, res.Target, res)
			}
			if res.Workload == "mem-idle" && len(res.Samples) == 1 && res.Samples[0] <= 0 {
				t.Errorf("mem-idle on %s: %v MiB", res.Target, res.Samples)
			}
			continue
		}
		if len(res.Samples) != 1 || len(res.Errors) > 0 || res.Samples[0] <= 0 {
			t.Errorf("%s on %s: samples %v, errors %v", res.Workload, res.Target, res.Samples, res.Errors)
		}
		if fuse != (len(res.Requests) == 1) {
			t.Errorf("%s on %s: requests %+v", res.Workload, res.Target, res.Requests)
			continue
		}
		if !fuse {
			continue
		}
		q := res.Requests[0]
		if q.Ops <= 0 || (tracing && q.FuseRequests == nil) || (res.Target == "goverlay") != (q.Daemon != nil) {
			t.Errorf("%s on %s: request sample %+v", res.Workload, res.Target, q)
		}
		if strings.HasPrefix(res.Workload, "warm-") && tracing && q.FuseRequestsByType == nil {
			t.Errorf("%s on %s: no request types", res.Workload, res.Target)
		}
	}
	for _, s := range []string{"FUSE REQ/1000 OPS", "DAEMON L+G/1000 OPS", "--scale 0.002", "Design targets", "≤ 1 KiB per cached inode", "idle daemon ≤ 20 MiB RSS"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q", s)
		}
	}
	data, err := os.ReadFile(c.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Config   struct{ Scale float64 } `json:"config"`
		Dircache struct {
			TreeDirs   int `json:"tree_dirs"`
			BigEntries int `json:"big_entries"`
		} `json:"dircache"`
		Goals   []Goal `json:"goals"`
		Results []struct {
			Workload, Target string
			Requests         []ReqSample `json:"requests"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &parsed); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if parsed.Config.Scale != 0.002 || parsed.Dircache.TreeDirs != 2 || parsed.Dircache.BigEntries != 200 || len(parsed.Goals) == 0 {
		t.Errorf("JSON: scale %v, dircache %+v, goals %+v", parsed.Config.Scale, parsed.Dircache, parsed.Goals)
	}
	assertClean(t, scratch)
}

// TestMemoryReport: the mem-* workloads have no value on the targets
// without a daemon; their rows are all "-", the JSON says so, no ratio
// to the kernel is made up, the goals compare with fuse-overlayfs, and
// the chart leaves them out when the kernel is the reference.
func TestMemoryReport(t *testing.T) {
	r := &Report{
		Config: ReportConfig{Runs: 2, Workloads: []string{"stat-deep", "mem-per-inode", "mem-idle"}},
		Targets: []*TargetStatus{{Name: "native", Status: "ok"}, {Name: "kernel", Status: "ok"},
			{Name: "fuse-overlayfs", Status: "ok"}, {Name: "goverlay", Status: "ok"}, {Name: "goverlay-nosec-off", Status: "skipped", Reason: "test"}},
	}
	for _, tg := range []string{"native", "kernel", "fuse-overlayfs", "goverlay"} {
		r.Results = append(r.Results, &Result{Workload: "stat-deep", Target: tg, HigherIsBetter: true, Samples: []float64{100, 200}})
	}
	mem := map[string][2][]float64{
		"fuse-overlayfs": {{300, 320}, {3, 3.5}},
		"goverlay":       {{900, 1000}, {30, 40}},
	}
	for _, tg := range []string{"native", "kernel", "fuse-overlayfs", "goverlay", "goverlay-nosec-off"} {
		na := tg == "native" || tg == "kernel"
		r.Results = append(r.Results,
			&Result{Workload: "mem-per-inode", Target: tg, Unit: "bytes/inode", NotApplicable: na, Samples: mem[tg][0]},
			&Result{Workload: "mem-idle", Target: tg, Unit: "MiB", NotApplicable: na, Samples: mem[tg][1]})
	}
	r.finish()
	if r.Reference != "kernel" {
		t.Fatalf("reference %q", r.Reference)
	}
	for _, w := range []string{"mem-per-inode", "mem-idle"} {
		for _, tg := range []string{"native", "kernel", "fuse-overlayfs", "goverlay"} {
			if res := r.result(w, tg); res.VsKernel != nil {
				t.Errorf("%s on %s: VS KERNEL %v without a kernel value", w, tg, *res.VsKernel)
			}
		}
	}
	if res := r.result("mem-per-inode", "goverlay"); res.Median == nil || *res.Median != 950 {
		t.Errorf("mem-per-inode median: %+v", res)
	}

	goals := map[string]Goal{}
	for _, g := range r.Goals {
		goals[g.Target+" "+g.Workload] = g
	}
	if g, ok := goals["goverlay mem-per-inode"]; !ok || !g.Met || !strings.Contains(g.Value, "950 bytes/inode (fuse-overlayfs: 310)") {
		t.Errorf("mem-per-inode goal: %+v (present %v)", g, ok)
	}
	if g, ok := goals["goverlay mem-idle"]; !ok || g.Met || !strings.Contains(g.Value, "35.0 MiB (fuse-overlayfs: 3.25)") {
		t.Errorf("mem-idle goal: %+v (present %v)", g, ok)
	}
	if _, ok := goals["fuse-overlayfs mem-idle"]; ok {
		t.Errorf("a goal for fuse-overlayfs: %+v", r.Goals)
	}

	var table bytes.Buffer
	r.WriteTable(&table)
	rows := map[string][]string{}
	for _, line := range strings.Split(table.String(), "\n") {
		if f := strings.Fields(line); len(f) > 3 && strings.HasPrefix(f[0], "mem-") {
			rows[f[0]+" "+f[1]] = f
		}
	}
	for _, w := range []string{"mem-per-inode", "mem-idle"} {
		for _, tg := range []string{"native", "kernel"} {
			f := rows[w+" "+tg]
			if len(f) < 7 || f[2] != "-" || f[3] != "-" || f[4] != "-" || f[6] != "-" {
				t.Errorf("row %s %s: %q, want all -", w, tg, f)
			}
		}
		if f := rows[w+" goverlay"]; len(f) < 7 || f[3] == "-" || f[6] != "-" {
			t.Errorf("row %s goverlay: %q", w, f)
		}
		if _, ok := rows[w+" goverlay-nosec-off"]; ok {
			t.Errorf("a row for the skipped target: %s", table.String())
		}
	}
	if !strings.Contains(table.String(), "met") || !strings.Contains(table.String(), "missed") {
		t.Errorf("table has no memory goals:\n%s", table.String())
	}

	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Results []struct {
			Workload, Target string
			NotApplicable    bool `json:"not_applicable"`
		} `json:"results"`
	}
	if err := json.Unmarshal(js.Bytes(), &parsed); err != nil {
		t.Fatal(err)
	}
	na := 0
	for _, res := range parsed.Results {
		if res.NotApplicable {
			na++
			if !strings.HasPrefix(res.Workload, "mem-") || (res.Target != "native" && res.Target != "kernel") {
				t.Errorf("JSON: %s on %s not applicable", res.Workload, res.Target)
			}
		}
	}
	if na != 4 {
		t.Errorf("JSON: %d results not applicable, want 4", na)
	}

	// The kernel has no daemon: the chart draws memory against
	// fuse-overlayfs, in a panel of its own.
	svg := filepath.Join(t.TempDir(), "bench.svg")
	if err := r.WriteSVG(svg); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stat-deep", "mem-idle (MiB)", "Daemon memory", "memory ÷ the target"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tgoverlay\nVmPeak:\t  900 kB\nVmRSS:\t   12332 kB\nRssAnon:\t 5000 kB\n"
	if n, err := parseVmRSS([]byte(status)); err != nil || n != 12332<<10 {
		t.Errorf("parseVmRSS = %d, %v; want %d", n, err, 12332<<10)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\n", "VmRSS:\tlots kB\n"} {
		if n, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("parseVmRSS(%q) = %d, no error", bad, n)
		}
	}
	// Our own process has a resident set, and it settles.
	if n, err := procRSS(os.Getpid()); err != nil || n <= 0 {
		t.Errorf("procRSS(self) = %d, %v", n, err)
	}
	if n, err := settleRSS(context.Background(), os.Getpid()); err != nil || n <= 0 {
		t.Errorf("settleRSS(self) = %d, %v", n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := settleRSS(ctx, os.Getpid()); !errors.Is(err, context.Canceled) {
		t.Errorf("settleRSS after cancel: %v", err)
	}
}

func TestFindDaemon(t *testing.T) {
	for _, c := range []struct {
		cmdline string
		want    bool
	}{
		{"/usr/bin/fuse-overlayfs\x00-o\x00lowerdir=/l\x00/tmp/x/mnt\x00", true},
		{"fuse-overlayfs\x00-o\x00lowerdir=/l\x00/tmp/x/mnt", true},
		{"fuse-overlayfs\x00-o\x00lowerdir=/l\x00/tmp/x/mnt2\x00", false},
		{"goverlay\x00-o\x00lowerdir=/l\x00/tmp/x/mnt\x00", false},
		{"/tmp/x/mnt\x00", false},
		{"", false},
	} {
		if got := cmdlineMatches([]byte(c.cmdline), "fuse-overlayfs", "/tmp/x/mnt"); got != c.want {
			t.Errorf("cmdlineMatches(%q) = %v", c.cmdline, got)
		}
	}

	// A real process, found by its program and last argument.
	arg := "3600." + strconv.Itoa(os.Getpid())
	cmd := exec.Command("sleep", arg)
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// Start returns once the child is forked, maybe before it execs
	// sleep: until then its cmdline is ours.
	got := 0
	for deadline := time.Now().Add(5 * time.Second); got == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = findDaemon("sleep", arg)
	}
	if got != cmd.Process.Pid {
		t.Errorf("findDaemon = %d, want %d", got, cmd.Process.Pid)
	}
	inst := &instance{def: findTarget("fuse-overlayfs"), root: "/nonexistent/goverlay-bench-mnt"}
	if pid, err := daemonPID(inst); err == nil {
		t.Errorf("daemonPID for a mountpoint nothing serves = %d", pid)
	}
	inst = &instance{def: findTarget("goverlay"), pid: cmd.Process.Pid}
	if pid, err := daemonPID(inst); err != nil || pid != cmd.Process.Pid {
		t.Errorf("daemonPID(goverlay) = %d, %v", pid, err)
	}
}

// TestMemShortRun runs the mem-* workloads alone at a tiny scale on
// native, goverlay and fuse-overlayfs (when installed): the FUSE daemons
// get a sample each, native none (not applicable, a row of "-"), no FUSE
// request counter is set up since no selected workload counts requests,
// and the memory goals are checked. Nothing about the figures themselves
// is asserted but that an idle daemon has a resident set.
func TestMemShortRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting and drop_caches need root")
	}
	bin := goverlayBinary(t)
	scratch := t.TempDir()
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   []string{"native", "fuse-overlayfs", "goverlay"},
		Workloads: []string{"mem"},
		Duration:  20 * time.Millisecond,
		Runs:      1,
		Scale:     0.01,
		Dir:       scratch,
		Out:       &table,
	}
	rep := mustRun(t, c, &table)
	if strings.Join(rep.Config.Workloads, ",") != "mem-per-inode,mem-idle" {
		t.Errorf("workloads %v", rep.Config.Workloads)
	}
	ran := map[string]bool{}
	for _, ts := range rep.Targets {
		ran[ts.Name] = ts.Status == "ok"
	}
	if !ran["native"] || !ran["goverlay"] {
		t.Fatalf("targets: %+v", rep.Targets)
	}
	for _, res := range rep.Results {
		if !ran[res.Target] {
			continue
		}
		if !tableHasRow(table.String(), res.Workload, res.Target) {
			t.Errorf("table has no row for %s on %s", res.Workload, res.Target)
		}
		if res.Target == "native" {
			if !res.NotApplicable || len(res.Samples) != 0 || len(res.Errors) != 0 {
				t.Errorf("%s on native: %+v", res.Workload, res)
			}
			continue
		}
		if res.NotApplicable || len(res.Samples) != 1 || len(res.Errors) != 0 {
			t.Errorf("%s on %s: samples %v, errors %v", res.Workload, res.Target, res.Samples, res.Errors)
			continue
		}
		if res.Workload == "mem-idle" && res.Samples[0] <= 0 {
			t.Errorf("mem-idle on %s: %v MiB", res.Target, res.Samples[0])
		}
	}
	if rep.RequestCounting != "" || strings.Contains(table.String(), "FUSE REQ/1000 OPS") {
		t.Errorf("request counting set up for workloads that count none: %q", rep.RequestCounting)
	}
	goals := 0
	for _, g := range rep.Goals {
		if g.Target == "goverlay" && strings.HasPrefix(g.Workload, "mem-") {
			goals++
		}
	}
	if goals != 2 {
		t.Errorf("memory goals: %+v", rep.Goals)
	}
	assertClean(t, scratch)
}

// mustRun runs c, whose Out is table, fails the test if the run fails, and
// logs the table either way.
func mustRun(t *testing.T, c Config, table *bytes.Buffer) *Report {
	t.Helper()
	rep, err := Run(context.Background(), c)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, table.String())
	}
	t.Logf("table:\n%s", table.String())
	return rep
}

// TestRotated: each round's target order starts one further.
func TestRotated(t *testing.T) {
	ts := []string{"a", "b", "c"}
	for k, want := range []string{"abc", "bca", "cab", "abc"} {
		if got := strings.Join(rotated(ts, k), ""); got != want {
			t.Errorf("rotated by %d: %s, want %s", k, got, want)
		}
	}
	if strings.Join(ts, "") != "abc" {
		t.Errorf("rotated changed its argument: %v", ts)
	}
}
