package bench

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// TestCommitWalk runs ct-stat-walk and ct-commit-walk as root on a tiny
// tree, on the host, the kernel overlay, fuse-overlayfs and goverlay: the
// commit walk, with the caches dropped first, lstats and reads
// security.capability of every entry, and on the FUSE targets the
// requests it sent are counted: the names learnt again, cold, and a
// GETXATTR an entry. Nothing about timings is asserted.
func TestCommitWalk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting and drop_caches need root")
	}
	bin := goverlayBinary(t)
	scratch := t.TempDir()
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   []string{"native", "kernel", "fuse-overlayfs", "goverlay"},
		Workloads: []string{"ct-stat-walk", "ct-commit-walk"},
		Runs:      1,
		Scale:     0.002,
		Dir:       scratch,
		Out:       &table,
		Progress:  io.Discard,
	}
	rep := mustRun(t, c, &table)
	ran := ctRan(t, rep, "fuse-overlayfs")
	if !ran["kernel"] || !ran["goverlay"] {
		t.Fatalf("the kernel overlay and goverlay must run: %v", ran)
	}
	if rep.Containers == nil || rep.Containers.Entries == 0 {
		t.Fatalf("no containers tree in the report: %+v", rep.Containers)
	}
	entries := float64(rep.Containers.Entries)
	tracing := !strings.HasPrefix(rep.RequestCounting, "unavailable")
	steps := 0
	for _, res := range rep.Results {
		if !ran[res.Target] {
			continue
		}
		steps++
		q := ctSample(t, res, table.String(), res.Target == "goverlay" || res.Target == "fuse-overlayfs")
		if q == nil {
			continue
		}
		if q.Ops != entries || q.DaemonCPU == nil || (res.Target == "goverlay") != (q.Daemon != nil) {
			t.Errorf("%s on %s: request sample %+v, want %v ops", res.Workload, res.Target, q, entries)
		}
		if res.Workload != "ct-commit-walk" || !tracing {
			continue
		}
		// Cold, the kernel learns every directory's names again (a
		// READDIRPLUS of it, or a LOOKUP of each name: a warm walk sends
		// neither), and it asks the daemon for each entry's
		// security.capability and xattr list (FUSE caches no xattrs).
		by := q.FuseRequestsByType
		if by["LOOKUP"]+by["READDIRPLUS"] < uint64(rep.Containers.Dirs) || float64(by["GETXATTR"]) < entries || float64(by["LISTXATTR"]) < entries {
			t.Errorf("%s on %s: FUSE requests by type %v; want at least %d LOOKUP+READDIRPLUS and %v GETXATTR and LISTXATTR",
				res.Workload, res.Target, by, rep.Containers.Dirs, entries)
		}
	}
	if want := 2 * len(ran); steps != want {
		t.Errorf("%d step results on the targets that ran, want %d", steps, want)
	}
	assertClean(t, scratch)
}

// ctRan is the set of rep's targets that ran: optional may have been
// skipped as not installed; any other target that did not run is an
// error.
func ctRan(t *testing.T, rep *Report, optional string) map[string]bool {
	t.Helper()
	ran := map[string]bool{}
	for _, ts := range rep.Targets {
		switch {
		case ts.Status == "ok":
			ran[ts.Name] = true
		case ts.Name == optional && strings.Contains(ts.Reason, "not installed"):
			t.Logf("%s: %s", ts.Name, ts.Reason)
		default:
			t.Errorf("target %s: %s %s", ts.Name, ts.Status, ts.Reason)
		}
	}
	return ran
}

// ctSample checks a containers step's result on a target that ran: one
// sample, no error, a row in the table, and a request sample exactly
// when the target is a FUSE one (fuse). It returns that request sample,
// or nil.
func ctSample(t *testing.T, res *Result, table string, fuse bool) *ReqSample {
	t.Helper()
	if res.NotApplicable || len(res.Samples) != 1 || res.Samples[0] <= 0 || len(res.Errors) > 0 {
		t.Errorf("%s on %s: not applicable %v, samples %v, errors %v", res.Workload, res.Target, res.NotApplicable, res.Samples, res.Errors)
		return nil
	}
	if !tableHasRow(table, res.Workload, res.Target) {
		t.Errorf("table has no row for %s on %s", res.Workload, res.Target)
	}
	if fuse != (len(res.Requests) == 1) {
		t.Errorf("%s on %s: requests %+v", res.Workload, res.Target, res.Requests)
		return nil
	}
	if !fuse {
		return nil
	}
	return &res.Requests[0]
}
