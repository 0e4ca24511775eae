package containers_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// rootlessScript runs in `unshare -Urm` as the unprivileged user, where
// it is root over a user namespace that maps only itself: it mounts PROG
// with userxattr, changes the tree and unmounts. $1 is the program, $2 its
// extra options, $3 the pidfile option ("" for fuse-overlayfs).
const rootlessScript = `set -e
cd "$BASE"
"$1" -o "lowerdir=lower,upperdir=upper,workdir=work$2" $3 mnt
# goverlay removes its pidfile when it exits: keep the PID.
if [ -e daemon.pid ]; then cp daemon.pid daemon.pid.kept; fi
echo new > mnt/new.txt
echo appended >> mnt/file.txt
rm mnt/gone.txt
rm -r mnt/dir
mkdir mnt/dir
echo fresh > mnt/dir/fresh.txt
mv mnt/keep mnt/keep.moved
find mnt | sort
cat mnt/file.txt
umount mnt
`

// copyFile copies src to dst with mode.
func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRootless mounts as an unprivileged user in `unshare -Urm`, the way
// rootless podman runs its mount program, with -o userxattr over layers
// owned by that user: /dev/fuse is opened to the user with an ACL for the
// test (and taken back). The upper layer must record the changes with
// user.overlay.* xattrs and no trusted.* ones, whiteouts as char 0/0 (the
// kernel allows unprivileged whiteouts since 5.8) or else .wh. files, and
// every file owned by the user. fuse-overlayfs runs the same script as a
// reference for the merged view.
func TestRootless(t *testing.T) {
	testutil.RequireRoot(t)
	lookTools(t, map[string]string{"unshare": "util-linux", "setpriv": "util-linux", "setfacl": "acl", "getfacl": "acl"})
	uid, gid := testutil.TestUser(t)
	user := strconv.Itoa(uid)

	// Open /dev/fuse to the user, and restore its ACL afterwards.
	before, err := exec.Command("getfacl", "-cp", "/dev/fuse").Output()
	if err != nil {
		t.Fatalf("getfacl /dev/fuse: %v", err)
	}
	if out, err := exec.Command("setfacl", "-m", "u:"+user+":rw", "/dev/fuse").CombinedOutput(); err != nil {
		t.Fatalf("setfacl -m u:%s:rw /dev/fuse: %v: %s", user, err, out)
	}
	t.Cleanup(func() {
		restore := exec.Command("setfacl", "--set-file=-", "/dev/fuse")
		restore.Stdin = strings.NewReader(string(before))
		if out, err := restore.CombinedOutput(); err != nil {
			t.Errorf("restoring the ACL of /dev/fuse: %v: %s", err, out)
		}
		if after, _ := exec.Command("getfacl", "-cp", "/dev/fuse").Output(); string(after) != string(before) {
			t.Errorf("/dev/fuse's ACL is %q after the test, was %q", after, before)
		}
	})

	// The race build, copied where the user can run it.
	race := testutil.Binary(t)
	progs := []mountProgram{{"goverlay", ""}}
	if _, err := os.Stat(fuseOverlayfs); err == nil {
		progs = append(progs, mountProgram{"fuse-overlayfs", fuseOverlayfs})
	}
	outputs := map[string]string{}
	for _, prog := range progs {
		t.Run(prog.name, func(t *testing.T) {
			base := t.TempDir()
			testutil.OpenUp(t, base)
			if err := os.Chmod(base, 0o755); err != nil {
				t.Fatal(err)
			}
			extra, pidOpt := ",userxattr", ""
			if prog.name == "goverlay" {
				prog.path = filepath.Join(base, "goverlay")
				copyFile(t, race, prog.path, 0o755)
				pidOpt = "--pidfile=" + filepath.Join(base, "daemon.pid")
			} else {
				extra = "" // fuse-overlayfs picks user.* xattrs by itself when unprivileged
			}
			l := testutil.NewLayer(t, filepath.Join(base, "lower"))
			l.File("file.txt", "file\n", 0o644).File("gone.txt", "gone\n", 0o644).
				File("dir/old.txt", "old\n", 0o644).File("keep/inner.txt", "inner\n", 0o644)
			for _, d := range []string{"upper", "work", "mnt"} {
				if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", uid, gid), base).CombinedOutput(); err != nil {
				t.Fatalf("chown -R: %v: %s", err, out)
			}
			t.Cleanup(func() {
				for _, k := range waitProcsGone(prog.path, base+"/", exitDeadline, t.Name()) {
					t.Errorf("%s process left running: %s (killed)", prog.name, k)
				}
				if d := detach(base); len(d) > 0 {
					t.Errorf("mounts left under %s: %q", base, d)
				}
			})

			cmd := exec.Command("setpriv", "--reuid", user, "--regid", strconv.Itoa(gid), "--clear-groups",
				"unshare", "-Urm", "sh", "-c", rootlessScript, "sh", prog.path, extra, pidOpt)
			cmd.Env = append(os.Environ(), "BASE="+base, "GORACE=atexit_sleep_ms=0 log_path="+filepath.Join(base, "race"))
			out, err := cmd.CombinedOutput()
			t.Logf("%s in unshare -Urm as uid %d:\n%s", prog.name, uid, out)
			if err != nil {
				t.Fatalf("the rootless script failed: %v", err)
			}
			if prog.name == "goverlay" {
				checkRootlessDaemon(t, filepath.Join(base, "daemon.pid.kept"))
			}
			// The merged view, without the program's own notices.
			var view []string
			for _, line := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(line, "mnt") || line == "file" || line == "appended" {
					view = append(view, line)
				}
			}
			outputs[prog.name] = strings.Join(view, "\n")
			want := "mnt\nmnt/dir\nmnt/dir/fresh.txt\nmnt/file.txt\nmnt/keep.moved\nmnt/keep.moved/inner.txt\nmnt/new.txt\nfile\nappended"
			if outputs[prog.name] != want {
				t.Errorf("the merged view through %s differs (- want, + got):\n%s", prog.name,
					diffLines(strings.Split(want, "\n"), view))
			}
			upper := filepath.Join(base, "upper")
			t.Logf("%s: whiteout of gone.txt: %q; upper/dir xattrs: %s; upper/dir: %v; upper: %v; upper/keep.moved xattrs: %s", prog.name,
				whiteoutFormat(upper, "gone.txt"), xattrs(t, filepath.Join(upper, "dir")), names(t, filepath.Join(upper, "dir")),
				names(t, upper), xattrs(t, filepath.Join(upper, "keep.moved")))
			if prog.name == "goverlay" {
				checkRootlessUpper(t, upper, uid, gid)
			}
			if races, _ := filepath.Glob(filepath.Join(base, "race.*")); len(races) > 0 {
				for _, r := range races {
					data, _ := os.ReadFile(r)
					t.Errorf("the race detector reported:\n%s", data)
				}
			}
		})
	}
}

