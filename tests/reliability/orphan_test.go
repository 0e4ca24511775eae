package reliability_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestUnlinkedOpenFile: an open file whose name was removed (unlink, or a
// rename over it) goes on working through its descriptor: ftruncate,
// fchmod, futimens, fsetxattr, fgetxattr, write and read, as on the
// kernel overlay, which runs the same steps; with passthrough on and off,
// for a file made in the mount, one copied up from a lower layer, and a
// lower file opened read-only, which a change through the descriptor
// copies up to a file no name shows. There the kernel overlay's copy-up
// fails with EEXIST (it links the copy to the removed name, which the
// whiteout or the other file holds) and goverlay does what a local
// filesystem does: from the kernel's first EEXIST on, the steps are
// compared with the same steps on a plain directory. Once closed, the file
// leaves nothing in the upper layer or the workdir.
func TestUnlinkedOpenFile(t *testing.T) {
	testutil.RequireRoot(t)
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("lower", "lower data\n", 0o644).File("other", "other\n", 0o644)
		for _, f := range []string{"lower-ro", "lower-reopen"} {
			l[0].File(f, "lower data\n", 0o644).Xattr(f, "user.lower", "lv")
		}
	}
	for _, pt := range []string{"on", "off"} {
		for _, how := range []string{"unlink", "rename-over"} {
			for _, which := range []string{"new", "lower", "lower-ro", "lower-reopen"} {
				t.Run(fmt.Sprintf("passthrough=%s/%s/%s", pt, how, which), func(t *testing.T) {
					t.Parallel()
					start := time.Now()
					ks, gs := newStack(t, 1, build), newStack(t, 1, build)
					kmnt, g := mountK(t, ks), mountG(t, gs, "-o", "passthrough="+pt)
					steps := unlinkedSteps
					readOnly := strings.HasPrefix(which, "lower-r")
					if readOnly {
						steps = unlinkedReadOnlySteps
					}
					kr := steps(t, kmnt, how, which)
					var gr []string
					if readOnly {
						// Reading copies nothing up.
						gr = readOnlySteps(t, g.Dir, how, which, func() {
							if ents, err := os.ReadDir(filepath.Join(gs.work, "work")); err != nil || len(ents) > 0 {
								t.Errorf("before any change the workdir holds %v (%v)", ents, err)
							}
						})
					} else {
						gr = steps(t, g.Dir, how, which)
					}
					want, by := kr, make([]string, len(kr))
					for i := range by {
						by[i] = "kernel overlay"
					}
					if readOnly {
						// The same steps on a plain directory, the layer
						// of a stack of its own.
						ls := newStack(t, 1, build)
						want = sinceEEXIST(kr, steps(t, ls.lower[0], how, which), by)
						if pt == "off" {
							// Opened without a request (noopen=1,
							// the default where passthrough is
							// off), the file shows nlink 0
							// (TestUnlinkedOpenNlink).
							want[0] = strings.Replace(want[0], " nlink=1 ", " nlink=0 ", 1)
						}
					}
					if len(want) != len(gr) {
						t.Fatalf("goverlay %q, want %q", gr, want)
					}
					for i := range want {
						if want[i] != gr[i] {
							t.Errorf("goverlay %s, %s %s", gr[i], by[i], want[i])
						}
					}
					g.Unmount(t)
					layout := func(dir string) testutil.Tree {
						tr := normalize(testutil.UpperLayout(t, dir), start)
						for _, n := range tr {
							if n.Type == "whiteout" {
								n.Nlink = 0 // the kernel links its whiteouts to one inode
							}
							// The overlays' own marks differ (origin, uuid, impure).
							for k := range n.Xattrs {
								if strings.HasPrefix(k, "trusted.overlay.") {
									delete(n.Xattrs, k)
								}
							}
						}
						return tr
					}
					if d := diffTrees(layout(gs.upper), layout(ks.upper), "goverlay", "kernel"); len(d) > 0 {
						t.Errorf("the upper layers differ after the last close:\n%s", strings.Join(d, "\n"))
					}
					if ents, err := os.ReadDir(filepath.Join(gs.work, "work")); err != nil || len(ents) > 0 {
						t.Errorf("after the last close and unmount the workdir holds %v (%v)", ents, err)
					}
				})
			}
		}
	}
}

