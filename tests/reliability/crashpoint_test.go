package reliability_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestCrashAtSyscall kills the daemon at exact points instead of random
// ones: strace follows every thread of the daemon and holds each call of
// one syscall for a moment after it returned (delay_exit), the test counts
// the calls in strace's output (over all threads: strace's own when=
// counts per thread) and sends SIGKILL right after the nth. The
// operations run one at a time, so the merged view after a remount must
// be the view after some prefix of them, the one in flight included or
// not; the views after each prefix come from the kernel overlay running
// the same operations on a copy of the layers.

// seqOp is one operation of a sequential crash script.
type seqOp struct {
	what string
	fn   func(mnt string) error
}

type crashPoint struct {
	name  string
	lower func(l *testutil.Layer)
	ops   []seqOp
	// The daemon dies right after its nth call of syscall returned.
	syscall string
	nth     int
}

func opUnlink(rel string) seqOp {
	return seqOp{"unlink " + rel, func(m string) error { return unix.Unlink(filepath.Join(m, rel)) }}
}

func opRmdir(rel string) seqOp {
	return seqOp{"rmdir " + rel, func(m string) error { return unix.Rmdir(filepath.Join(m, rel)) }}
}

func opRename(from, to string) seqOp {
	return seqOp{"rename " + from + " " + to, func(m string) error {
		return unix.Rename(filepath.Join(m, from), filepath.Join(m, to))
	}}
}

func opLink(from, to string) seqOp {
	return seqOp{"link " + from + " " + to, func(m string) error {
		return unix.Link(filepath.Join(m, from), filepath.Join(m, to))
	}}
}

