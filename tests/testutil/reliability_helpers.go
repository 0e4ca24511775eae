package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil/uringswitch"
)

// Helpers of the reliability and security tests (tests/reliability): a
// mount with a changed environment, a daemon killed on purpose, the
// daemon's resource use, a goroutine dump of a daemon that stopped
// answering, and operations run with another user's credentials.

// MountConfig is how MountWith starts the binary beyond Options.
type MountConfig struct {
	// Env entries are added to the environment of the mount command and
	// so of the daemon (e.g. "GOMAXPROCS=1").
	Env []string
	// Wrap is a command line the binary is run under, e.g.
	// {"prlimit", "--nofile=256:256", "--"}; it must exec the binary in
	// place (the daemon is found by its --pidfile).
	Wrap []string
	// Mountpoint, if set, is the directory to mount on (it must exist);
	// otherwise a new one is made under t.TempDir().
	Mountpoint string
	// Uring mounts while the kernel offers FUSE over io_uring and checks
	// that the mount took it (as every mount does after OfferUring).
	Uring bool
}

// MountWith is Mount with the daemon's environment or a wrapper command
// changed. It makes a mountpoint under t.TempDir() and runs the binary;
// the readiness handshake is the command returning 0, the daemon's PID
// comes from --pidfile, and when the test ends the mount is unmounted,
// the daemon must exit 0 and nothing may be left mounted. The race-enabled
// binary's one-second sleep at exit (GORACE atexit_sleep_ms) is turned
// off, in the mount command that exits once the mount is live and in the
// daemon: tests that mount hundreds of times would spend minutes in it.
// Race reports still go to the files the harness shows.
func MountWith(t testing.TB, o Options, c MountConfig) *Mounted {
	t.Helper()
	RequireRoot(t)
	bin := Binary(t)
	LeakCheck(t)
	base := t.TempDir()
	m := &Mounted{
		Dir:     filepath.Join(base, "mnt"),
		OutFile: filepath.Join(base, "mount.out"),
	}
	if c.Mountpoint != "" {
		m.Dir = c.Mountpoint
	} else if err := os.Mkdir(m.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pidfile := filepath.Join(base, "daemon.pid")
	args := []string{"-o", o.OptString(), "--pidfile", pidfile}
	if SupportsFlag(t, "--log") {
		m.LogFile = filepath.Join(base, "daemon.log")
		args = append(args, "--log", m.LogFile)
	}
	// Before the test's own options, so that a mask= of the test's
	// wins (the last one does).
	args = append(args, MaskArgs(t)...)
	args = append(args, OptionsArgs()...)
	args = append(args, o.Extra...)
	args = append(args, m.Dir)

	trackMount(m.Dir)
	t.Cleanup(func() { m.finish(t, true, false) })

	out, err := os.Create(m.OutFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), mountTimeout)
	defer cancel()
	argv := append(append(append([]string{}, c.Wrap...), bin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(append(os.Environ(), "GORACE=log_path="+filepath.Join(base, "race")+" atexit_sleep_ms=0"), c.Env...)
	uring := c.Uring || uringMounts.Load()
	if uring {
		WithUringOffered(t, func() { err = cmd.Run() })
	} else {
		uringswitch.Withheld(t, func() { err = cmd.Run() })
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (no return within %v)", err, mountTimeout)
		}
		if !m.adoptPidfile(t, pidfile) {
			if pids := FindProcs(bin, m.Dir); len(pids) == 1 {
				if p, err := Track(pids[0], t.Name()); err == nil {
					m.PID, m.proc = pids[0], p
				}
			}
		}
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, m.logs())
	}
	if !m.adoptPidfile(t, pidfile) {
		t.Fatalf("goverlay returned 0 but wrote no PID to --pidfile %s\n%s", pidfile, m.logs())
	}
	if !IsMounted(m.Dir) {
		t.Fatalf("goverlay returned 0 but %s is not in /proc/self/mountinfo\n%s", m.Dir, m.logs())
	}
	m.recordDev()
	if uring {
		CheckUring(t, m)
	}
	return m
}

