package reliability_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestOpenModeRace: a writer opening a lower file (a copy-up, then a
// passthrough open) while two readers open and close it. The kernel wants
// every open of an inode in one I/O mode, and fails an open whose mode
// conflicts with EIO (fs/fuse/iomode.c fuse_file_io_open()). Found as a
// stray EIO in TestStress (bug 10 in README.md): go-fuse drops a node's
// backing-file reference for every released handle, cached ones too, after
// the handle's Release, so a cached reader whose release was still in
// progress could unregister the backing file a writer had just been given.
// Before the fix, about 1 open in 5,000 of this pattern failed on ext4.
func TestOpenModeRace(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	files := pick(10000, 40000)
	s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) {
		for i := range files {
			l[0].File(fmt.Sprintf("d/f%d", i), "data\n", 0o644)
		}
	})
	m := mountG(t, s)
	var mu sync.Mutex
	var failed []string
	sem := make(chan struct{}, 12)
	var wg sync.WaitGroup
	for i := range files {
		p := filepath.Join(m.Dir, fmt.Sprintf("d/f%d", i))
		for k := range 3 {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				what, err := openUse(p, k == 0)
				if err != nil {
					mu.Lock()
					if len(failed) < 10 {
						failed = append(failed, fmt.Sprintf("%s %s: %v", what, p, err))
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d files × (1 writer + 2 readers) at once; failures:\n%s", files, strings.Join(failed, "\n"))
	}
}

// openUse opens p, writes one byte at 0 (write) or reads, and closes it; it
// says which step failed.
func openUse(p string, write bool) (string, error) {
	flags, what := unix.O_RDONLY, "reader"
	if write {
		flags, what = unix.O_WRONLY, "writer"
	}
	fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return what + " open", err
	}
	defer unix.Close(fd)
	if write {
		_, err = unix.Pwrite(fd, []byte("x"), 0)
		return what + " pwrite", err
	}
	_, err = unix.Read(fd, make([]byte, 16))
	return what + " read", err
}
