// Command goverlay mounts an overlay filesystem with FUSE. Its command line
// is a drop-in for fuse-overlayfs (podman and buildah's mount_program) and
// also works as a mount helper for "mount -t fuse.goverlay".
package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program but for the exit: parse, validate, then either
// start the background process (parent) or mount and serve (foreground,
// or the background child).
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "stats":
			return runStats(args[1:], stdout, stderr)
		case "bench":
			return runBench(args[1:], stdout, stderr)
		}
	}
	if len(args) > 0 && args[0] == serverCommand {
		return runServer(args[1:], stderr)
	}
	pipe := daemonPipe()
	rep := &reporter{stderr: stderr}
	if pipe != nil {
		rep.pipe = pipe
	}

	cfg, err := parseArgs(args)
	if err != nil {
		return rep.fail(err)
	}
	switch {
	case cfg.Help:
		printHelp(stdout)
		return exitOK
	case cfg.Version:
		printVersion(stdout)
		return exitOK
	case cfg.OptionsMarkdown:
		printOptionsMarkdown(stdout)
		return exitOK
	}
	if pipe == nil {
		// The background child parses the same arguments; only the
		// process the user sees prints the warnings.
		for _, w := range cfg.Warnings {
			fmt.Fprintf(stderr, "goverlay: %s\n", w)
		}
	}
	if pipe == nil && cfg.background() && cfg.Shared {
		// The server validates, as the background child does.
		return mountShared(args, stderr)
	}
	// The child validates again: the parent's checks may be stale by
	// now, and the child is the one that mounts.
	if err := validate(cfg); err != nil {
		return rep.fail(err)
	}
	if pipe == nil && cfg.background() {
		return startDaemon(cfg, stderr)
	}
	if pipe != nil {
		// Like fuse_daemonize: do not keep the caller's directory
		// busy. Every path is absolute by now.
		_ = os.Chdir("/")
	}

	logFile, logger, err := openLog(cfg, stderr)
	if err != nil {
		return rep.fail(err)
	}
	if logFile != nil {
		defer logFile.Close()
		if pipe != nil {
			// Everything the background process says belongs in the
			// log, including what go-fuse prints while mounting; the
			// caller's stderr only gets the report, via the parent.
			if err := redirect(logFile, 1, 2); err != nil {
				return rep.fail(failf(exitDaemon, "cannot send output to log file %s: %w", show(cfg.LogFile), err))
			}
		}
		for _, w := range cfg.Warnings {
			logger.Print(w)
		}
		// A failure goes to the caller anyway (stderr or the report
		// pipe); the log file gets a copy.
		rep.logf = logger.Printf
	}
	if cfg.Debug {
		logger.Printf("mounting: %v", cfg)
	}
	return serve(cfg, logger, logFile, rep)
}

// openLog picks where warnings and debug output go: --log FILE if given,
// else stderr (which a background process detaches from once mounted).
func openLog(cfg *config, stderr io.Writer) (*os.File, *log.Logger, error) {
	if cfg.LogFile == "" {
		return nil, log.New(stderr, "goverlay: ", 0), nil
	}
	f, err := os.OpenFile(cfg.LogFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, failf(exitDaemon, "cannot open log file %s: %w; pick a writable location for --log", show(cfg.LogFile), err)
	}
	prefix := "goverlay[" + strconv.Itoa(os.Getpid()) + "]: "
	return f, log.New(f, prefix, log.LstdFlags|log.Lmicroseconds), nil
}

