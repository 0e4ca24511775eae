package cli_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestBackgroundMountIsLive: when the command returns 0 the mount already
// works, /proc/mounts shows it as fuse.goverlay, and --pidfile names the
// serving process.
func TestBackgroundMountIsLive(t *testing.T) {
	t.Parallel()
	lower, _ := layers(t)
	m := testutil.Mount(t, testutil.Options{Lower: []string{lower}})
	// Right after the command returned: no wait of any kind.
	data, err := os.ReadFile(filepath.Join(m.Dir, "file"))
	if err != nil || string(data) != "hello\n" {
		t.Fatalf("read through the mount right after goverlay returned: %q, %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(m.Dir, "dir", "inner")); err != nil {
		t.Errorf("stat through the mount: %v", err)
	}
	if typ := procMountsType(t, m.Dir); typ != "fuse.goverlay" {
		t.Errorf("/proc/mounts shows %s as %q, want fuse.goverlay", m.Dir, typ)
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(m.PID) + "/exe")
	if err != nil || exe != testutil.Binary(t) {
		t.Errorf("--pidfile PID %d runs %q (%v), want %s", m.PID, exe, err, testutil.Binary(t))
	}
	m.Unmount(t)
}

// procMountsType is the type /proc/mounts gives the mount on dir.
func procMountsType(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.Open("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	typ := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 3 && fs[1] == dir {
			typ = fs[2]
		}
	}
	return typ
}

// TestUnmount: each way of ending a mount unmounts it and makes the daemon
// exit 0.
func TestUnmount(t *testing.T) {
	testutil.RequireRoot(t)
	cases := map[string]func(t *testing.T, m *testutil.Mounted){
		"umount": func(t *testing.T, m *testutil.Mounted) {
			m.Unmount(t) // umount(8), then the daemon must exit 0
		},
		"fusermount3": func(t *testing.T, m *testutil.Mounted) {
			if _, err := exec.LookPath("fusermount3"); err != nil {
				t.Skip("fusermount3 not installed (package fuse3)")
			}
			if out, err := exec.Command("fusermount3", "-u", m.Dir).CombinedOutput(); err != nil {
				t.Fatalf("fusermount3 -u: %v: %s", err, out)
			}
			m.WaitDaemon(t)
		},
		"SIGTERM": func(t *testing.T, m *testutil.Mounted) {
			if err := m.Proc().Signal(unix.SIGTERM); err != nil {
				t.Fatal(err)
			}
			m.WaitDaemon(t) // exit 0, and the mount gone
		},
		"SIGINT": func(t *testing.T, m *testutil.Mounted) {
			if err := m.Proc().Signal(unix.SIGINT); err != nil {
				t.Fatal(err)
			}
			m.WaitDaemon(t)
		},
	}
	for name, end := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lower, _ := layers(t)
			m := testutil.Mount(t, testutil.Options{Lower: []string{lower}})
			end(t, m)
			if testutil.IsMounted(m.Dir) {
				t.Errorf("%s still mounted", m.Dir)
			}
		})
	}
}

