package bench

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/containers/buildspec"
)

func TestParseStepLine(t *testing.T) {
	for _, c := range []struct {
		line string
		n, m int
		text string
		ok   bool
	}{
		{"STEP 1/6: FROM localhost/bb", 1, 6, "FROM localhost/bb", true},
		{"STEP 2/6: RUN mkdir /gen && cd /gen", 2, 6, "RUN mkdir /gen && cd /gen", true},
		{"STEP 6/6: RUN a: b", 6, 6, "RUN a: b", true},
		{"STEP 7/6: RUN x", 0, 0, "", false},
		{"STEP 0/6: RUN x", 0, 0, "", false},
		{"STEP 1/x: RUN x", 0, 0, "", false},
		{"STEP 1/6 RUN x", 0, 0, "", false},
		{"STEP 1/6: ", 0, 0, "", false},
		{"COMMIT localhost/built", 0, 0, "", false},
		{"--> 3f2a", 0, 0, "", false},
		{" STEP 1/6: FROM x", 0, 0, "", false},
		{"", 0, 0, "", false},
	} {
		n, m, text, ok := parseStepLine(c.line)
		if n != c.n || m != c.m || text != c.text || ok != c.ok {
			t.Errorf("parseStepLine(%q) = %d, %d, %q, %v; want %d, %d, %q, %v", c.line, n, m, text, ok, c.n, c.m, c.text, c.ok)
		}
	}
}

func TestStepTimes(t *testing.T) {
	want := buildspec.Steps("FROM a\nRUN  b   c\n\nCOPY d /e\n")
	if len(want) != 3 || want[1].N != 2 || want[1].Instruction() != "RUN" || want[2].Instruction() != "COPY" {
		t.Fatalf("Steps: %+v", want)
	}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	events := []stepEvent{{1, 3, "FROM a", at(0)}, {2, 3, "RUN b c", at(100)}, {3, 3, "COPY d /e", at(1100)}}
	got, err := stepTimes(events, at(1500), want)
	if err != nil {
		t.Fatal(err)
	}
	for n, d := range map[int]time.Duration{1: 100 * time.Millisecond, 2: time.Second, 3: 400 * time.Millisecond} {
		if got[n] != d {
			t.Errorf("step %d: %v, want %v", n, got[n], d)
		}
	}
	for name, bad := range map[string][]stepEvent{
		"a step missing":  {events[0], events[2]},
		"another step":    {events[0], {2, 3, "RUN x", at(100)}, events[2]},
		"another count":   {events[0], {2, 4, "RUN b c", at(100)}, events[2]},
		"out of order":    {events[0], events[2], events[1]},
		"time going back": {events[0], {2, 3, "RUN b c", at(2000)}, events[2]},
	} {
		if _, err := stepTimes(bad, at(1500), want); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := stepTimes(events, at(1000), want); err == nil {
		t.Errorf("an end before the last step: no error")
	}
}

// TestBuildWorkloads: the build group is the whole build and one
// workload per RUN step, run only when asked for, on every overlay
// target; without podman, each says so.
func TestBuildWorkloads(t *testing.T) {
	got, err := expandWorkloads([]string{groupBuild}, DefaultScale)
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(got, ","); s != "build,build-step-2,build-step-3,build-step-4,build-step-6" {
		t.Errorf("build group: %s", s)
	}
	def, _ := expandWorkloads(nil, DefaultScale)
	for _, w := range def {
		if strings.HasPrefix(w, "build") {
			t.Errorf("the default workloads have %s", w)
		}
	}
	if targets, _ := expandTargets([]string{"all"}); strings.Contains(strings.Join(targets, ","), "metacopy") {
		t.Errorf("all has the metacopy targets: %v", targets)
	}
	if why := findWorkload("build").whyNot(findTarget("native")); !strings.Contains(why, "not an overlay") {
		t.Errorf("build on native: %q", why)
	}
	t.Setenv("PATH", t.TempDir())
	for _, tg := range []string{"kernel", "fuse-overlayfs", "goverlay", "goverlay-metacopy", "goverlay-rootless"} {
		if why := findWorkload("build-step-2").whyNot(findTarget(tg)); why != "podman is not installed (not found in PATH)" {
			t.Errorf("build-step-2 on %s without podman: %q", tg, why)
		}
	}
}

// TestBuildShortRun runs the build group once on goverlay as root: every
// build workload has a sample (the built image was checked), and nothing
// is left mounted, running or on disk. Nothing about timings is asserted.
func TestBuildShortRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("podman on a private store as root needs root")
	}
	if why := buildNotFor(findTarget("goverlay")); why != "" {
		t.Skip(why)
	}
	scratch := t.TempDir()
	var table bytes.Buffer
	c := Config{
		Binary:    goverlayBinary(t),
		Targets:   []string{"native", "goverlay"},
		Workloads: []string{groupBuild},
		Runs:      1,
		Dir:       scratch,
		Out:       &table,
		Progress:  io.Discard,
	}
	rep := mustRun(t, c, &table)
	for _, res := range rep.Results {
		if res.Target == "native" {
			if !res.NotApplicable {
				t.Errorf("%s on native: %+v", res.Workload, res)
			}
			continue
		}
		if len(res.Samples) != 1 || len(res.Errors) != 0 || res.Samples[0] <= 0 {
			t.Errorf("%s on goverlay: samples %v, errors %v", res.Workload, res.Samples, res.Errors)
		}
		if !tableHasRow(table.String(), res.Workload, res.Target) {
			t.Errorf("table has no row for %s on %s", res.Workload, res.Target)
		}
	}
	if !strings.Contains(table.String(), "build workloads: podman") {
		t.Errorf("table lacks the build line:\n%s", table.String())
	}
	assertClean(t, scratch)
	assertNoDaemons(t, scratch)
}