// overlayOptions maps the command line onto overlay.Options.
func overlayOptions(cfg *config, euid int, logger *log.Logger) overlay.Options {
	kernel := slices.Clone(cfg.KernelOptions)
	if euid == 0 && !slices.Contains(kernel, "nosuid") && !slices.Contains(kernel, "suid") {
		// fuse-overlayfs run as root adds "-o suid" (get_new_args), so
		// setuid programs in a container image work as on kernel
		// overlayfs; FUSE mounts are nosuid otherwise.
		kernel = append(kernel, "suid")
	}
	return overlay.Options{
		Lower:            cfg.Lower,
		Upper:            cfg.Upper,
		Work:             cfg.Work,
		UserXattr:        cfg.UserXattr,
		NoFsync:          cfg.NoFsync,
		NoSec:            cfg.NoSec,
		Passthrough:      !cfg.NoPassthrough,
		OpenRequests:     cfg.OpenRequests,
		ShareCache:       cfg.ShareCache,
		Writeback:        cfg.Writeback,
		NoACL:            cfg.NoACL,
		NoUring:          cfg.NoUring,
		Mask:             cfg.Mask,
		RedirectDirOff:   cfg.RedirectDirOff,
		Metacopy:         cfg.Metacopy,
		XattrPermissions: cfg.XattrPermissions,
		Owners:           cfg.Owners,
		StaticNlink:      cfg.StaticNlink,
		FsName:           cfg.FsName,
		// As root, other users (a container's) must get in; as
		// fuse-overlayfs does, root always mounts with allow_other.
		AllowOther:    cfg.AllowOther || euid == 0,
		KernelOptions: kernel,
		Debug:         cfg.Debug,
		Verbose:       cfg.Debug || cfg.LogFile != "",
		Logger:        logger,
	}
}

// serve mounts and serves until the mount goes away or a signal asks us to
// stop. It returns the exit code.
func serve(cfg *config, logger *log.Logger, logFile *os.File, rep *reporter) int {
	// Catch signals before mounting: one arriving between the mount and
	// the handler would otherwise kill us and leave a dead mount. These
	// are the ones libfuse's fuse_set_signal_handlers turns into a clean
	// exit.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	// libfuse ignores SIGPIPE too; a closed log pipe must not kill a
	// server whose mount is in use.
	signal.Ignore(unix.SIGPIPE)
	return serveMount(cfg, overlayOptions(cfg, geteuid(), logger), logger, logFile, rep, sigs)
}

// stopSignals unmount and end a daemon, as libfuse's
// fuse_set_signal_handlers has them do.
var stopSignals = []os.Signal{unix.SIGINT, unix.SIGTERM, unix.SIGHUP}

// serveMount mounts with opts and serves until the mount goes away or a
// signal arrives on sigs. It returns the exit code.
func serveMount(cfg *config, opts overlay.Options, logger *log.Logger, logFile *os.File, rep *reporter, sigs <-chan os.Signal) int {
	fsys, err := overlay.New(opts)
	if errors.Is(err, overlay.ErrInUse) {
		return rep.fail(failf(exitBadLayer, "%w", err))
	}
	if err != nil {
		return rep.fail(failf(exitMount, "cannot open the layers: %w; check that every layer is readable", err))
	}
	// Runs after the mount is gone: deferred calls run last-in first-out.
	defer fsys.Close()

	srv, err := fsys.Mount(cfg.Mountpoint)
	if err != nil {
		return rep.fail(mountError(cfg.Mountpoint, err))
	}
	if cfg.PidFile != "" {
		if err := writePidFile(cfg.PidFile); err != nil {
			unmount(srv, cfg.Mountpoint, logger)
			return rep.fail(failf(exitDaemon, "cannot write pidfile %s: %w; pick a writable location for --pidfile", show(cfg.PidFile), err))
		}
		defer removePidFile(cfg.PidFile)
	}
	if err := rep.ready(logFile); err != nil {
		// The caller never heard that we are up and has given up on
		// us; a mount it does not know about would only surprise it.
		logger.Printf("cannot report the mount to the waiting process: %v; unmounting", err)
		unmount(srv, cfg.Mountpoint, logger)
		return exitDaemon
	}
	var mst unix.Stat_t
	if err := unix.Stat(cfg.Mountpoint, &mst); err != nil {
		mst.Dev = 0
	}
	waitForEnd(srv, cfg, mst.Dev, sigs, logger)
	return exitOK
}