// TestForeground: with -f the command itself serves the mount and exits 0
// once it is unmounted.
func TestForeground(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	t.Parallel()
	lower, mnt := layers(t)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	must(t, err)
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Binary(t), "-f", "-o", "lowerdir="+lower, mnt)
	cmd.Stdout, cmd.Stderr = out, out
	exited := make(chan struct{})
	var waitErr, mountErr error
	testutil.WithUringWithheld(t, func() {
		must(t, cmd.Start())
		go func() { waitErr = cmd.Wait(); close(exited) }()
		mountErr = testutil.WaitMounted(mnt, cmdTimeout, exited)
	})
	t.Cleanup(func() {
		// Whatever happened, leave nothing behind: kill the process
		// (a no-op once it exited), then detach a mount it left.
		cancel()
		<-exited
		if testutil.IsMounted(mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	if err := mountErr; err != nil {
		log, _ := os.ReadFile(out.Name())
		t.Fatalf("goverlay -f: %v\n%s", err, log)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "file")); err != nil || string(data) != "hello\n" {
		t.Errorf("read through the foreground mount: %q, %v", data, err)
	}
	select {
	case <-exited:
		t.Fatalf("goverlay -f returned while mounted: %v", waitErr)
	default:
	}
	var st unix.Stat_t
	must(t, unix.Stat(mnt, &st))
	if err := testutil.Umount(mnt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(testutil.DaemonExitTimeout):
		// A copy of the mount in the namespace of another test's
		// process (podman, unshare) keeps the daemon alive, as the
		// kernel wants.
		testutil.DetachCopiesAt(t, mnt, st.Dev)
	}
	<-exited // bounded by cmdTimeout through the context
	if ctx.Err() != nil {
		t.Fatalf("goverlay -f did not exit within %v of the unmount", cmdTimeout)
	}
	if waitErr != nil {
		log, _ := os.ReadFile(out.Name())
		t.Errorf("goverlay -f after umount: %v, want exit 0\n%s", waitErr, log)
	}
}

// TestReadOnly: without upperdir every change fails with EROFS.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	lower, _ := layers(t)
	m := testutil.Mount(t, testutil.Options{Lower: []string{lower}})
	p := func(n string) string { return filepath.Join(m.Dir, n) }
	ops := map[string]func() error{
		"create":   func() error { return os.WriteFile(p("new"), nil, 0o644) },
		"mkdir":    func() error { return os.Mkdir(p("newdir"), 0o755) },
		"unlink":   func() error { return os.Remove(p("file")) },
		"rmdir":    func() error { return unix.Rmdir(p("dir")) },
		"write":    func() error { return openWrite(p("file")) },
		"rename":   func() error { return os.Rename(p("file"), p("renamed")) },
		"symlink":  func() error { return os.Symlink("file", p("sym")) },
		"link":     func() error { return os.Link(p("file"), p("hard")) },
		"chmod":    func() error { return os.Chmod(p("file"), 0o600) },
		"chown":    func() error { return os.Lchown(p("file"), 1, 1) },
		"mknod":    func() error { return unix.Mknod(p("fifo"), unix.S_IFIFO|0o644, 0) },
		"setxattr": func() error { return unix.Setxattr(p("file"), "user.x", []byte("y"), 0) },
		"truncate": func() error { return os.Truncate(p("file"), 0) },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s on a read-only mount: %v, want EROFS", name, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(lower, "file")); err != nil || string(data) != "hello\n" {
		t.Errorf("the lower layer changed: %q, %v", data, err)
	}
}

func openWrite(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		f.Close()
	}
	return err
}

// TestHelpVersion: --help and --version succeed and say something useful.
func TestHelpVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ flag, want string }{
		{"--help", "lowerdir"}, {"-h", "lowerdir"}, {"--version", "goverlay"}, {"-V", "goverlay"},
	} {
		r := goverlay(t, c.flag)
		if r.Code != 0 {
			t.Errorf("goverlay %s: %s", c.flag, r)
		}
		if !strings.Contains(r.Stdout, c.want) {
			t.Errorf("goverlay %s prints %q on stdout, want it to mention %q", c.flag, r.Stdout, c.want)
		}
	}
}

// TestQuietMount: a mount that goes well prints nothing (scripts and
// fstab mounts see no noise); the NOSEC decision goes to the --log file,
// and goverlay stats reports it whatever the flags.
func TestQuietMount(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	t.Parallel()
	lower, mnt := layers(t)
	r := goverlay(t, "-o", "lowerdir="+lower, mnt)
	if r.Code != 0 {
		if testutil.IsMounted(mnt) {
			testutil.Adopt(t, mnt)
		}
		t.Fatalf("goverlay -o lowerdir=... MNT: %s", r)
	}
	m := testutil.Adopt(t, mnt)
	if r.Stderr != "" || r.Stdout != "" {
		t.Errorf("a plain mount printed stdout %q, stderr %q; want nothing", r.Stdout, r.Stderr)
	}
	s := testutil.ReadStats(t, m)
	if s.NoSecReason == "" {
		t.Errorf("goverlay stats gives no NOSEC reason: %+v", s)
	}
	m.Unmount(t)

	lower, _ = layers(t)
	m = testutil.Mount(t, testutil.Options{Lower: []string{lower}})
	if m.LogFile == "" {
		t.Fatal("the harness mounted without --log")
	}
	log, err := os.ReadFile(m.LogFile)
	if err != nil || !strings.Contains(string(log), "NOSEC") {
		t.Errorf("--log file %q (%v) does not record the NOSEC decision", log, err)
	}
	m.Unmount(t)
}

