package lower

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// stack is a set of layer directories, index 0 topmost, opened as Layers.
type stack struct {
	paths  []string
	layers []*Layer
	caches *Caches // shared by the layers, as a mount's are
}

// testCaches, when set, are the caches the next stacks share (withFDCache).
var testCaches *Caches

// newStack makes n empty layer directories under one t.TempDir() and
// opens them. The layers are closed at the end of the test.
func newStack(t *testing.T, n int) *stack {
	t.Helper()
	root := t.TempDir()
	s := &stack{caches: testCaches}
	if s.caches == nil {
		s.caches = NewCaches()
	}
	for i := 0; i < n; i++ {
		p := filepath.Join(root, "l"+strconv.Itoa(i))
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		s.paths = append(s.paths, p)
	}
	for i, p := range s.paths {
		l, err := OpenLayer(p, i, false)
		if err != nil {
			t.Fatal(err)
		}
		l.Caches = s.caches
		t.Cleanup(func() { l.Close() })
		s.layers = append(s.layers, l)
	}
	return s
}

func (s *stack) chain() Chain { return RootChain(s.layers) }

// path is rel inside layer i.
func (s *stack) path(i int, rel string) string { return filepath.Join(s.paths[i], rel) }

func (s *stack) file(t *testing.T, i int, rel, content string) {
	t.Helper()
	if err := os.WriteFile(s.path(i, rel), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (s *stack) dir(t *testing.T, i int, rel string) {
	t.Helper()
	if err := os.MkdirAll(s.path(i, rel), 0o755); err != nil {
		t.Fatal(err)
	}
}

// whiteout makes a kernel whiteout (char 0/0).
func (s *stack) whiteout(t *testing.T, i int, rel string) {
	t.Helper()
	if err := unix.Mknod(s.path(i, rel), unix.S_IFCHR|0o600, 0); err != nil {
		t.Fatal(err)
	}
}

func (s *stack) mknod(t *testing.T, i int, rel string, mode uint32, dev int) {
	t.Helper()
	if err := unix.Mknod(s.path(i, rel), mode, dev); err != nil {
		t.Fatal(err)
	}
}

func (s *stack) symlink(t *testing.T, i int, rel, target string) {
	t.Helper()
	if err := os.Symlink(target, s.path(i, rel)); err != nil {
		t.Fatal(err)
	}
}

func (s *stack) setxattr(t *testing.T, i int, rel, name, value string) {
	t.Helper()
	if err := xattr.LSet(s.path(i, rel), name, []byte(value)); err != nil {
		t.Fatal(err)
	}
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
