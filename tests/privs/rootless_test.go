package privs_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// rootlessCombos are the matrix's mount options rootless, where
// passthrough is never granted: the default (the writeback cache), and
// every write a request; each with NOSEC on and off.
var rootlessCombos = []string{
	"nosec=on",
	"nosec=off",
	"nosec=on,writeback=0",
	"nosec=off,writeback=0",
}

// nsScript runs as the test user in `unshare -Urm`, as rootless
// podman runs its mount program: it mounts goverlay and the kernel overlay
// (both with userxattr), says "ready", waits for a line on stdin and
// unmounts.
const nsScript = `set -e
"$GOVERLAY" -o "lowerdir=$GL,upperdir=$GU,workdir=$GW,userxattr,$GOPTS" --pidfile "$PIDFILE" "$GMNT"
mount -t overlay overlay -o "lowerdir=$KL,upperdir=$KU,workdir=$KW,userxattr" "$KMNT"
echo ready
read _ || true
umount "$KMNT"
umount "$GMNT"
`

// TestPrivMatrixRootless runs the matrix with both overlays mounted by an
// unprivileged user in a user namespace of its own (it is root there, over
// a namespace that maps only itself). The writers are that namespace's
// root, with and without CAP_FSETID: neither has CAP_FSETID where the
// kernel looks for it (the initial namespace), so set-id bits go on every
// write. /dev/fuse is made 0666 for the user, as udev leaves it on desktop
// distributions, when it is not already.
func TestPrivMatrixRootless(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tool := range []string{"unshare", "nsenter", "setpriv", "capsh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	helper(t)
	openDevFuse(t)
	for _, opts := range rootlessCombos {
		t.Run(subtestName(opts), func(t *testing.T) {
			t.Parallel()
			runRootlessMatrix(t, opts)
		})
	}
}

// openDevFuse makes /dev/fuse usable by every user (0666), saying so.
func openDevFuse(t *testing.T) {
	var st unix.Stat_t
	if err := unix.Stat("/dev/fuse", &st); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	if st.Mode&0o666 == 0o666 {
		return
	}
	if err := os.Chmod("/dev/fuse", 0o666); err != nil {
		t.Fatalf("chmod 0666 /dev/fuse: %v", err)
	}
	t.Logf("/dev/fuse was %04o: made it 0666 so that the unprivileged user can mount (udev's mode on desktop distributions); left so", st.Mode&0o7777)
}

func runRootlessMatrix(t *testing.T, goOpts string) {
	uid, gid := testutil.TestUser(t)
	base := t.TempDir()
	// The namespace shell must see what the writers use: nsenter runs them in
	// its namespaces by its PID, known once it started.
	var nsPID int
	nsenter := func(cmd []string) []string {
		return append([]string{"setpriv", "--clear-groups", "nsenter", "-t", strconv.Itoa(nsPID), "-U", "-m", "-S", "0", "-G", "0", "--"}, cmd...)
	}
	ws := []writer{
		{name: "nsroot", fsetid: false, capFsetid: true, root: true, uid: 0, gid: 0, diskGid: gid,
			argv: nsenter},
		{name: "nsroot-nofsetid", fsetid: false, capFsetid: false, root: true, uid: 0, gid: 0, diskGid: gid,
			argv: func(cmd []string) []string {
				return nsenter(append([]string{"capsh", "--drop=cap_fsetid", "--", "-c", `exec "$0" "$@"`}, cmd...))
			}},
	}
	// Files of a group the namespace does not map cannot be copied up
	// (the kernel overlay says EOVERFLOW, goverlay EACCES); rootless
	// layers have none, containers/storage maps every id of an image.
	var cs []cell
	for _, c := range cells(ws, gid) {
		if !c.k.groupRoot {
			cs = append(cs, c)
		}
	}
	gs := newStack(t, filepath.Join(base, "g"), matrixLower(t, cs, uid))
	ks := newStack(t, filepath.Join(base, "k"), matrixLower(t, cs, uid))
	gmnt, kmnt := filepath.Join(base, "gmnt"), filepath.Join(base, "kmnt")
	for _, d := range []string{gmnt, kmnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{gs.upper, gs.work, ks.upper, ks.work, gmnt, kmnt, base} {
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	testutil.OpenUp(t, gmnt)
	pidfile := filepath.Join(base, "daemon.pid")

	cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(gid), "--clear-groups",
		"unshare", "-Urm", "sh", "-c", nsScript)
	cmd.Env = append(os.Environ(), "GOVERLAY="+testutil.Binary(t), "GOPTS="+testutil.MaskOpt(t, goOpts), "PIDFILE="+pidfile,
		"GL="+gs.lower, "GU="+gs.upper, "GW="+gs.work, "GMNT="+gmnt,
		"KL="+ks.lower, "KU="+ks.upper, "KW="+ks.work, "KMNT="+kmnt, "GORACE=atexit_sleep_ms=0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// setpriv and unshare exec: the PID is the namespace shell's.
	nsPID = cmd.Process.Pid
	ended := make(chan error, 1)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-ended:
			if err != nil {
				t.Errorf("rootless shell: %v: %s", err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("rootless shell did not end: killing it and its daemon")
			cmd.Process.Kill()
			if b, err := os.ReadFile(pidfile); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			<-ended
		}
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
		io.Copy(io.Discard, stdout)
		ended <- cmd.Wait()
	}()
	select {
	case line := <-ready:
		if strings.TrimSpace(line) != "ready" {
			t.Fatalf("rootless shell did not mount: %q: %s", line, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("rootless shell: no mount after 60s: %s", stderr.String())
	}

	e := matrixEnv{
		gDir: gmnt, kDir: kmnt, gs: gs, ks: ks, rootless: true,
		// The mount is in the shell's mount namespace only: ask from
		// there, as the namespace's root (its owner).
		stats: func() testutil.Stats { return testutil.ReadStatsWith(t, gmnt, nsenter(nil)) },
		state: func(paths []string) map[string]fileState {
			var pairs [][2]string
			for _, p := range paths {
				pairs = append(pairs, [2]string{"state", p})
			}
			m := map[string]fileState{}
			for p, r := range runOps(t, ws[0], pairs) {
				m[p] = parseState(r)
			}
			return m
		},
	}
	runMatrixIn(t, goOpts, ws, cs, e)
}

// parseState reads the helper's state answer.
func parseState(r opResult) fileState {
	if !r.ok {
		return fileState{err: r.err}
	}
	f := strings.Fields(r.detail)
	if len(f) == 1 && f[0] == "absent" {
		return fileState{}
	}
	if len(f) != 2 {
		return fileState{err: "bad state " + r.detail}
	}
	m, err := strconv.ParseUint(f[0], 8, 32)
	if err != nil {
		return fileState{err: "bad state " + r.detail}
	}
	return fileState{exists: true, mode: uint32(m), cap: f[1] == "cap"}
}

// rootlessControls checks that the kernel overlay did what a rootless
// mount does in a few cells, so that a broken setup fails.
func rootlessControls(t *testing.T, k map[string]fileState) {
	t.Helper()
	want := []struct {
		cell string
		mode uint32
	}{
		// Root of a user namespace has no CAP_FSETID where the kernel
		// looks (capable()).
		{"w-nsroot__op-write__f-suid", 0o777},
		{"w-nsroot__op-write__f-sgid-gx", 0o777},
		{"w-nsroot-nofsetid__op-write__f-suid", 0o777},
		// In the file's group: kept.
		{"w-nsroot__op-write__f-sgid-nogx", 0o2766},
		{"w-nsroot__op-write__f-plain", 0o777},
	}
	for _, w := range want {
		got, ok := k[w.cell]
		if !ok {
			t.Errorf("control: no cell %s", w.cell)
			continue
		}
		if !got.exists || got.mode != w.mode {
			t.Errorf("control: %s on the rootless kernel overlay is %v, expected %04o: the setup does not test what it says", w.cell, got, w.mode)
		}
	}
}
