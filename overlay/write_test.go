package overlay

import (
	"bytes"
	"errors"
	stdlog "log"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// rwMount mounts lower with a fresh upper and workdir.
func rwMount(t *testing.T, lowers ...string) (mnt, up string) {
	t.Helper()
	up, work := t.TempDir(), t.TempDir()
	return mountT(t, Options{Lower: lowers, Upper: up, Work: work}), up
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func isWhiteout(t *testing.T, path string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func TestCopyUpKeepsBytesAroundWrite(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/f", "Hello world")
	os.Chmod(lo+"/f", 0o640)
	os.Chown(lo+"/f", 1234, 5678)
	if err := xattr.Set(lo+"/f", "user.k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	mnt, up := rwMount(t, lo)

	f, err := os.OpenFile(mnt+"/f", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("J"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := readFile(t, mnt+"/f"); got != "Jello world" {
		t.Errorf("through the mount: %q, want %q", got, "Jello world")
	}
	if got := readFile(t, up+"/f"); got != "Jello world" {
		t.Errorf("upper: %q", got)
	}
	if got := readFile(t, lo+"/f"); got != "Hello world" {
		t.Errorf("lower changed: %q", got)
	}
	var st unix.Stat_t
	if err := unix.Lstat(up+"/f", &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&07777 != 0o640 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("upper copy: mode %o owner %d:%d, want 640 1234:5678", st.Mode&07777, st.Uid, st.Gid)
	}
	if v, err := xattr.Get(up+"/f", "user.k"); err != nil || string(v) != "v" {
		t.Errorf("upper copy xattr: %q %v", v, err)
	}
}

func TestTruncatingOpenCopiesNoData(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/f", "old contents")
	mnt, up := rwMount(t, lo)
	if err := os.WriteFile(mnt+"/f", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, up+"/f"); got != "new" {
		t.Errorf("upper: %q, want new", got)
	}
}

func TestUnlinkWritesWhiteoutOnly(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/f", "x")
	write(t, lo+"/d/g", "y")
	mnt, up := rwMount(t, lo)
	if err := os.Remove(mnt + "/f"); err != nil {
		t.Fatal(err)
	}
	if !isWhiteout(t, up+"/f") {
		t.Errorf("upper/f is not a whiteout")
	}
	if _, err := os.Lstat(mnt + "/f"); !os.IsNotExist(err) {
		t.Errorf("f still visible: %v", err)
	}
	// The parent was copied up for the whiteout, not the file.
	if err := os.Remove(mnt + "/d/g"); err != nil {
		t.Fatal(err)
	}
	if !isWhiteout(t, up+"/d/g") {
		t.Errorf("upper/d/g is not a whiteout")
	}
	if err := os.Remove(mnt + "/d"); err != nil {
		t.Fatalf("rmdir of a dir that looks empty: %v", err)
	}
	if !isWhiteout(t, up+"/d") {
		t.Errorf("upper/d is not a whiteout after rmdir")
	}
	if got := names(t, mnt); len(got) != 0 {
		t.Errorf("root not empty: %v", got)
	}
}

func TestRmdirNotEmpty(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/d/g", "y")
	mnt, _ := rwMount(t, lo)
	if err := syscall.Rmdir(mnt + "/d"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("rmdir: %v, want ENOTEMPTY", err)
	}
}

func TestMkdirOverWhiteoutIsOpaque(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/d/old", "y")
	write(t, lo+"/plain/x", "y")
	mnt, up := rwMount(t, lo)
	if err := os.RemoveAll(mnt + "/d"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt+"/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if got := names(t, mnt+"/d"); len(got) != 0 {
		t.Errorf("new dir shows %v from below", got)
	}
	if v, err := xattr.Get(up+"/d", "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Errorf("opaque xattr: %q %v", v, err)
	}
	if _, err := os.Lstat(up + "/d/.wh..wh..opq"); err == nil {
		t.Errorf("an opaque dir must not also get the AUFS marker")
	}
	// Not every new directory is opaque (fuse-overlayfs makes them all
	// so): like the kernel with redirect_dir=on, only those made in a
	// merged directory, where it spares their lookups the layers below.
	if err := os.MkdirAll(mnt+"/new/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := xattr.Get(up+"/new/sub", "trusted.overlay.opaque"); err == nil {
		t.Errorf("a new dir in an upper-only dir must not be opaque")
	}
	if v, err := xattr.Get(up+"/new", "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Errorf("a new dir in a merged dir: opaque %q %v, want y as the kernel with redirect_dir=on", v, err)
	}
}

func TestCreateOverWhiteout(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/f", "lower")
	mnt, up := rwMount(t, lo)
	os.Remove(mnt + "/f")
	if err := os.WriteFile(mnt+"/f", []byte("again"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, mnt+"/f"); got != "again" {
		t.Errorf("got %q", got)
	}
	if isWhiteout(t, up+"/f") {
		t.Errorf("whiteout left in place")
	}
}

func TestWhiteoutNamesRefused(t *testing.T) {
	lo := t.TempDir()
	mnt, _ := rwMount(t, lo)
	err := os.WriteFile(mnt+"/.wh.x", nil, 0o644)
	if !errors.Is(err, syscall.EINVAL) {
		t.Errorf("create .wh.x: %v, want EINVAL", err)
	}
	if err := xattr.Set(mnt, "trusted.overlay.opaque", []byte("y")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("set private xattr: %v, want EPERM", err)
	}
}

func TestRenameLowerFileLeavesWhiteout(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/a", "A")
	write(t, lo+"/dir/x", "X")
	mnt, up := rwMount(t, lo)
	if err := os.Rename(mnt+"/a", mnt+"/b"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, mnt+"/b"); got != "A" {
		t.Errorf("b: %q", got)
	}
	if !isWhiteout(t, up+"/a") {
		t.Errorf("no whiteout at the old name")
	}
	if err := os.Mkdir(mnt+"/up", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(mnt+"/up", mnt+"/up2"); err != nil {
		t.Errorf("rename of an upper-only dir: %v", err)
	}
}

func TestReadOnlyHandleSeesCopyUp(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/f", "LOWERDATA")
	mnt, _ := rwMount(t, lo)
	r, err := os.Open(mnt + "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.WriteFile(mnt+"/f", []byte("UPPERDATA"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
	buf := make([]byte, 9)
	if _, err := r.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if string(buf) != "UPPERDATA" {
		t.Errorf("old handle reads %q, want UPPERDATA", buf)
	}
}

func TestLowerHardlinksDoNotAlias(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/a", "orig\n")
	if err := os.Link(lo+"/a", lo+"/b"); err != nil {
		t.Fatal(err)
	}
	mnt, _ := rwMount(t, lo)
	// Look both up first, as ls would.
	readFile(t, mnt+"/a")
	readFile(t, mnt+"/b")
	f, err := os.OpenFile(mnt+"/a", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("more\n")
	f.Close()
	if got := readFile(t, mnt+"/b"); got != "orig\n" {
		t.Errorf("b shows %q after a write through a", got)
	}
	if got := readFile(t, mnt+"/a"); got != "orig\nmore\n" {
		t.Errorf("a: %q", got)
	}
	// As with the kernel overlay (no index): a is now a file of its own.
	// (The kernel is told to look a up again asynchronously; dropping its
	// dentries makes the check independent of that timing.)
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
	var sa, sb unix.Stat_t
	if err := unix.Lstat(mnt+"/a", &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(mnt+"/b", &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino == sb.Ino || sa.Nlink != 1 || sb.Nlink != 2 {
		t.Errorf("after copy-up: a ino %d nlink %d, b ino %d nlink %d; want distinct inos, nlink 1 and 2", sa.Ino, sa.Nlink, sb.Ino, sb.Nlink)
	}
}

func TestConcurrentCopyUps(t *testing.T) {
	lo := t.TempDir()
	const files = 8
	for i := 0; i < files; i++ {
		write(t, lo+"/d/sub/f"+string(rune('a'+i)), strings.Repeat("x", 100000))
	}
	mnt, _ := rwMount(t, lo)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		for i := 0; i < files; i++ {
			wg.Add(1)
			go func(w, i int) {
				defer wg.Done()
				p := mnt + "/d/sub/f" + string(rune('a'+i))
				f, err := os.OpenFile(p, os.O_WRONLY, 0)
				if err != nil {
					t.Error(err)
					return
				}
				f.WriteAt([]byte{byte('0' + w)}, int64(w))
				f.Close()
			}(w, i)
		}
	}
	wg.Wait()
	for i := 0; i < files; i++ {
		got := readFile(t, mnt+"/d/sub/f"+string(rune('a'+i)))
		if len(got) != 100000 || got[:4] != "0123" || strings.Count(got, "x") != 100000-4 {
			t.Errorf("file %d: len %d head %q", i, len(got), got[:8])
		}
	}
}

// TestRenameLowerDirWithRedirect: a directory with lower instances moves
// with a redirect; the result reads the same through goverlay after a
// remount and through the kernel overlay (which follows redirects).
func TestRenameLowerDirWithRedirect(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/dir/x", "X")
	write(t, lo+"/dir/sub/y", "Y")
	write(t, lo+"/other/z", "Z")
	up, work := t.TempDir(), t.TempDir()
	o := Options{Lower: []string{lo}, Upper: up, Work: work}
	mnt, f := mountFS(t, o)
	if err := os.Rename(mnt+"/dir", mnt+"/moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(mnt+"/deep/er", 0o755); err != nil {
		t.Fatal(err)
	}
	// A child of a moved directory moves again: its redirect must name
	// where it is in the lower layer, not where its parent is now.
	if err := os.Rename(mnt+"/moved/sub", mnt+"/deep/er/sub2"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"moved/x": "X", "deep/er/sub2/y": "Y", "other/z": "Z"}
	check := func(where, m string) {
		t.Helper()
		for p, c := range want {
			if b, err := os.ReadFile(m + "/" + p); err != nil || string(b) != c {
				t.Errorf("%s: %s: %q %v, want %q", where, p, b, err, c)
			}
		}
		for _, gone := range []string{"dir", "moved/sub"} {
			if _, err := os.Lstat(m + "/" + gone); !os.IsNotExist(err) {
				t.Errorf("%s: %s still there: %v", where, gone, err)
			}
		}
	}
	check("live", mnt)
	// As the kernel writes them (ovl_get_redirect()): the old name when
	// the parent stays, else the path in the merged view before the move,
	// with an ancestor's redirect standing for its name.
	if v, err := xattr.Get(up+"/moved", "trusted.overlay.redirect"); err != nil || string(v) != "dir" {
		t.Errorf("upper/moved redirect: %q %v, want dir", v, err)
	}
	if v, err := xattr.Get(up+"/deep/er/sub2", "trusted.overlay.redirect"); err != nil || string(v) != "/dir/sub" {
		t.Errorf("upper/deep/er/sub2 redirect: %q %v, want /dir/sub", v, err)
	}
	if !isWhiteout(t, up+"/dir") {
		t.Errorf("no whiteout at the old name")
	}

	// A second mount of the same layers (only read from now on), once
	// the first has let go of the upper layer (it holds it locked).
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	check("goverlay remount", mountT(t, Options{Lower: []string{lo}, Upper: up, Work: t.TempDir()}))

	// The kernel overlay reads what goverlay wrote. (t.TempDir is on the
	// upper's filesystem, as a workdir must be.)
	kmnt, kwork := t.TempDir(), t.TempDir()
	err := unix.Mount("overlay", kmnt, "overlay", 0, "lowerdir="+lo+",upperdir="+up+",workdir="+kwork+",redirect_dir=on")
	if err != nil {
		t.Skipf("kernel overlay: %v", err)
	}
	defer unix.Unmount(kmnt, unix.MNT_DETACH)
	check("kernel", kmnt)
}

func TestRenameLowerDirRedirectOff(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/dir/x", "X")
	up, work := t.TempDir(), t.TempDir()
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work, RedirectDirOff: true})
	if err := os.Rename(mnt+"/dir", mnt+"/dir2"); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("rename of a lower dir with redirect_dir=off: %v, want EXDEV", err)
	}
}

// TestTmpfile: an O_TMPFILE file is invisible until linkat gives it a
// name, and leaves nothing behind when closed without one.
func TestTmpfile(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/d/x", "x")
	up, work := t.TempDir(), t.TempDir()
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work})
	needKernel(t, 6, 1, "O_TMPFILE through FUSE (FUSE_TMPFILE)")
	fd, err := unix.Open(mnt+"/d", unix.O_TMPFILE|unix.O_RDWR, 0o640)
	if err != nil {
		t.Fatalf("O_TMPFILE: %v", err)
	}
	if _, err := unix.Write(fd, []byte("tmp data")); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Nlink != 0 || st.Mode&07777 != 0o640 {
		t.Errorf("fstat of the tmpfile: nlink %d mode %o %v, want 0 and 640", st.Nlink, st.Mode&07777, err)
	}
	if got := names(t, mnt+"/d"); strings.Join(got, " ") != "x" {
		t.Errorf("d lists %v before the link", got)
	}
	if err := unix.Linkat(fd, "", unix.AT_FDCWD, mnt+"/d/linked", unix.AT_EMPTY_PATH); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if got := readFile(t, mnt+"/d/linked"); got != "tmp data" {
		t.Errorf("linked: %q", got)
	}
	if got := readFile(t, up+"/d/linked"); got != "tmp data" {
		t.Errorf("upper: %q", got)
	}
	// An unlinked one leaves nothing.
	fd, err = unix.Open(mnt+"/d", unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	unix.Write(fd, []byte("gone"))
	unix.Close(fd)
	// The kernel sends RELEASE, or FORGET, after close returns: wait for
	// its effect, within a bound.
	if got := waitWorkEmpty(t, work); len(got) != 0 {
		t.Errorf("workdir/work holds %v after the tmpfiles are linked or closed", got)
	}
}

// waitWorkEmpty waits up to 5 s for workdir/work under work to be empty,
// and returns what it still holds.
func waitWorkEmpty(t *testing.T, work string) []string {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = names(t, work+"/work"); len(got) == 0 {
			break
		}
	}
	return got
}

// TestCreateOwnerAndMode: files an unprivileged caller creates belong to
// it (the group of a setgid directory), with the mode it asked less its
// umask, wherever they are made: a merged directory, an upper-only one, a
// setgid one, over a whiteout, and through O_RDONLY|O_CREAT; the workdir
// is left empty.
func TestCreateOwnerAndMode(t *testing.T) {
	umask := uint32(syscall.Umask(0))
	syscall.Umask(int(umask))
	for _, m := range matrix {
		t.Run(m.name, func(t *testing.T) {
			lo := openDir(t)
			for _, d := range []string{"merged", "sgid"} {
				if err := os.Mkdir(lo+"/"+d, 0o777); err != nil {
					t.Fatal(err)
				}
				os.Chmod(lo+"/"+d, 0o777)
			}
			os.Chown(lo+"/sgid", 0, 4321)
			unix.Chmod(lo+"/sgid", 0o2777)
			write(t, lo+"/merged/gone", "lower")
			os.Chmod(lo+"/merged/gone", 0o666)
			up, work := openDir(t), openDir(t)
			mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: m.mode, Passthrough: m.passthrough, OpenRequests: m.opens, Writeback: m.writeback, AllowOther: true})
			run(t, asNobody, "umask 027 && cd "+mnt+" && mkdir -m 777 merged/new && mkdir sgid/d && "+
				": > merged/a && echo x > merged/new/b && : > sgid/c && "+
				"rm merged/gone && echo again > merged/gone")
			// O_RDONLY|O_CREAT, as root: the workdir path.
			fd, err := unix.Open(mnt+"/merged/ro", unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL, 0o604)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			want := map[string][3]uint32{
				"merged/a":     {0o640, 65534, 65534},
				"merged/new":   {unix.S_IFDIR | 0o777, 65534, 65534},
				"merged/new/b": {0o640, 65534, 65534},
				"sgid/c":       {0o640, 65534, 4321},
				"sgid/d":       {unix.S_IFDIR | unix.S_ISGID | 0o750, 65534, 4321},
				"merged/gone":  {0o640, 65534, 65534},
			}
			for rel, w := range want {
				var st unix.Stat_t
				if err := unix.Lstat(up+"/"+rel, &st); err != nil {
					t.Errorf("%s: %v", rel, err)
					continue
				}
				wantMode := w[0]
				if wantMode&unix.S_IFMT == 0 {
					wantMode |= unix.S_IFREG
				}
				if st.Mode != wantMode || st.Uid != w[1] || st.Gid != w[2] {
					t.Errorf("%s: mode %#o owner %d:%d, want %#o %d:%d", rel, st.Mode, st.Uid, st.Gid, wantMode, w[1], w[2])
				}
			}
			if got := readFile(t, mnt+"/merged/gone"); got != "again\n" {
				t.Errorf("merged/gone: %q", got)
			}
			if ents, _ := os.ReadDir(work + "/work"); len(ents) != 0 {
				t.Errorf("left in workdir/work: %v", ents)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for go-fuse's debug logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNoFlushOnClose: opens say FOPEN_NOFLUSH, so close(2) sends no FLUSH
// (created, written, read-only and read-write files alike), and what a
// shared writable mapping wrote is in the upper file once it is unmapped,
// after its descriptor was closed.
func TestNoFlushOnClose(t *testing.T) {
	for _, m := range matrix {
		t.Run(m.name, func(t *testing.T) {
			lo := t.TempDir()
			write(t, lo+"/ro", "read me")
			write(t, lo+"/mapped", strings.Repeat("-", 8192))
			var log syncBuffer
			up, work := t.TempDir(), t.TempDir()
			mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: m.mode, Passthrough: m.passthrough, OpenRequests: m.opens, Writeback: m.writeback,
				Debug: true, Logger: stdlog.New(&log, "", 0)})
			if err := os.WriteFile(mnt+"/new", []byte("new"), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, mnt+"/ro"); got != "read me" {
				t.Errorf("ro: %q", got)
			}
			// In another process: a page fault on this process's own
			// mount cannot be preempted, and a garbage collection
			// starting meanwhile would wait for it while the daemon
			// that must serve it waits for the collection.
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMmapWrite$")
			cmd.Env = append(os.Environ(), "GOVERLAY_MMAP_WRITE="+mnt+"/mapped")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("mmap write: %v: %s", err, out)
			}
			if got := readFile(t, up+"/mapped"); got[4096:4096+19] != "through the mapping" {
				t.Errorf("upper file after munmap: %q", got[4090:4120])
			}
			if got := readFile(t, up+"/new"); got != "new" {
				t.Errorf("new: %q", got)
			}
			// go-fuse's own poll probe at mount (node ^0) is not ours.
			// The writeback cache flushes at close whatever the open
			// said (fuse_flush()), until the first FLUSH is answered
			// ENOSYS.
			// Files opened without a request: the kernel flushes at
			// close until the first FLUSH is answered ENOSYS, and
			// sends no RELEASE (noopen.go).
			if m.writeback == WritebackOn || !m.opens {
				if fl := grepLines(log.String(), ": FLUSH ", "FLUSH n18446744073709551615 "); strings.Count(fl, "\n") > 0 {
					t.Errorf("FLUSH requests sent after the first was answered ENOSYS:\n%s", fl)
				}
				return
			}
			if fl := grepLines(log.String(), ": FLUSH ", "FLUSH n18446744073709551615 "); fl != "" {
				t.Errorf("FLUSH requests sent:\n%s", fl)
			}
			if !strings.Contains(log.String(), ": RELEASE ") {
				t.Errorf("no RELEASE in the debug log: the check above saw nothing")
			}
		})
	}
}

// TestHelperMmapWrite is TestNoFlushOnClose's writer, run in a process of
// its own: it maps the file named by GOVERLAY_MMAP_WRITE, writes through
// the mapping, closes the descriptor, then unmaps.
func TestHelperMmapWrite(t *testing.T) {
	path := os.Getenv("GOVERLAY_MMAP_WRITE")
	if path == "" {
		t.Skip("run by TestNoFlushOnClose")
	}
	fd, err := unix.Open(path, unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	copy(mem[4096:], "through the mapping")
	unix.Close(fd)
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
}

// grepLines returns the lines of s that contain sub and not except.
func grepLines(s, sub, except string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.Contains(l, except) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A redirect is written as the kernel writes it (ovl_set_redirect()): the
// old name within one parent, whatever the path's length; an absolute path
// longer than the kernel's redirect_max (256) is EXDEV, and mv copies. A
// directory that has a redirect keeps it when it moves within its parent
// and gets an absolute one, its own redirect standing for its name, when
// it moves to another.
func TestRenameRedirectFormat(t *testing.T) {
	lo := t.TempDir()
	long := strings.Repeat("l", 200)
	write(t, lo+"/"+long+"/"+long+"/d/f", "f")
	write(t, lo+"/p/d/f", "f")
	if err := os.Mkdir(lo+"/q", 0o755); err != nil {
		t.Fatal(err)
	}
	up, work := t.TempDir(), t.TempDir()
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work})
	redirect := func(rel string) string {
		t.Helper()
		v, err := xattr.Get(up+"/"+rel, "trusted.overlay.redirect")
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		return string(v)
	}
	deep := long + "/" + long
	if err := os.Rename(mnt+"/"+deep+"/d", mnt+"/"+deep+"/e"); err != nil {
		t.Fatalf("rename within a deep parent: %v", err)
	}
	if r := redirect(deep + "/e"); r != "d" {
		t.Errorf("redirect %q, want d", r)
	}
	if err := os.Rename(mnt+"/"+deep+"/e", mnt+"/q/e"); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("rename to another parent with a %d-byte path: %v, want EXDEV", len(deep)+3, err)
	}
	for _, step := range []struct{ from, to, want string }{
		{"p/d", "p/d1", "d"},     // lower, same parent: its old name
		{"p/d1", "p/d2", "d"},    // kept
		{"p/d2", "q/d3", "/p/d"}, // another parent: absolute, from its own redirect
		{"q/d3", "q/d4", "/p/d"}, // kept
		{"q/d4", "p/d", "/p/d"},  // back where it was: still absolute
	} {
		if err := os.Rename(mnt+"/"+step.from, mnt+"/"+step.to); err != nil {
			t.Fatalf("rename %s %s: %v", step.from, step.to, err)
		}
		if r := redirect(step.to); r != step.want {
			t.Errorf("after rename %s %s: redirect %q, want %q", step.from, step.to, r, step.want)
		}
	}
	if b, err := os.ReadFile(mnt + "/p/d/f"); err != nil || string(b) != "f" {
		t.Errorf("p/d/f: %q %v", b, err)
	}
}

// A rename that fails at its commit point (the upper's renameat2: here
// the target directory is immutable, EPERM) leaves no redirect behind on
// the directory it copied up, and the node does not take one either: the
// rename that then succeeds writes the value a first rename would.
func TestRenameFailureUndone(t *testing.T) {
	if _, err := exec.LookPath("chattr"); err != nil {
		t.Skip("no chattr")
	}
	lo := t.TempDir()
	write(t, lo+"/p/d/f", "f")
	write(t, lo+"/q/g", "g")
	up, work := t.TempDir(), t.TempDir()
	mnt := mountT(t, Options{Lower: []string{lo}, Upper: up, Work: work})
	// q into the upper layer, then made immutable there.
	write(t, mnt+"/q/new", "n")
	if out, err := exec.Command("chattr", "+i", up+"/q").CombinedOutput(); err != nil {
		t.Skipf("chattr +i: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", up+"/q").Run() })
	if err := os.Rename(mnt+"/p/d", mnt+"/q/d"); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("rename into an immutable upper dir: %v, want EPERM", err)
	}
	if v, err := xattr.Get(up+"/p/d", "trusted.overlay.redirect"); err == nil {
		t.Errorf("upper p/d keeps the redirect %q of the failed rename", v)
	}
	if b, err := os.ReadFile(mnt + "/p/d/f"); err != nil || string(b) != "f" {
		t.Errorf("p/d/f after the failed rename: %q %v", b, err)
	}
	if out, err := exec.Command("chattr", "-i", up+"/q").CombinedOutput(); err != nil {
		t.Fatalf("chattr -i: %v %s", err, out)
	}
	if err := os.Rename(mnt+"/p/d", mnt+"/p/e"); err != nil {
		t.Fatal(err)
	}
	if v, err := xattr.Get(up+"/p/e", "trusted.overlay.redirect"); err != nil || string(v) != "d" {
		t.Errorf("upper p/e redirect: %q %v, want d", v, err)
	}
}
