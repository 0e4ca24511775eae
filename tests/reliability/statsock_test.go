package reliability_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The control socket of a mount (`goverlay stats`) as other users see it.
// A root daemon's socket is /run/goverlay/HASH.sock, HASH the first 16
// bytes of the SHA-256 of the resolved mountpoint, in hex (the man page's
// FILES); goverlay once served the abstract address
// @goverlay-stats-HASH instead, which any user could bind first.

// statsSocket is the socket of root's daemon of the mount on mnt.
func statsSocket(mnt string) string {
	sum := sha256.Sum256([]byte(mnt))
	return "/run/goverlay/" + hex.EncodeToString(sum[:16]) + ".sock"
}

// resolved is dir with its symlinks resolved, as goverlay names a
// mountpoint.
func resolved(t *testing.T, dir string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// oldStatsAddr is the abstract address goverlay once served mnt's
// statistics on.
func oldStatsAddr(mnt string) string {
	sum := sha256.Sum256([]byte(mnt))
	return "@goverlay-stats-" + hex.EncodeToString(sum[:16])
}

// squatter answers every connection with a statistics JSON of other
// layers, as a user bent on being read as the mount would, and counts
// them.
type squatter struct {
	conns atomic.Int64
}

func (q *squatter) serve(t *testing.T, l net.Listener, mnt string) {
	t.Cleanup(func() { l.Close() })
	answer, _ := json.Marshal(map[string]any{"mountpoint": mnt, "pid": os.Getpid(), "lowerdir": []string{"/squatter"}})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			q.conns.Add(1)
			c.Write(answer)
			c.Close()
		}
	}()
}

// TestStatsSocketNotTaken: before root mounts, the unprivileged test user
// listens on the abstract address goverlay once used for the mountpoint,
// makes /tmp/goverlay-0 (where a user's daemon would keep its socket, were
// its uid 0) and listens there under the mountpoint's name, and cannot
// make or bind anything in /run/goverlay; a dead daemon of the same
// mountpoint left its socket file in /run/goverlay. root's mount comes
// up, `goverlay stats` reports its mountpoint, daemon and layers, the
// user's listeners get no connection, and the daemon removes its socket
// when it exits.
func TestStatsSocketNotTaken(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	uid, gid := testutil.TestUser(t)
	s := newStack(t, 2, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("top", "top\n", 0o644)
		l[1].File("bottom", "bottom\n", 0o644)
	})
	mnt := filepath.Join(resolved(t, t.TempDir()), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := statsSocket(mnt)

	// The dead daemon's socket: bound, never removed.
	if err := os.Mkdir(filepath.Dir(sock), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	t.Cleanup(func() { os.Remove(sock) })

	var q squatter
	var listeners []net.Listener
	userDir, madeDir := "/tmp/goverlay-0", false
	err = testutil.AsUser(uid, gid, nil, func() {
		l, err := net.Listen("unix", oldStatsAddr(mnt))
		if err != nil {
			t.Errorf("as uid %d, listen on %s: %v", uid, oldStatsAddr(mnt), err)
		} else {
			listeners = append(listeners, l)
		}
		switch err := unix.Mkdir(userDir, 0o700); {
		case err == nil:
			madeDir = true
			p := filepath.Join(userDir, filepath.Base(sock))
			if l, err := net.Listen("unix", p); err != nil {
				t.Errorf("as uid %d, listen on %s: %v", uid, p, err)
			} else {
				listeners = append(listeners, l)
			}
		case errors.Is(err, unix.EEXIST):
			t.Logf("%s exists already: not listening there", userDir)
		default:
			t.Errorf("as uid %d, mkdir %s: %v", uid, userDir, err)
		}
		// Controls: root's directory is root's alone.
		if err := unix.Mkdir(filepath.Join(filepath.Dir(sock), "x"), 0o700); !errors.Is(err, unix.EACCES) {
			t.Errorf("as uid %d, mkdir in %s: %v, want EACCES", uid, filepath.Dir(sock), err)
		}
		if l, err := net.Listen("unix", sock+".squat"); err == nil {
			l.Close()
			t.Errorf("as uid %d, listened in %s", uid, filepath.Dir(sock))
		}
	})
	if madeDir {
		t.Cleanup(func() { os.RemoveAll(userDir) })
	}
	for _, l := range listeners {
		q.serve(t, l, mnt)
	}
	if err != nil {
		t.Fatalf("as uid %d: %v", uid, err)
	}

	m := testutil.MountWith(t, s.opts(), testutil.MountConfig{Mountpoint: mnt})
	st := testutil.ReadStats(t, m)
	if st.Mountpoint != mnt || st.PID != m.PID || !slices.Equal(st.Lower, s.lower) || st.Upper != s.upper {
		t.Errorf("goverlay stats: mountpoint %q, pid %d, lowerdir %q, upperdir %q; want %q, %d, %q, %q",
			st.Mountpoint, st.PID, st.Lower, st.Upper, mnt, m.PID, s.lower, s.upper)
	}
	if n := q.conns.Load(); n != 0 {
		t.Errorf("the user's listeners were connected to %d time(s)", n)
	}
	var fi unix.Stat_t
	if err := unix.Lstat(sock, &fi); err != nil || fi.Mode&unix.S_IFMT != unix.S_IFSOCK || fi.Uid != 0 || fi.Mode&0o077 != 0 {
		t.Errorf("%s: mode %o uid %d, %v; want root's socket, mode 0600", sock, fi.Mode, fi.Uid, err)
	}
	m.Unmount(t)
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after the daemon exited: %v, want it removed", sock, err)
	}
}