// checkRootlessDaemon waits for the daemon named in pidfile to exit after
// the unmount in the namespace, and checks it exited 0.
func checkRootlessDaemon(t *testing.T, pidfile string) {
	t.Helper()
	data, err := os.ReadFile(pidfile)
	if err != nil {
		t.Errorf("no pidfile: %v", err)
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Errorf("pidfile holds %q", data)
		return
	}
	p, err := testutil.Track(pid, t.Name())
	if err != nil {
		// Gone and reaped already (not our child): nothing to check.
		t.Logf("daemon %d: %v", pid, err)
		return
	}
	if !p.Wait(exitDeadline) {
		p.Kill()
		t.Errorf("the daemon outlived its unmount in the namespace by %v: killed it", exitDeadline)
		return
	}
	ok, known, desc := p.Status()
	switch {
	case ok:
		t.Logf("daemon %d: %s after the unmount in the namespace", pid, desc)
	case known:
		t.Errorf("daemon %d: %s, want exit status 0", pid, desc)
	default:
		t.Logf("daemon %d: %s", pid, desc)
	}
}

// checkRootlessUpper checks goverlay's upper layer after the script.
func checkRootlessUpper(t *testing.T, upper string, uid, gid int) {
	t.Helper()
	switch wf := whiteoutFormat(upper, "gone.txt"); wf {
	case "char 0/0", "aufs":
	default:
		t.Errorf("no whiteout for gone.txt in upper (%q)", wf)
	}
	if wf := whiteoutFormat(upper, "dir"); wf != "" {
		t.Errorf("the re-created dir left a whiteout (%s) instead of an opaque directory", wf)
	}
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(filepath.Join(upper, "dir"), "user.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("upper/dir: user.overlay.opaque = %q, %v; want \"y\"", buf[:max(n, 0)], err)
	}
	// redirect_dir=on (the default): the lower dir renamed in place.
	n, err = unix.Lgetxattr(filepath.Join(upper, "keep.moved"), "user.overlay.redirect", buf)
	if err != nil || !strings.HasSuffix(string(buf[:n]), "keep") {
		t.Errorf("upper/keep.moved: user.overlay.redirect = %q, %v; want a redirect to keep", buf[:max(n, 0)], err)
	}
	for _, x := range strings.Fields(xattrs(t, upper) + " " + xattrs(t, filepath.Join(upper, "dir")) + " " + xattrs(t, filepath.Join(upper, "keep.moved"))) {
		if strings.HasPrefix(x, "trusted.") {
			t.Errorf("a trusted.* xattr in the upper layer of a userxattr mount: %s", x)
		}
	}
	err = filepath.Walk(upper, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("upper %s is owned by %d:%d, want the user's %d:%d", p, st.Uid, st.Gid, uid, gid)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// xattrs lists p's xattrs with their values, "name=value ...".
func xattrs(t *testing.T, p string) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "(missing)"
		}
		return "(" + err.Error() + ")"
	}
	var out []string
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 256)
		m, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			out = append(out, name+"=("+err.Error()+")")
			continue
		}
		out = append(out, fmt.Sprintf("%s=%q", name, v[:m]))
	}
	return strings.Join(out, " ")
}

// names lists a directory's entries, with a c for char devices.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.Type()&os.ModeCharDevice != 0 {
			n += " (c)"
		}
		out = append(out, n)
	}
	return out
}
