package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/cmd/internal/mountclient"
)

// Going to the background.
//
// fuse-overlayfs (through libfuse's fuse_daemonize) forks after the mount
// is live, so its caller may use the mountpoint as soon as it returns.
// containers/storage relies on that. A Go program cannot fork, so the
// parent re-executes itself with the same arguments and an inherited pipe
// (fd 3, named by GOVERLAY_DAEMON_FD); the child, in its own session,
// validates, mounts and then writes one report on the pipe:
//
//	"ok\n"                   the mount is live; the parent exits 0
//	"fail CODE\nMESSAGE"     nothing is mounted; the parent prints
//	                         "goverlay: MESSAGE" and exits with CODE
//
// If the pipe closes without a report, the child died; the parent says so
// and exits with exitDaemon.

const daemonEnv = "GOVERLAY_DAEMON_FD"

// startDaemon runs in the parent: it starts the child and waits for its
// report. It returns the exit code for the parent.
func startDaemon(cfg *config, stderr io.Writer) int {
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: cannot create a pipe for the background process: %v; use -f to stay in the foreground\n", err)
		return exitDaemon
	}
	env := environWith(daemonEnv, "3") // ExtraFiles[0] is fd 3 in the child
	cmd := &exec.Cmd{
		// /proc/self/exe is this very binary even if the file on disk
		// was replaced or removed meanwhile.
		Path: "/proc/self/exe",
		Args: os.Args,
		Env:  env,
		// Stdin and Stdout stay /dev/null. Stderr is shared until the
		// child detaches, so that a crash before the report is seen.
		Stderr:      os.Stderr,
		ExtraFiles:  []*os.File{w},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	closeInheritedOnExec()
	err = cmd.Start()
	w.Close() // only the child holds the write end now, so EOF means it is done
	if err != nil {
		r.Close()
		fmt.Fprintf(stderr, "goverlay: cannot start the background process: %v; use -f to stay in the foreground\n", err)
		return exitDaemon
	}
	msg, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	r.Close()

	code, text, ok := mountclient.ParseReport(msg)
	switch {
	case !ok:
		werr := cmd.Wait()
		where := "run with -f to see why"
		if cfg.LogFile != "" {
			where = "see " + show(cfg.LogFile) + " or run with -f"
		}
		fmt.Fprintf(stderr, "goverlay: the background process ended before the mount was live (%v); %s\n", werr, where)
		return exitDaemon
	case code == exitOK:
		// The child serves on; it is not ours to wait for.
		cmd.Process.Release()
		return exitOK
	default:
		cmd.Wait() // it exits right after reporting; do not leave a zombie
		fmt.Fprintf(stderr, "goverlay: %s\n", text)
		return code
	}
}

// environWith is this process's environment with name set to value,
// whatever it was: the fd a re-executed goverlay inherits.
func environWith(name, value string) []string {
	env := []string{name + "=" + value}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// closeInheritedOnExec keeps the fds our caller left open (beyond 0, 1 and 2)
// out of the daemon. The parent exits soon; the daemon would hold them for
// the life of the mount, and a caller waiting for EOF on one of them would
// hang the way podman would on our stderr.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// daemonPipe returns the report pipe if this process is the background
// child, nil otherwise. It accepts the variable only if it names an
// inherited pipe, so a stray GOVERLAY_DAEMON_FD in a user's environment
// cannot make goverlay write to some other file.
func daemonPipe() *os.File {
	v, set := os.LookupEnv(daemonEnv)
	if !set {
		return nil
	}
	// Do not hand the variable on to fusermount3 and friends.
	os.Unsetenv(daemonEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil
	}
	// Inherited fds are not close-on-exec; a fusermount3 holding the
	// write end would delay the parent's EOF.
	unix.CloseOnExec(fd)
	// Executing /proc/self/exe names the process "exe"; give it back its
	// name so that ps, pidof and pkill find it as they find a forked one.
	name := filepath.Base(os.Args[0])
	if len(name) > 15 { // TASK_COMM_LEN - 1
		name = name[:15]
	}
	_ = os.WriteFile("/proc/self/comm", []byte(name), 0)
	return os.NewFile(uintptr(fd), "goverlay-report")
}

// reporter tells whoever waits for the mount how it went: the parent
// through the pipe in the background, or stderr in the foreground.
type reporter struct {
	pipe   io.WriteCloser // nil in the foreground
	stderr io.Writer
	logf   func(format string, a ...any) // also records failures; may be nil
	// shared: the report goes to a client of the shared mount server,
	// whose stdio was detached when it started.
	shared bool
}

// fail reports err and returns the exit code to use.
func (r *reporter) fail(err error) int {
	code := exitCodeOf(err)
	if code == exitOK {
		code = exitMount
	}
	if r.logf != nil {
		r.logf("%v", err)
	}
	if r.pipe != nil {
		fmt.Fprintf(r.pipe, "fail %d\n%s", code, err)
		r.pipe.Close()
		r.pipe = nil
		return code
	}
	fmt.Fprintf(r.stderr, "goverlay: %v\n", err)
	return code
}

// ready reports that the mount is live. In the background it first points
// stdin, stdout and stderr at /dev/null, or stdout and stderr at the log
// file: podman reads our stderr through a pipe until EOF and would hang if
// the daemon kept it open. Detaching before saying "ok" means the parent's
// stderr is released by the time the parent exits.
func (r *reporter) ready(logFile *os.File) error {
	if r.pipe == nil {
		return nil
	}
	defer func() { r.pipe.Close(); r.pipe = nil }()
	if !r.shared {
		if err := detachStdio(logFile); err != nil {
			return err
		}
	}
	_, err := io.WriteString(r.pipe, "ok\n")
	return err
}

// detachStdio replaces fds 0, 1 and 2. With a log file, output (including
// a Go panic trace) lands there instead of vanishing.
func detachStdio(logFile *os.File) error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	defer null.Close()
	if err := redirect(null, 0); err != nil {
		return err
	}
	if logFile != nil {
		return redirect(logFile, 1, 2)
	}
	return redirect(null, 1, 2)
}

// redirect points the given fds at f. Writes through os.Stdout and
// os.Stderr, and those of go-fuse's default logger, follow.
func redirect(f *os.File, fds ...int) error {
	for _, fd := range fds {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("redirect fd %d: %w", fd, err)
		}
	}
	return nil
}
