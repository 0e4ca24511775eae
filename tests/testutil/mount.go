package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// DaemonExitTimeout bounds how long the harness waits for a daemon to exit
// once its mount is gone. A variable for the harness's own tests.
var DaemonExitTimeout = 10 * time.Second

// mountTimeout bounds a mount command that should return as soon as the
// mount is live.
const mountTimeout = 60 * time.Second

// Options describe a goverlay mount. Lower is topmost first.
type Options struct {
	Lower       []string
	Upper, Work string
	// Extra arguments go before the mount point (e.g. "-o", "allow_other").
	Extra []string
}

// OptString is the -o value for o: lowerdir=A:B[,upperdir=U,workdir=W].
func (o Options) OptString() string {
	s := "lowerdir=" + strings.Join(o.Lower, ":")
	if o.Upper != "" {
		s += ",upperdir=" + o.Upper
	}
	if o.Work != "" {
		s += ",workdir=" + o.Work
	}
	return s
}

// Mounted is a live goverlay mount started by Mount.
type Mounted struct {
	Dir string // the mount point
	PID int    // the daemon serving it
	// LogFile is the daemon's --log file ("" if the CLI has no --log);
	// OutFile has what the mount command printed.
	LogFile, OutFile string

	proc *Proc
	// dev is the mount's st_dev (0 if unknown), to find copies of it in
	// other mount namespaces (leakedCopies).
	dev uint64

	mu   sync.Mutex
	done bool
}

// Mount runs the real binary to mount o on a new directory under
// t.TempDir(). The command returning 0 is the readiness handshake: it must
// only return once the mount is live. The daemon's PID comes from
// --pidfile. When the test ends the mount is unmounted, the daemon must
// exit 0 within DaemonExitTimeout, and nothing may be left mounted.
func Mount(t testing.TB, o Options) *Mounted {
	t.Helper()
	return MountWith(t, o, MountConfig{})
}

// adoptPidfile reads the daemon's PID and starts watching it.
func (m *Mounted) adoptPidfile(t testing.TB, pidfile string) bool {
	data, err := os.ReadFile(pidfile)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		t.Errorf("--pidfile %s holds %q, not a PID", pidfile, data)
		return false
	}
	p, err := Track(pid, t.Name())
	if err != nil {
		t.Errorf("daemon PID %d from --pidfile: %v", pid, err)
		return false
	}
	m.PID, m.proc = pid, p
	return true
}

// Unmount unmounts with umount(8) and returns once the daemon has exited,
// failing the test unless it exited 0.
func (m *Mounted) Unmount(t testing.TB) {
	t.Helper()
	if !IsMounted(m.Dir) {
		t.Errorf("Unmount: %s is not mounted", m.Dir)
	}
	m.finish(t, true, true)
}

// Proc is the daemon, for tests that signal it.
func (m *Mounted) Proc() *Proc { return m.proc }

// WaitDaemon waits for the daemon to exit on its own (after the test
// unmounted by other means or signalled it) and fails the test unless it
// exited 0 and the mount is gone.
func (m *Mounted) WaitDaemon(t testing.TB) {
	t.Helper()
	m.finish(t, false, true)
}

