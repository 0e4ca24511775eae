package overlay

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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
