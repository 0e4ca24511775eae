package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/cmd/internal/mountclient"
	"github.com/goverlay/goverlay/overlay"
	"github.com/goverlay/goverlay/overlay/rundir"
)

// The shared mount server (-o daemon=shared).
//
// By default each mount has a process of its own: goverlay re-executes
// itself (daemon.go), so a mount costs two Go starts, and each process
// its own runtime, heap and threads. With daemon=shared, one process per
// user serves every such mount: the goverlay command sends its arguments
// to the server over a unix socket and waits for the same report the
// background child gives ("ok", or "fail CODE\nMESSAGE"); the server
// validates, mounts in-process and serves. A server sees the world of
// the command that started it, so there is one per user namespace and
// mount namespace (and per goverlay binary: another build is another
// server), its socket in the user's runtime directory
// (rundir.Runtime), which no other user may write:
//
//	server-USERNS-MNTNS-DEV-INO.sock  the listening socket
//	server-USERNS-MNTNS-DEV-INO.lock  flock(2)ed around connecting and exiting
//	server-USERNS-MNTNS-DEV-INO.log   the server's stderr
//
// The command takes the lock, connects, and lets go. If no server
// answers, it binds and listens on the socket itself and starts the
// server with the listening socket (fd 3) and the directory (fd 4), then
// connects: the connection waits in the backlog until the server accepts
// it. A server whose last mount has ended takes the lock, answers a
// connection that is already waiting, or else removes its socket and
// exits; so a command never connects to a server that is going away.
//
// A mount's requests are served with overlay.Options.Recover: a panic in
// one mount answers that request with EIO instead of ending every mount.
// Each mount's caches share the process's fds (serverFDBudget). SIGINT,
// SIGTERM and SIGHUP to the server unmount every mount it serves, as they
// unmount a daemon's only one.

const (
	// serverCommand is the server's first argument; it is not for
	// running by hand.
	serverCommand = "mount-server"
	// serverEnv names the listening socket's fd (3) in the server.
	serverEnv = "GOVERLAY_SERVER_FD"
	// serverListenFD and serverDirFD are the fds the server inherits.
	serverListenFD = 3
	serverDirFD    = 4
	// serverReadTimeout bounds how long a client may take to send its
	// request.
	serverReadTimeout = 10 * time.Second
)

// mountShared is the command's side: it has the user's server mount
// args, starting the server if there is none, and returns the exit code.
func mountShared(args []string, stderr io.Writer) int {
	conn, logPath, err := dialServer()
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: daemon=shared: %v; nothing is mounted (without daemon=shared the mount gets a process of its own)\n", err)
		return exitDaemon
	}
	defer conn.Close()
	wd, _ := os.Getwd() // "" makes a relative path an error in the server
	return mountclient.Mount(conn, mountclient.Request{Args: args, Cwd: wd}, logPath, stderr)
}

// dialServer connects to the user's server, starting it if none answers.
// It also returns the path of the server's log.
func dialServer() (*os.File, string, error) {
	dir, err := rundir.Runtime()
	if err != nil {
		return nil, "", fmt.Errorf("no directory for the mount server's socket: %w", err)
	}
	defer dir.Close()
	name, err := mountclient.Name("/proc/self/exe")
	if err != nil {
		return nil, "", err
	}
	logPath := filepath.Join(dir.Name(), name+".log")
	unlock, err := mountclient.Lock(dir, name)
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	conn, err := mountclient.Connect(dir, name)
	if err == nil {
		return conn, logPath, nil
	}
	if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ECONNREFUSED) {
		return nil, "", fmt.Errorf("cannot reach the mount server at %s: %w", filepath.Join(dir.Name(), name+".sock"), err)
	}
	if err := startServer(dir, name); err != nil {
		return nil, "", err
	}
	if conn, err = mountclient.Connect(dir, name); err != nil {
		return nil, "", fmt.Errorf("cannot reach the mount server just started at %s: %w", filepath.Join(dir.Name(), name+".sock"), err)
	}
	return conn, logPath, nil
}

