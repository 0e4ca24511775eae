package cli_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// sharedMount is one mount of TestSharedDaemon: its layers and pidfile.
type sharedMount struct {
	lower, upper, mnt, pidfile string
}

// newSharedMount makes fresh layers (the lower with "file") for one mount.
func newSharedMount(t *testing.T, name string) sharedMount {
	t.Helper()
	base := filepath.Join(t.TempDir(), name)
	l := testutil.NewLayer(t, filepath.Join(base, "lower"))
	l.File("file", name+"\n", 0o644)
	m := sharedMount{lower: l.Root, upper: filepath.Join(base, "upper"), mnt: filepath.Join(base, "mnt"), pidfile: filepath.Join(base, "pid")}
	for _, d := range []string{m.upper, filepath.Join(base, "work"), m.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if testutil.IsMounted(m.mnt) {
			unix.Unmount(m.mnt, unix.MNT_DETACH)
		}
	})
	return m
}

// args is the command line that mounts m through the shared server.
func (m sharedMount) args() []string {
	return []string{"-o", "lowerdir=" + m.lower + ",upperdir=" + m.upper + ",workdir=" + filepath.Join(filepath.Dir(m.upper), "work") + ",daemon=shared",
		"--pidfile", m.pidfile, m.mnt}
}

// pid is the serving process's PID from m's pidfile.
func (m sharedMount) pid(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile(m.pidfile)
	if err != nil {
		t.Fatalf("pidfile of %s: %v", m.mnt, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("pidfile %s holds %q", m.pidfile, data)
	}
	return pid
}

// unmountShared unmounts dir, and any copy of its mount that another
// test's process (podman, unshare) took into its mount namespace: such a
// copy keeps the mount, and its layers, alive in the server.
func unmountShared(t *testing.T, dir string) {
	t.Helper()
	dev := testutil.FuseDev(dir)
	if err := testutil.Umount(dir); err != nil {
		t.Fatal(err)
	}
	testutil.DetachCopiesAt(t, dir, dev)
}

// serverSockets lists the shared servers' sockets in root's runtime
// directory.
func serverSockets(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir("/run/goverlay")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "server-") && strings.HasSuffix(e.Name(), ".sock") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestSharedDaemon: with -o daemon=shared one process serves every mount;
// each mount is live when its command returns and writes its own upper
// layer; a refused mount is reported by its command and leaves the others
// alone; the server outlives an unmount while it serves other mounts and
// exits with the last, removing its socket; SIGTERM unmounts every mount
// it serves. Not parallel: every shared mount of this test binary meets
// in one server, whose life the test follows.
func TestSharedDaemon(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	socketsBefore := serverSockets(t)

	// Three commands at once, with no server yet: one starts it, and
	// all three mounts are served by it.
	ms := []sharedMount{newSharedMount(t, "one"), newSharedMount(t, "two"), newSharedMount(t, "three")}
	errs := make([]string, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := exec.Command(testutil.Binary(t), m.args()...).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Sprintf("goverlay %s: %v: %s", strings.Join(m.args(), " "), err, out)
				return
			}
			// Live when the command returns.
			want := filepath.Base(filepath.Dir(m.mnt)) + "\n"
			if data, err := os.ReadFile(filepath.Join(m.mnt, "file")); err != nil || string(data) != want {
				errs[i] = fmt.Sprintf("read %s right after the mount: %q, %v; want %q", m.mnt, data, err, want)
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Fatal(e)
		}
	}
	pid := ms[0].pid(t)
	for _, m := range ms[1:] {
		if p := m.pid(t); p != pid {
			t.Fatalf("pidfiles name PIDs %d and %d: want one server for every daemon=shared mount", pid, p)
		}
	}
	server, err := testutil.Track(pid, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if server.Alive() {
			server.Kill()
			t.Errorf("the shared server (PID %d) was still running at the end", pid)
		}
	})
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err != nil || exe != testutil.Binary(t) {
		t.Errorf("the server runs %q (%v), want %s", exe, err, testutil.Binary(t))
	}

	// Each mount writes its own upper layer.
	for i, m := range ms {
		if err := os.WriteFile(filepath.Join(m.mnt, "new"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range ms {
		if data, err := os.ReadFile(filepath.Join(m.upper, "new")); err != nil || string(data) != strconv.Itoa(i) {
			t.Errorf("%s/new: %q, %v; want %q", m.upper, data, err, strconv.Itoa(i))
		}
	}

	// A request that is not one is answered with a failure; the server
	// serves on.
	var sock string
	for _, name := range serverSockets(t) {
		if !slices.Contains(socketsBefore, name) {
			sock = filepath.Join("/run/goverlay", name)
		}
	}
	if sock == "" {
		t.Fatalf("no new server socket in /run/goverlay")
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("connect to the server's socket: %v", err)
	}
	c.Write([]byte("not a request\n"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasPrefix(string(reply), "fail ") {
		t.Errorf("the server answered a malformed request with %q, want a failure", reply)
	}

	// A mount the server refuses: the command says why, nothing is
	// mounted, and the server serves on.
	bad := newSharedMount(t, "bad")
	badArgs := bad.args()
	badArgs[1] = strings.Replace(badArgs[1], "lowerdir="+bad.lower, "lowerdir="+bad.lower+"-missing", 1)
	r := goverlay(t, badArgs...)
	if r.Code == 0 || !strings.Contains(r.Stderr, "does not exist") {
		t.Errorf("a missing lowerdir through the server: %s; want a non-zero exit saying it does not exist", r)
	}
	if testutil.IsMounted(bad.mnt) {
		t.Errorf("%s is mounted after a refused mount", bad.mnt)
	}

	// Relative paths are the command's, not the server's.
	rel := newSharedMount(t, "rel")
	cmd := exec.Command(testutil.Binary(t), "-o", "lowerdir=lower,upperdir=upper,workdir=work,daemon=shared", "mnt")
	cmd.Dir = filepath.Dir(rel.mnt)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("goverlay with relative paths from %s: %v: %s", cmd.Dir, err, out)
	}
	if data, err := os.ReadFile(filepath.Join(rel.mnt, "file")); err != nil || string(data) != "rel\n" {
		t.Errorf("the mount with relative paths reads %q, %v; want %q", data, err, "rel\n")
	}
	unmountShared(t, rel.mnt)

	// One unmount, and the same layers again at once on the same
	// mountpoint, as podman remounts a layer: the server does not
	// exit, so the command waits for the old mount to let go of its
	// layers, not for the process.
	unmountShared(t, ms[0].mnt)
	for range 3 {
		if r := goverlay(t, ms[0].args()...); r.Code != 0 {
			t.Fatalf("remount of %s right after its unmount: %s", ms[0].mnt, r)
		}
		unmountShared(t, ms[0].mnt)
	}
	// The others are served on; the pidfile goes with its mount.
	for end := time.Now().Add(testutil.DaemonExitTimeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ms[0].pidfile); os.IsNotExist(err) {
			break
		}
	}
	if _, err := os.Stat(ms[0].pidfile); !os.IsNotExist(err) {
		t.Errorf("the pidfile of the unmounted %s: %v; want it removed", ms[0].mnt, err)
	}
	if !server.Alive() {
		t.Fatalf("the server exited with two mounts left")
	}
	if data, err := os.ReadFile(filepath.Join(ms[1].mnt, "file")); err != nil || string(data) != "two\n" {
		t.Errorf("read %s after another mount ended: %q, %v", ms[1].mnt, data, err)
	}

	// SIGTERM unmounts the two left and ends the server, once no copy
	// of their mounts lives on in another test's mount namespace.
	devs := []uint64{testutil.FuseDev(ms[1].mnt), testutil.FuseDev(ms[2].mnt)}
	if err := server.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(testutil.DaemonExitTimeout); time.Now().Before(end) && (testutil.IsMounted(ms[1].mnt) || testutil.IsMounted(ms[2].mnt)); {
		time.Sleep(20 * time.Millisecond)
	}
	for i, m := range ms[1:] {
		if testutil.IsMounted(m.mnt) {
			t.Errorf("%s is still mounted after the server's SIGTERM", m.mnt)
		}
		testutil.DetachCopiesAt(t, m.mnt, devs[i])
	}
	if !server.Wait(testutil.DaemonExitTimeout) {
		t.Fatalf("the server still runs %v after SIGTERM", testutil.DaemonExitTimeout)
	}
	if ok, _, desc := server.Status(); !ok {
		t.Errorf("the server ended with %s, want exit 0", desc)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the server's socket %s is left behind (%v)", sock, err)
	}

	// The next mount starts a new server, which exits with its only
	// mount.
	again := newSharedMount(t, "again")
	if r := goverlay(t, again.args()...); r.Code != 0 {
		t.Fatalf("goverlay after the server ended: %s", r)
	}
	p2, err := testutil.Track(again.pid(t), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if p2.Alive() && again.pid(t) == pid {
		t.Errorf("the new mount is served by the old server's PID %d", pid)
	}
	unmountShared(t, again.mnt)
	if !p2.Wait(testutil.DaemonExitTimeout) {
		p2.Kill()
		t.Fatalf("the server still runs %v after its only mount ended", testutil.DaemonExitTimeout)
	}
	if ok, _, desc := p2.Status(); !ok {
		t.Errorf("the server ended with %s, want exit 0", desc)
	}
}

// TestSharedDaemonByHand: the server's command is refused when run by
// hand, with a clear message.
func TestSharedDaemonByHand(t *testing.T) {
	t.Parallel()
	r := goverlay(t, "mount-server")
	if r.Code == 0 || !strings.Contains(r.Stderr, "not run by hand") {
		t.Errorf("goverlay mount-server: %s; want a usage error", r)
	}
}

// TestGoverlayMount: goverlay-mount mounts through the shared server, as
// goverlay -o daemon=shared does. The first mount starts the server (it
// runs goverlay); the next is sent to it, with the server's warnings and
// failures printed by goverlay-mount, relative paths resolved against its
// directory; a command line that is not -o options and a mountpoint is
// goverlay's. The server exits with the last mount. Not parallel: the
// server is the one TestSharedDaemon follows.
func TestGoverlayMount(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	bin := testutil.MountBinary(t)
	socketsBefore := serverSockets(t)
	plain := func(m sharedMount, extra string) []string {
		return []string{"-o", "lowerdir=" + m.lower + ",upperdir=" + m.upper + ",workdir=" + filepath.Join(filepath.Dir(m.upper), "work") + extra, m.mnt}
	}
	run := func(dir string, args ...string) testutil.Result {
		t.Helper()
		return testutil.RunIn(t, cmdTimeout, dir, nil, bin, args...)
	}
	live := func(m sharedMount, name string) {
		t.Helper()
		if data, err := os.ReadFile(filepath.Join(m.mnt, "file")); err != nil || string(data) != name+"\n" {
			t.Fatalf("read %s right after goverlay-mount: %q, %v; want %q", m.mnt, data, err, name+"\n")
		}
	}

	first, second := newSharedMount(t, "first"), newSharedMount(t, "second")
	if r := run("/", plain(first, "")...); r.Code != 0 {
		t.Fatalf("goverlay-mount with no server: %s", r)
	}
	live(first, "first")
	var sock string
	for _, name := range serverSockets(t) {
		if !slices.Contains(socketsBefore, name) {
			sock = name
		}
	}
	if sock == "" {
		t.Fatalf("goverlay-mount started no server in /run/goverlay")
	}
	// The server runs: goverlay-mount sends it the mount itself,
	// executing nothing (strace sees one execve, its own), and prints
	// the warning the server sends back.
	trace := filepath.Join(t.TempDir(), "trace")
	r := testutil.RunIn(t, cmdTimeout, "/", nil, "strace", append([]string{"-f", "-qq", "-e", "trace=execve", "-o", trace, bin}, plain(second, ",bogus")...)...)
	if r.Code != 0 || !strings.Contains(r.Stderr, `unknown option "bogus" ignored`) {
		t.Fatalf("goverlay-mount with an unknown option: %s; want exit 0 and the warning", r)
	}
	live(second, "second")
	if tr, err := os.ReadFile(trace); err != nil || strings.Count(string(tr), "execve(") != 1 {
		t.Errorf("goverlay-mount with the server running executed (strace: %q, %v); want only its own execve", tr, err)
	}
	if now := serverSockets(t); len(now) != len(socketsBefore)+1 {
		t.Errorf("server sockets %v after two mounts, before %v: want one server", now, socketsBefore)
	}

	// A refused mount: goverlay's message and exit code, nothing mounted.
	bad := newSharedMount(t, "bad")
	args := plain(bad, "")
	args[1] = strings.Replace(args[1], "lowerdir="+bad.lower, "lowerdir="+bad.lower+"-missing", 1)
	if r := run("/", args...); r.Code != 2 || !strings.Contains(r.Stderr, "does not exist") {
		t.Errorf("goverlay-mount with a missing lowerdir: %s; want exit 2 saying it does not exist", r)
	}
	if testutil.IsMounted(bad.mnt) {
		t.Errorf("%s is mounted after a refused mount", bad.mnt)
	}

	// Relative paths are the command's.
	rel := newSharedMount(t, "rel")
	if r := run(filepath.Dir(rel.mnt), "-o", "lowerdir=lower,upperdir=upper,workdir=work", "mnt"); r.Code != 0 {
		t.Fatalf("goverlay-mount with relative paths: %s", r)
	}
	live(rel, "rel")

	// Anything else is goverlay's.
	if r := run("/", "--help"); r.Code != 0 || !strings.Contains(r.Stdout, "lowerdir") {
		t.Errorf("goverlay-mount --help: %s; want goverlay's help", r)
	}
	if r := run("/", "-o", "lowerdir=/x"); r.Code != 1 {
		t.Errorf("goverlay-mount without a mountpoint: %s; want goverlay's usage error (exit 1)", r)
	}

	// The server ends with its last mount.
	pidOf := func() int {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if exe, _ := os.Readlink("/proc/" + e.Name() + "/exe"); exe == testutil.Binary(t) && strings.Contains(string(cmdline), "mount-server") {
				pid, _ := strconv.Atoi(e.Name())
				return pid
			}
		}
		return 0
	}
	pid := pidOf()
	if pid == 0 {
		t.Fatalf("no mount server runs %s", testutil.Binary(t))
	}
	server, err := testutil.Track(pid, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []sharedMount{first, second, rel} {
		unmountShared(t, m.mnt)
	}
	if !server.Wait(testutil.DaemonExitTimeout) {
		server.Kill()
		t.Fatalf("the server still runs %v after its last mount ended", testutil.DaemonExitTimeout)
	}
	if _, err := os.Stat(filepath.Join("/run/goverlay", sock)); !os.IsNotExist(err) {
		t.Errorf("the server's socket %s is left behind (%v)", sock, err)
	}
}