// TestStatsSocketOthersGetNothing: a user neither root nor the mount's
// owner cannot connect to root's socket (its directory is root's, 0700),
// and when it gets through anyway (CAP_DAC_OVERRIDE kept, uid changed)
// the daemon closes the connection without a byte, by SO_PEERCRED;
// `goverlay stats` run by the user says who may read the statistics.
func TestStatsSocketOthersGetNothing(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	uid, gid := testutil.TestUser(t)
	s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) { l[0].File("f", "f\n", 0o644) })
	testutil.OpenUp(t, s.base)
	m := mountG(t, s)
	sock := statsSocket(resolved(t, m.Dir))

	// Root's connection, the control: the counters.
	if got, err := readSocket(sock); err != nil || !strings.Contains(string(got), `"pid":`+strconv.Itoa(m.PID)) {
		t.Fatalf("root reading %s: %q, %v; want the daemon's statistics", sock, got, err)
	}
	err := testutil.AsUser(uid, gid, nil, func() {
		if got, err := readSocket(sock); !errors.Is(err, unix.EACCES) || len(got) > 0 {
			t.Errorf("as uid %d, reading %s: %q, %v; want EACCES and nothing", uid, sock, got, err)
		}
		if err := raiseEffectiveCaps(); err != nil {
			t.Errorf("as uid %d, capset: %v", uid, err)
			return
		}
		if got, err := readSocket(sock); err != nil || len(got) > 0 {
			t.Errorf("as uid %d with CAP_DAC_OVERRIDE, reading %s: %q, %v; want the connection closed without data", uid, sock, got, err)
		}
	})
	if err != nil {
		t.Fatalf("as uid %d: %v", uid, err)
	}

	r := testutil.Run(t, time.Minute, []string{"GORACE=atexit_sleep_ms=0"}, "setpriv",
		"--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(gid), "--clear-groups", testutil.UserBinary(t), "stats", m.Dir)
	if r.Code != 2 || r.Stdout != "" || !strings.Contains(r.Stderr, "only root and the mount's owner (uid 0) may") {
		t.Errorf("goverlay stats as uid %d: %s; want exit 2 saying who may read them", uid, r)
	}
}

