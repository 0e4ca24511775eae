// Package mountclient is the command's side of the shared mount server
// (goverlay -o daemon=shared): the server's name, its lock and socket,
// the request and the report. goverlay uses it, and goverlay-mount (a C
// program, cmd/goverlay-mount) speaks the same protocol; the tests hold
// the two to it.
package mountclient

import (
	"bufio"
	"bytes"
	"errors"
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
	Args []string
	Cwd  string
	Warn bool
}

// RequestMagic is a request's first field: a server reading anything
// else was sent it by another build's command.
const RequestMagic = "goverlay-mount-request-1"

// Request limits: a request's size, and its number of arguments.
const (
	maxRequest = 1 << 20
	maxArgs    = 4096
)

// Encode is the request on the wire: fields, each ended by a NUL, so
// that paths go byte for byte: RequestMagic; "warn" or ""; the working
// directory; the number of arguments, in decimal; the arguments.
func (r Request) Encode() []byte {
	warn := ""
	if r.Warn {
		warn = "warn"
	}
	fields := append([]string{RequestMagic, warn, r.Cwd, strconv.Itoa(len(r.Args))}, r.Args...)
	var b bytes.Buffer
	for _, f := range fields {
		b.WriteString(f)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// ReadRequest reads one request (Encode) from r, which the command leaves
// open for the report.
func ReadRequest(r io.Reader) (Request, error) {
	br := bufio.NewReader(io.LimitReader(r, maxRequest))
	field := func() (string, error) {
		s, err := br.ReadString(0)
		if errors.Is(err, io.EOF) {
			return "", errors.New("the request ends early")
		}
		return strings.TrimSuffix(s, "\x00"), err
	}
	var req Request
	// The magic byte by byte: what is not a request fails at its first
	// byte that differs, not when the command gives up.
	for i := 0; i <= len(RequestMagic); i++ {
		b, err := br.ReadByte()
		if err != nil {
			return req, errors.New("the request ends early")
		}
		if i < len(RequestMagic) && b != RequestMagic[i] || i == len(RequestMagic) && b != 0 {
			return req, errors.New("the request is not one this goverlay reads (goverlay-mount and goverlay from different builds?)")
		}
	}
	warn, err := field()
	if err != nil {
		return req, err
	}
	req.Warn = warn == "warn"
	if req.Cwd, err = field(); err != nil {
		return req, err
	}
	count, err := field()
	if err != nil {
		return req, err
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 || n > maxArgs {
		return req, fmt.Errorf("the request's argument count %q is not a number up to %d", count, maxArgs)
	}
	req.Args = make([]string, n)
	for i := range req.Args {
		if req.Args[i], err = field(); err != nil {
			return req, err
		}
	}
	return req, nil
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
	if _, err := conn.Write(req.Encode()); err != nil {
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
