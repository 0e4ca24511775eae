package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

// Report is the outcome of Run: every sample of every (workload, target).
type Report struct {
	Config      ReportConfig `json:"config"`
	Machine     Machine      `json:"machine"`
	Scratch     string       `json:"scratch"`
	Started     time.Time    `json:"started"`
	Finished    time.Time    `json:"finished"`
	Interrupted bool         `json:"interrupted,omitempty"`
	// Reference is the target the ratios are relative to: kernel, when
	// it ran.
	Reference string          `json:"reference,omitempty"`
	Targets   []*TargetStatus `json:"targets"`
	Results   []*Result       `json:"results"`
	Errors    []string        `json:"errors,omitempty"`
	// Dircache is the size of the dircache workloads, when any ran.
	Dircache *dcLayout `json:"dircache,omitempty"`
	// RequestCounting says how the FUSE requests of the dircache
	// workloads were counted on FUSE targets, or why they were not.
	RequestCounting string `json:"request_counting,omitempty"`
	// Goals are goverlay's design targets for its caches and memory,
	// met or missed, for the goverlay targets, from the workloads that
	// ran.
	Goals []Goal `json:"goals,omitempty"`
	// Containers describes the containers workloads' tree, when any ran.
	Containers *ContainersInfo `json:"containers,omitempty"`
	// Host describes the host workloads, when any ran.
	Host *HostInfo `json:"host,omitempty"`
	// Build describes the build workloads, when any ran.
	Build string `json:"build,omitempty"`
}

// Goal is one design target checked on one goverlay target.
type Goal struct {
	Goal     string `json:"goal"`
	Target   string `json:"target"`
	Workload string `json:"workload"`
	Value    string `json:"value"`
	Met      bool   `json:"met"`
}

// ReportConfig is the Config as the report records it.
type ReportConfig struct {
	Binary          string   `json:"binary"`
	Targets         []string `json:"targets"`
	Workloads       []string `json:"workloads"`
	Duration        string   `json:"duration"`
	DurationSeconds float64  `json:"duration_seconds"`
	Runs            int      `json:"runs"`
	Scale           float64  `json:"scale"`
	Dir             string   `json:"dir"`
}

// Machine describes where the numbers come from.
type Machine struct {
	NProc         int    `json:"nproc"`
	Kernel        string `json:"kernel"`
	KernelVersion string `json:"kernel_version"`
	Arch          string `json:"arch"`
	CPU           string `json:"cpu,omitempty"`
	GoVersion     string `json:"go_version"`
	ScratchFS     string `json:"scratch_fs"`
	Goverlay      string `json:"goverlay_version,omitempty"`
}

// TargetStatus says whether a target ran, and what it said.
type TargetStatus struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Status is "ok" or "skipped" (it could not run here; Reason says
	// why).
	Status  string   `json:"status"`
	Reason  string   `json:"reason,omitempty"`
	Version string   `json:"version,omitempty"`
	Notes   []string `json:"notes,omitempty"`
	Errors  []string `json:"errors,omitempty"`
	// Stats are a goverlay daemon's counters at the end of the last
	// round.
	Stats *overlay.Stats `json:"stats,omitempty"`
}

