// Package rundir finds the directories where goverlay's processes keep
// their sockets: a mount's stats socket, the shared mount server's. It
// imports nothing of goverlay's and no FUSE library, so that a command
// that only talks to those sockets starts fast.
package rundir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// RootDir holds the sockets of root's processes.
const RootDir = "/run/goverlay"

// initialUserNS is the initial user namespace as /proc/PID/ns/user names
// it (user_namespaces(7)).
const initialUserNS = "user:[4026531837]"

// Dir is a directory for the sockets of one user's daemons: its path,
// and whether others may read and search it (root's, in /run; a user's
// must be private).
type Dir struct {
	Path   string
	Shared bool
}

// Own is where this process, running as uid, keeps its sockets:
// RootDir for root (of the initial user namespace);
// $XDG_RUNTIME_DIR/goverlay when that directory is set and the user's
// own; otherwise /tmp/goverlay-UID, named by the uid outside a user
// namespace, so that two users' namespaces do not meet there.
func Own(uid int) Dir {
	if d, ok := userDir(uid, os.Getenv("XDG_RUNTIME_DIR")); ok {
		return d
	}
	return tmpDir(uid)
}

// userDir is the directory of root's daemons (uid 0 of the initial
// user namespace), or that in $XDG_RUNTIME_DIR when xdg is set and
// belongs to uid.
func userDir(uid int, xdg string) (Dir, bool) {
	if uid == 0 && InInitialUserNS() {
		return Dir{Path: RootDir, Shared: true}, true
	}
	if filepath.IsAbs(xdg) && ownedDir(xdg, uid) {
		return Dir{Path: filepath.Join(xdg, "goverlay")}, true
	}
	return Dir{}, false
}

// tmpDir is uid's directory in /tmp.
func tmpDir(uid int) Dir {
	return Dir{Path: "/tmp/goverlay-" + strconv.Itoa(hostUID(uid))}
}

// Of lists where a daemon of the mount owner's may have its
// stats socket, as seen by a client that may have another environment: in the
// client's $XDG_RUNTIME_DIR, in the one pam_systemd gives the owner
// (/run/user/UID), or in /tmp.
func Of(owner int) []Dir {
	var dirs []Dir
	if d, ok := userDir(owner, os.Getenv("XDG_RUNTIME_DIR")); ok {
		if d.Shared {
			return []Dir{d}
		}
		dirs = append(dirs, d)
	}
	if run := "/run/user/" + strconv.Itoa(hostUID(owner)); ownedDir(run, owner) {
		if d := filepath.Join(run, "goverlay"); len(dirs) == 0 || dirs[0].Path != d {
			dirs = append(dirs, Dir{Path: d})
		}
	}
	return append(dirs, tmpDir(owner))
}

// ownedDir reports whether path is a directory (not a symlink) of uid's
// that no one else may write.
func ownedDir(path string, uid int) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == uid && st.Mode&0o022 == 0
}

// Open opens d, a directory of uid's, making it (mode 0700) if
// create is set and it is missing. It refuses a symlink, anything but a
// directory, one of another owner, and one that group or others may write
// (or, unless shared, read or search). The fd is what the socket is
// reached through (Path), so the directory checked is the one used.
func Open(d Dir, uid int, create bool) (int, error) {
	if create {
		if err := unix.Mkdir(d.Path, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("cannot make %s: %w", d.Path, err)
		}
	}
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%s is not a directory (a symlink, or another file)", d.Path)
		}
		return -1, &os.PathError{Op: "open", Path: d.Path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "fstat", Path: d.Path, Err: err}
	}
	mask := uint32(0o077)
	if d.Shared {
		mask = 0o022
	}
	switch {
	case int(st.Uid) != uid:
		err = fmt.Errorf("%s belongs to uid %d, not %d", d.Path, st.Uid, uid)
	case st.Mode&mask != 0:
		err = fmt.Errorf("%s has mode %04o: others may use it", d.Path, st.Mode&0o7777)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Path is the path of entry name of the directory open at dirfd,
// through /proc/self/fd: short enough for sun_path, and no path can put
// another directory in the place of the one checked.
func Path(dirfd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// InInitialUserNS reports whether this process is in the initial user
// namespace (user_namespaces(7)).
func InInitialUserNS() bool {
	ns, err := os.Readlink("/proc/self/ns/user")
	return err != nil || ns == initialUserNS
}

// hostUID maps uid of this process's user namespace to the parent
// namespace's (uid itself where it is not mapped, or in the initial one).
func hostUID(uid int) int {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return uid
	}
	return mapUID(string(b), uid)
}

// mapUID maps uid through uidMap, a uid_map's text: lines of "ID-INSIDE
// ID-OUTSIDE LENGTH" (user_namespaces(7)).
func mapUID(uidMap string, uid int) int {
	for _, line := range strings.Split(uidMap, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		in, e1 := strconv.ParseUint(f[0], 10, 32)
		out, e2 := strconv.ParseUint(f[1], 10, 32)
		n, e3 := strconv.ParseUint(f[2], 10, 32)
		if e1 == nil && e2 == nil && e3 == nil && uid >= 0 && uint64(uid) >= in && uint64(uid)-in < n {
			return int(out + uint64(uid) - in)
		}
	}
	return uid
}

// Runtime opens the directory where this process's user keeps
// goverlay's sockets, making it if missing: /run/goverlay for root,
// $XDG_RUNTIME_DIR/goverlay or /tmp/goverlay-UID for others (Own).
// Open checks that it belongs to the user and that no one else may write
// it, so a socket found there was put there by one of the user's
// processes. The file's name is the
// directory's path; reach entries through /proc/self/fd (SocketPath).
func Runtime() (*os.File, error) {
	uid := os.Geteuid()
	d := Own(uid)
	fd, err := Open(d, uid, true)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), d.Path), nil
}

// SocketPath is the path of entry name in dir (from Runtime) that
// bind(2) and connect(2) take: short enough for sun_path whatever dir's
// path, and it can only reach the directory that was checked.
func SocketPath(dir *os.File, name string) string {
	return Path(int(dir.Fd()), name)
}