func opAppend(rel, data string) seqOp {
	return seqOp{"append to " + rel, func(m string) error {
		f, err := os.OpenFile(filepath.Join(m, rel), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}}
}

func opCreate(rel string) seqOp { return opCreateMode(rel, 0o644) }

// opCreateMode creates rel with mode: one with the sticky bit is not made
// in place (upper.Layer.inPlace) but unnamed, then linked.
func opCreateMode(rel string, mode uint32) seqOp {
	return seqOp{fmt.Sprintf("create %s %#o", rel, mode), func(m string) error {
		fd, err := unix.Open(filepath.Join(m, rel), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, mode)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	}}
}

var crashPoints = []crashPoint{
	{
		name:  "copy-up/after-fsync-of-the-copy",
		lower: func(l *testutil.Layer) { l.File("f", strings.Repeat("data", 1<<18), 0o644) },
		ops:   []seqOp{opAppend("f", "X")}, syscall: "fsync", nth: 1,
	},
	{
		name:  "copy-up/after-publishing-rename",
		lower: func(l *testutil.Layer) { l.File("f", strings.Repeat("data", 1<<18), 0o644) },
		ops:   []seqOp{opAppend("f", "X")}, syscall: "renameat2", nth: 1,
	},
	{
		name:  "whiteouts/after-second-mknod",
		lower: func(l *testutil.Layer) { l.File("d/a", "a", 0o644).File("d/b", "b", 0o644).File("d/c", "c", 0o644) },
		ops:   []seqOp{opUnlink("d/a"), opUnlink("d/b"), opUnlink("d/c")}, syscall: "mknodat", nth: 2,
	},
	{
		name:  "dir-rename/after-copy-up-of-the-dir",
		lower: func(l *testutil.Layer) { l.File("D/x", "x", 0o644).File("D/sub/y", "y", 0o600) },
		ops:   []seqOp{opRename("D", "E"), opRename("E", "F")}, syscall: "renameat2", nth: 1,
	},
	{
		name:  "dir-rename/after-setting-the-redirect",
		lower: func(l *testutil.Layer) { l.File("D/x", "x", 0o644).File("D/sub/y", "y", 0o600) },
		ops:   []seqOp{opRename("D", "E"), opRename("E", "F")}, syscall: "setxattr", nth: 1,
	},
	{
		name: "dir-rename/after-the-second-redirect",
		// The second rename changes the parent: the relative
		// redirect the first wrote ("D") is replaced by an absolute
		// one. (Within one parent it would be kept, as the kernel's
		// ovl_set_redirect() keeps it.)
		lower: func(l *testutil.Layer) { l.File("D/x", "x", 0o644).File("D/sub/y", "y", 0o600).Dir("P", 0o755) },
		ops:   []seqOp{opRename("D", "E"), opRename("E", "P/F")}, syscall: "setxattr", nth: 2,
	},
	{
		// rename(2) onto an empty-looking merged directory: goverlay
		// first deletes the whiteouts inside the target's upper
		// instance, one by one, then renames. The kernel overlay
		// replaces the target with an opaque empty directory in one
		// exchange (ovl_clear_empty()), so no crash brings the deleted
		// names back.
		name: "rename-onto-emptied-merged-dir/after-first-whiteout-removal",
		lower: func(l *testutil.Layer) {
			for j := range 8 {
				l.File(fmt.Sprintf("T/n%d", j), fmt.Sprintf("n%d", j), 0o644)
			}
			l.File("S/s1", "s1", 0o644)
		},
		ops: []seqOp{
			opUnlink("T/n0"), opUnlink("T/n1"), opUnlink("T/n2"), opUnlink("T/n3"),
			opUnlink("T/n4"), opUnlink("T/n5"), opUnlink("T/n6"), opUnlink("T/n7"),
			opRename("S", "T"),
		},
		syscall: "unlinkat", nth: 1,
	},
	{
		// A new file whose open would not give it its mode (here the
		// sticky bit) is made unnamed (O_TMPFILE), given its owner and
		// mode, then linked into place: killed before the linkat, it
		// leaves nothing. (One the open gives everything is made in
		// place by that one openat: there is no state in between.)
		name:  "create/after-fchmod-of-the-unnamed-file",
		lower: func(l *testutil.Layer) { l.File("d/old", "old", 0o644) },
		ops:   []seqOp{opCreateMode("d/new", 0o1644), opAppend("d/new", "new")}, syscall: "fchmod", nth: 1,
	},
	{
		name:  "create/after-linkat",
		lower: func(l *testutil.Layer) { l.File("d/old", "old", 0o644) },
		ops:   []seqOp{opCreateMode("d/new", 0o1644), opAppend("d/new", "new")}, syscall: "linkat", nth: 1,
	},
	{
		name:  "create-over-whiteout/after-the-exchange",
		lower: func(l *testutil.Layer) { l.File("a", "old", 0o644) },
		ops:   []seqOp{opUnlink("a"), opCreate("a"), opAppend("a", "new")}, syscall: "renameat2", nth: 1,
	},
	{
		name:  "rmdir-merged-dir/after-rename-whiteout",
		lower: func(l *testutil.Layer) { l.File("D/x", "x", 0o644).File("D/y", "y", 0o644) },
		ops:   []seqOp{opUnlink("D/x"), opUnlink("D/y"), opRmdir("D")}, syscall: "unlinkat", nth: 1,
	},
	{
		name:  "rename-file-over-lower-file/after-copy-up",
		lower: func(l *testutil.Layer) { l.File("a", "a", 0o644).File("b", "b", 0o600) },
		ops:   []seqOp{opRename("a", "b")}, syscall: "renameat2", nth: 1,
	},
	{
		name:  "link/after-linking-into-workdir",
		lower: func(l *testutil.Layer) { l.File("a", "a", 0o644) },
		ops:   []seqOp{opLink("a", "c"), opAppend("c", "more")}, syscall: "linkat", nth: 1,
	},
}

func TestCrashAtSyscall(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace not installed: exact crash points need it")
	}
	testutil.Binary(t)
	for _, cp := range crashPoints {
		t.Run(cp.name, func(t *testing.T) {
			t.Parallel()
			crashAt(t, cp)
		})
	}
}