// Result is one (workload, target).
type Result struct {
	Workload       string `json:"workload"`
	Target         string `json:"target"`
	Unit           string `json:"unit"`
	HigherIsBetter bool   `json:"higher_is_better"`
	// NotApplicable is set when the workload means nothing on the target
	// (the mem-* workloads on a target without a daemon): it has no
	// samples, and its row is all "-".
	NotApplicable bool `json:"not_applicable,omitempty"`
	// NotApplicableReason says why, where the workload gives one.
	NotApplicableReason string    `json:"not_applicable_reason,omitempty"`
	Samples             []float64 `json:"samples"`
	Errors              []string  `json:"errors,omitempty"`
	Min                 *float64  `json:"min,omitempty"`
	Median              *float64  `json:"median,omitempty"`
	Max                 *float64  `json:"max,omitempty"`
	// VsKernel is the median's performance relative to the reference
	// target's: median/reference when higher is better, reference/median
	// when lower is (path-miss), so that above 1 is always faster.
	VsKernel *float64 `json:"vs_kernel,omitempty"`
	// VsNoSecOff is the same for goverlay against goverlay-nosec-off, on
	// the goverlay rows.
	VsNoSecOff *float64 `json:"vs_nosec_off,omitempty"`
	// GetxattrPer1000Writes are GETXATTR(security.capability) requests
	// per 1000 write() calls in fstime write phases, from the goverlay
	// daemon's counters, one per sample.
	GetxattrPer1000Writes []float64 `json:"getxattr_per_1000_writes,omitempty"`
	GetxattrMedian        *float64  `json:"getxattr_per_1000_writes_median,omitempty"`
	// Requests are, for the dircache workloads on FUSE targets, the
	// requests that reached the daemon in each sample's timed part;
	// the medians are per 1000 ops, from the tracepoint (FUSE) and from
	// the daemon's counters (goverlay only).
	Requests          []ReqSample        `json:"requests,omitempty"`
	FuseReqsMedian    *float64           `json:"fuse_requests_per_1000_ops_median,omitempty"`
	DaemonReqsMedian  *float64           `json:"daemon_requests_per_1000_ops_median,omitempty"`
	FuseReqsByTypeMed map[string]float64 `json:"fuse_requests_by_type_per_1000_ops_median,omitempty"`
}

// ReqSample is what one sample's timed part sent the daemon.
type ReqSample struct {
	// Ops is the sample's count of operations (stats, entries, files).
	Ops float64 `json:"ops"`
	// FuseRequests counts fuse:fuse_request_send on the mount's
	// connection; FuseRequestsByType splits it for warm-stat and
	// warm-path-miss ("other": every type not counted on its own).
	FuseRequests       *uint64           `json:"fuse_requests,omitempty"`
	FuseRequestsByType map[string]uint64 `json:"fuse_requests_by_type,omitempty"`
	// Daemon are goverlay's own counters' increase.
	Daemon *DaemonRequests `json:"daemon,omitempty"`
	// DaemonCPU is the FUSE daemon's utime+stime over the timed part,
	// in seconds (the containers workloads).
	DaemonCPU *float64 `json:"daemon_cpu_seconds,omitempty"`
}

// DaemonRequests are the request counters of `goverlay stats`: LOOKUPs
// that found something, LOOKUPs that found nothing, GETATTRs.
type DaemonRequests struct {
	Lookups         uint64 `json:"lookups"`
	NegativeLookups uint64 `json:"negative_lookups"`
	Getattrs        uint64 `json:"getattrs"`
}

// total is every request the counters saw: overlay/lookup.go counts a
// LOOKUP in lookups when it finds the name and in negative_lookups when
// it does not, never in both.
func (d DaemonRequests) total() uint64 { return d.Lookups + d.NegativeLookups + d.Getattrs }

func per1000(n uint64, ops float64) float64 {
	if ops <= 0 {
		return 0
	}
	return float64(n) * 1000 / ops
}

func newReport(c Config) *Report {
	return &Report{
		Config: ReportConfig{
			Binary: c.Binary, Targets: c.Targets, Workloads: c.Workloads,
			Duration: c.Duration.String(), DurationSeconds: c.Duration.Seconds(),
			Runs: c.Runs, Scale: c.Scale, Dir: c.Dir,
		},
		Started: time.Now(),
	}
}

func (m *Machine) fill(binary string) {
	m.NProc = runtime.NumCPU()
	m.Arch = runtime.GOARCH
	m.GoVersion = runtime.Version()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
		m.KernelVersion = unix.ByteSliceToString(u.Version[:])
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if binary != "" {
		if out, err := exec.Command(binary, "--version").Output(); err == nil {
			m.Goverlay, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
		}
	}
}

