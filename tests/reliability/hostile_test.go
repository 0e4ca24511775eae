package reliability_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// No escape from the layers. The canary is a tree outside the layers, in
// the test's temp dir, with known contents, modes, owners, xattrs and
// times; after the test it must be exactly as it was, ctime included
// (any chmod, chown, write, truncate, xattr change or link count change
// moves it).
//
// The kernel resolves the symlinks of a path in the mount itself: a
// symlink in a layer that points at the canary, used as a path component
// or followed by chmod(2), reaches the real canary, legitimately, without
// goverlay having a say. So the operations below never let the VFS follow
// a symlink (the l* calls, AT_SYMLINK_NOFOLLOW, openat2 with
// RESOLVE_NO_SYMLINKS): whatever reaches the canary then, goverlay did.

// canary is a snapshot of a tree outside the layers.
type canary struct {
	dir    string
	layout testutil.Tree
	ctimes map[string]unix.Timespec
}

func newCanary(t testing.TB, dir string) *canary {
	t.Helper()
	c := &canary{dir: dir}
	c.snap(t)
	return c
}

func (c *canary) snap(t testing.TB) (testutil.Tree, map[string]unix.Timespec) {
	t.Helper()
	tr := testutil.UpperLayout(t, c.dir)
	ct := map[string]unix.Timespec{}
	for p := range tr {
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, filepath.Join(c.dir, p), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_CTIME, &stx); err != nil {
			t.Fatal(err)
		}
		ct[p] = unix.Timespec{Sec: stx.Ctime.Sec, Nsec: int64(stx.Ctime.Nsec)}
	}
	if c.layout == nil {
		c.layout, c.ctimes = tr, ct
	}
	return tr, ct
}

// check fails t if the canary changed in any way.
func (c *canary) check(t testing.TB) {
	t.Helper()
	tr, ct := c.snap(t)
	reportDiff(t, "the canary outside the layers changed", testutil.DiffWith(c.layout, tr, testutil.DiffOptions{A: "before", B: "after"}))
	for p, want := range c.ctimes {
		if got, ok := ct[p]; ok && got != want {
			t.Errorf("canary %s: ctime changed from %v to %v: something changed its inode", p, want, got)
		}
	}
}

// buildCanary makes the canary tree under dir.
func buildCanary(t testing.TB, dir string) {
	t.Helper()
	l := testutil.NewLayer(t, dir)
	l.File("canary", "CANARY\n", 0o640).Xattr("canary", "user.canary", "1").
		File("dir/inner", "INNER\n", 0o600).
		File("sw-target/a", "OUT-A\n", 0o644).File("sw-target/sub/b", "OUT-B\n", 0o644).
		File("sw-target/OUTSIDE-ONLY", "", 0o644).
		Symlink("link-in-canary", "canary")
	l.Finish()
}