func crashAt(t *testing.T, cp crashPoint) {
	start := time.Now()
	build := func(lowers []*testutil.Layer, _ *testutil.Layer) { cp.lower(lowers[0]) }
	ks := newStack(t, 1, build)
	gs := newStack(t, 1, build)

	// The views after each prefix of the script, on the kernel overlay.
	kmnt := mountK(t, ks)
	states := []testutil.Tree{normalize(testutil.Snapshot(t, kmnt), start)}
	for _, op := range cp.ops {
		if err := op.fn(kmnt); err != nil {
			t.Fatalf("the script fails on the kernel overlay: %s: %v", op.what, err)
		}
		states = append(states, normalize(testutil.Snapshot(t, kmnt), start))
	}
	testutil.UnmountKernel(t, kmnt)

	m := mountG(t, gs)
	tr := startTracer(t, m.PID, cp.syscall)
	opsDone := make(chan []string, 1)
	var opsLog opLog
	go func() {
		for _, op := range cp.ops {
			if !opsLog.ok(op.what, op.fn(m.Dir)) {
				break
			}
		}
		opsLog.mu.Lock()
		defer opsLog.mu.Unlock()
		opsDone <- opsLog.bad
	}()
	calls := 0
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
wait:
	for {
		select {
		case line, ok := <-tr.lines:
			if !ok {
				t.Fatalf("strace ended after %d %s calls:\n%s", calls, cp.syscall, tr.transcript())
			}
			tr.seen = append(tr.seen, line)
			if completedCall(line, cp.syscall) {
				calls++
				if calls == cp.nth {
					opsLog.kill()
					m.Crash(t)
					break wait
				}
			}
		case bad := <-opsDone:
			m.Crash(t)
			t.Fatalf("the script ended (errors %q) after only %d %s calls of the %d the crash point needs:\n%s", bad, calls, cp.syscall, cp.nth, tr.transcript())
		case <-deadline.C:
			m.Crash(t)
			t.Fatalf("no %dth %s call within 60s (%d seen):\n%s", cp.nth, cp.syscall, calls, tr.transcript())
		}
	}
	for _, b := range <-opsDone {
		t.Errorf("operation failed with another error than the dead connection's: %s", b)
	}
	tr.wait(t)
	if err := statSync(m.Dir); !errors.Is(err, unix.ENOTCONN) {
		t.Errorf("stat of the dead mount: %v, want ENOTCONN", err)
	}
	if err := unix.Unmount(m.Dir, unix.MNT_DETACH); err != nil {
		t.Fatalf("umount2(MNT_DETACH): %v", err)
	}

	m2 := mountG(t, gs)
	testutil.WorkEmpty(t, gs.work)
	if stray := strayTemps(t, gs.upper); len(stray) > 0 {
		t.Errorf("temporary files published in the upper layer: %q", stray)
	}
	gt := normalize(testutil.Snapshot(t, m2.Dir), start)
	m2.Unmount(t)
	kt := normalize(testutil.Snapshot(t, mountK(t, gs)), start)

	for label, view := range map[string]testutil.Tree{"goverlay": gt, "the kernel overlay over the upper goverlay left": kt} {
		best, bestDiff := -1, []string(nil)
		for k, st := range states {
			// A directory copied up is merged: both overlays then
			// report nlink 1 (ovl_getattr()).
			d := testutil.DiffWith(st, view, testutil.DiffOptions{IgnoreDirNlink: true, A: fmt.Sprintf("after %d ops", k), B: "after the crash"})
			if len(d) == 0 {
				best, bestDiff = k, nil
				break
			}
			if best < 0 || len(d) < len(bestDiff) {
				best, bestDiff = k, d
			}
		}
		if bestDiff == nil {
			t.Logf("%s after the crash shows the state after %d of %d operations", label, best, len(cp.ops))
			continue
		}
		var script []string
		for _, op := range cp.ops {
			script = append(script, op.what)
		}
		t.Errorf("SIGKILL right after the daemon's call %d of %s during %q, then a remount: %s shows a state that no prefix of the script leaves; closest is after %d operations:\n  %s",
			cp.nth, cp.syscall, script, label, best, strings.Join(bestDiff, "\n  "))
	}
}

