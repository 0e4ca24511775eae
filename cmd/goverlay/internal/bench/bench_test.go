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
	"strings"
	"testing"
	"time"
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
		moduleRoot := filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
		dir, err := os.MkdirTemp("", "goverlay-bench-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "goverlay")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/goverlay")
		cmd.Dir = moduleRoot
		out, err := cmd.CombinedOutput()
		builtBinary.path = bin
		if err != nil {
			builtBinary.err = errors.New(string(out))
		}
	}
	if builtBinary.err != nil {
		t.Fatalf("go build ./cmd/goverlay: %v", builtBinary.err)
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
	if len(c.Targets) != len(allTargets) || len(c.Workloads) != len(allWorkloads) {
		t.Errorf("defaults: %d targets, %d workloads; want all", len(c.Targets), len(c.Workloads))
	}
	if c.Duration != DefaultDuration || c.Runs != DefaultRuns {
		t.Errorf("defaults: duration %v runs %d", c.Duration, c.Runs)
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
	rep, err := Run(context.Background(), c)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, table.String())
	}
	t.Logf("table:\n%s", table.String())

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