// startServer listens on server name's socket in dir (replacing a stale
// one) and starts the server on it.
func startServer(dir *os.File, name string) error {
	sockName := name + ".sock"
	if err := unix.Unlinkat(int(dir.Fd()), sockName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cannot remove the stale socket %s: %w", filepath.Join(dir.Name(), sockName), err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cannot make the mount server's socket: %w", err)
	}
	ln := os.NewFile(uintptr(fd), "mount-server-listener")
	defer ln.Close() // the server holds its own copy
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: rundir.SocketPath(dir, sockName)}); err != nil {
		return fmt.Errorf("cannot bind %s: %w", filepath.Join(dir.Name(), sockName), err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		return fmt.Errorf("cannot listen on %s: %w", filepath.Join(dir.Name(), sockName), err)
	}
	// The server outlives this command and its caller's pipes: its
	// stdin and stdout are /dev/null, and its stderr a file beside the
	// socket, where a crash of the whole server leaves its trace. A
	// mount's --log gets what concerns that mount.
	lfd, err := unix.Openat(int(dir.Fd()), name+".log", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("cannot open the mount server's log %s: %w", filepath.Join(dir.Name(), name+".log"), err)
	}
	logFile := os.NewFile(uintptr(lfd), name+".log")
	defer logFile.Close()
	closeInheritedOnExec()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{os.Args[0], serverCommand},
		Env:         environWith(serverEnv, strconv.Itoa(serverListenFD)),
		Stderr:      logFile,
		ExtraFiles:  []*os.File{ln, dir},
		Dir:         "/",
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		unix.Unlinkat(int(dir.Fd()), sockName, 0)
		return fmt.Errorf("cannot start the mount server: %w", err)
	}
	cmd.Process.Release()
	return nil
}

// server is the shared mount server's state.
type server struct {
	ln   *net.UnixListener
	dir  *os.File
	name string
	uid  int
	// sock is the socket file's stat when the server started.
	sock unix.Stat_t
	// fdBudget is each mount's share of the fds (serverFDBudget).
	fdBudget int

	mu sync.Mutex
	// active counts the requests being answered and the mounts being
	// served; the server may exit when it is 0.
	active int
	// stopping is set by a signal: no new mounts, and the served ones
	// are unmounted.
	stopping os.Signal
	// mounts hold each served mount's signal channel.
	mounts map[chan os.Signal]struct{}
	// settle returns the free memory once mounts and unmounts pause
	// (quiet).
	settle *time.Timer
}

// settleAfter is how long mounts and unmounts must pause before the
// server gives its free memory back. Setting up a mount leaves garbage
// (the parsed mount table, the layers' probes) that the heap keeps, and
// the Go runtime returns freed pages to the kernel only slowly: a hundred
// idle mounts measured 28 or 47 MiB of PSS depending on where the
// collector stood (docs/BENCHMARKS.md, "One process for all mounts").
const settleAfter = 500 * time.Millisecond

// quiet (re)starts the wait after which the server collects its garbage
// and returns its free memory to the kernel (debug.FreeOSMemory): one
// collection after each burst of mounts or unmounts, none while they
// come.
//
// Preconditions: s.mu is held.
func (s *server) quiet() {
	if s.settle == nil {
		s.settle = time.AfterFunc(settleAfter, debug.FreeOSMemory)
		return
	}
	s.settle.Reset(settleAfter)
}