// finish unmounts (if unmount and still mounted), waits for the daemon,
// checks its exit status and that nothing is left mounted.
func (m *Mounted) finish(t testing.TB, unmount, explicit bool) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return
	}
	m.done = true
	// The daemon has DaemonExitTimeout from the moment its mount is
	// gone: umount(8) first (it waits for the kernel to let go of the
	// mount, which on a loaded machine can take a while, and gives up
	// after umountTimeout with a lazy detach: a daemon that stopped
	// answering blocks it), then the wait.
	//
	// umount(8) can also be stuck for good: a daemon stopped or hung after
	// it read the statfs request umount sends cannot be interrupted out of
	// (request_wait_answer() waits for a request already in userspace
	// uninterruptibly), and only the daemon's death ends it. So umount
	// runs beside this function, which waits for it a little longer than
	// umountTimeout and otherwise goes on to the daemon, whose kill frees
	// it.
	var umountDone chan error
	if unmount && IsMounted(m.Dir) {
		umountDone = make(chan error, 1)
		go func() { umountDone <- runUmount(m.Dir) }()
		select {
		case err := <-umountDone:
			umountDone = nil
			if err != nil {
				t.Errorf("%v", err)
			}
		case <-time.After(umountTimeout + 5*time.Second):
			t.Errorf("umount %s: stuck in a request the daemon does not answer", m.Dir)
		}
	}
	if m.proc != nil {
		if !m.proc.Wait(DaemonExitTimeout) && m.detachCopies(t) {
			m.proc.Wait(DaemonExitTimeout)
		}
		if !m.proc.Wait(0) {
			// Its goroutines go to the --log file, which the
			// failure shows, before it is killed.
			m.proc.Signal(unix.SIGQUIT)
			if !m.proc.Wait(5 * time.Second) {
				m.proc.Kill()
			}
			t.Errorf("daemon %d outlived its mount %s by %v: killed it", m.PID, m.Dir, DaemonExitTimeout)
		} else if ok, known, desc := m.proc.Status(); !ok {
			if known || explicit {
				t.Errorf("daemon %d of %s: %s", m.PID, m.Dir, desc)
			} else {
				t.Logf("daemon %d of %s: %s", m.PID, m.Dir, desc)
			}
		}
	}
	if umountDone != nil && m.proc != nil {
		// The daemon is gone (it was killed at the latest): so is
		// what held umount.
		if err := <-umountDone; err != nil {
			t.Errorf("%v", err)
		}
	}
	if IsMounted(m.Dir) {
		t.Errorf("%s is still mounted after its daemon exited", m.Dir)
		// The dead daemon's mount answers ENOTCONN: detach it.
		lazyUnmount(m.Dir)
	}
	if t.Failed() {
		t.Logf("goverlay output and log of %s:\n%s", m.Dir, m.logs())
	}
}

// recordDev notes the st_dev of the mount on m.Dir, for detachCopies;
// only of a FUSE mount, since detachCopies detaches whatever has that
// device number (the filesystem below a mount this namespace does not
// see would be the wrong one).
func (m *Mounted) recordDev() { m.dev = FuseDev(m.Dir) }

// FuseDev is the device number of the FUSE mount on dir, or 0 when dir is
// not one.
func FuseDev(dir string) uint64 {
	var fs unix.Statfs_t
	var st unix.Stat_t
	if unix.Statfs(dir, &fs) == nil && fs.Type == unix.FUSE_SUPER_MAGIC && unix.Stat(dir, &st) == nil {
		return st.Dev
	}
	return 0
}

// detachCopies handles a daemon that outlived its unmount because its
// mount is not gone: a process of another test (podman, unshare) made a
// mount namespace while the mount was there, and its copy of the mount
// keeps the FUSE connection, and so the daemon, alive, as the kernel
// wants. Each such copy is detached from inside its namespace, after which
// the daemon must exit as usual. It reports whether it found any.
func (m *Mounted) detachCopies(t testing.TB) bool {
	t.Helper()
	return DetachCopies(t, m.Dir, m.dev)
}

// DetachCopies is detachCopies for the mount of device dev (FuseDev) that
// was on dir, for tests that track their daemons themselves.
func DetachCopies(t testing.TB, dir string, dev uint64) bool {
	t.Helper()
	return detachCopies(t, dir, dev, false)
}

// DetachCopiesAt is DetachCopies for a mount that may be gone already,
// whose device number the kernel may have given to another FUSE mount
// since: a copy counts only if it is a goverlay mount at dir, as the
// copies that namespaces made of it are.
func DetachCopiesAt(t testing.TB, dir string, dev uint64) bool {
	t.Helper()
	return detachCopies(t, dir, dev, true)
}

