package testutil

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The daemon a background mount leaves behind is the grandchild of the test
// process: the command we run forks it and exits. Making the test process a
// child subreaper (prctl(2)) has the orphaned daemon reparented to us, so we
// can collect its exit status like a child's.
var subreaperOnce sync.Once

func becomeSubreaper() {
	subreaperOnce.Do(func() {
		// Best effort: without it we still see the daemon exit
		// through its pidfd, only not its status.
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	})
}

// Proc is a process the harness started, directly or not, watched through a
// pidfd so that neither its exit nor a kill can hit a recycled PID.
type Proc struct {
	PID  int
	Name string // the test that started it

	fd int

	mu     sync.Mutex
	reaped bool
	status unix.WaitStatus
	known  bool // status was collected (the process was our child)
}

var (
	procsMu sync.Mutex
	procs   = map[*Proc]bool{}
)

// Track starts watching pid on behalf of the test called name.
func Track(pid int, name string) (*Proc, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	p := &Proc{PID: pid, Name: name, fd: fd}
	procsMu.Lock()
	procs[p] = true
	procsMu.Unlock()
	return p, nil
}

// Wait waits up to timeout for the process to exit and reports whether it
// did. It blocks in poll(2) on the pidfd: no sleeping.
func (p *Proc) Wait(timeout time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return true
	}
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		break
	}
	p.reaped = true
	var ws unix.WaitStatus
	// The process has exited; if it is our child (directly or through
	// the subreaper) it is a zombie whose PID cannot be reused yet.
	for {
		wpid, err := unix.Wait4(p.PID, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && wpid == p.PID {
			p.status, p.known = ws, true
		}
		break
	}
	unix.Close(p.fd)
	p.fd = -1
	procsMu.Lock()
	delete(procs, p)
	procsMu.Unlock()
	return true
}

// Alive reports whether the process has not exited yet.
func (p *Proc) Alive() bool { return !p.Wait(0) }

// Kill sends SIGKILL through the pidfd, then waits for the exit.
func (p *Proc) Kill() {
	p.mu.Lock()
	if !p.reaped {
		_ = unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0)
	}
	p.mu.Unlock()
	p.Wait(10 * time.Second)
}

// Signal sends sig through the pidfd.
func (p *Proc) Signal(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return os.ErrProcessDone
	}
	return unix.PidfdSendSignal(p.fd, sig, nil, 0)
}

// Status describes how the process ended: ok is true for exit code 0, and
// known is false when it was not our child and so its status is unknowable.
func (p *Proc) Status() (ok, known bool, desc string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.reaped:
		return false, false, "still running"
	case !p.known:
		return false, false, "exited (status unknown: not our child)"
	case p.status.Exited():
		c := p.status.ExitStatus()
		d := "exit status " + strconv.Itoa(c)
		if c == 66 {
			d += " (the race detector found a data race: see the daemon log)"
		}
		return c == 0, true, d
	case p.status.Signaled():
		return false, true, "killed by " + p.status.Signal().String()
	}
	return false, true, fmt.Sprintf("wait status %#x", uint32(p.status))
}

// liveProcs lists the tracked processes that have not exited, for name
// ("" for all).
func liveProcs(name string) []*Proc {
	procsMu.Lock()
	var ps []*Proc
	for p := range procs {
		if name == "" || p.Name == name {
			ps = append(ps, p)
		}
	}
	procsMu.Unlock()
	var live []*Proc
	for _, p := range ps {
		if p.Alive() {
			live = append(live, p)
		}
	}
	return live
}

// FindProcs lists the PIDs of the live processes running the executable
// exe (the same file, whatever path it was started by) that have arg as
// one of their arguments, for daemons started by a program we do not
// control the arguments of (mount(8)).
func FindProcs(exe, arg string) []int {
	return findProcs(exe, func(a string) bool { return a == arg })
}

// FindProcsMentioning lists the live processes running exe with an
// argument that contains substr.
func FindProcsMentioning(exe, substr string) []int {
	return findProcs(exe, func(a string) bool { return strings.Contains(a, substr) })
}

func findProcs(exe string, match func(string) bool) []int {
	if exe == "" {
		return nil
	}
	want, err := os.Stat(exe)
	if err != nil {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// Stat follows the magic link to the running file itself.
		if fi, err := os.Stat("/proc/" + e.Name() + "/exe"); err != nil || !os.SameFile(fi, want) {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(cmd), "\x00") {
			if match(a) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}