// finish computes the summaries from the samples. It may run again.
func (r *Report) finish() {
	for _, t := range r.Targets {
		if t.Reason != "" {
			t.Status = "skipped"
		}
	}
	r.Reference = ""
	for _, name := range []string{"kernel-rootless", "kernel"} {
		if r.ran(name) {
			r.Reference = name
		}
	}
	for _, res := range r.Results {
		res.Min, res.Median, res.Max, res.VsKernel, res.VsNoSecOff, res.GetxattrMedian = nil, nil, nil, nil, nil, nil
		res.FuseReqsMedian, res.DaemonReqsMedian, res.FuseReqsByTypeMed = nil, nil, nil
		if len(res.Samples) == 0 {
			continue
		}
		res.summariseRequests()
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range res.Samples {
			lo, hi = math.Min(lo, s), math.Max(hi, s)
		}
		med := median(res.Samples)
		res.Min, res.Median, res.Max = &lo, &med, &hi
		if len(res.GetxattrPer1000Writes) > 0 {
			g := median(res.GetxattrPer1000Writes)
			res.GetxattrMedian = &g
		}
	}
	for _, res := range r.Results {
		if r.Reference != "" {
			res.VsKernel = r.relative(res, r.Reference)
		}
		if res.Target == "goverlay" {
			res.VsNoSecOff = r.relative(res, "goverlay-nosec-off")
		}
	}
	r.Goals = r.goals()
}

// summariseRequests computes the per-1000-ops medians of res.Requests.
func (res *Result) summariseRequests() {
	var fuse, daemon []float64
	byType := map[string][]float64{}
	typed := false
	for _, q := range res.Requests {
		if q.FuseRequests != nil {
			fuse = append(fuse, per1000(*q.FuseRequests, q.Ops))
		}
		if q.Daemon != nil {
			daemon = append(daemon, per1000(q.Daemon.total(), q.Ops))
		}
		if q.FuseRequestsByType != nil {
			typed = true
			for k := range q.FuseRequestsByType {
				byType[k] = nil
			}
		}
	}
	if len(fuse) > 0 {
		m := median(fuse)
		res.FuseReqsMedian = &m
	}
	if len(daemon) > 0 {
		m := median(daemon)
		res.DaemonReqsMedian = &m
	}
	if typed {
		// Empty when no request was sent at all.
		res.FuseReqsByTypeMed = map[string]float64{}
		for k := range byType {
			var xs []float64
			for _, q := range res.Requests {
				if q.FuseRequestsByType != nil {
					xs = append(xs, per1000(q.FuseRequestsByType[k], q.Ops))
				}
			}
			res.FuseReqsByTypeMed[k] = median(xs)
		}
	}
}

// goals checks goverlay's design targets on every goverlay target that
// has the numbers: warm stats and warm PATH misses send no request (the
// kernel answers them from its caches); stat-deep at least 1.2× the kernel
// overlay; fork+exec through PATH (path-miss) at most 1.2× native's time;
// metadata and create-unlink-100k at least 3× fuse-overlayfs; at most
// 1 KiB of daemon memory per cached inode and 20 MiB idle.
func (r *Report) goals() []Goal {
	var out []Goal
	for _, t := range r.Targets {
		if !strings.HasPrefix(t.Name, "goverlay") {
			continue
		}
		for _, w := range []string{"warm-stat", "warm-path-miss"} {
			res := r.result(w, t.Name)
			if res == nil {
				continue
			}
			v, src := res.FuseReqsMedian, "FUSE requests"
			if v == nil {
				v, src = res.DaemonReqsMedian, "daemon lookups+getattrs"
			}
			if v == nil {
				continue
			}
			out = append(out, Goal{Goal: w + ": 0 requests", Target: t.Name, Workload: w,
				Value: fmt.Sprintf("%s %s per 1000 stats", fmtNum(*v), src), Met: *v == 0})
		}
		ratio := func(w, ref string) (float64, float64, bool) {
			res, base := r.result(w, t.Name), r.result(w, ref)
			if res == nil || base == nil || res.Median == nil || base.Median == nil || *base.Median == 0 {
				return 0, 0, false
			}
			return *res.Median, *res.Median / *base.Median, true
		}
		if v, x, ok := ratio("stat-deep", "kernel"); ok {
			out = append(out, Goal{Goal: "stat ≥ 1.2× kernel", Target: t.Name, Workload: "stat-deep",
				Value: fmt.Sprintf("%s ops/s = %.2f× kernel", fmtNum(v), x), Met: x >= 1.2})
		}
		if v, x, ok := ratio("path-miss", "native"); ok {
			out = append(out, Goal{Goal: "fork+execvp ≤ 1.2× native", Target: t.Name, Workload: "path-miss",
				Value: fmt.Sprintf("%s µs = %.2f× native", fmtNum(v), x), Met: x <= 1.2})
		}
		for _, w := range []string{"metadata", "create-unlink-100k"} {
			if v, x, ok := ratio(w, "fuse-overlayfs"); ok {
				out = append(out, Goal{Goal: "metadata ≥ 3× fuse-overlayfs", Target: t.Name, Workload: w,
					Value: fmt.Sprintf("%s ops/s = %.2f× fuse-overlayfs", fmtNum(v), x), Met: x >= 3})
			}
		}
		for _, m := range []struct {
			goal, workload string
			max            float64
		}{
			{"≤ 1 KiB per cached inode", "mem-per-inode", 1024},
			{"idle daemon ≤ 20 MiB RSS", "mem-idle", 20},
		} {
			res := r.result(m.workload, t.Name)
			if res == nil || res.Median == nil {
				continue
			}
			v := fmt.Sprintf("%s %s", fmtNum(*res.Median), res.Unit)
			if f := r.result(m.workload, "fuse-overlayfs"); f != nil && f.Median != nil {
				v += fmt.Sprintf(" (fuse-overlayfs: %s)", fmtNum(*f.Median))
			}
			out = append(out, Goal{Goal: m.goal, Target: t.Name, Workload: m.workload, Value: v, Met: *res.Median <= m.max})
		}
	}
	return out
}