func detachCopies(t testing.TB, dir string, dev uint64, strict bool) bool {
	t.Helper()
	if dev == 0 {
		return false
	}
	want := fmt.Sprintf(" %d:%d ", unix.Major(dev), unix.Minor(dev))
	me, _ := os.Readlink("/proc/self/ns/mnt")
	seen := map[string]bool{me: true}
	found := false
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		ns, err := os.Readlink(p + "/ns/mnt")
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		data, err := os.ReadFile(p + "/mountinfo")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 || !strings.Contains(line, want) {
				continue
			}
			if strict {
				_, after, _ := strings.Cut(line, " - ")
				if unescapeMountinfo(f[4]) != dir || !strings.HasPrefix(after, "fuse.goverlay ") {
					continue
				}
			}
			found = true
			err := detachIn(p, unescapeMountinfo(f[4]))
			t.Logf("the mount %s lived on at %s in the mount namespace of %s (%s): detached it (%v)", dir, f[4], p, ns, err)
			if err != nil {
				// A copy in a namespace that a user namespace owns
				// is locked to its parent (EINVAL): end the FUSE
				// connection instead, which the daemon sees as
				// the end of its mount.
				t.Logf("aborted the FUSE connection of %s (%v)", dir, abortConnection(dev))
			}
		}
	}
	return found
}

// abortConnection aborts the FUSE connection of the mount with device
// number dev (Documentation/filesystems/fuse/fuse.rst, "Aborting a
// filesystem connection"), mounting the fusectl filesystem if it is not.
func abortConnection(dev uint64) error {
	const ctl = "/sys/fs/fuse/connections"
	// Named by the kernel's dev_t of the mount: major<<20 | minor.
	abort := fmt.Sprintf("%s/%d/abort", ctl, uint64(unix.Major(dev))<<20|uint64(unix.Minor(dev)))
	if _, err := os.Stat(abort); err != nil {
		if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount fusectl: %w", err)
		}
	}
	return os.WriteFile(abort, []byte("1"), 0)
}

// detachIn detaches the mount at path in the mount namespace of process
// proc ("/proc/PID"), path being relative to that process's root, as its
// mountinfo shows it. It runs on a thread of its own that enters the
// namespace and is never handed back to the scheduler: it ends with the
// goroutine.
func detachIn(proc, path string) error {
	errc := make(chan error, 1)
	go detachOnThread(proc, path, errc)
	return <-errc
}

// detachOnThread is detachIn's work, on a locked thread that dies with the
// goroutine. Not on the main thread: the runtime does not end that one
// when its goroutine exits, and /proc/self is the main thread's view, so
// the tests' reads of /proc/self/mountinfo would show the other
// namespace from then on. There it hands the work to another goroutine,
// which cannot land on the main thread while this one holds it.
func detachOnThread(proc, path string, errc chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		inner := make(chan error, 1)
		go detachOnThread(proc, path, inner)
		err := <-inner
		runtime.UnlockOSThread()
		errc <- err
		return
	}
	root, err := unix.Open(proc+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		errc <- err
		return
	}
	defer unix.Close(root)
	ns, err := unix.Open(proc+"/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		errc <- err
		return
	}
	defer unix.Close(ns)
	for _, step := range []func() error{
		func() error { return unix.Unshare(unix.CLONE_FS) },
		func() error { return unix.Setns(ns, unix.CLONE_NEWNS) },
		func() error { return unix.Fchdir(root) },
		func() error { return unix.Chroot(".") },
		func() error { return unix.Unmount(path, unix.MNT_DETACH) },
	} {
		if err := step(); err != nil {
			errc <- err
			return
		}
	}
	errc <- nil
}

// logs is the mount command's output and the daemon's log.
func (m *Mounted) logs() string {
	var b strings.Builder
	if data, err := os.ReadFile(m.OutFile); err == nil && len(data) > 0 {
		fmt.Fprintf(&b, "--- mount command output ---\n%s", data)
	}
	if m.LogFile != "" {
		if data, err := os.ReadFile(m.LogFile); err == nil && len(data) > 0 {
			fmt.Fprintf(&b, "--- daemon log (%d bytes) ---\n%s", len(data), tail(data, 64<<10))
		}
	}
	var races []string
	if m.OutFile != "" {
		races, _ = filepath.Glob(filepath.Join(filepath.Dir(m.OutFile), "race.*"))
	}
	for _, r := range races {
		if data, err := os.ReadFile(r); err == nil {
			fmt.Fprintf(&b, "--- race detector report %s ---\n%s", filepath.Base(r), data)
		}
	}
	if b.Len() == 0 {
		return "(goverlay printed nothing)"
	}
	return b.String()
}