// waitForEnd returns once the mount is gone: unmounted from outside
// (umount, fusermount3 -u), or by us on a signal. dev is the mount's
// st_dev.
func waitForEnd(srv *overlay.Server, cfg *config, dev uint64, sigs <-chan os.Signal, logger *log.Logger) {
	done := make(chan struct{})
	go func() {
		srv.Wait()
		close(done)
	}()
	select {
	case <-done:
		if cfg.Debug {
			logger.Printf("%s was unmounted", cfg.Mountpoint)
		}
		return
	case s := <-sigs:
		if cfg.Debug {
			logger.Printf("got %v; unmounting %s", s, cfg.Mountpoint)
		}
	}
	// go-fuse's Unmount returns once the connection ends, which a bind
	// mount of it elsewhere (even inside a layer) puts off for good.
	go unmount(srv, cfg.Mountpoint, logger)
	// After a lazy detach the kernel keeps the connection until the last
	// open file is closed; serve until then, unless asked again, or
	// unless the mountpoint is let go while the mount lives on elsewhere:
	// then exiting ends it, as asked.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case s := <-sigs:
			logger.Printf("got %v again; exiting although %s may still be in use", s, cfg.Mountpoint)
			return
		case <-tick.C:
			if where := mountedElsewhere(cfg.Mountpoint, dev); where != "" {
				logger.Printf("%s is unmounted but the mount lives on at %s; exiting ends it", cfg.Mountpoint, where)
				return
			}
		}
	}
}

// mountedElsewhere reports, once mnt no longer shows the mount of st_dev
// dev, another place where that mount still is ("" if none, or mnt still
// shows it).
func mountedElsewhere(mnt string, dev uint64) string {
	var st unix.Stat_t
	if dev == 0 || unix.Stat(mnt, &st) != nil || st.Dev == dev {
		return ""
	}
	mounts, _ := readMountinfo("/proc/self/mountinfo")
	want := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	for _, m := range mounts {
		if m.dev == want {
			return m.mountpoint
		}
	}
	return ""
}

// unmount takes the mount down: srv.Unmount (which already retries a few
// times), a few more tries while it is busy, then a lazy detach so that
// the mountpoint is free at once and the mount goes away with its last
// user.
func unmount(srv *overlay.Server, mnt string, logger *log.Logger) {
	err := srv.Unmount()
	for try := 0; err != nil && isBusy(err) && try < 3; try++ {
		time.Sleep(200 * time.Millisecond)
		err = srv.Unmount()
	}
	if err == nil {
		return
	}
	logger.Printf("cannot unmount %s (%s); detaching it lazily", mnt, oneLine(err.Error()))
	if err := lazyUnmount(mnt); err != nil {
		logger.Printf("cannot detach %s either (%s); still serving, signal again to exit anyway", mnt, oneLine(err.Error()))
	}
}

func isBusy(err error) bool {
	// fusermount3 reports EBUSY as text, hence the string match.
	return errors.Is(err, unix.EBUSY) || strings.Contains(strings.ToLower(err.Error()), "busy")
}

// lazyUnmount detaches mnt: umount2(MNT_DETACH) as root, "fusermount3 -u
// -z" otherwise (it is what libfuse does to unmount, too).
func lazyUnmount(mnt string) error {
	err := unix.Unmount(mnt, unix.MNT_DETACH)
	if err == nil || !errors.Is(err, unix.EPERM) {
		return err
	}
	for _, name := range []string{"fusermount3", "fusermount"} {
		bin, lerr := exec.LookPath(name)
		if lerr != nil {
			continue
		}
		out, cerr := exec.Command(bin, "-u", "-z", mnt).CombinedOutput()
		if cerr != nil {
			return fmt.Errorf("%s -u -z: %w: %s", name, cerr, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return err
}

// writePidFile writes our PID atomically: whoever polls for the file never
// reads it half-written.
func writePidFile(path string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// removePidFile removes the pidfile if it is still ours; a later goverlay
// may have reused the name.
func removePidFile(path string) {
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid()) {
		os.Remove(path)
	}
}