// sinceEEXIST returns the kernel overlay's outcomes kr up to the first
// EEXIST, and the local filesystem's lr from there on, and says whose each
// is in by.
func sinceEEXIST(kr, lr, by []string) []string {
	if len(kr) != len(lr) {
		return kr
	}
	want := append([]string(nil), kr...)
	for i := range kr {
		if f := strings.Fields(kr[i]); len(f) > 1 && f[1] == "EEXIST" {
			for j := i; j < len(kr); j++ {
				want[j], by[j] = lr[j], "local filesystem"
			}
			break
		}
	}
	return want
}

// removeName removes the name p in mnt: unlinked, or another file renamed
// over it.
func removeName(t *testing.T, mnt, p, how string) {
	t.Helper()
	var err error
	switch how {
	case "unlink":
		err = unix.Unlink(p)
	case "rename-over":
		err = unix.Rename(filepath.Join(mnt, "other"), p)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", how, p, err)
	}
}

// unlinkedReadOnlySteps opens a lower file read-only in mnt, removes its
// name, and changes its metadata through the descriptor; it returns one
// line per step with its outcome. For "lower-reopen" the first change is a
// write through a reopen for writing (/proc/self/fd).
func unlinkedReadOnlySteps(t *testing.T, mnt, how, which string) []string {
	t.Helper()
	return readOnlySteps(t, mnt, how, which, func() {})
}

// readOnlySteps is unlinkedReadOnlySteps, calling read after the steps that
// only read.
func readOnlySteps(t *testing.T, mnt, how, which string, read func()) []string {
	t.Helper()
	p := filepath.Join(mnt, which)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	ino := st.Ino
	removeName(t, mnt, p, how)
	var out []string
	step := func(name string, err error, result string) {
		out = append(out, fmt.Sprintf("%-10s %s %s", name, errName(errnoOf(t, err)), result))
	}
	buf := make([]byte, 64)
	// A write sets mtime to the time of the run, which is not the
	// oracle's: "now" stands for it.
	begin := time.Now().Unix() - 1
	stat := func(name string) {
		err := unix.Fstat(fd, &st)
		mtime := fmt.Sprint(st.Mtim.Sec)
		if st.Mtim.Sec >= begin {
			mtime = "now"
		}
		step(name, err, fmt.Sprintf("mode=%o size=%d nlink=%d mtime=%s same-ino=%v", st.Mode, st.Size, st.Nlink, mtime, st.Ino == ino))
	}
	stat("fstat0")
	n, err := unix.Fgetxattr(fd, "user.lower", buf)
	step("fgetxattr0", err, string(buf[:max(n, 0)]))
	read()
	if which == "lower-reopen" {
		wfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			_, err = unix.Pwrite(wfd, []byte("LOWER"), 0)
			unix.Close(wfd)
		}
		step("reopen-rw", err, "")
		n, err = unix.Pread(fd, buf, 0)
		step("pread0", err, fmt.Sprintf("%q", buf[:max(n, 0)]))
	}
	step("ftruncate", unix.Ftruncate(fd, 4), "")
	step("fchmod", unix.Fchmod(fd, 0o640), "")
	stat("fstat1")
	ts := []unix.Timespec{{Sec: 1000000, Nsec: 0}, {Sec: 2000000, Nsec: 0}}
	step("futimens", unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH), "")
	step("fsetxattr", unix.Fsetxattr(fd, "user.k", []byte("v"), 0), "")
	n, err = unix.Fgetxattr(fd, "user.k", buf)
	step("fgetxattr", err, string(buf[:max(n, 0)]))
	n, err = unix.Fgetxattr(fd, "user.lower", buf)
	step("fgetxattr1", err, string(buf[:max(n, 0)]))
	n, err = unix.Flistxattr(fd, buf)
	step("flistxattr", err, fmt.Sprintf("%q", buf[:max(n, 0)]))
	step("fremovexattr", unix.Fremovexattr(fd, "user.lower"), "")
	n, err = unix.Pread(fd, buf, 0)
	step("pread", err, fmt.Sprintf("%q", buf[:max(n, 0)]))
	stat("fstat2")
	rfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		n, err = unix.Pread(rfd, buf, 0)
		if err == nil {
			step("fchmod2", unix.Fchmod(rfd, 0o600), "")
		}
		unix.Close(rfd)
	}
	step("reopen", err, fmt.Sprintf("%q", buf[:max(n, 0)]))
	stat("fstat3")
	b, err := os.ReadFile(p)
	step("name", err, strings.TrimSpace(string(b)))
	return out
}

