// Package mountclient is the command's side of the shared mount server
// (goverlay -o daemon=shared): the server's name, its lock and socket,
// the request and the report. goverlay and goverlay-mount both use it;
// it imports nothing that goverlay-mount's start would pay for (no FUSE
// library, none of the overlay's packages).
package mountclient

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay/rundir"
)

// Request is what a command sends: its arguments, and its working
// directory, against which relative paths resolve. With Warn the server
// sends the arguments' warnings back (Ask), for a command that did not
// parse them itself.
type Request struct {
	Args []string `json:"args"`
	Cwd  string   `json:"cwd"`
	Warn bool     `json:"warn,omitempty"`
}

// Name names the server of the goverlay binary exe in this process's
// user and mount namespaces: its socket, lock and log are Name's with
// .sock, .lock and .log.
func Name(exe string) (string, error) {
	var user, mnt, bin unix.Stat_t
	for _, s := range []struct {
		path string
		st   *unix.Stat_t
	}{{"/proc/self/ns/user", &user}, {"/proc/self/ns/mnt", &mnt}, {exe, &bin}} {
		if err := unix.Stat(s.path, s.st); err != nil {
			return "", &os.PathError{Op: "stat", Path: s.path, Err: err}
		}
	}
	return fmt.Sprintf("server-%d-%d-%x-%x", user.Ino, mnt.Ino, bin.Dev, bin.Ino), nil
}

// Lock takes the lock of server name in dir and returns its release.
func Lock(dir *os.File, name string) (func(), error) {
	fd, err := unix.Openat(int(dir.Fd()), name+".lock", unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot open the mount server's lock %s: %w", filepath.Join(dir.Name(), name+".lock"), err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cannot lock %s: %w", filepath.Join(dir.Name(), name+".lock"), err)
	}
	return func() { unix.Close(fd) }, nil
}

// Connect connects to server name's socket in dir (rundir.Runtime). A
// missing socket or one nobody listens on is ENOENT or ECONNREFUSED.
func Connect(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: rundir.SocketPath(dir, name+".sock")}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "mount-server"), nil
}

// Ask sends req over conn and reads the server's answer: the warnings
// (with req.Warn), then the report, as the background daemon's
// ("ok\n", or "fail CODE\nMESSAGE"). ok is false when the answer is not
// a report (the server ended first).
func Ask(conn io.ReadWriter, req Request) (warnings []string, code int, text string, ok bool, err error) {
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return nil, 0, "", false, err
	}
	msg, _ := io.ReadAll(io.LimitReader(conn, 64<<10))
	for {
		line, rest, found := bytes.Cut(msg, []byte("\n"))
		w, isWarn := bytes.CutPrefix(line, []byte("warn "))
		if !found || !isWarn {
			break
		}
		warnings = append(warnings, string(w))
		msg = rest
	}
	code, text, ok = ParseReport(msg)
	return warnings, code, text, ok, nil
}

// ExitDaemon is goverlay's exit code when the mount's process (here, the
// server) could not report (goverlay(1), EXIT STATUS).
const ExitDaemon = 5

// Mount asks the server on conn for req's mount and prints what the
// command prints: the warnings, and the failure, "goverlay: MESSAGE"; a
// server that ends without a report is sent to its log, logPath. It
// returns the command's exit code.
func Mount(conn io.ReadWriter, req Request, logPath string, stderr io.Writer) int {
	warnings, code, text, ok, err := Ask(conn, req)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "goverlay: %s\n", w)
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "goverlay: daemon=shared: cannot send the mount to the server: %v; nothing is mounted\n", err)
		return ExitDaemon
	case !ok:
		fmt.Fprintf(stderr, "goverlay: daemon=shared: the mount server ended before the mount was live; see %s, or mount with goverlay -f to see why\n", logPath)
		return ExitDaemon
	case code != 0:
		fmt.Fprintf(stderr, "goverlay: %s\n", text)
	}
	return code
}

// WriteWarnings writes the warnings as Ask reads them, one per line.
func WriteWarnings(w io.Writer, warnings []string) error {
	bw := bufio.NewWriter(w)
	for _, s := range warnings {
		fmt.Fprintf(bw, "warn %s\n", strings.ReplaceAll(s, "\n", " "))
	}
	return bw.Flush()
}

// ParseReport reads a report: "ok\n" is code 0; "fail CODE\nMESSAGE" is
// CODE (1–255) and MESSAGE. ok is false for anything else.
func ParseReport(msg []byte) (code int, text string, ok bool) {
	if string(msg) == "ok\n" {
		return 0, "", true
	}
	rest, found := bytes.CutPrefix(msg, []byte("fail "))
	if !found {
		return 0, "", false
	}
	num, text2, found := bytes.Cut(rest, []byte("\n"))
	if !found {
		return 0, "", false
	}
	code, err := strconv.Atoi(string(num))
	if err != nil || code <= 0 || code > 255 {
		return 0, "", false
	}
	return code, string(text2), true
}