// completedCall reports whether a line of strace -f output is a call of
// name that returned: "PID name(args) = R" or "PID <... name resumed>...
// = R", not "PID name(args <unfinished ...>".
func completedCall(line, name string) bool {
	if strings.HasSuffix(line, "<unfinished ...>") {
		return false
	}
	return (strings.Contains(line, " "+name+"(") || strings.Contains(line, "<... "+name+" resumed>")) && returned.MatchString(line)
}

// returned matches the end of a call that returned: ")", padding, "= R".
var returned = regexp.MustCompile(`\)\s+= `)

// tracer is a running strace attached to the daemon.
type tracer struct {
	cmd   *exec.Cmd
	lines chan string
	seen  []string
	done  chan struct{}
}

// startTracer attaches strace to every thread of pid, tracing syscall and
// holding each call 300ms after it returned, and returns once strace says
// it attached (from then on every call is seen). strace is killed, by its
// PID, at the end of the test if still running.
func startTracer(t *testing.T, pid int, syscall string) *tracer {
	t.Helper()
	// The trace goes to its own pipe (fd 3 of strace): strace's messages
	// on stderr ("Process N attached" for every new thread) would
	// otherwise land in the middle of a traced call's line.
	traceR, traceW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("strace", "-f", "-o", "/dev/fd/3", "-e", "trace="+syscall, "-e", "inject="+syscall+":delay_exit=300ms", "-p", strconv.Itoa(pid))
	cmd.ExtraFiles = []*os.File{traceW}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("strace: %v", err)
	}
	traceW.Close()
	tr := &tracer{cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-tr.done:
		default:
			cmd.Process.Kill()
			<-tr.done
		}
	})
	attached := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "attached") {
				once = true
				close(attached)
			}
		}
	}()
	go func() {
		sc := bufio.NewScanner(traceR)
		for sc.Scan() {
			tr.lines <- sc.Text()
		}
		traceR.Close()
		close(tr.lines)
		cmd.Wait()
		close(tr.done)
	}()
	select {
	case <-attached:
	case <-tr.done:
		t.Fatalf("strace -p %d exited before attaching", pid)
	case <-time.After(30 * time.Second):
		t.Fatalf("strace -p %d did not attach within 30s", pid)
	}
	return tr
}

// transcript is what strace printed so far (for failure messages).
func (tr *tracer) transcript() string {
	for {
		select {
		case l, ok := <-tr.lines:
			if !ok {
				return strings.Join(tr.seen, "\n")
			}
			tr.seen = append(tr.seen, l)
		default:
			return strings.Join(tr.seen, "\n")
		}
	}
}

// detach stops strace (SIGTERM: it detaches from the daemon, which runs
// on untraced) and waits for it, keeping what it printed in seen.
func (tr *tracer) detach(t *testing.T) {
	t.Helper()
	tr.cmd.Process.Signal(unix.SIGTERM)
	tr.wait(t)
}

// wait waits for strace to exit after its tracee died, keeping what it
// printed in seen.
func (tr *tracer) wait(t *testing.T) {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-tr.lines:
			if !ok {
				<-tr.done
				return
			}
			tr.seen = append(tr.seen, l)
		case <-timer.C:
			t.Errorf("strace still running 30s after the daemon died: killing it")
			tr.cmd.Process.Kill()
			for l := range tr.lines {
				tr.seen = append(tr.seen, l)
			}
			<-tr.done
			return
		}
	}
}
