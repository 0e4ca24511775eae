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
// for a file made in the mount and one copied up from a lower layer. Once
// closed, the file leaves nothing in the upper layer or the workdir.
func TestUnlinkedOpenFile(t *testing.T) {
	testutil.RequireRoot(t)
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("lower", "lower data\n", 0o644).File("other", "other\n", 0o644)
	}
	for _, pt := range []string{"on", "off"} {
		for _, how := range []string{"unlink", "rename-over"} {
			for _, which := range []string{"new", "lower"} {
				t.Run(fmt.Sprintf("passthrough=%s/%s/%s", pt, how, which), func(t *testing.T) {
					t.Parallel()
					start := time.Now()
					ks, gs := newStack(t, 1, build), newStack(t, 1, build)
					kmnt, g := mountK(t, ks), mountG(t, gs, "-o", "passthrough="+pt)
					kr := unlinkedSteps(t, kmnt, how, which)
					gr := unlinkedSteps(t, g.Dir, how, which)
					for i := range kr {
						if kr[i] != gr[i] {
							t.Errorf("goverlay %s, kernel overlay %s", gr[i], kr[i])
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
	switch how {
	case "unlink":
		err = unix.Unlink(p)
	case "rename-over":
		// Another file takes the name.
		other := filepath.Join(mnt, "other")
		err = unix.Rename(other, p)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", how, p, err)
	}
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