// unlinkedSteps opens a file in mnt, removes its name, and uses the
// descriptor; it returns one line per step with its outcome.
func unlinkedSteps(t *testing.T, mnt, how, which string) []string {
	t.Helper()
	p := filepath.Join(mnt, which)
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if which == "new" {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	fd, err := unix.Open(p, flags, 0o600)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, []byte("written before\n"), 0); err != nil {
		t.Fatal(err)
	}
	removeName(t, mnt, p, how)
	var out []string
	step := func(name string, err error, result string) {
		out = append(out, fmt.Sprintf("%-10s %s %s", name, errName(errnoOf(t, err)), result))
	}
	step("ftruncate", unix.Ftruncate(fd, 4), "")
	_, err = unix.Pwrite(fd, []byte("+w"), 4)
	step("pwrite", err, "")
	step("fchmod", unix.Fchmod(fd, 0o640), "")
	ts := []unix.Timespec{{Sec: 1000000, Nsec: 0}, {Sec: 2000000, Nsec: 0}}
	step("futimens", unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH), "")
	step("fsetxattr", unix.Fsetxattr(fd, "user.k", []byte("v"), 0), "")
	buf := make([]byte, 16)
	n, err := unix.Fgetxattr(fd, "user.k", buf)
	step("fgetxattr", err, string(buf[:max(n, 0)]))
	n, err = unix.Pread(fd, buf, 0)
	step("pread", err, fmt.Sprintf("%q", buf[:max(n, 0)]))
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	step("fstat", err, fmt.Sprintf("mode=%o size=%d nlink=%d mtime=%d", st.Mode, st.Size, st.Nlink, st.Mtim.Sec))
	// Reopened through /proc: the same file.
	rfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		n, err = unix.Pread(rfd, buf, 0)
		unix.Close(rfd)
	}
	step("reopen", err, fmt.Sprintf("%q", buf[:max(n, 0)]))
	b, err := os.ReadFile(p)
	step("name", err, strings.TrimSpace(string(b)))
	return out
}

// TestUnlinkedOpenNlink: fstat(2) on a lower file opened read-only, for
// writing, and written, whose name was then removed, shows the link count
// and size the kernel overlay's does (0 for a writer, whose open copied
// the file up). Opened without a request (noopen=1, the default),
// goverlay cannot tell a reader from a writer and shows 0 for both, as a
// local filesystem does; the kernel overlay shows the lower file's 1 to a
// reader (ovl_getattr()). With noopen=0 every case is the kernel's.
func TestUnlinkedOpenNlink(t *testing.T) {
	testutil.RequireRoot(t)
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("f", "lower data\n", 0o644).File("other", "other\n", 0o644)
	}
	opens := []struct {
		name  string
		flags int
		write bool
	}{
		{"read-only", unix.O_RDONLY, false},
		{"read-write", unix.O_RDWR, false},
		{"write-only", unix.O_WRONLY, false},
		{"written", unix.O_RDWR, true},
	}
	steps := func(t *testing.T, mnt, how string, flags int, write bool) string {
		p := filepath.Join(mnt, "f")
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open %s: %v", p, err)
		}
		defer unix.Close(fd)
		if write {
			if _, err := unix.Pwrite(fd, []byte("LOWER DATA AND MORE\n"), 0); err != nil {
				t.Fatal(err)
			}
		}
		removeName(t, mnt, p, how)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatalf("fstat: %v", err)
		}
		return fmt.Sprintf("nlink=%d size=%d", st.Nlink, st.Size)
	}
	for _, noopen := range []string{"1", "0"} {
		for _, how := range []string{"unlink", "rename-over"} {
			for _, o := range opens {
				t.Run(fmt.Sprintf("noopen=%s/%s/%s", noopen, how, o.name), func(t *testing.T) {
					t.Parallel()
					ks, gs := newStack(t, 1, build), newStack(t, 1, build)
					kmnt, g := mountK(t, ks), mountG(t, gs, "-o", "noopen="+noopen)
					want := steps(t, kmnt, how, o.flags, o.write)
					if noopen == "1" && o.flags == unix.O_RDONLY {
						if want != "nlink=1 size=11" {
							t.Fatalf("kernel overlay: %s, want nlink=1 size=11", want)
						}
						want = "nlink=0 size=11" // the difference documented above
					}
					if got := steps(t, g.Dir, how, o.flags, o.write); got != want {
						t.Errorf("goverlay: fstat after %s gives %s, kernel overlay %s", how, got, want)
					}
				})
			}
		}
	}
}