// runServer is the server process: started by startServer, it serves
// until its last mount has ended. It returns the exit code.
func runServer(args []string, stderr io.Writer) int {
	v, set := os.LookupEnv(serverEnv)
	os.Unsetenv(serverEnv)
	var lst, dst unix.Stat_t
	if !set || v != strconv.Itoa(serverListenFD) || len(args) != 0 ||
		unix.Fstat(serverListenFD, &lst) != nil || lst.Mode&unix.S_IFMT != unix.S_IFSOCK ||
		unix.Fstat(serverDirFD, &dst) != nil || dst.Mode&unix.S_IFMT != unix.S_IFDIR {
		fmt.Fprintf(stderr, "goverlay: %s is the server of -o daemon=shared, which goverlay starts itself; it is not run by hand\n", serverCommand)
		return exitUsage
	}
	unix.CloseOnExec(serverListenFD)
	unix.CloseOnExec(serverDirFD)
	_ = os.WriteFile("/proc/self/comm", []byte("goverlay"), 0)
	// What goes wrong before the first mount goes to stderr, the log
	// beside the socket; the waiting command sees the server end.
	name, err := mountclient.Name("/proc/self/exe")
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: %s: %v\n", serverCommand, err)
		return exitDaemon
	}
	lf := os.NewFile(serverListenFD, "mount-server")
	l, err := net.FileListener(lf)
	lf.Close() // FileListener holds a duplicate
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: %s: the inherited socket: %v\n", serverCommand, err)
		return exitDaemon
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		fmt.Fprintf(stderr, "goverlay: %s: the inherited socket is not a unix socket\n", serverCommand)
		return exitDaemon
	}
	// The socket is removed by exit(), under the lock; not by Close.
	ul.SetUnlinkOnClose(false)
	s := &server{ln: ul, dir: os.NewFile(serverDirFD, "runtime-dir"), name: name, uid: os.Geteuid(),
		mounts: map[chan os.Signal]struct{}{}, fdBudget: serverFDBudget()}
	// The command that started us bound the socket and holds the lock
	// until it has connected: the file there now is ours.
	unix.Fstatat(serverDirFD, name+".sock", &s.sock, unix.AT_SYMLINK_NOFOLLOW)
	return s.run()
}

// run accepts connections until the server may exit.
func (s *server) run() int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, stopSignals...)
	signal.Ignore(unix.SIGPIPE)
	go func() {
		for sig := range sigs {
			s.stop(sig)
		}
	}()
	for {
		c, err := s.ln.AcceptUnix()
		if err == nil {
			s.admit(c)
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			// The listener is broken; serve the mounts there are,
			// then go.
			s.waitIdle()
			return exitDaemon
		}
		if s.exit() {
			return exitOK
		}
	}
}

// admit answers c if it comes from this server's user.
func (s *server) admit(c *net.UnixConn) {
	if cred, err := overlay.PeerCred(c); err != nil || int(cred.Uid) != s.uid {
		c.Close()
		return
	}
	s.mu.Lock()
	s.active++
	s.quiet()
	s.mu.Unlock()
	go s.handle(c)
}

// done ends a request or a mount; at the last one it wakes run, which
// decides whether to exit.
func (s *server) done() {
	s.mu.Lock()
	s.active--
	s.quiet()
	if s.active == 0 {
		s.ln.SetDeadline(time.Now())
	}
	s.mu.Unlock()
}