// TestHostileSymlinks: symlinks in a lower layer point out of it (an
// absolute path to the canary, a relative one, "/", "..") or loop; a lower
// file is a hard link of the canary itself. Through the mount, without
// the VFS following any link: the links read back as they are; chown -h,
// lsetxattr, utimensat(AT_SYMLINK_NOFOLLOW) copy up the link itself;
// llistxattr and lgetxattr act on the link; unlink leaves a whiteout and
// rename copies the link; the hard link is copied up before any write,
// chmod, chown, truncate, xattr or time change. The canary (which the
// hard link shares its inode with) and the lower layer stay as they were.
func TestHostileSymlinks(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	base := t.TempDir()
	out := filepath.Join(base, "outside")
	buildCanary(t, out)
	s := newStackIn(t, filepath.Join(base, "stack"), 1, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].Symlink("ln_abs", filepath.Join(out, "canary")).
			Symlink("ln_rel", "../../outside/canary").
			Symlink("ln_root", "/").
			Symlink("ln_dir", filepath.Join(out, "dir")).
			Symlink("ln_x", filepath.Join(out, "canary")).Xattr("ln_x", "trusted.linkx", "on-the-link").
			Symlink("loop1", "loop2").Symlink("loop2", "loop1").Symlink("self", "self").
			Symlink("d/up", "..").Symlink("d/upup", "../../../..")
	})
	// A hard link of the canary in the lower layer (after Finish, which
	// would have set the canary's times through it).
	if err := os.Link(filepath.Join(out, "canary"), filepath.Join(s.lower[0], "hl")); err != nil {
		t.Fatal(err)
	}
	cn := newCanary(t, out)
	lowerBefore := testutil.UpperLayout(t, s.lower[0])
	m := mountG(t, s)
	p := func(rel string) string { return filepath.Join(m.Dir, rel) }
	ok := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}

	for _, c := range []struct{ name, target string }{
		{"ln_abs", filepath.Join(out, "canary")}, {"ln_rel", "../../outside/canary"}, {"ln_root", "/"},
		{"ln_dir", filepath.Join(out, "dir")}, {"loop1", "loop2"}, {"self", "self"}, {"d/up", ".."}, {"d/upup", "../../../.."},
	} {
		if got, err := os.Readlink(p(c.name)); err != nil || got != c.target {
			t.Errorf("readlink %s = %q, %v; want %q", c.name, got, err, c.target)
		}
	}
	var st unix.Stat_t
	for _, n := range []string{"loop1", "self"} {
		if err := unix.Stat(p(n), &st); !errors.Is(err, unix.ELOOP) {
			t.Errorf("stat %s: %v, want ELOOP", n, err)
		}
	}

	// llistxattr/lgetxattr act on the link, not its target.
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p("ln_x"), buf)
	ok("llistxattr ln_x", err)
	if names := string(buf[:max(n, 0)]); !strings.Contains(names, "trusted.linkx") || strings.Contains(names, "user.canary") {
		t.Errorf("llistxattr of the link lists %q: want the link's trusted.linkx, not the target's user.canary", names)
	}
	if _, err := unix.Lgetxattr(p("ln_x"), "user.canary", buf); !errors.Is(err, unix.ENODATA) {
		t.Errorf("lgetxattr user.canary of the link: %v, want ENODATA (the target's xattr)", err)
	}

	// Changes to the links copy the links up.
	ok("lchown ln_abs", unix.Lchown(p("ln_abs"), 1234, 1234))
	ok("lsetxattr ln_rel", unix.Lsetxattr(p("ln_rel"), "trusted.t", []byte("v"), 0))
	ts := []unix.Timespec{unix.NsecToTimespec(1e9), unix.NsecToTimespec(2e9)}
	ok("utimensat ln_dir", unix.UtimesNanoAt(unix.AT_FDCWD, p("ln_dir"), ts, unix.AT_SYMLINK_NOFOLLOW))
	ok("lchown ln_root", unix.Lchown(p("ln_root"), 42, 42))
	ok("rename ln_dir", unix.Rename(p("ln_dir"), p("ln_dir2")))
	ok("lsetxattr ln_x", unix.Lsetxattr(p("ln_x"), "trusted.linkx", []byte("changed"), 0))
	ok("unlink ln_abs", unix.Unlink(p("ln_abs")))
	ok("unlink loop1", unix.Unlink(p("loop1")))
	up := testutil.UpperLayout(t, s.upper)
	for name, target := range map[string]string{"ln_rel": "../../outside/canary", "ln_dir2": filepath.Join(out, "dir"), "ln_root": "/", "ln_x": filepath.Join(out, "canary")} {
		if n := up[name]; n == nil || n.Type != "symlink" || n.Target != target {
			t.Errorf("upper %s: %+v, want a copy of the link to %q", name, n, target)
		}
	}
	if n := up["ln_abs"]; n == nil || n.Type != "whiteout" {
		t.Errorf("upper ln_abs: %+v, want a whiteout", n)
	}
	if n := up["ln_rel"]; n != nil && n.Xattrs["trusted.t"] != "v" {
		t.Errorf("upper ln_rel xattrs %v, want trusted.t=v on the link", n.Xattrs)
	}

	// The lower hard link of the canary: everything copies it up first.
	f, err := os.OpenFile(p("hl"), os.O_RDONLY, 0)
	ok("open hl", err)
	if err == nil {
		b := make([]byte, 64)
		k, _ := f.Read(b)
		if string(b[:k]) != "CANARY\n" {
			t.Errorf("hl reads %q", b[:k])
		}
		f.Close()
	}
	ok("chmod hl", unix.Chmod(p("hl"), 0o777))
	ok("chown hl", unix.Chown(p("hl"), 4321, 4321))
	ok("setxattr hl", unix.Setxattr(p("hl"), "user.evil", []byte("x"), 0))
	ok("removexattr hl", unix.Removexattr(p("hl"), "user.canary"))
	ok("utimes hl", unix.UtimesNano(p("hl"), ts))
	ok("truncate hl", unix.Truncate(p("hl"), 2))
	if f, err := os.OpenFile(p("hl"), os.O_WRONLY|os.O_APPEND, 0); err == nil {
		f.WriteString("escaped?")
		f.Close()
	} else {
		t.Errorf("open hl for append: %v", err)
	}
	ok("link hl", unix.Link(p("hl"), p("hl-link")))
	ok("rename hl", unix.Rename(p("hl"), p("hl2")))
	ok("unlink hl2", unix.Unlink(p("hl2")))

	m.Unmount(t)
	cn.check(t)
	reportDiff(t, "the lower layer changed", testutil.DiffWith(lowerBefore, testutil.UpperLayout(t, s.lower[0]), testutil.DiffOptions{A: "before", B: "after"}))
}