// readSocket connects to the unix socket at path from the calling thread
// (whose credentials SO_PEERCRED reports) and reads until the peer closes.
func readSocket(path string) ([]byte, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval(int64(30 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, err
	}
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buf)
		if n > 0 {
			out = append(out, buf[:n]...)
		}
		if err != nil || n <= 0 {
			return out, err
		}
	}
}

// raiseEffectiveCaps makes the calling thread's permitted capabilities
// effective again: after testutil.AsUser changed only its effective uid,
// the thread keeps them permitted (capabilities(7), "Effect of user ID
// changes on capabilities").
func raiseEffectiveCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	return unix.Capset(&hdr, &data[0])
}

// fakeStats puts a listener of its own in the place of the socket at path,
// as a daemon replaces a stale one, and answers every connection with
// answer. listen runs the listen(2), whose caller SO_PEERCRED names.
func fakeStats(t *testing.T, path string, answer []byte, listen func(func()) error) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".fake"
	os.Remove(tmp)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: tmp}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if lerr := listen(func() { err = unix.Listen(fd, 8) }); lerr != nil {
		err = lerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	f := os.NewFile(uintptr(fd), "fake stats")
	defer f.Close()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write(answer)
			c.Close()
		}
	}()
}

// TestStatsFakeServerRefused: root's own listener in the place of a live
// mount's socket (as another daemon of root's, or the owner's, could put
// there) is not taken for the mount's daemon: `goverlay stats` refuses an
// answer whose pid is not its sender's, one for another mountpoint, and
// one from a listener of another user, and says what did not match. The
// daemon leaves the socket file it finds at its exit alone: it is not its
// own.
func TestStatsFakeServerRefused(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	uid, gid := testutil.TestUser(t)
	s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) { l[0].File("f", "f\n", 0o644) })
	m := mountG(t, s)
	mnt := resolved(t, m.Dir)
	sock := statsSocket(mnt)
	t.Cleanup(func() { os.Remove(sock) })
	genuine := testutil.ReadStats(t, m)
	me := os.Getpid()
	answer := func(mutate func(st *testutil.Stats)) []byte {
		st := genuine
		st.Lower = []string{"/fake/layer"}
		mutate(&st)
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	asRoot := func(fn func()) error { fn(); return nil }
	asUser := func(fn func()) error { return testutil.AsUser(uid, gid, nil, fn) }
	for _, c := range []struct {
		name   string
		answer []byte
		listen func(func()) error
		want   string
	}{
		{"the daemon's pid, not the sender's", answer(func(st *testutil.Stats) {}), asRoot,
			fmt.Sprintf("the answer names pid %d, but pid %d sent it", m.PID, me)},
		{"another mountpoint", answer(func(st *testutil.Stats) { st.PID, st.Mountpoint = me, "/elsewhere" }), asRoot,
			fmt.Sprintf("the answer is for mountpoint %q, not %q", "/elsewhere", mnt)},
		{"a listener of another user", answer(func(st *testutil.Stats) { st.PID = me }), asUser,
			fmt.Sprintf("runs as uid %d, neither root nor the mount's owner (uid 0)", uid)},
	} {
		t.Run(c.name, func(t *testing.T) {
			fakeStats(t, sock, c.answer, c.listen)
			r := testutil.Run(t, time.Minute, []string{"GORACE=atexit_sleep_ms=0"}, testutil.Binary(t), "stats", m.Dir)
			if r.Code != 2 || r.Stdout != "" || !strings.Contains(r.Stderr, c.want) || !strings.Contains(r.Stderr, sock) {
				t.Errorf("goverlay stats with a fake answer on %s: %s; want exit 2 and %q", sock, r, c.want)
			}
		})
	}
	m.Unmount(t)
	var fi unix.Stat_t
	if err := unix.Lstat(sock, &fi); err != nil || fi.Mode&unix.S_IFMT != unix.S_IFSOCK {
		t.Errorf("%s after the daemon exited: %v; want the fake's socket left in place", sock, err)
	}
}
