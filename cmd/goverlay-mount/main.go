// Command goverlay-mount mounts through the user's goverlay mount server:
// `goverlay-mount -o OPTIONS MOUNTPOINT` is `goverlay -o
// daemon=shared,OPTIONS MOUNTPOINT`, in a program that starts in about
// half of goverlay's time (it links no FUSE library and none of the
// overlay's packages), for a host that mounts many containers (the man
// page's SHARED DAEMON section). It sends its arguments to the running
// server and relays its warnings and report. Anything else it leaves to
// goverlay, beside it, which it executes with -o daemon=shared: a command
// line other than -o options and a mountpoint, and the first mount, which
// starts the server.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/cmd/internal/mountclient"
	"github.com/goverlay/goverlay/overlay/rundir"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	full, err := goverlayBinary()
	if err != nil {
		fmt.Fprintf(stderr, "goverlay-mount: %v; it runs the goverlay installed beside it\n", err)
		return mountclient.ExitDaemon
	}
	if !plainMount(args) {
		return execGoverlay(full, args, stderr)
	}
	conn, logPath, err := dial(full)
	if err != nil {
		// No server (the first mount), or none that answers: goverlay
		// starts one, or says what is wrong.
		return execGoverlay(full, args, stderr)
	}
	defer conn.Close()
	wd, _ := os.Getwd() // "" makes a relative path an error in the server
	return mountclient.Mount(conn, mountclient.Request{Args: args, Cwd: wd, Warn: true}, logPath, stderr)
}

// goverlayBinary is the goverlay beside this program (symlinks to it
// resolved).
func goverlayBinary() (string, error) {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return "", fmt.Errorf("cannot find this program's path: %w", err)
	}
	full := filepath.Join(filepath.Dir(exe), "goverlay")
	if err := unix.Access(full, unix.X_OK); err != nil {
		return "", &os.PathError{Op: "access", Path: full, Err: err}
	}
	return full, nil
}

// plainMount reports whether args are -o options and one mountpoint, as
// containers/storage gives a mount program, none choosing the daemon.
func plainMount(args []string) bool {
	points := 0
	for i := 0; i < len(args); i++ {
		a := args[i]
		opts, isOpt := strings.CutPrefix(a, "-o")
		switch {
		case a == "-o" && i+1 < len(args):
			i++
			opts = args[i]
		case isOpt && opts != "":
		case !strings.HasPrefix(a, "-") && a != "":
			points++
			continue
		default:
			return false
		}
		if strings.Contains(opts, "daemon=") {
			return false
		}
	}
	return points == 1
}

// dial connects to the server of full in this process's namespaces, under
// its lock, as goverlay does; it also returns the server's log's path.
func dial(full string) (*os.File, string, error) {
	dir, err := rundir.Runtime()
	if err != nil {
		return nil, "", err
	}
	defer dir.Close()
	name, err := mountclient.Name(full)
	if err != nil {
		return nil, "", err
	}
	unlock, err := mountclient.Lock(dir, name)
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	conn, err := mountclient.Connect(dir, name)
	if err != nil {
		return nil, "", err
	}
	return conn, filepath.Join(dir.Name(), name+".log"), nil
}

// execGoverlay replaces this process with goverlay -o daemon=shared ARGS.
func execGoverlay(full string, args []string, stderr io.Writer) int {
	argv := append([]string{full, "-o", "daemon=shared"}, args...)
	err := syscall.Exec(full, argv, os.Environ())
	if errors.Is(err, unix.ENOENT) {
		err = fmt.Errorf("%s is gone", full)
	}
	fmt.Fprintf(stderr, "goverlay-mount: cannot run %s: %v\n", full, err)
	return mountclient.ExitDaemon
}
