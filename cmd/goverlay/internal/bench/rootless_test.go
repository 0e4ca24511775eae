package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestRootlessShortRun runs fstime on the rootless kernel overlay and
// goverlay: each mounted by the unprivileged user in its namespace, the
// workloads run there by the agent, and goverlay on the writeback cache
// (passthrough is never granted there).
func TestRootlessShortRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("rootless targets are set up by root")
	}
	for _, tool := range []string{"setpriv", "unshare", "useradd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	bin := goverlayBinary(t)
	defer func(f func() (string, error)) { agentExecutable = f }(agentExecutable)
	agentExecutable = func() (string, error) { return bin, nil }
	// The rootless user must reach the scratch tree.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
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
	rep, err := Run(context.Background(), c)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, table.String())
	}
	t.Logf("table:\n%s", table.String())
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