// waitIdle waits for the last mount to end.
func (s *server) waitIdle() {
	for {
		s.mu.Lock()
		n := s.active
		s.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exit is called when the accept loop was woken: if nothing is active,
// it takes the lock and answers a connection that is already waiting, or
// else removes the socket and reports that the server may exit.
func (s *server) exit() bool {
	s.ln.SetDeadline(time.Time{})
	s.mu.Lock()
	busy := s.active > 0
	s.mu.Unlock()
	if busy {
		return false
	}
	unlock, err := mountclient.Lock(s.dir, s.name)
	if err != nil {
		// Without the lock a command may be connecting now: stay.
		return false
	}
	defer unlock()
	if c := s.acceptWaiting(); c != nil {
		s.admit(c)
		return false
	}
	// Remove the socket if it is still ours: a command that found it
	// dead may have put another in its place.
	sockName := s.name + ".sock"
	var there unix.Stat_t
	if unix.Fstatat(int(s.dir.Fd()), sockName, &there, unix.AT_SYMLINK_NOFOLLOW) == nil && there.Ino == s.sock.Ino && there.Dev == s.sock.Dev {
		unix.Unlinkat(int(s.dir.Fd()), sockName, 0)
	}
	s.ln.Close()
	return true
}

// acceptWaiting accepts a connection already in the backlog, without
// waiting for one.
func (s *server) acceptWaiting() *net.UnixConn {
	raw, err := s.ln.SyscallConn()
	if err != nil {
		return nil
	}
	nfd := -1
	raw.Read(func(fd uintptr) bool {
		nfd, _, _ = unix.Accept4(int(fd), unix.SOCK_CLOEXEC)
		return true // one try, no waiting
	})
	if nfd < 0 {
		return nil
	}
	f := os.NewFile(uintptr(nfd), "mount-client")
	c, err := net.FileConn(f)
	f.Close() // FileConn holds a duplicate
	if err != nil {
		return nil
	}
	uc, _ := c.(*net.UnixConn)
	return uc
}

// stop handles a stop signal: no new mounts, and every served one is
// unmounted.
func (s *server) stop(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = sig
	for ch := range s.mounts {
		select {
		case ch <- sig:
		default:
		}
	}
	if s.active == 0 {
		s.ln.SetDeadline(time.Now())
	}
}

// handle answers one command: it mounts and serves, or reports why not.
func (s *server) handle(c *net.UnixConn) {
	defer s.done()
	defer c.Close()
	rep := &reporter{pipe: c, stderr: io.Discard, shared: true}
	c.SetReadDeadline(time.Now().Add(serverReadTimeout))
	req, err := mountclient.ReadRequest(c)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		rep.fail(failf(exitDaemon, "the mount server could not read the request: %w", err))
		return
	}
	sigs := make(chan os.Signal, 2)
	s.mu.Lock()
	stopping := s.stopping
	if stopping == nil {
		s.mounts[sigs] = struct{}{}
	}
	s.mu.Unlock()
	if stopping != nil {
		rep.fail(failf(exitDaemon, "the mount server is stopping (%v); mount again once it has exited", stopping))
		return
	}
	defer func() {
		s.mu.Lock()
		delete(s.mounts, sigs)
		s.mu.Unlock()
	}()
	cfg, err := parseArgsAt(req.Args, func() (string, error) {
		if req.Cwd == "" {
			return "", errors.New("the command's working directory is unknown")
		}
		return req.Cwd, nil
	})
	if err != nil {
		rep.fail(err)
		return
	}
	if req.Warn {
		// goverlay-mount does not parse its arguments: it prints the
		// warnings the server sends it.
		mountclient.WriteWarnings(c, cfg.Warnings)
	}
	if err := validate(cfg); err != nil {
		rep.fail(err)
		return
	}
	logFile, logger, err := openLog(cfg, io.Discard)
	if err != nil {
		rep.fail(err)
		return
	}
	if logFile != nil {
		defer logFile.Close()
		for _, w := range cfg.Warnings {
			logger.Print(w)
		}
		rep.logf = logger.Printf
	}
	if cfg.Debug {
		logger.Printf("mounting: %v", cfg)
	}
	opts := overlayOptions(cfg, geteuid(), logger)
	opts.Shared, opts.Recover, opts.FDBudget = true, true, s.fdBudget
	serveMount(cfg, opts, logger, logFile, rep, sigs)
}

// serverMounts is how many busy mounts a server's fds are planned for.
const serverMounts = 64

// serverFDBudget is each mount's share of the server's fds: the caches
// that hold fds across requests size themselves from it
// (overlay.Options.FDBudget) as a lone daemon's do from RLIMIT_NOFILE,
// which Go has raised to its hard limit. They are caches: a mount beyond
// the 64th shrinks no one's, and they only fill with use.
func serverFDBudget() int {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil || rl.Cur == 0 {
		return 1024
	}
	return int(max(rl.Cur/serverMounts, 256))
}