// TestLowerSwapRace: a hostile setup changes a lower layer under the
// mount (which the overlay contract forbids): a swapper exchanges the
// directory lowerdir/sw with a symlink to the canary's sw-target (same
// names inside) with renameat2(RENAME_EXCHANGE), as fast as it can, while
// workers read, copy up, chmod, setxattr, truncate, unlink, rename and
// create in mnt/sw through the mount. The workers' paths never follow a
// symlink (openat2 RESOLVE_NO_SYMLINKS from the mount's root), so the
// only way to reach the canary is goverlay following the swapped-in link
// itself. The daemon runs with RLIMIT_NOFILE 256, so its directory fd
// cache (64) is small and directories are reopened from their parents by
// name all the time. Errors are fine; reading "OUT-" content, listing
// OUTSIDE-ONLY, or any change to the canary is an escape.
func TestLowerSwapRace(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	dur := pick(3*time.Second, 30*time.Second)
	rng := rand.New(rand.NewSource(seed(t, 11)))
	base := t.TempDir()
	out := filepath.Join(base, "outside")
	buildCanary(t, out)
	s := newStackIn(t, filepath.Join(base, "stack"), 1, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("sw/a", "IN-A\n", 0o644).File("sw/sub/b", "IN-B\n", 0o644).Symlink("sw.link", filepath.Join(out, "sw-target"))
		for i := range 100 {
			l[0].File(fmt.Sprintf("pad/p%03d/f", i), "pad", 0o644) // churns the fd cache
		}
	})
	cn := newCanary(t, out)
	m := testutil.MountWith(t, s.opts(), testutil.MountConfig{Wrap: []string{"prlimit", "--nofile=256:256", "--"}})
	root, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Closed before the unmount, also when the test stops early.
	closeRoot := sync.OnceFunc(func() { unix.Close(root) })
	t.Cleanup(closeRoot)
	var escapes []string
	var escMu sync.Mutex
	escape := func(format string, a ...any) {
		escMu.Lock()
		if len(escapes) < 20 {
			escapes = append(escapes, fmt.Sprintf(format, a...))
		}
		escMu.Unlock()
	}
	var swaps, okOps atomic.Int64
	open2 := func(rel string, flags int) (int, error) {
		return unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH,
		})
	}
	m.Watchdog(t, dur+2*time.Minute, func() {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the swapper, in the lower layer itself
			defer wg.Done()
			lfd, err := unix.Open(s.lower[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(lfd)
			for {
				select {
				case <-stop:
					// Leave the directory in place, as it was.
					var st unix.Stat_t
					if unix.Fstatat(lfd, "sw", &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
						unix.Renameat2(lfd, "sw", lfd, "sw.link", unix.RENAME_EXCHANGE)
					}
					return
				default:
				}
				if err := unix.Renameat2(lfd, "sw", lfd, "sw.link", unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("swap: %v", err)
					return
				}
				swaps.Add(1)
			}
		}()
		for w := range 4 {
			wr := rand.New(rand.NewSource(rng.Int63()))
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 256)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var err error
					switch wr.Intn(10) {
					case 0, 1: // read
						name := []string{"sw/a", "sw/sub/b", "sw/a2"}[wr.Intn(3)]
						fd, e := open2(name, unix.O_RDONLY)
						if err = e; e == nil {
							n, _ := unix.Read(fd, buf)
							if bytes.HasPrefix(buf[:max(n, 0)], []byte("OUT-")) {
								escape("worker %d read %q from %s: the canary's content", w, buf[:n], name)
							}
							unix.Close(fd)
						}
					case 2: // copy-up by a write
						fd, e := open2("sw/a", unix.O_WRONLY|unix.O_APPEND)
						if err = e; e == nil {
							_, err = unix.Write(fd, []byte("W"))
							unix.Close(fd)
						}
					case 3: // chmod through an fd
						fd, e := open2("sw/sub/b", unix.O_RDONLY)
						if err = e; e == nil {
							err = unix.Fchmod(fd, 0o600|uint32(wr.Intn(2))*0o44)
							unix.Close(fd)
						}
					case 4:
						fd, e := open2("sw/a", unix.O_RDONLY)
						if err = e; e == nil {
							err = unix.Fsetxattr(fd, "user.w", []byte("x"), 0)
							unix.Close(fd)
						}
					case 5:
						fd, e := open2("sw/sub/b", unix.O_WRONLY)
						if err = e; e == nil {
							err = unix.Ftruncate(fd, 1)
							unix.Close(fd)
						}
					case 6: // unlink, rename, mkdir by name in a directory fd
						dfd, e := open2("sw/sub", unix.O_RDONLY|unix.O_DIRECTORY)
						if err = e; e == nil {
							err = unix.Unlinkat(dfd, "b", 0)
							unix.Close(dfd)
						}
					case 7:
						dfd, e := open2("sw", unix.O_RDONLY|unix.O_DIRECTORY)
						if err = e; e == nil {
							if wr.Intn(2) == 0 {
								err = unix.Renameat(dfd, "a", dfd, "a2")
							} else {
								err = unix.Mkdirat(dfd, "new", 0o755)
							}
							unix.Close(dfd)
						}
					case 8: // list
						dfd, e := open2("sw", unix.O_RDONLY|unix.O_DIRECTORY)
						if err = e; e == nil {
							ds, _ := testutil.ReadAllDirents(dfd, 4096)
							for _, d := range ds {
								if d.Name == "OUTSIDE-ONLY" {
									escape("worker %d listed OUTSIDE-ONLY in sw: the canary's directory", w)
								}
							}
							unix.Close(dfd)
						}
					case 9: // churn the daemon's fd cache
						fd, e := open2(fmt.Sprintf("pad/p%03d/f", wr.Intn(100)), unix.O_RDONLY)
						if err = e; e == nil {
							unix.Close(fd)
						}
					}
					if err == nil {
						okOps.Add(1)
					}
				}
			}()
		}
		time.Sleep(dur) // the length of the race, not a synchronisation
		close(stop)
		wg.Wait()
	})
	t.Logf("%d swaps, %d operations succeeded", swaps.Load(), okOps.Load())
	if swaps.Load() < 100 || okOps.Load() < 100 {
		t.Errorf("the race hardly ran: %d swaps, %d successful operations", swaps.Load(), okOps.Load())
	}
	for _, e := range escapes {
		t.Errorf("escape: %s", e)
	}
	closeRoot()
	m.Unmount(t)
	cn.check(t)
}
