package bench

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestGenerateTreeDeterministic(t *testing.T) {
	a, b := generateTree(7, 3000), generateTree(7, 3000)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two different trees")
	}
	if c := generateTree(8, 3000); reflect.DeepEqual(a.Entries, c.Entries) {
		t.Fatal("seeds 7 and 8 gave the same tree")
	}
}

// TestGenerateTreeMix checks the shape the generator promises: the share
// of each kind, the size mix, the depth, and the spread over the layers.
func TestGenerateTreeMix(t *testing.T) {
	const n = 20000
	tr := generateTree(ctSeed, n)
	if len(tr.Entries) != n {
		t.Fatalf("%d entries, want %d", len(tr.Entries), n)
	}
	count := map[ctKind]int{}
	var small, under16k, large, maxDepth int
	var bytes int64
	fileLayers := map[string]map[int]bool{} // directory -> layers of its entries
	seen := map[string]bool{}
	for _, e := range tr.Entries {
		if seen[e.Path] {
			t.Fatalf("%s twice", e.Path)
		}
		seen[e.Path] = true
		if e.Kind != ctDir && !seen[filepath.Dir(e.Path)] {
			t.Fatalf("%s comes before its directory", e.Path)
		}
		count[e.Kind]++
		maxDepth = max(maxDepth, strings.Count(e.Path, "/")+1)
		if e.Kind == ctDir {
			continue
		}
		if e.Layer < 0 || e.Layer >= ctLayers {
			t.Fatalf("%s in layer %d", e.Path, e.Layer)
		}
		d := filepath.Dir(e.Path)
		if fileLayers[d] == nil {
			fileLayers[d] = map[int]bool{}
		}
		fileLayers[d][e.Layer] = true
		if e.Kind == ctFile {
			bytes += e.Size
			switch {
			case e.Size < 1<<10:
				small++
			case e.Size >= 256<<10:
				large++
			}
			if e.Size < 16<<10 {
				under16k++
			}
			if e.Size > 1<<20 {
				t.Errorf("%s is %d bytes, above the largest class", e.Path, e.Size)
			}
		}
	}
	share := func(k ctKind) float64 { return float64(count[k]) / n }
	for _, c := range []struct {
		kind     ctKind
		name     string
		lo, high float64
	}{
		{ctDir, "directories", 0.08, 0.10},
		{ctFile, "files", 0.75, 0.81},
		{ctSymlink, "symlinks", 0.10, 0.12},
		{ctHardlink, "hard links", 0.015, 0.025},
	} {
		if s := share(c.kind); s < c.lo || s > c.high {
			t.Errorf("%s: %.3f of the entries, want %.3f..%.3f", c.name, s, c.lo, c.high)
		}
	}
	files := count[ctFile]
	if f := float64(small) / float64(files); f < 0.5 || f > 0.6 {
		t.Errorf("%.2f of the files under 1 KiB, want about half", f)
	}
	if f := float64(under16k) / float64(files); f < 0.9 {
		t.Errorf("%.2f of the files under 16 KiB, want nine in ten", f)
	}
	if large == 0 || large > files/100 {
		t.Errorf("%d files of 256 KiB or more, want a few", large)
	}
	if mean := bytes / int64(files); mean < 3<<10 || mean > 7<<10 {
		t.Errorf("mean file size %d bytes, want about 5 KiB", mean)
	}
	if maxDepth < 7 {
		t.Errorf("deepest entry %d levels down, want a distribution-like depth", maxDepth)
	}
	merged, perLayer := 0, map[int]int{}
	for _, ls := range fileLayers {
		if len(ls) > 1 {
			merged++
		}
		for l := range ls {
			perLayer[l]++
		}
	}
	if merged == 0 || len(perLayer) != ctLayers {
		t.Errorf("%d directories spread over more than one layer, layers used %v", merged, perLayer)
	}
}

// TestBuildTree writes a small tree as three layers and merged, and checks
// that the merged tree holds every entry, that the layers together hold the
// same names, and that hard links are links.
func TestBuildTree(t *testing.T) {
	const n = 1500
	tr := generateTree(3, n)
	dir := t.TempDir()
	layers := []string{filepath.Join(dir, "l1"), filepath.Join(dir, "l2"), filepath.Join(dir, "l3")}
	merged := filepath.Join(dir, "merged")
	if err := tr.buildLayers(layers, merged); err != nil {
		t.Fatal(err)
	}
	idx, err := indexTree(merged)
	if err != nil {
		t.Fatal(err)
	}
	var dirs, syms, files int
	for _, e := range tr.Entries {
		switch e.Kind {
		case ctDir:
			dirs++
		case ctSymlink:
			syms++
		default:
			files++
		}
	}
	if idx.Entries != n || idx.Dirs != dirs || idx.Symlinks != syms || idx.Files != files || idx.Other != 0 {
		t.Errorf("merged: %+v, want %d entries: %d directories, %d files, %d symlinks", *idx, n, dirs, files, syms)
	}
	if idx.SubtreeEntries < n/20 || idx.SubtreeEntries > n/5 {
		t.Errorf("subtree %s has %d entries, want about a tenth of %d", idx.Subtree, idx.SubtreeEntries, n)
	}
	union := map[string]bool{}
	for _, l := range layers {
		filepath.WalkDir(l, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			if rel, _ := filepath.Rel(l, p); rel != "." {
				union[rel] = true
			}
			return nil
		})
	}
	if len(union) != n {
		t.Errorf("the layers hold %d names together, want %d", len(union), n)
	}
	for _, e := range tr.Entries {
		if !union[e.Path] {
			t.Fatalf("%s is in no layer", e.Path)
		}
		if e.Kind == ctHardlink {
			var a, b unix.Stat_t
			if err := unix.Lstat(filepath.Join(merged, e.Path), &a); err != nil {
				t.Fatal(err)
			}
			if err := unix.Lstat(filepath.Join(merged, e.Target), &b); err != nil {
				t.Fatal(err)
			}
			if a.Ino != b.Ino || a.Nlink < 2 {
				t.Errorf("%s is not a hard link of %s", e.Path, e.Target)
			}
		}
	}
}

func TestParseProcCPU(t *testing.T) {
	line := "1234 (go daemon) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 100 0 0\n"
	got, err := parseProcCPU([]byte(line))
	if err != nil || got != 3.25 {
		t.Errorf("parseProcCPU = %v, %v; want 3.25 s", got, err)
	}
	if _, err := parseProcCPU([]byte("1 (x) S 1")); err == nil {
		t.Error("a short line parsed")
	}
}

// TestBaselineTarget: goverlay-baseline is left out of "all", mounts the
// --baseline binary, and is skipped with a reason without one.
func TestBaselineTarget(t *testing.T) {
	c, err := ParseFlags([]string{"--targets", "kernel,goverlay-baseline,goverlay", "--baseline", "/x/old", "--binary", "/x/new"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Targets, ",") != "kernel,goverlay,goverlay-baseline" {
		t.Errorf("targets %v", c.Targets)
	}
	base, gov := findTarget("goverlay-baseline"), findTarget("goverlay")
	if base.binary(c) != "/x/old" || gov.binary(c) != "/x/new" {
		t.Errorf("binaries: baseline %s, goverlay %s", base.binary(c), gov.binary(c))
	}
	c.Baseline = ""
	if why := base.precheck(c); !strings.Contains(why, "--baseline") {
		t.Errorf("baseline without --baseline: %q", why)
	}
}