// Crash kills the daemon with SIGKILL (through its pidfd, so never a
// recycled PID) and waits for it to die. The mount stays behind, dead:
// the test examines it and detaches it; whatever is still mounted at the
// end of the test is detached quietly. It fails the test unless the
// daemon was alive and died of the SIGKILL.
func (m *Mounted) Crash(t testing.TB) {
	t.Helper()
	m.abandon(t)
	if m.proc == nil {
		t.Fatalf("Crash: no daemon PID for %s", m.Dir)
	}
	if err := m.proc.Signal(unix.SIGKILL); err != nil {
		t.Fatalf("Crash: SIGKILL daemon %d: %v", m.PID, err)
	}
	if !m.proc.Wait(DaemonExitTimeout) {
		t.Fatalf("Crash: daemon %d still alive %v after SIGKILL", m.PID, DaemonExitTimeout)
	}
	m.proc.mu.Lock()
	known, ws := m.proc.known, m.proc.status
	m.proc.mu.Unlock()
	if known && !(ws.Signaled() && ws.Signal() == unix.SIGKILL) {
		_, _, desc := m.proc.Status()
		t.Errorf("Crash: daemon %d: %s, want killed by SIGKILL", m.PID, desc)
	}
}

// abandon takes the mount out of the end-of-test checks of Mount (which
// want a clean exit) and detaches it at the end if the test did not. A
// data race the race-enabled daemon reported before it was killed still
// fails the test.
func (m *Mounted) abandon(t testing.TB) {
	m.mu.Lock()
	m.done = true
	m.mu.Unlock()
	t.Cleanup(func() {
		if IsMounted(m.Dir) {
			lazyUnmount(m.Dir)
		}
		if m.proc != nil && m.proc.Alive() {
			m.proc.Kill()
		}
		if races, _ := filepath.Glob(filepath.Join(filepath.Dir(m.OutFile), "race.*")); len(races) > 0 {
			t.Errorf("the daemon of %s reported data races before it died:\n%s", m.Dir, m.logs())
		}
	})
}

// Logs is what the mount command printed and the daemon's log.
func (m *Mounted) Logs() string { return m.logs() }

// GoroutineDump sends SIGQUIT to a daemon that stopped answering: the Go
// runtime writes every goroutine's stack to its stderr, which is the --log
// file, and exits. It returns the log (empty without --log). The dead
// mount is left to the test, as with Crash.
func (m *Mounted) GoroutineDump(t testing.TB) string {
	t.Helper()
	m.abandon(t)
	if m.proc == nil {
		return "(no daemon PID)"
	}
	if err := m.proc.Signal(unix.SIGQUIT); err != nil {
		return fmt.Sprintf("(SIGQUIT daemon %d: %v)", m.PID, err)
	}
	if !m.proc.Wait(DaemonExitTimeout) {
		m.proc.Kill()
	}
	return m.logs()
}

// Watchdog runs fn and returns once it does. If fn has not returned after
// d, the daemon is taken to have stopped answering: it gets SIGQUIT, which
// dumps its goroutines to the --log file and, by ending the daemon, aborts
// the FUSE connection so that fn's blocked calls return; the test then
// fails with the dump.
func (m *Mounted) Watchdog(t testing.TB, d time.Duration, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	dump := m.GoroutineDump(t)
	// The connection is gone with the daemon: fn's calls fail now.
	lazyUnmount(m.Dir)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		dump += "\n(the test's own goroutines did not return after the daemon died either)"
	}
	t.Fatalf("no progress within %v: the daemon %d stopped answering (deadlock?); SIGQUIT dump:\n%s", d, m.PID, dump)
}

// ProcFDs counts the open file descriptors of process pid.
func ProcFDs(pid int) (int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}

// ProcRSS is the resident set size of process pid in KiB (VmRSS).
func ProcRSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, errors.New("no VmRSS in /proc/" + strconv.Itoa(pid) + "/status")
}

// DropCaches writes 2 to /proc/sys/vm/drop_caches: the kernel frees the
// dentries and inodes it can, and so sends FUSE FORGETs for them.
func DropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
}

// AsUser runs fn on an OS thread of its own whose effective (and so
// filesystem) user and group IDs are uid and gid, with groups as the
// supplementary groups and, uid being non-zero, no effective
// capabilities. Credentials are per thread in Linux; the raw syscalls
// change only this one (Go's syscall.Setuid would change all). The thread
// is never handed back to the scheduler: it ends with the goroutine, so
// its credentials cannot leak into other code, and the runtime does not
// start new threads from a locked one.
func AsUser(uid, gid int, groups []int, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread exits with this goroutine.
		gs := make([]uint32, len(groups))
		for i, g := range groups {
			gs[i] = uint32(g)
		}
		var gp unsafe.Pointer
		if len(gs) > 0 {
			gp = unsafe.Pointer(&gs[0])
		}
		_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gs)), uintptr(gp), 0)
		runtime.KeepAlive(gs)
		if e != 0 {
			errc <- fmt.Errorf("setgroups: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
			errc <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			errc <- fmt.Errorf("setresuid: %w", e)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}
