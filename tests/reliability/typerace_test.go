package reliability_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestTypeRace: workers create, symlink, unlink, rename, mkdir, rmdir and
// link the same few names in three directories while the page, dentry
// and inode caches are dropped every second, so that inode numbers are
// reused by objects of another type while the kernel may still know the
// old ones. Every reply must describe the object the operation made or
// found: no EIO (the kernel's answer to a node of the wrong type), no
// EINVAL from following a symlink that was answered as a file. The view
// while mounted must then match a remount's. The workers run chrooted in
// the mount (their symlinks have absolute targets); the kernel overlay
// runs the same workload, which shows the errors counted as legitimate
// are its errors too.
func TestTypeRace(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.Binary(t)
	s := seed(t, 11)
	dur := pick(8*time.Second, 60*time.Second)
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("d/a", "lower a\n", 0o644).Dir("d/s1", 0o755).File("d/s2/b", "lower b\n", 0o644)
	}
	for _, kind := range []string{"goverlay", "kernel"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			st := newStack(t, 1, build)
			var mnt string
			var g *testutil.Mounted
			if kind == "kernel" {
				mnt = mountK(t, st)
			} else {
				g = mountG(t, st)
				mnt = g.Dir
			}
			ok, bad := typeRaceRun(t, mnt, s, dur)
			t.Logf("%s: %d operations succeeded in %v", kind, ok, dur)
			for _, b := range bad {
				t.Errorf("%s: not a legitimate error of concurrent operations: %s", kind, b)
			}
			if ok < 100 {
				t.Errorf("only %d operations succeeded: the workload is not doing anything", ok)
			}
			if g == nil {
				return
			}
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
				t.Fatal(err)
			}
			live := testutil.Snapshot(t, g.Dir)
			g.Unmount(t)
			again := mountG(t, st)
			remount := testutil.Snapshot(t, again.Dir)
			again.Unmount(t)
			reportDiff(t, "goverlay's view while mounted vs after a remount", diffTrees(normalize(live, never), normalize(remount, never), "live", "remounted"))
		})
	}
}

// typeRaceEnv carries root, seed and duration to a worker process.
const typeRaceEnv = "GOVERLAY_TYPERACE_WORKER"

// typeRaceRun runs the workers, in a process of their own chrooted in
// mnt, dropping the caches every second; it returns the operations that
// succeeded and the errors that are not legitimate.
func typeRaceRun(t *testing.T, mnt string, seed int64, dur time.Duration) (int, []string) {
	t.Helper()
	return raceRun(t, fmt.Sprintf("types:%s:%d:%d", mnt, seed, dur.Milliseconds()), dur)
}

// raceRun runs a worker process with arg (raceWorkerMain), dropping the
// caches every second; it returns the operations that succeeded and the
// lines the workers printed otherwise.
func raceRun(t *testing.T, arg string, dur time.Duration) (int, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dur+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), typeRaceEnv+"="+arg)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				unix.Sync()
				os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
			}
		}
	}()
	ok := 0
	var bad []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := sc.Text()
		if n, found := strings.CutPrefix(l, "ok "); found {
			ok, _ = strconv.Atoi(n)
		} else if len(bad) < 50 {
			bad = append(bad, l)
		}
	}
	err = cmd.Wait()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the worker process: %v", err)
	}
	return ok, bad
}

// typeRaceLegit are the errors concurrent operations on one name space
// cause by themselves.
var typeRaceLegit = map[string][]unix.Errno{
	"create":  {unix.ENOENT, unix.EEXIST, unix.ENOTDIR, unix.EISDIR},
	"symlink": {unix.ENOENT, unix.EEXIST, unix.ENOTDIR},
	"unlink":  {unix.ENOENT, unix.ENOTDIR, unix.EISDIR},
	"rename":  {unix.ENOENT, unix.ENOTDIR, unix.EISDIR, unix.ENOTEMPTY, unix.EEXIST, unix.EINVAL},
	"mkdir":   {unix.ENOENT, unix.EEXIST, unix.ENOTDIR},
	"rmdir":   {unix.ENOENT, unix.ENOTDIR, unix.ENOTEMPTY},
	"link":    {unix.ENOENT, unix.EEXIST, unix.ENOTDIR, unix.EPERM},
	"stat":    {unix.ENOENT, unix.ENOTDIR, unix.ELOOP},
	"open":    {unix.ENOENT, unix.ENOTDIR, unix.ELOOP},
}