func tail(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append([]byte("...\n"), b[len(b)-n:]...)
}

// umountTimeout bounds one umount(8).
const umountTimeout = 30 * time.Second

// Umount is umount(8) of dir as the harness runs it (runUmount): retried
// while a process forked by a parallel test briefly holds the mount busy,
// bounded, and detached lazily if it still fails, which it reports.
func Umount(dir string) error { return runUmount(dir) }

// runUmount runs umount(8) on dir with a deadline, and on failure detaches
// dir lazily.
func runUmount(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), umountTimeout)
	defer cancel()
	var out []byte
	var err error
	// EBUSY can be transient: a process forked by a parallel test holds
	// copies of all our fds (even O_CLOEXEC ones) until it execs, which
	// may include one that was open on this mount a moment ago. Retry a
	// few times, as gocryptfs's harness does, before giving up.
	for try := 1; ; try++ {
		out, err = exec.CommandContext(ctx, "umount", dir).CombinedOutput()
		if err == nil {
			return nil
		}
		if try == 10 || ctx.Err() != nil || !strings.Contains(string(out), "busy") {
			break
		}
		time.Sleep(time.Duration(try) * 20 * time.Millisecond)
	}
	lazyUnmount(dir)
	if ctx.Err() != nil {
		return fmt.Errorf("umount %s: no return within %v; detached it lazily", dir, umountTimeout)
	}
	return fmt.Errorf("umount %s: %v: %s", dir, err, out)
}

// lazyUnmount detaches dir (umount -l), the last resort of every cleanup.
// It is umount2(2) itself: umount(8) would stat dir and could hang on a
// mount whose daemon does not answer.
func lazyUnmount(dir string) {
	_ = unix.Unmount(dir, unix.MNT_DETACH)
}

// unmountStrict unmounts dir with umount(8), lazily if that fails, and
// fails the test unless dir ends up unmounted.
func unmountStrict(t testing.TB, dir string) {
	t.Helper()
	if !IsMounted(dir) {
		return
	}
	if err := runUmount(dir); err != nil {
		t.Errorf("%v", err)
	}
	if IsMounted(dir) {
		t.Errorf("%s is still mounted after umount", dir)
		lazyUnmount(dir)
	}
}

// KernelOverlay mounts the kernel's overlayfs on a new directory under
// t.TempDir() (upper and work may be empty for a read-only mount; extra
// are more -o options) and unmounts it when the test ends.
func KernelOverlay(t testing.TB, lower []string, upper, work string, extra ...string) string {
	t.Helper()
	RequireRoot(t)
	LeakCheck(t)
	mnt := filepath.Join(t.TempDir(), "kmnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{Lower: lower, Upper: upper, Work: work}.OptString()
	for _, e := range extra {
		opts += "," + e
	}
	trackMount(mnt)
	t.Cleanup(func() { unmountStrict(t, mnt) })
	if out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o", opts, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -t overlay -o %s: %v: %s", opts, err, out)
	}
	return mnt
}

// Tmpfs mounts a fresh tmpfs of 64 MiB on a new directory under
// t.TempDir() and unmounts it when the test ends.
func Tmpfs(t testing.TB) string {
	t.Helper()
	return TmpfsSize(t, "64m")
}

// TmpfsSize is Tmpfs of size (tmpfs's size=, e.g. "20m").
func TmpfsSize(t testing.TB, size string) string {
	t.Helper()
	RequireRoot(t)
	LeakCheck(t)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	trackMount(dir)
	t.Cleanup(func() { unmountStrict(t, dir) })
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=755", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	return dir
}
