package upper

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// env is an upper layer with its workdir and one lower layer, all
// directories of one t.TempDir().
type env struct {
	upperPath, workPath, lowerPath string
	up, lo                         *lower.Layer
	l                              *Layer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOpts(t, Options{XattrPrefix: lower.TrustedPrefix})
}

func newEnvOpts(t *testing.T, o Options) *env {
	t.Helper()
	root := t.TempDir()
	e := &env{
		upperPath: filepath.Join(root, "upper"),
		workPath:  filepath.Join(root, "work"),
		lowerPath: filepath.Join(root, "lower"),
	}
	for _, p := range []string{e.upperPath, e.workPath, e.lowerPath} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if e.up, err = lower.OpenLayer(e.upperPath, 0, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.up.Close() })
	if e.lo, err = lower.OpenLayer(e.lowerPath, 1, false); err != nil {
		t.Fatal(err)
	}
	e.lo.Caches = e.up.Caches // one mount's
	t.Cleanup(func() { e.lo.Close() })
	if e.l, err = Open(e.up, e.workPath, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.l.Close() })
	return e
}

func (e *env) upper(rel string) string { return filepath.Join(e.upperPath, rel) }
func (e *env) lower(rel string) string { return filepath.Join(e.lowerPath, rel) }

// workLeft lists what is in workdir/work.
func (e *env) workLeft(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.workPath, workName))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

func (e *env) wantWorkEmpty(t *testing.T) {
	t.Helper()
	if left := e.workLeft(t); len(left) != 0 {
		t.Errorf("left in workdir/work: %q", left)
	}
}

// upperDir opens rel (a directory) of the upper layer; closed at the end.
func (e *env) upperDir(t *testing.T, rel string) *lower.Dir {
	t.Helper()
	if rel == "" {
		return e.up.Root()
	}
	d, err := e.up.Root().OpenDir(rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// source describes name of the lower root for CopyUp.
func (e *env) source(t *testing.T, name string) Source {
	t.Helper()
	return Source{Dir: e.lo.Root(), Name: name, Stat: lstat(t, e.lower(name))}
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func exists(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil
}

func isWhiteout(t *testing.T, p string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false
	}
	return lower.IsWhiteout(&st)
}

func writeFile(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mknod(t *testing.T, p string, mode uint32, dev uint64) {
	t.Helper()
	if err := unix.Mknod(p, mode, int(dev)); err != nil {
		t.Fatal(err)
	}
	// The exact mode, whatever the umask.
	if err := unix.Chmod(p, mode&07777); err != nil {
		t.Fatal(err)
	}
}

func lset(t *testing.T, p, name string, v []byte) {
	t.Helper()
	if err := xattr.LSet(p, name, v); err != nil {
		t.Fatal(err)
	}
}

// xattrsOf lists p's attributes (not following a symlink), sorted.
func xattrsOf(t *testing.T, p string) []string {
	t.Helper()
	names, err := xattr.LList(p)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names
}

func xattrIs(t *testing.T, p, name, want string) {
	t.Helper()
	v, err := xattr.LGet(p, name)
	if err != nil {
		t.Errorf("%s: getxattr %s: %v", filepath.Base(p), name, err)
		return
	}
	if !bytes.Equal(v, []byte(want)) {
		t.Errorf("%s: %s = %q, want %q", filepath.Base(p), name, v, want)
	}
}

func noXattr(t *testing.T, p, name string) {
	t.Helper()
	if v, err := xattr.LGet(p, name); !errors.Is(err, unix.ENODATA) {
		t.Errorf("%s: %s = %q, %v; want ENODATA", filepath.Base(p), name, v, err)
	}
}

func dirNames(t *testing.T, p string) []string {
	t.Helper()
	ents, err := os.ReadDir(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ents {
		out = append(out, d.Name())
	}
	return out
}