// raceWorkerMain is a worker process of TestTypeRace or TestNameRace:
// arg is KIND:ROOT:SEED:MILLISECONDS[:EXTRA]. It chroots into the mount
// at ROOT, so that the symlinks its workers make lead nowhere outside it
// for them, and runs the workers.
func raceWorkerMain(arg string) int {
	f := strings.Split(arg, ":")
	if len(f) < 4 {
		fmt.Fprintf(os.Stderr, "bad %s=%q\n", typeRaceEnv, arg)
		return 2
	}
	seed, _ := strconv.ParseInt(f[2], 10, 64)
	ms, _ := strconv.Atoi(f[3])
	if err := unix.Chroot(f[1]); err != nil {
		fmt.Fprintf(os.Stderr, "chroot %s: %v\n", f[1], err)
		return 2
	}
	if err := os.Chdir("/"); err != nil {
		fmt.Fprintf(os.Stderr, "chdir: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
	defer cancel()
	switch f[0] {
	case "types":
		return typeRaceWorkers(ctx, seed)
	case "names":
		return nameRaceWorkers(ctx, f[4:])
	}
	fmt.Fprintf(os.Stderr, "bad %s=%q\n", typeRaceEnv, arg)
	return 2
}

// typeRaceWorkers runs four workers; it prints each illegitimate error,
// then "ok N".
func typeRaceWorkers(ctx context.Context, seed int64) int {
	dirs := []string{"/d", "/d/s1", "/d/s2"}
	names := []string{"a", "b", "c"}
	targets := []string{"a", "../b", "/d/c", "/etc", "s1"}
	var mu sync.Mutex
	ok := 0
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed*100 + int64(w)))
			path := func() string {
				return filepath.Join(dirs[rng.Intn(len(dirs))], names[rng.Intn(len(names))])
			}
			ops := []string{"create", "symlink", "unlink", "rename", "mkdir", "rmdir", "link", "stat", "open"}
			buf := make([]byte, 4096)
			for ctx.Err() == nil {
				op := ops[rng.Intn(len(ops))]
				p := path()
				what := op + " " + p
				var err error
				switch op {
				case "create":
					var fd int
					if fd, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err == nil {
						unix.Close(fd)
					}
				case "symlink":
					tg := targets[rng.Intn(len(targets))]
					what += " -> " + tg
					err = unix.Symlink(tg, p)
				case "unlink":
					err = unix.Unlink(p)
				case "rename":
					q := path()
					what += " " + q
					err = unix.Rename(p, q)
				case "mkdir":
					err = unix.Mkdir(p, 0o755)
				case "rmdir":
					err = unix.Rmdir(p)
				case "link":
					q := path()
					what += " " + q
					err = unix.Link(p, q)
				case "stat":
					var st unix.Stat_t
					err = unix.Stat(p, &st)
				case "open":
					var fd int
					if fd, err = unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
						_, err = unix.Read(fd, buf)
						if err == unix.EISDIR {
							err = nil
						}
						unix.Close(fd)
					}
				}
				e, _ := err.(unix.Errno)
				legit := err == nil
				for _, l := range typeRaceLegit[op] {
					legit = legit || e == l
				}
				mu.Lock()
				if err == nil {
					ok++
				} else if !legit {
					fmt.Printf("%s: %v\n", what, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	fmt.Printf("ok %d\n", ok)
	return 0
}

// TestNameRace: workers change a file through its descriptor (fchmod,
// fsetxattr, fremovexattr, ftruncate, pwrite, futimens) while others
// rename a symlink to a canary outside the layers over its name, and a
// new file over that: an operation must reach the file it was asked for,
// never the symlink's target nor the file that took the name, so the
// canary keeps its mode, size and attributes. The kernel overlay runs the
// same workload.
func TestNameRace(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.Binary(t)
	dur := pick(6*time.Second, 60*time.Second)
	for _, kind := range []string{"goverlay", "kernel"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			canary := filepath.Join(t.TempDir(), "canary")
			if err := os.WriteFile(canary, []byte("canary\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			st := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) {
				l[0].File("f", "lower f\n", 0o644)
			})
			var mnt string
			if kind == "kernel" {
				mnt = mountK(t, st)
			} else {
				mnt = mountG(t, st).Dir
			}
			ok, lines := raceRun(t, fmt.Sprintf("names:%s:0:%d:%s", mnt, dur.Milliseconds(), canary), dur)
			t.Logf("%s: %d operations succeeded in %v", kind, ok, dur)
			for _, l := range lines {
				t.Errorf("%s: %s", kind, l)
			}
			if ok < 100 {
				t.Errorf("only %d operations succeeded: the workload is not doing anything", ok)
			}
			var cst unix.Stat_t
			if err := unix.Stat(canary, &cst); err != nil {
				t.Fatal(err)
			}
			if cst.Mode&07777 != 0o600 || cst.Size != 7 {
				t.Errorf("the canary outside the layers was changed through the mount: mode %o size %d, want 600 and 7", cst.Mode&07777, cst.Size)
			}
			if n, _ := unix.Listxattr(canary, make([]byte, 1024)); n > 0 {
				t.Errorf("the canary outside the layers got attributes through the mount")
			}
		})
	}
}

// nameRaceWorkers: four workers change /f through descriptors, two
// rename a symlink to the canary (args[0]) and new files over /f. It
// prints EIO and errors that are not an errno, then "ok N".
func nameRaceWorkers(ctx context.Context, args []string) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "names: want the canary's path\n")
		return 2
	}
	canary := args[0]
	var mu sync.Mutex
	ok := 0
	report := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			ok++
			return
		}
		if e, isErrno := err.(unix.Errno); !isErrno || e == unix.EIO {
			fmt.Printf("%s: %v\n", what, err)
		}
	}
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, g := fmt.Sprintf("/s%d", w), fmt.Sprintf("/g%d", w)
			for ctx.Err() == nil {
				unix.Unlink(s)
				report("symlink", unix.Symlink(canary, s))
				report("rename symlink over f", unix.Rename(s, "/f"))
				fd, err := unix.Open(g, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
				if err == nil {
					unix.Close(fd)
				}
				report("create", err)
				report("rename file over f", unix.Rename(g, "/f"))
			}
		}()
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts := []unix.Timespec{{Sec: 1000}, {Sec: 2000}}
			for i := 0; ctx.Err() == nil; i++ {
				fd, err := unix.Open("/f", unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					continue // a symlink there now (ELOOP), or nothing
				}
				report("fchmod", unix.Fchmod(fd, 0o640|uint32(w&1)<<2))
				report("fsetxattr", unix.Fsetxattr(fd, "user.race", []byte("w"), 0))
				report("fremovexattr", unix.Fremovexattr(fd, "user.race"))
				report("ftruncate", unix.Ftruncate(fd, 0))
				_, err = unix.Pwrite(fd, []byte("w"), 0)
				report("pwrite", err)
				report("futimens", unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH))
				unix.Close(fd)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("ok %d\n", ok)
	return 0
}
