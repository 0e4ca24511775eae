package overlay

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOpenStatsDir: the directory of the control socket is made 0700 when
// missing, and refused when it is a symlink or not a directory, belongs
// to another user, or others may write it (or, in /tmp, read it).
func TestOpenStatsDir(t *testing.T) {
	base := t.TempDir()
	uid := os.Geteuid()
	good := filepath.Join(base, "good")
	fd, err := openStatsDir(statsDir{path: good}, uid, true)
	if err != nil {
		t.Fatalf("make %s: %v", good, err)
	}
	unix.Close(fd)
	if fi, err := os.Lstat(good); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, %v; want a directory of mode 0700", good, fi, err)
	}
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		d    statsDir
		want string // "" for accepted
	}{
		{statsDir{path: good}, ""},
		{statsDir{path: link}, "not a directory"},
		{statsDir{path: file}, "not a directory"},
		{statsDir{path: mk("readable", 0o755)}, "others may use it"},
		{statsDir{path: mk("shared", 0o755), shared: true}, ""},
		{statsDir{path: mk("groupw", 0o770), shared: true}, "others may use it"},
		{statsDir{path: filepath.Join(base, "missing")}, "no such file"},
	}
	if uid == 0 {
		other := mk("other", 0o700)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			d    statsDir
			want string
		}{statsDir{path: other}, "belongs to uid 65534"})
	}
	for _, c := range cases {
		fd, err := openStatsDir(c.d, uid, false)
		if err == nil {
			unix.Close(fd)
		}
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("openStatsDir(%+v): %v; want %q", c.d, err, c.want)
		}
	}
}

// TestStatsSocketReplace: a stale socket file of the same name is
// replaced without EADDRINUSE, and a daemon leaves at its exit a socket a
// later daemon of the same mountpoint put in its place.
func TestStatsSocketReplace(t *testing.T) {
	dir := t.TempDir()
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	name := statsName("/some/mountpoint")
	path := filepath.Join(dir, name)
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	open := func(pid int) *statsServer {
		d, err := unix.Dup(dirfd)
		if err != nil {
			t.Fatal(err)
		}
		s := &statsServer{dirfd: d, name: name}
		if err := s.listen(pid); err != nil {
			t.Fatalf("listen over %s: %v", path, err)
		}
		return s
	}
	answers := func(s *statsServer) bool {
		c, err := net.Dial("unix", path)
		if err != nil {
			return false
		}
		defer c.Close()
		// The connection is in s's backlog if s listens on path.
		s.l.SetDeadline(time.Now().Add(5 * time.Second))
		ac, err := s.l.AcceptUnix()
		if err == nil {
			ac.Close()
		}
		return err == nil
	}
	first := open(1)
	if !answers(first) {
		t.Fatalf("%s does not reach the daemon that replaced the stale socket", path)
	}
	second := open(2)
	first.close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the first daemon removed the second's socket at its exit: %v", err)
	}
	if !answers(second) {
		t.Errorf("%s does not reach the second daemon", path)
	}
	second.close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after the second daemon's exit: %v; want it removed", path, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("%s holds %v at the end", dir, ents)
	}
}

func TestMapUID(t *testing.T) {
	const m = "         0       1000          1\n         1     100000      65536\n"
	for uid, want := range map[int]int{0: 1000, 1: 100000, 65536: 165535, 65537: 65537, 1000: 100999} {
		if got := mapUID(m, uid); got != want {
			t.Errorf("mapUID(%d) = %d, want %d", uid, got, want)
		}
	}
	if got := mapUID("0 0 4294967295\n", 1234); got != 1234 {
		t.Errorf("initial namespace: mapUID(1234) = %d", got)
	}
}
