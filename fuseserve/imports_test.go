package fuseserve

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	module = "github.com/goverlay/goverlay"
	goFuse = "github.com/hanwen/go-fuse/"
)

// imports returns, for each package directory of the module (relative to
// its root), what its non-test files import.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod above the package: %v", err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(out[dir], p) {
				out[dir] = append(out[dir], p)
			}
		}
		if out[dir] == nil {
			out[dir] = []string{}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImportGraph: the packages import one another only along the arrows
// of docs/ARCHITECTURE.md ("Packages"): cmd/goverlay → overlay →
// {fuseserve, upper → lower, privs}; the transport imports nothing of
// goverlay's, and go-fuse is imported by overlay, cmd and the transport
// alone. Neither overlay nor the transport reads go-fuse's unexported
// state by reflection.
func TestImportGraph(t *testing.T) {
	allowed := map[string][]string{
		"fuseserve":      {},
		"overlay":        {"fuseserve", "upper", "lower", "privs", "overlay/rundir"},
		"overlay/rundir": {},
		// The protocol of goverlay-mount (C), which links nothing.
		"cmd/internal/mountclient": {"overlay/rundir"},
		"upper":                    {"lower"},
		"lower":                    {},
		"privs":                    {},
	}
	mayImportFuse := func(dir string) bool {
		return dir == "overlay" || dir == "fuseserve" || dir == "cmd" || strings.HasPrefix(dir, "cmd"+string(filepath.Separator))
	}
	all := imports(t)
	for _, dir := range []string{"fuseserve", "overlay", "upper", "lower", "privs", "cmd/internal/mountclient"} {
		if _, ok := all[dir]; !ok {
			t.Errorf("no package %s", dir)
		}
	}
	for dir, imps := range all {
		for _, p := range imps {
			if p == "reflect" && (dir == "overlay" || dir == "fuseserve") {
				t.Errorf("%s imports reflect", dir)
			}
			if strings.HasPrefix(p, goFuse) && (!mayImportFuse(dir) || dir == "cmd/internal/mountclient") {
				t.Errorf("%s imports %s: only overlay, cmd and fuseserve talk to go-fuse", dir, p)
			}
			own, ok := strings.CutPrefix(p, module+"/")
			if !ok {
				continue
			}
			if may, listed := allowed[dir]; listed && !slices.Contains(may, own) {
				t.Errorf("%s imports %s, which is not one of its arrows (%v)", dir, own, may)
			}
		}
	}
}
