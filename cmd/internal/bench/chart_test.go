package bench

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chartReport is a report with the shape of a real run: a 20× spread
// between targets, one noisy sample, a latency and two memory workloads.
func chartReport() *Report {
	r := &Report{Config: ReportConfig{Runs: 3, Workloads: []string{"fstime-1024-write", "metadata", "path-miss", "mem-per-inode", "mem-idle"}}}
	for _, t := range []string{"native", "kernel", "fuse-overlayfs", "goverlay", "goverlay-nosec-off"} {
		r.Targets = append(r.Targets, &TargetStatus{Name: t, Status: "ok"})
	}
	add := func(w, unit string, higher bool, target string, samples ...float64) {
		r.Results = append(r.Results, &Result{Workload: w, Target: target, Unit: unit, HigherIsBetter: higher, Samples: samples})
	}
	add("fstime-1024-write", "KB/s", true, "native", 1.6e6, 1.7e6, 1.65e6)
	add("fstime-1024-write", "KB/s", true, "kernel", 1.4e6, 1.5e6, 1.45e6)
	add("fstime-1024-write", "KB/s", true, "fuse-overlayfs", 6e4, 6.5e4, 6.3e4)
	add("fstime-1024-write", "KB/s", true, "goverlay", 1.5e6, 1.6e6, 1.1e7) // one noisy sample
	add("fstime-1024-write", "KB/s", true, "goverlay-nosec-off", 5.4e4, 5.5e4, 5.6e4)
	add("metadata", "ops/s", true, "native", 16000, 15000, 17000)
	add("metadata", "ops/s", true, "kernel", 54000, 50000, 58000)
	add("metadata", "ops/s", true, "fuse-overlayfs", 14500, 14000, 15000)
	add("metadata", "ops/s", true, "goverlay", 8800, 8000, 9000)
	add("metadata", "ops/s", true, "goverlay-nosec-off", 8850, 8000, 9000)
	add("path-miss", "µs", false, "native", 500, 510, 505)
	add("path-miss", "µs", false, "kernel", 523, 530, 520)
	add("path-miss", "µs", false, "fuse-overlayfs", 612, 600, 620)
	add("path-miss", "µs", false, "goverlay", 578, 570, 590)
	add("path-miss", "µs", false, "goverlay-nosec-off", 582, 580, 590)
	add("mem-per-inode", "bytes/inode", false, "fuse-overlayfs", 1200, 1250, 1300)
	add("mem-per-inode", "bytes/inode", false, "goverlay", 845, 850, 860)
	add("mem-per-inode", "bytes/inode", false, "goverlay-nosec-off", 861, 870, 880)
	add("mem-idle", "MiB", false, "fuse-overlayfs", 30.2, 30, 31)
	add("mem-idle", "MiB", false, "goverlay", 17.5, 17, 18)
	add("mem-idle", "MiB", false, "goverlay-nosec-off", 17.6, 17, 18)
	for _, w := range []string{"mem-per-inode", "mem-idle"} {
		for _, t := range []string{"native", "kernel"} {
			r.Results = append(r.Results, &Result{Workload: w, Target: t, Unit: "MiB", NotApplicable: true})
		}
	}
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestChartPanels: one panel per kind of unit; speeds relative to the
// kernel overlay (times inverted, so right is always faster), memory to
// fuse-overlayfs; each point's whisker spans its runs.
func TestChartPanels(t *testing.T) {
	ps := chartReport().panels()
	var titles []string
	for _, p := range ps {
		titles = append(titles, p.Title+"/"+p.Reference)
	}
	if got := strings.Join(titles, ","); got != "Throughput/kernel,Latency/kernel,Daemon memory/fuse-overlayfs" {
		t.Fatalf("panels %s", got)
	}
	find := func(p chartPanel, w, target string) chartPoint {
		for _, pt := range p.Points {
			if strings.HasPrefix(pt.Workload, w+" (") && pt.Target == target {
				return pt
			}
		}
		t.Fatalf("no point for %s on %s in %s", w, target, p.Title)
		return chartPoint{}
	}
	g := find(ps[0], "fstime-1024-write", "goverlay")
	if !near(g.Med, 1.6e6/1.45e6) || !near(g.Lo, 1.5e6/1.45e6) || !near(g.Hi, 1.1e7/1.45e6) {
		t.Errorf("fstime goverlay point %+v", g)
	}
	k := find(ps[0], "metadata", "kernel")
	if !near(k.Med, 1) || !near(k.Lo, 50000.0/54000) || !near(k.Hi, 58000.0/54000) {
		t.Errorf("metadata kernel point %+v", k)
	}
	pm := find(ps[1], "path-miss", "goverlay")
	if !near(pm.Med, 523.0/578) || !near(pm.Lo, 523.0/590) || !near(pm.Hi, 523.0/570) {
		t.Errorf("path-miss goverlay point %+v: want kernel time ÷ target time", pm)
	}
	mi := find(ps[2], "mem-idle", "goverlay")
	if !near(mi.Med, 30.2/17.5) || mi.Lo > mi.Med || mi.Hi < mi.Med {
		t.Errorf("mem-idle goverlay point %+v", mi)
	}
	for _, p := range ps {
		for _, pt := range p.Points {
			if pt.Target == "native" && p.Title == "Daemon memory" {
				t.Errorf("native in the memory panel: %+v", pt)
			}
		}
	}
}

// TestChartFiles: the chart is written as PNG and as SVG, with the
// panels and every target named.
func TestChartFiles(t *testing.T) {
	r := chartReport()
	dir := t.TempDir()
	pngPath, svgPath := filepath.Join(dir, "bench.png"), filepath.Join(dir, "bench.svg")
	if err := r.WriteChart(pngPath); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("bench.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 500 {
		t.Errorf("bench.png is %v, too small to read", b)
	}
	if err := r.WriteChart(svgPath); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Throughput", "Latency", "Daemon memory", "fuse-overlayfs", "goverlay-nosec-off", "path-miss (µs)", "1×"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("bench.svg lacks %q", want)
		}
	}
}

