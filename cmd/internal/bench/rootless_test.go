package bench

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rootlessSetup skips unless rootless targets can be set up here, makes the
// agent the test's goverlay binary (until the test ends), and returns that
// binary and a scratch directory the rootless user can reach.
func rootlessSetup(t *testing.T) (bin, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("rootless targets are set up by root")
	}
	for _, tool := range []string{"setpriv", "unshare", "useradd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	bin = goverlayBinary(t)
	saved := agentExecutable
	t.Cleanup(func() { agentExecutable = saved })
	agentExecutable = func() (string, error) { return filepath.Join(filepath.Dir(bin), "goverlay-bench"), nil }
	dir = t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin, dir
}

// TestRootlessShortRun runs fstime on the rootless kernel overlay and
// goverlay: each mounted by the unprivileged user in its namespace, the
// workloads run there by the agent, and goverlay on the writeback cache
// (passthrough is never granted there).
func TestRootlessShortRun(t *testing.T) {
	bin, dir := rootlessSetup(t)
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   rootlessTargets([]string{"kernel", "goverlay"}),
		Workloads: []string{"fstime-1024-write", "fstime-1024-copy"},
		Duration:  100 * time.Millisecond,
		Runs:      1,
		Dir:       dir,
		Out:       &table,
		Progress:  io.Discard,
	}
	rep := mustRun(t, c, &table)
	if rep.Reference != "kernel-rootless" {
		t.Errorf("reference %q, want kernel-rootless", rep.Reference)
	}
	for _, res := range rep.Results {
		if len(res.Samples) != 1 || res.Samples[0] <= 0 || len(res.Errors) > 0 {
			t.Errorf("%s on %s: samples %v, errors %v", res.Workload, res.Target, res.Samples, res.Errors)
		}
	}
	for _, ts := range rep.Targets {
		if ts.Status != "ok" {
			t.Errorf("target %s: %s %s", ts.Name, ts.Status, ts.Reason)
		}
		if ts.Name == "goverlay-rootless" {
			if ts.Stats == nil || !ts.Stats.Writeback || ts.Stats.Passthrough || ts.Stats.OpensPassthrough != 0 {
				t.Errorf("goverlay-rootless: stats %+v, want the writeback cache and no passthrough", ts.Stats)
			}
		}
	}
}

// TestRootlessContainers runs the containers group rootless on a small
// tree: every step on the kernel overlay, fuse-overlayfs and goverlay,
// each mounted by the unprivileged user over its own copy of the layers,
// with the caches dropped by the bench for the cold steps and the FUSE
// requests counted by the bench on the agent's mount.
func TestRootlessContainers(t *testing.T) {
	if why := staticBinary(ctBusybox); why != "" {
		t.Skip(why)
	}
	bin, dir := rootlessSetup(t)
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   rootlessTargets([]string{"kernel", "fuse-overlayfs", "goverlay"}),
		Workloads: []string{groupContainers},
		Runs:      1,
		Scale:     0.002,
		Dir:       dir,
		Out:       &table,
		Progress:  io.Discard,
	}
	rep := mustRun(t, c, &table)
	ran := ctRan(t, rep, "fuse-overlayfs-rootless")
	tracing := !strings.HasPrefix(rep.RequestCounting, "unavailable")
	steps := 0
	for _, res := range rep.Results {
		if !ran[res.Target] {
			continue
		}
		steps++
		q := ctSample(t, res, table.String(), res.Target != "kernel-rootless")
		if q == nil {
			continue
		}
		if q.Ops <= 0 || q.DaemonCPU == nil || (res.Target == "goverlay-rootless") != (q.Daemon != nil) {
			t.Errorf("%s on %s: request sample %+v", res.Workload, res.Target, q)
		}
		if tracing && (q.FuseRequests == nil || q.FuseRequestsByType == nil) {
			t.Errorf("%s on %s: FUSE requests not counted: %+v", res.Workload, res.Target, q)
			continue
		}
		// Warm steps may send nothing; creating, cold reading and the
		// cold commit walk cannot, so a counter that saw none is not
		// counting.
		if tracing && (res.Workload == "ct-create" || res.Workload == "ct-read-cold" || res.Workload == "ct-commit-walk") && *q.FuseRequests == 0 {
			t.Errorf("%s on %s: 0 FUSE requests counted", res.Workload, res.Target)
		}
	}
	if want := 11 * len(ran); steps != want {
		t.Errorf("%d step results on the targets that ran, want %d", steps, want)
	}
	if !ran["kernel-rootless"] || !ran["goverlay-rootless"] {
		t.Fatalf("the rootless kernel overlay and goverlay must run: %v", ran)
	}
	if res := rep.result("ct-find-warm", "goverlay-rootless"); rep.relative(res, "kernel-rootless") == nil {
		t.Errorf("no ratio of goverlay-rootless to kernel-rootless")
	}
	for _, s := range []string{"Containers: tree generated", "≥ 1.5× fuse-overlayfs-rootless"} {
		if ran["fuse-overlayfs-rootless"] && !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q", s)
		}
	}
	assertClean(t, dir)
}

// TestRootlessContainersTree: with --tree the rootless targets get the
// user's own copy of the real tree, so that a directory only its owner
// may read (root's, 0700, here) is readable in the user's stack, as
// layers a rootless engine pulled are its own.
func TestRootlessContainersTree(t *testing.T) {
	bin, dir := rootlessSetup(t)
	tree := filepath.Join(t.TempDir(), "realtree")
	for _, d := range []string{"a/private", "b"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, f := range []string{"a/private/secret", "a/one", "b/two", "top"} {
		if err := os.WriteFile(filepath.Join(tree, f), []byte(strings.Repeat("x", i+1)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(tree, "a/private"), 0o700); err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	c := Config{
		Binary:    bin,
		Targets:   []string{"kernel-rootless", "goverlay-rootless"},
		Workloads: []string{"ct-find-warm", "ct-read-cold", "ct-cp", "ct-rm"},
		Runs:      1,
		Tree:      tree,
		Dir:       dir,
		Out:       &table,
		Progress:  io.Discard,
	}
	rep := mustRun(t, c, &table)
	if rep.Containers == nil || rep.Containers.Entries != 7 || rep.Containers.Files != 4 {
		t.Errorf("tree: %+v, want 7 entries, 4 files", rep.Containers)
	}
	for _, ts := range rep.Targets {
		if ts.Status != "ok" {
			t.Errorf("target %s: %s %s", ts.Name, ts.Status, ts.Reason)
		}
	}
	for _, res := range rep.Results {
		if len(res.Samples) != 1 || res.Samples[0] <= 0 || len(res.Errors) > 0 {
			t.Errorf("%s on %s: samples %v, errors %v", res.Workload, res.Target, res.Samples, res.Errors)
		}
	}
	assertClean(t, dir)
}
