package overlay

import "os"

// RuntimeDir opens the directory where this process's user keeps
// goverlay's sockets, making it if missing: /run/goverlay for root,
// $XDG_RUNTIME_DIR/goverlay or /tmp/goverlay-UID for others (statsDir).
// The checks are those of the stats sockets' (openStatsDir): it belongs
// to the user and no one else may write it, so a socket found there was
// put there by one of the user's processes. The file's name is the
// directory's path; reach entries through /proc/self/fd (SocketPath).
func RuntimeDir() (*os.File, error) {
	uid := os.Geteuid()
	d := daemonStatsDir(uid)
	fd, err := openStatsDir(d, uid, true)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), d.path), nil
}

// SocketPath is the path of entry name in dir (from RuntimeDir) that
// bind(2) and connect(2) take: short enough for sun_path whatever dir's
// path, and it can only reach the directory that was checked.
func SocketPath(dir *os.File, name string) string {
	return statsPath(int(dir.Fd()), name)
}