// targetOK reports whether target was not skipped.
func (r *Report) targetOK(target string) bool {
	for _, t := range r.Targets {
		if t.Name == target {
			return t.Status == "ok"
		}
	}
	return false
}

// ran reports whether target has at least one sample.
func (r *Report) ran(target string) bool {
	for _, res := range r.Results {
		if res.Target == target && len(res.Samples) > 0 {
			return true
		}
	}
	return false
}

func (r *Report) result(workload, target string) *Result {
	for _, res := range r.Results {
		if res.Workload == workload && res.Target == target {
			return res
		}
	}
	return nil
}

// relative is res's median performance relative to target's on the same
// workload: above 1 is faster.
func (r *Report) relative(res *Result, target string) *float64 {
	ref := r.result(res.Workload, target)
	if ref == nil || ref.Median == nil || res.Median == nil || *ref.Median == 0 || *res.Median == 0 {
		return nil
	}
	v := *res.Median / *ref.Median
	if !res.HigherIsBetter {
		v = *ref.Median / *res.Median
	}
	return &v
}

// WriteJSON writes the whole report, every sample, as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	r.finish()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the results as text tables.
func (r *Report) WriteTable(w io.Writer) {
	var b bytes.Buffer
	r.writeTable(&b)
	// The tabwriter pads blank and short rows; drop trailing blanks.
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if strings.HasSuffix(line, "\n") {
			line = strings.TrimRight(line, " \n") + "\n"
		}
		io.WriteString(w, line)
	}
}