// TestRemountAtOnce: `umount DIR; goverlay ... DIR` run back to back
// mounts again, on the same mountpoint and on another one, though the
// first daemon may still be closing its layers when the second starts.
func TestRemountAtOnce(t *testing.T) {
	testutil.RequireRoot(t)
	for _, where := range []string{"same-mountpoint", "other-mountpoint"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			testutil.LeakCheck(t)
			lower, mnt := layers(t)
			// Enough files that a daemon takes a while to let go of them.
			for i := 0; i < 3000; i++ {
				must(t, os.WriteFile(filepath.Join(lower, "dir", "f"+strconv.Itoa(i)), nil, 0o644))
			}
			base := t.TempDir()
			upper, work := mkdirs(t, base, "upper", "work")
			other, _ := mkdirs(t, base, "other", "unused")
			type daemon struct {
				p   *testutil.Proc
				dir string
				dev uint64
			}
			var daemons []daemon
			t.Cleanup(func() {
				for _, d := range []string{mnt, other} {
					if testutil.IsMounted(d) {
						_ = testutil.Umount(d)
					}
				}
				for _, d := range daemons {
					// A copy of its mount in the namespace of another
					// test's process (podman, unshare) keeps a daemon
					// alive, as the kernel wants.
					if !d.p.Wait(10*time.Second) && testutil.DetachCopiesAt(t, d.dir, d.dev) {
						d.p.Wait(10 * time.Second)
					}
					if d.p.Alive() {
						d.p.Kill()
						t.Errorf("a daemon did not exit after its mount on %s was gone", d.dir)
					}
				}
			})
			opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
			for i := 0; i < 10; i++ {
				dir := mnt
				if where == "other-mountpoint" && i%2 == 1 {
					dir = other
				}
				pidfile := filepath.Join(base, "pid"+strconv.Itoa(i))
				// The race runtime's sleep at exit off (GORACE), as the
				// harness has it: a daemon sleeping there holds its layers.
				r := testutil.Run(t, cmdTimeout, []string{"GORACE=atexit_sleep_ms=0"}, testutil.Binary(t), "--pidfile", pidfile, "-o", opts, dir)
				if r.Code != 0 {
					t.Fatalf("mount %d on %s right after the umount of the last one: %v", i, dir, r)
				}
				data, err := os.ReadFile(pidfile)
				if err != nil {
					t.Fatal(err)
				}
				pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
				if err != nil {
					t.Fatal(err)
				}
				p, err := testutil.Track(pid, "daemon")
				if err != nil {
					t.Fatal(err)
				}
				daemons = append(daemons, daemon{p, dir, testutil.FuseDev(dir)})
				if _, err := os.Stat(filepath.Join(dir, "file")); err != nil {
					t.Fatalf("mount %d: %v", i, err)
				}
				if r := testutil.Run(t, cmdTimeout, []string{"GORACE=atexit_sleep_ms=0"}, testutil.Binary(t), "stats", dir); r.Code != 0 {
					t.Errorf("goverlay stats of mount %d: %v", i, r)
				}
				ents, err := os.ReadDir(filepath.Join(dir, "dir"))
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					if _, err := e.Info(); err != nil {
						t.Fatal(err)
					}
				}
				if err := testutil.Umount(dir); err != nil {
					t.Fatal(err)
				}
				// A copy of the mount that another test's process
				// (podman, unshare) took into its namespace would
				// keep this daemon, and the upperdir, for good.
				testutil.DetachCopiesAt(t, dir, daemons[len(daemons)-1].dev)
			}
		})
	}
}
