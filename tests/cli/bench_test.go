package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestBenchProgram: `goverlay bench` runs goverlay-bench from beside the
// goverlay binary, and names itself as the goverlay the targets mount;
// without goverlay-bench it says where it looked and how to build it.
func TestBenchProgram(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "goverlay")
	data, err := os.ReadFile(testutil.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(self, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// A PATH with nothing in it: goverlay-bench is nowhere to be found.
	r := testutil.Run(t, cmdTimeout, []string{"PATH=" + t.TempDir()}, self, "bench", "--help")
	if r.Code != 1 || !strings.Contains(r.Stderr, "goverlay-bench is neither beside "+self+" nor in PATH") ||
		!strings.Contains(r.Stderr, "./cmd/goverlay-bench") {
		t.Errorf("goverlay bench without goverlay-bench: %s; want exit 1 and where it looked", r)
	}

	build := testutil.Run(t, installTimeout, nil, "go", "-C", testutil.ModuleRoot(t), "build", "-o", filepath.Join(dir, "goverlay-bench"), "./cmd/goverlay-bench")
	if build.Code != 0 {
		t.Fatalf("go build ./cmd/goverlay-bench: %s", build)
	}
	r = testutil.Run(t, cmdTimeout, nil, self, "bench", "--help")
	if r.Code != 0 || !strings.Contains(r.Stdout, "--workloads") {
		t.Errorf("goverlay bench --help: %s; want exit 0 and the usage", r)
	}
	r = testutil.Run(t, cmdTimeout, nil, self, "bench", "--runs", "0")
	if r.Code != 1 || !strings.Contains(r.Stderr, "--runs must be at least 1") {
		t.Errorf("goverlay bench --runs 0: %s; want exit 1 and why", r)
	}

	// The bench mounts the goverlay that ran it: the JSON report names it.
	testutil.RequireRoot(t)
	js := filepath.Join(dir, "report.json")
	r = testutil.Run(t, installTimeout, nil, self, "bench", "--targets", "goverlay", "--workloads", "fstime-1024-write",
		"--duration", "100ms", "--runs", "1", "--dir", dir, "--json", js)
	if r.Code != 0 {
		t.Fatalf("goverlay bench: %s", r)
	}
	var rep struct {
		Config struct{ Binary string } `json:"config"`
	}
	b, err := os.ReadFile(js)
	if err == nil {
		err = json.Unmarshal(b, &rep)
	}
	if err != nil || rep.Config.Binary != self {
		t.Errorf("the report's binary is %q (%v), want %s", rep.Config.Binary, err, self)
	}
}