func (r *Report) writeTable(w io.Writer) {
	r.finish()
	m := r.Machine
	fmt.Fprintf(w, "goverlay bench: %d interleaved run(s), %s per phase; Linux %s, %d CPU(s), %s; scratch on %s\n",
		r.Config.Runs, r.Config.Duration, m.Kernel, m.NProc, m.GoVersion, m.ScratchFS)
	if r.Interrupted {
		fmt.Fprintf(w, "INTERRUPTED: partial results\n")
	}
	ref := r.Reference
	if ref == "" {
		ref = "kernel"
		fmt.Fprintf(w, "MIN/MEDIAN/MAX over the runs; no kernel results, so no ratios\n\n")
	} else {
		fmt.Fprintf(w, "MIN/MEDIAN/MAX over the runs; VS %s = median relative to %s's, above 1 is better: faster, or smaller (for times and memory: %s's value / the target's)\n\n", strings.ToUpper(ref), ref, ref)
	}

	if d := r.Dircache; d != nil {
		fmt.Fprintf(w, "dircache workloads at --scale %g: find-cold and mem-per-inode %s files in %s directories, readdir-100k %s entries (%s in the upper), create-unlink-100k %s files\n",
			d.Scale, fmtInt(d.treeFiles()), fmtInt(d.TreeDirs), fmtInt(d.BigEntries), fmtInt(d.BigUpper), fmtInt(d.Creates))
	}
	if r.RequestCounting != "" {
		if strings.HasPrefix(r.RequestCounting, "unavailable") {
			fmt.Fprintf(w, "FUSE REQ/1000 OPS: not counted, the request counter is %s\n", r.RequestCounting)
		} else {
			fmt.Fprintf(w, "FUSE REQ/1000 OPS: requests the kernel sent the daemon per 1000 ops (stats, entries, files), median; counted with the %s\n", r.RequestCounting)
		}
		fmt.Fprintf(w, "DAEMON L+G/1000 OPS: goverlay's own counters (lookups + lookups_not_found + attribute_requests) per 1000 ops; lookups include those READDIRPLUS makes for each entry, so they can exceed the requests\n")
	}
	if r.Host != nil {
		fmt.Fprintln(w, r.Host.line())
	}
	if r.Build != "" {
		fmt.Fprintln(w, r.Build)
	}
	if r.Dircache != nil || r.RequestCounting != "" || r.Host != nil || r.Build != "" {
		fmt.Fprintln(w)
	}

	withReqs := false
	for _, res := range r.Results {
		withReqs = withReqs || len(res.Requests) > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := []string{"WORKLOAD", "TARGET", "MIN", "MEDIAN", "MAX", "UNIT", "VS " + strings.ToUpper(ref), "GETXATTR/1000 WRITES"}
	right := []bool{false, false, true, true, true, false, true, true}
	if withReqs {
		header = append(header, "FUSE REQ/1000 OPS", "DAEMON L+G/1000 OPS")
		right = append(right, true, true)
	}
	rows := [][]string{header}
	var prev string
	for _, res := range r.Results {
		if len(res.Samples) == 0 && len(res.Errors) == 0 && !(res.NotApplicable && r.targetOK(res.Target)) {
			continue // a skipped target
		}
		if prev != "" && res.Workload != prev {
			rows = append(rows, nil)
		}
		prev = res.Workload
		row := []string{res.Workload, res.Target, "-", "-", "-", res.Unit, "-", "-"}
		if res.Median != nil {
			row[2], row[3], row[4] = fmtNum(*res.Min), fmtNum(*res.Median), fmtNum(*res.Max)
		} else if !res.NotApplicable {
			row[3] = "error"
		}
		if res.VsKernel != nil {
			row[6] = fmtTableRatio(*res.VsKernel)
		}
		if res.GetxattrMedian != nil {
			row[7] = fmtNum(*res.GetxattrMedian)
		}
		if withReqs {
			row = append(row, "-", "-")
			if res.FuseReqsMedian != nil {
				row[8] = fmtNum(*res.FuseReqsMedian)
			}
			if res.DaemonReqsMedian != nil {
				row[9] = fmtNum(*res.DaemonReqsMedian)
			}
		}
		rows = append(rows, row)
	}
	writeRows(tw, rows, right)
	tw.Flush()
	r.writeNotApplicable(w)

	// The request types behind FUSE REQ/1000 OPS, where they were
	// counted apart.
	var types [][]string
	for _, res := range r.Results {
		if res.FuseReqsByTypeMed == nil {
			continue
		}
		var parts []string
		for _, k := range sortedKeys(res.FuseReqsByTypeMed) {
			if v := res.FuseReqsByTypeMed[k]; v != 0 {
				parts = append(parts, k+" "+fmtNum(v))
			}
		}
		if len(parts) == 0 {
			parts = []string{"none"}
		}
		if len(types) > 0 && types[len(types)-1][0] != res.Workload {
			types = append(types, nil)
		}
		types = append(types, []string{res.Workload, res.Target, strings.Join(parts, ", ")})
	}
	if len(types) > 0 {
		fmt.Fprintf(w, "\nFUSE requests by type, per 1000 ops (median over the runs)\n\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		writeRows(tw, append([][]string{{"WORKLOAD", "TARGET", "REQUESTS"}}, types...), nil)
		tw.Flush()
	}

	if len(r.Goals) > 0 {
		fmt.Fprintf(w, "\nDesign targets (warm caches send no requests, stat and exec speed, metadata against fuse-overlayfs, daemon memory), on the goverlay targets\n\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		grows := [][]string{{"GOAL", "TARGET", "WORKLOAD", "MEDIAN", "MET"}}
		for _, g := range r.Goals {
			met := "missed"
			if g.Met {
				met = "met"
			}
			grows = append(grows, []string{g.Goal, g.Target, g.Workload, g.Value, met})
		}
		writeRows(tw, grows, nil)
		tw.Flush()
	}

	r.writeContainers(w)

	// goverlay against itself without NOSEC.
	var cmp [][]string
	for _, res := range r.Results {
		if res.Target != "goverlay" || res.VsNoSecOff == nil {
			continue
		}
		off := r.result(res.Workload, "goverlay-nosec-off")
		cmp = append(cmp, []string{res.Workload, fmtNum(*res.Median), fmtNum(*off.Median), res.Unit, fmt.Sprintf("%.2f", *res.VsNoSecOff)})
	}
	if len(cmp) > 0 {
		fmt.Fprintf(w, "\ngoverlay vs goverlay-nosec-off (medians; ratio above 1: goverlay is faster, or for bytes and MiB smaller)\n\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		writeRows(tw, append([][]string{{"WORKLOAD", "GOVERLAY", "NOSEC-OFF", "UNIT", "RATIO"}}, cmp...), []bool{false, true, true, false, true})
		tw.Flush()
	}

	fmt.Fprintf(w, "\nTargets\n\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	trows := [][]string{{"TARGET", "STATUS", "DETAILS"}}
	for _, t := range r.Targets {
		var details []string
		if t.Reason != "" {
			details = append(details, t.Reason)
		} else {
			if t.Description != "" {
				details = append(details, t.Description)
			}
			if t.Version != "" {
				details = append(details, t.Version)
			}
			if s := t.Stats; s != nil {
				nosec := "off"
				if s.NoSec {
					nosec = "on"
				}
				details = append(details, fmt.Sprintf("NOSEC %s (%s)", nosec, s.NoSecReason),
					fmt.Sprintf("opens: %d passthrough, %d through goverlay", s.OpensPassthrough, s.OpensCached))
			}
			details = append(details, t.Notes...)
			details = append(details, t.Errors...)
		}
		trows = append(trows, []string{t.Name, t.Status, oneLine(strings.Join(details, "; "))})
	}
	writeRows(tw, trows, nil)
	tw.Flush()

	var errs []string
	for _, res := range r.Results {
		for _, e := range res.Errors {
			errs = append(errs, fmt.Sprintf("%s on %s: %s", res.Workload, res.Target, e))
		}
	}
	errs = append(errs, r.Errors...)
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nErrors\n\n")
		for _, e := range errs {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	r.writeSummary(w)
}

// writeNotApplicable says why the rows of "-" are empty, per target and
// reason, for the workloads that give one.
func (r *Report) writeNotApplicable(w io.Writer) {
	type key struct{ target, reason string }
	var keys []key
	workloads := map[key][]string{}
	for _, res := range r.Results {
		if !res.NotApplicable || res.NotApplicableReason == "" || !r.targetOK(res.Target) {
			continue
		}
		k := key{res.Target, res.NotApplicableReason}
		if workloads[k] == nil {
			keys = append(keys, k)
		}
		workloads[k] = append(workloads[k], res.Workload)
	}
	if len(keys) == 0 {
		return
	}
	fmt.Fprintf(w, "\nNot applicable (the rows of \"-\")\n\n")
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s: %s\n", k.target, strings.Join(workloads[k], ", "), k.reason)
	}
}

// fmtTableRatio prints a ratio with two decimals, or two significant
// digits below 0.01.
func fmtTableRatio(v float64) string {
	if v < 0.01 {
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtSummaryRatio(v float64) string { return fmtTableRatio(v) + "×" }

// closeBand is how near the reference's median a ratio counts as a draw:
// within 10% either way.
const closeBand = 1.1

// noisySpread is the max/min over a target's runs above which its median
// is flagged as noisy.
const noisySpread = 2.0

// writeSummary ends the report with what a reader acts on: where goverlay
// wins and loses against the kernel overlay and against fuse-overlayfs,
// and by how much, slowest first.
func (r *Report) writeSummary(w io.Writer) {
	target := ""
	for _, t := range []string{"goverlay-rootless", "goverlay"} {
		if r.ran(t) {
			target = t
		}
	}
	if target == "" {
		for _, t := range r.Targets {
			if strings.HasPrefix(t.Name, "goverlay") && r.ran(t.Name) {
				target = t.Name
				break
			}
		}
	}
	if target == "" {
		return
	}
	fmt.Fprintf(w, "\nSummary: %s, median speed relative to each reference (above 1: %s is faster, or for memory smaller)\n\n", target, target)
	lines := 0
	// A rootless goverlay is compared with the rootless references.
	suffix := ""
	if strings.HasSuffix(target, "-rootless") {
		suffix = "-rootless"
	}
	for _, ref := range []string{"kernel" + suffix, "fuse-overlayfs" + suffix} {
		if !r.ran(ref) {
			continue
		}
		type cmp struct {
			workload string
			ratio    float64
			noisy    bool
		}
		var wins, draws, losses []cmp
		for _, wl := range r.Config.Workloads {
			res := r.result(wl, target)
			if res == nil || res.Median == nil {
				continue
			}
			v := r.relative(res, ref)
			if v == nil {
				continue
			}
			c := cmp{wl, *v, *res.Min > 0 && *res.Max / *res.Min > noisySpread}
			if b := r.result(wl, ref); b != nil && b.Min != nil && *b.Min > 0 && *b.Max / *b.Min > noisySpread {
				c.noisy = true
			}
			switch {
			case c.ratio >= closeBand:
				wins = append(wins, c)
			case c.ratio <= 1/closeBand:
				losses = append(losses, c)
			default:
				draws = append(draws, c)
			}
		}
		total := len(wins) + len(draws) + len(losses)
		if total == 0 {
			continue
		}
		sort.Slice(wins, func(i, j int) bool { return wins[i].ratio > wins[j].ratio })
		sort.Slice(losses, func(i, j int) bool { return losses[i].ratio < losses[j].ratio })
		sort.Slice(draws, func(i, j int) bool { return draws[i].ratio > draws[j].ratio })
		list := func(cs []cmp, slower bool) string {
			var parts []string
			for _, c := range cs {
				p := c.workload + " " + fmtSummaryRatio(c.ratio)
				if slower {
					worse := "slower"
					if res := r.result(c.workload, target); unitKind(res.Unit) == "memory" {
						worse = "larger"
					}
					p += fmt.Sprintf(" (%.1f× %s)", 1/c.ratio, worse)
				}
				if c.noisy {
					p += " noisy"
				}
				parts = append(parts, p)
			}
			return strings.Join(parts, ", ")
		}
		fmt.Fprintf(w, "  against %s, on %d workload(s):\n", ref, total)
		if len(wins) > 0 {
			fmt.Fprintf(w, "    ahead on %d: %s\n", len(wins), list(wins, false))
		}
		if len(draws) > 0 {
			fmt.Fprintf(w, "    within 10%% on %d: %s\n", len(draws), list(draws, false))
		}
		if len(losses) > 0 {
			fmt.Fprintf(w, "    behind on %d: %s\n", len(losses), list(losses, true))
		}
		lines++
	}
	if lines == 0 {
		fmt.Fprintf(w, "  no kernel or fuse-overlayfs results to compare with\n")
		return
	}
	fmt.Fprintf(w, "  \"noisy\": a target's runs spread over more than %g×; rerun with more --runs before acting on it.\n", noisySpread)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeRows writes rows through a tabwriter, padding the columns marked in
// right on the left so that numbers line up on their last digit. A nil row
// is a blank line that keeps the columns aligned.
func writeRows(w io.Writer, rows [][]string, right []bool) {
	width := map[int]int{}
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	n := len(rows[0])
	for _, row := range rows {
		if row == nil {
			fmt.Fprintln(w, strings.Repeat("\t", n-1))
			continue
		}
		cells := make([]string, len(row))
		for i, c := range row {
			if i < len(right) && right[i] {
				c = strings.Repeat(" ", width[i]-len([]rune(c))) + c
			}
			cells[i] = c
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
}

// fmtInt prints a count, thousands separated.
func fmtInt(n int) string {
	if n < 1000 && n > -1000 {
		return fmt.Sprint(n)
	}
	return fmtNum(float64(n))
}

// fmtNum prints a rate or a time with three or more significant digits,
// thousands separated.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		s := fmt.Sprintf("%.0f", v)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