func TestRatioTicks(t *testing.T) {
	var labels []string
	for _, tk := range (ratioTicks{}).Ticks(0.08, 30) {
		labels = append(labels, tk.Label)
	}
	if got := strings.Join(labels, " "); got != "0.1× 0.2× 0.5× 1× 2× 5× 10× 20×" {
		t.Errorf("ticks %s", got)
	}
	labels = nil
	for _, tk := range (ratioTicks{}).Ticks(0.65, 2.2) {
		labels = append(labels, tk.Label)
	}
	if got := strings.Join(labels, " "); got != "0.7× 0.8× 0.9× 1× 1.2× 1.5× 2×" {
		t.Errorf("ticks %s", got)
	}
}

// TestSummary: the text report ends with where goverlay is ahead and
// behind, against the kernel overlay and fuse-overlayfs, worst first, in
// words that fit the unit.
func TestSummary(t *testing.T) {
	var b strings.Builder
	chartReport().WriteTable(&b)
	out := b.String()
	i := strings.Index(out, "\nSummary: goverlay")
	if i < 0 {
		t.Fatalf("no summary:\n%s", out)
	}
	sum := out[i:]
	for _, want := range []string{
		"against kernel, on 3 workload(s):",
		"ahead on 1: fstime-1024-write 1.10× noisy",
		"behind on 2: metadata 0.16× (6.1× slower), path-miss 0.90× (1.1× slower)",
		"against fuse-overlayfs, on 5 workload(s):",
		"ahead on 3: fstime-1024-write 25.40× noisy, mem-idle 1.73×, mem-per-inode 1.47×",
		"within 10% on 1: path-miss 1.06×",
		"behind on 1: metadata 0.61× (1.6× slower)",
	} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
	if strings.Count(out[i+1:], "\n\n") > 1 {
		t.Errorf("the summary is not the end of the report:\n%s", sum)
	}
	for _, jargon := range []string{"Issue", "issue "} {
		if strings.Contains(out, jargon) {
			t.Errorf("report says %q", jargon)
		}
	}
}

// TestSummaryRootless: a rootless run's summary compares goverlay-rootless
// with the rootless kernel overlay and fuse-overlayfs.
func TestSummaryRootless(t *testing.T) {
	r := chartReport()
	rootless := map[string]bool{"kernel": true, "fuse-overlayfs": true, "goverlay": true}
	for _, tg := range r.Targets {
		if rootless[tg.Name] {
			tg.Name += "-rootless"
		}
	}
	for _, res := range r.Results {
		if rootless[res.Target] {
			res.Target += "-rootless"
		}
	}
	var b strings.Builder
	r.WriteTable(&b)
	out := b.String()
	i := strings.Index(out, "\nSummary: goverlay-rootless,")
	if i < 0 {
		t.Fatalf("no summary for goverlay-rootless:\n%s", out)
	}
	sum := out[i:]
	for _, want := range []string{
		"against kernel-rootless, on 3 workload(s):",
		"ahead on 1: fstime-1024-write 1.10× noisy",
		"against fuse-overlayfs-rootless, on 5 workload(s):",
	} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
}
