package lower

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

func TestOpenLayer(t *testing.T) {
	s := newStack(t, 1)
	l, err := OpenLayer(s.paths[0], 3, true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	st := lstat(t, s.paths[0])
	if l.Index != 3 || !l.Upper || l.Path != s.paths[0] || l.Dev != st.Dev {
		t.Errorf("layer = %+v, want index 3, upper, path %s, dev %d", l, s.paths[0], st.Dev)
	}
	if l.Root().Layer != l {
		t.Errorf("root's Layer is not the layer")
	}
	var rst unix.Stat_t
	if err := l.Root().StatSelf(&rst); err != nil || rst.Ino != st.Ino {
		t.Errorf("root is ino %d (%v), want %d", rst.Ino, err, st.Ino)
	}

	t.Run("not a directory", func(t *testing.T) {
		s.file(t, 0, "f", "")
		if l, err := OpenLayer(s.path(0, "f"), 0, false); err == nil {
			l.Close()
			t.Fatal("OpenLayer of a file succeeded")
		} else if !errors.Is(err, unix.ENOTDIR) || !strings.Contains(err.Error(), s.path(0, "f")) {
			t.Errorf("error %v: want ENOTDIR naming the path", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, err := OpenLayer(s.path(0, "missing"), 0, false); !errors.Is(err, unix.ENOENT) {
			t.Errorf("error %v, want ENOENT", err)
		}
	})
}

// fdOf returns d's current fd (pinned only for the call).
func fdOf(t *testing.T, d *Dir) int {
	t.Helper()
	fd, release, err := d.Pin()
	if err != nil {
		t.Fatalf("Pin: %v", err)
	}
	release()
	return fd
}

func fdOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

func TestDirClose(t *testing.T) {
	s := newStack(t, 1)
	s.dir(t, 0, "d")
	d, err := s.layers[0].Root().OpenDir("d")
	if err != nil {
		t.Fatal(err)
	}
	fd := fdOf(t, d)
	if err := d.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if fdOpen(fd) {
		t.Errorf("fd %d still open after Close", fd)
	}
	// Reuse the number, so that a second close would close someone else's.
	other, err := unix.Open(s.paths[0], unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(other)
	for i := 0; i < 2; i++ {
		if err := d.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+2, err)
		}
	}
	if !fdOpen(other) {
		t.Errorf("a later Close closed an unrelated fd %d", other)
	}
	var st unix.Stat_t
	if err := d.Stat("x", &st); !errors.Is(err, unix.EBADF) {
		t.Errorf("Stat on a closed Dir: %v, want EBADF", err)
	}
	if _, _, err := d.Pin(); !errors.Is(err, unix.EBADF) {
		t.Errorf("Pin on a closed Dir: %v, want EBADF (no reopen)", err)
	}

	t.Run("root", func(t *testing.T) {
		l, err := OpenLayer(s.paths[0], 0, false)
		if err != nil {
			t.Fatal(err)
		}
		fd := fdOf(t, l.Root())
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Layer.Close: %v", err)
		}
		if fdOpen(fd) {
			t.Errorf("root fd open after Layer.Close")
		}
	})
	t.Run("while pinned", func(t *testing.T) {
		d, err := s.layers[0].Root().OpenDir("d")
		if err != nil {
			t.Fatal(err)
		}
		fd, release, err := d.Pin()
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if !fdOpen(fd) {
			t.Fatalf("Close closed a pinned fd")
		}
		release()
		if fdOpen(fd) {
			t.Errorf("fd still open after the last release of a closed Dir")
		}
	})
	t.Run("NewDir", func(t *testing.T) {
		fd, err := unix.Open(s.path(0, "d"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		nd := NewDir(s.layers[0], fd)
		if got := fdOf(t, nd); got != fd {
			t.Errorf("NewDir's fd %d, want %d", got, fd)
		}
		nd.Close()
		if fdOpen(fd) {
			t.Errorf("NewDir's fd open after Close")
		}
	})
}

func TestFDCache(t *testing.T) {
	withFDCache(t, 2)
	s := newStack(t, 1)
	const n = 10
	var dirs []*Dir
	for i := 0; i < n; i++ {
		s.dir(t, 0, "d"+strconv.Itoa(i)+"/sub")
	}
	before := openFDs(t)
	for i := 0; i < n; i++ {
		d, err := s.layers[0].Root().OpenDir("d" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		dirs = append(dirs, d)
	}
	if got := openFDs(t); got > before+2 {
		t.Errorf("%d directory fds open with a cache of 2", got-before)
	}
	if got := s.caches.OpenDirFDs(); got > 2 {
		t.Errorf("OpenDirFDs() = %d, want <= 2", got)
	}
	// Evicted Dirs reopen transparently, and are the same directories.
	for i, d := range dirs {
		var st unix.Stat_t
		if err := d.StatSelf(&st); err != nil {
			t.Fatalf("d%d: %v", i, err)
		}
		if w := lstat(t, s.path(0, "d"+strconv.Itoa(i))); st.Ino != w.Ino {
			t.Errorf("d%d reopened as ino %d, want %d", i, st.Ino, w.Ino)
		}
		// A grandchild through an evicted parent.
		sub, err := d.OpenDir("sub")
		if err != nil {
			t.Fatalf("d%d/sub: %v", i, err)
		}
		d.Close()
		sub.Close()
	}

	t.Run("replaced directory is stale", func(t *testing.T) {
		s.dir(t, 0, "r")
		d, err := s.layers[0].Root().OpenDir("r")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := os.Rename(s.path(0, "r"), s.path(0, "r-old")); err != nil {
			t.Fatal(err)
		}
		s.dir(t, 0, "r") // another directory under the name
		evict(t, s, d)
		var st unix.Stat_t
		if err := d.StatSelf(&st); !errors.Is(err, unix.ESTALE) {
			t.Errorf("StatSelf after the directory was replaced: %v (ino %d), want ESTALE", err, st.Ino)
		}
	})
	t.Run("Moved", func(t *testing.T) {
		s.dir(t, 0, "mv/from")
		s.dir(t, 0, "mv2")
		parent, err := s.layers[0].Root().OpenDir("mv")
		if err != nil {
			t.Fatal(err)
		}
		defer parent.Close()
		parent2, err := s.layers[0].Root().OpenDir("mv2")
		if err != nil {
			t.Fatal(err)
		}
		defer parent2.Close()
		d, err := parent.OpenDir("from")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		want := lstat(t, s.path(0, "mv/from"))
		if err := os.Rename(s.path(0, "mv/from"), s.path(0, "mv2/to")); err != nil {
			t.Fatal(err)
		}
		d.Moved(parent2, "to")
		evict(t, s, d)
		var st unix.Stat_t
		if err := d.StatSelf(&st); err != nil || st.Ino != want.Ino {
			t.Errorf("StatSelf after Moved and eviction: ino %d, %v; want %d", st.Ino, err, want.Ino)
		}
	})
	t.Run("pinned fds are not evicted", func(t *testing.T) {
		s.dir(t, 0, "p")
		d, err := s.layers[0].Root().OpenDir("p")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		fd, release, err := d.Pin()
		if err != nil {
			t.Fatal(err)
		}
		evict(t, s, d)
		if !fdOpen(fd) {
			t.Errorf("a pinned fd was closed by the cache")
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Errorf("pinned fd unusable: %v", err)
		}
		release()
	})
}

// evict pushes d's idle fd out of the cache by opening other directories.
func evict(t *testing.T, s *stack, d *Dir) {
	t.Helper()
	c := d.Layer.Caches.fds
	c.mu.Lock()
	n := c.max + 1
	c.mu.Unlock()
	for i := 0; i < n; i++ {
		name := "evict" + strconv.Itoa(i)
		os.Mkdir(s.path(0, name), 0o755)
		e, err := s.layers[0].Root().OpenDir(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
	}
	d.mu.Lock()
	open := d.fd >= 0 && d.pins == 0
	d.mu.Unlock()
	if open {
		t.Fatalf("setup: d's idle fd was not evicted")
	}
}

func TestOpenDirSymlink(t *testing.T) {
	s := newStack(t, 1)
	s.dir(t, 0, "real")
	for _, target := range []string{"real", "/", "../../..", "missing"} {
		t.Run(target, func(t *testing.T) {
			name := "link-" + strconv.Itoa(len(target))
			s.symlink(t, 0, name, target)
			d, err := s.layers[0].Root().OpenDir(name)
			if err == nil {
				d.Close()
				t.Fatalf("OpenDir of a symlink to %q succeeded", target)
			}
			if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
				t.Errorf("error %v, want ELOOP or ENOTDIR", err)
			}
		})
	}
	t.Run("a file", func(t *testing.T) {
		s.file(t, 0, "f", "")
		if _, err := s.layers[0].Root().OpenDir("f"); !errors.Is(err, unix.ENOTDIR) {
			t.Errorf("error %v, want ENOTDIR", err)
		}
	})
	t.Run("Open of a symlink", func(t *testing.T) {
		s.file(t, 0, "target", "data")
		s.symlink(t, 0, "flink", "target")
		if fd, err := s.layers[0].Root().Open("flink", unix.O_RDONLY); err == nil {
			unix.Close(fd)
			t.Fatal("Open followed a symlink")
		} else if !errors.Is(err, unix.ELOOP) {
			t.Errorf("error %v, want ELOOP", err)
		}
	})
}

// asNobody runs f on a locked thread whose fsuid is 65534, so that
// permission checks are those of an unprivileged user (the capabilities
// that bypass them leave the effective set with fsuid 0), and restores it.
func asNobody(t *testing.T, f func()) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to switch fsuid")
	}
	runtime.LockOSThread()
	if err := unix.Setfsuid(65534); err != nil {
		runtime.UnlockOSThread()
		t.Skipf("setfsuid: %v", err)
	}
	if prev, _ := unix.SetfsuidRetUid(65534); prev != 65534 {
		unix.Setfsuid(0)
		runtime.UnlockOSThread()
		t.Skipf("setfsuid did not take (fsuid %d)", prev)
	}
	defer func() {
		unix.Setfsuid(0)
		if prev, _ := unix.SetfsuidRetUid(0); prev == 0 {
			runtime.UnlockOSThread()
		} // else leave the thread locked: it dies with the goroutine
	}()
	f()
}

func TestOpenDirSearchOnly(t *testing.T) {
	s := newStack(t, 1)
	// Others may search the layer root and "d", not read "d".
	if err := os.Chmod(s.paths[0], 0o755); err != nil {
		t.Fatal(err)
	}
	s.dir(t, 0, "d")
	s.file(t, 0, "d/inside", "abc")
	if err := os.Chmod(s.path(0, "d"), 0o311); err != nil {
		t.Fatal(err)
	}
	root := s.layers[0].Root()

	var d *Dir
	var skip string
	var err, rdErr, statErr error
	var flags int
	var st unix.Stat_t
	asNobody(t, func() {
		// First, that the switch worked: a plain open is refused.
		if root.Do(func(rfd int) error {
			fd, e := unix.Openat(rfd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if e == nil {
				unix.Close(fd)
			}
			return e
		}) == nil {
			skip = "fsuid 65534 can still read a 0311 directory (capabilities kept)"
			return
		}
		d, err = root.OpenDir("d")
		if err != nil {
			return
		}
		d.Do(func(fd int) error {
			flags, _ = unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
			return nil
		})
		statErr = d.Stat("inside", &st)
		_, rdErr = d.ReadDirRaw()
	})
	if skip != "" {
		t.Skip(skip)
	}
	if err != nil {
		t.Fatalf("OpenDir of a 0311 directory as nobody: %v", err)
	}
	defer d.Close()
	if flags&unix.O_PATH == 0 {
		t.Errorf("fd flags %#x: want an O_PATH fd", flags)
	}
	if statErr != nil || st.Size != 3 {
		t.Errorf("Stat through the O_PATH Dir: size %d, %v; want 3, nil", st.Size, statErr)
	}
	if rdErr == nil {
		t.Errorf("ReadDirRaw of a directory nobody may not read succeeded")
	}
}

func TestReadlink(t *testing.T) {
	s := newStack(t, 1)
	for _, n := range []int{1, 255, 256, 257, 511, 512, 1000, 4095} {
		// n bytes in components of at most 200 (NAME_MAX is 255).
		target := strings.Join(splitEvery(strings.Repeat("t", n), 200), "/")[:n]
		name := "l" + strconv.Itoa(n)
		s.symlink(t, 0, name, target)
		got, err := s.layers[0].Root().Readlink(name)
		if err != nil {
			t.Fatalf("%d bytes: %v", len(target), err)
		}
		if string(got) != target {
			t.Errorf("%d-byte target read back as %d bytes", len(target), len(got))
		}
	}
	if _, err := s.layers[0].Root().Readlink("missing"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing: %v", err)
	}
}

func splitEvery(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// TestXattrOfSymlinkItself runs with getxattrat(2)/listxattrat(2) and with
// the /proc/self/fd path that replaces them before Linux 6.13.
func TestXattrOfSymlinkItself(t *testing.T) {
	for _, viaProc := range []bool{false, true} {
		t.Run(map[bool]string{false: "xattrat", true: "proc"}[viaProc], func(t *testing.T) {
			c := NewCaches()
			c.noXattrAt.Store(viaProc)
			testCaches = c
			t.Cleanup(func() { testCaches = nil })
			testXattrOfSymlinkItself(t)
		})
	}
}

func testXattrOfSymlinkItself(t *testing.T) {
	s := newStack(t, 1)
	s.file(t, 0, "target", "")
	s.symlink(t, 0, "link", "target")
	if err := xattr.Set(s.path(0, "target"), "trusted.which", []byte("target")); err != nil {
		t.Fatal(err)
	}
	if err := xattr.LSet(s.path(0, "link"), "trusted.which", []byte("link")); err != nil {
		t.Skipf("trusted xattr on a symlink: %v", err)
	}
	if err := xattr.LSet(s.path(0, "link"), "trusted.only-link", []byte("1")); err != nil {
		t.Fatal(err)
	}
	s.setxattr(t, 0, "", "user.root", "r")
	root := s.layers[0].Root()

	v, err := root.Getxattr("link", "trusted.which")
	if err != nil || string(v) != "link" {
		t.Errorf("Getxattr(link) = %q, %v; want the link's own \"link\"", v, err)
	}
	names, err := root.Listxattr("link")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "trusted.only-link,trusted.which" {
		t.Errorf("Listxattr(link) = %v", names)
	}
	// The directory itself, through its fd.
	if v, err := root.Getxattr("", "user.root"); err != nil || string(v) != "r" {
		t.Errorf("Getxattr of the dir itself = %q, %v", v, err)
	}
	if names, err := root.Listxattr(""); err != nil || !contains(names, "user.root") {
		t.Errorf("Listxattr of the dir itself = %v, %v", names, err)
	}
	if _, err := root.Getxattr("target", "user.none"); !errors.Is(err, unix.ENODATA) {
		t.Errorf("absent attribute: %v, want ENODATA", err)
	}
	// Values longer than the first buffer, of an entry and of the
	// directory itself.
	long := strings.Repeat("v", 3000)
	s.setxattr(t, 0, "target", "user.long", long)
	s.setxattr(t, 0, "", "user.long", long)
	for _, name := range []string{"target", ""} {
		if v, err := root.Getxattr(name, "user.long"); err != nil || string(v) != long {
			t.Errorf("Getxattr(%q, user.long) = %d bytes, %v; want 3000", name, len(v), err)
		}
	}
	if _, err := root.Getxattr("missing", "user.long"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("attribute of a missing entry: %v, want ENOENT", err)
	}
}

// TestXattrOfSearchOnlyDir: a directory opened O_PATH (searchable, not
// readable) has no fd fgetxattr accepts; its attributes are still read.
func TestXattrOfSearchOnlyDir(t *testing.T) {
	s := newStack(t, 1)
	s.dir(t, 0, "d")
	s.setxattr(t, 0, "d", "user.mark", "m")
	fd, err := unix.Open(s.path(0, "d"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDir(s.layers[0], fd)
	defer d.Close()
	if v, err := d.Getxattr("", "user.mark"); err != nil || string(v) != "m" {
		t.Errorf("Getxattr through an O_PATH fd = %q, %v", v, err)
	}
	if names, err := d.Listxattr(""); err != nil || !contains(names, "user.mark") {
		t.Errorf("Listxattr through an O_PATH fd = %v, %v", names, err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestDoPath(t *testing.T) {
	s := newStack(t, 1)
	s.file(t, 0, "x", "hello")
	root := s.layers[0].Root()
	fd := fdOf(t, root)
	base := "/proc/self/fd/" + strconv.Itoa(fd)
	var got []string
	for _, name := range []string{"", "x"} {
		err := root.DoPath(name, func(p string) error {
			got = append(got, p)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != base || got[1] != base+"/x" {
		t.Errorf("paths %q, want %q and %q", got, base, base+"/x")
	}
	var b []byte
	err := root.DoPath("x", func(p string) error {
		var err error
		b, err = os.ReadFile(p)
		return err
	})
	if err != nil || string(b) != "hello" {
		t.Errorf("reading through DoPath: %q, %v", b, err)
	}
	sentinel := errors.New("sentinel")
	if err := root.DoPath("x", func(string) error { return sentinel }); err != sentinel {
		t.Errorf("DoPath returned %v, want fn's error", err)
	}
}

// Many goroutines using, opening and closing Dirs while a tiny fd cache
// evicts their fds: every call sees the right directory, nothing races
// (run with -race), and no fd is left behind.
func TestFDCacheConcurrent(t *testing.T) {
	withFDCache(t, 2)
	s := newStack(t, 1)
	const n = 16
	for i := 0; i < n; i++ {
		s.dir(t, 0, "d"+strconv.Itoa(i)+"/child")
		s.file(t, 0, "d"+strconv.Itoa(i)+"/child/f"+strconv.Itoa(i), "")
	}
	before := openFDs(t)
	dirs := make([]*Dir, n)
	inos := make([]uint64, n)
	for i := range dirs {
		d, err := s.layers[0].Root().OpenDir("d" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		dirs[i] = d
		inos[i] = lstat(t, s.path(0, "d"+strconv.Itoa(i))).Ino
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 200; k++ {
				i := (g*7 + k) % n
				d := dirs[i]
				var st unix.Stat_t
				if err := d.StatSelf(&st); err != nil || st.Ino != inos[i] {
					errs <- fmt.Errorf("d%d: ino %d, %v", i, st.Ino, err)
					return
				}
				c, err := d.OpenDir("child")
				if err != nil {
					errs <- fmt.Errorf("d%d/child: %v", i, err)
					return
				}
				ents, err := c.ReadDirRaw()
				if err != nil || len(ents) != 1 || ents[0].Name != "f"+strconv.Itoa(i) {
					errs <- fmt.Errorf("d%d/child listing %v, %v", i, ents, err)
					c.Close()
					return
				}
				c.Close()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, d := range dirs {
		d.Close()
	}
	if after := openFDs(t); after != before {
		t.Errorf("open fds %d after closing everything, %d before", after, before)
	}
	if got := s.caches.OpenDirFDs(); got != 0 {
		t.Errorf("OpenDirFDs() = %d after closing everything", got)
	}
}

// TestDirForget: a forgotten Dir lets its fd go at once, but still works:
// each later use reopens it and lets it go again (a node go-fuse revives
// after its FORGET); a pinned one lets go at its last release.
func TestDirForget(t *testing.T) {
	s := newStack(t, 1)
	s.dir(t, 0, "d/sub")
	s.file(t, 0, "d/sub/x", "x")
	d, err := s.layers[0].Root().OpenDir("d")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := d.OpenDir("sub")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	defer d.Close()
	fd := fdOf(t, d)
	d.Forget()
	if fdOpen(fd) {
		t.Errorf("fd %d still open after Forget", fd)
	}
	sub.Forget()
	var st unix.Stat_t
	if err := sub.Stat("x", &st); err != nil {
		t.Fatalf("Stat through a forgotten Dir whose parent was forgotten: %v", err)
	}
	before := openFDs(t)
	for i := 0; i < 3; i++ {
		if err := sub.Stat("x", &st); err != nil {
			t.Fatal(err)
		}
	}
	if n := openFDs(t); n > before {
		t.Errorf("%d fds open after using a forgotten Dir, %d before", n, before)
	}
	pfd, release, err := sub.Pin()
	if err != nil {
		t.Fatal(err)
	}
	sub.Forget()
	if !fdOpen(pfd) {
		t.Errorf("Forget closed a pinned fd")
	}
	release()
	if fdOpen(pfd) {
		t.Errorf("fd %d still open after the last release of a forgotten Dir", pfd)
	}
}
