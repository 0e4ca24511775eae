package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Counting the FUSE requests that reach a daemon, from the kernel's side,
// for any FUSE target (fuse-overlayfs as well as goverlay): the
// fuse:fuse_request_send tracepoint, counted with perf_event_open(2) on
// every CPU and filtered on the mount's connection, which is what
//
//	perf stat -e fuse:fuse_request_send --filter 'connection == N' -a
//
// counts, without the perf binary and started and stopped exactly around
// the timed loop. The tracepoint fires once per request queued for the
// daemon (FORGETs, which go on their own queue, are not counted).

// fuseOpcodes are the request types counted separately when a workload
// asks for a breakdown; every other type is counted as "other".
var fuseOpcodes = []struct {
	code uint32
	name string
}{
	{1, "LOOKUP"}, {3, "GETATTR"}, {4, "SETATTR"}, {9, "MKDIR"}, {10, "UNLINK"},
	{14, "OPEN"}, {15, "READ"}, {18, "RELEASE"}, {22, "GETXATTR"}, {23, "LISTXATTR"}, {25, "FLUSH"},
	{27, "OPENDIR"}, {28, "READDIR"}, {29, "RELEASEDIR"}, {34, "ACCESS"},
	{35, "CREATE"}, {44, "READDIRPLUS"}, {52, "STATX"},
}

// fuseTracer opens the counters; err says why it cannot.
type fuseTracer struct {
	id   uint64 // the tracepoint's id
	cpus []int
	err  error
}

// newFuseTracer finds the tracepoint and checks that a filtered counter
// can be opened here (root, or a low perf_event_paranoid).
func newFuseTracer() *fuseTracer {
	t := &fuseTracer{}
	var idText []byte
	for try := 0; try < 2 && idText == nil; try++ {
		if try == 1 {
			// tracefs is not mounted: mount it where the kernel
			// documents it (Documentation/trace/ftrace.rst); it stays.
			if unix.Mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, "") != nil {
				break
			}
		}
		for _, dir := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
			b, err := os.ReadFile(filepath.Join(dir, "events/fuse/fuse_request_send/id"))
			if err == nil {
				idText = b
				break
			}
		}
	}
	if idText == nil {
		t.err = errors.New("no fuse:fuse_request_send tracepoint (tracefs not mounted, or a kernel without FUSE tracepoints)")
		return t
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(idText)), 10, 64)
	if err != nil {
		t.err = fmt.Errorf("fuse:fuse_request_send id %q: %v", idText, err)
		return t
	}
	t.id = id
	if t.cpus, err = onlineCPUs(); err != nil {
		t.err = err
		return t
	}
	c, err := t.start(0, false)
	if err != nil {
		t.err = err
		return t
	}
	c.close()
	return t
}

// onlineCPUs parses /sys/devices/system/cpu/online ("0-1,4").
func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, err
	}
	var cpus []int
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, found := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if found {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("cannot parse the online CPUs %q", b)
		}
		for c := a; c <= z; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// fuseConnection is the connection number the tracepoint reports for the
// FUSE mount at mnt: the superblock's device in the kernel's encoding
// (MKDEV: major << 20 | minor).
func fuseConnection(mnt string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return 0, err
	}
	return uint64(unix.Major(st.Dev))<<20 | uint64(unix.Minor(st.Dev)), nil
}

// reqCounter is a set of live counters: kinds[i] on every CPU is fds[i].
type reqCounter struct {
	kinds []string
	fds   [][]int
}

// start opens and enables counters of the requests of connection conn:
// "total", and with byType one per fuseOpcodes entry.
func (t *fuseTracer) start(conn uint64, byType bool) (*reqCounter, error) {
	if t.err != nil {
		return nil, t.err
	}
	c := &reqCounter{}
	filters := []string{fmt.Sprintf("connection == %d", conn)}
	c.kinds = []string{"total"}
	if byType {
		for _, op := range fuseOpcodes {
			filters = append(filters, fmt.Sprintf("connection == %d && opcode == %d", conn, op.code))
			c.kinds = append(c.kinds, op.name)
		}
	}
	for _, f := range filters {
		var fds []int
		for _, cpu := range t.cpus {
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: t.id, Bits: unix.PerfBitDisabled}
			attr.Size = uint32(unsafe.Sizeof(attr))
			fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
			if err != nil {
				c.fds = append(c.fds, fds)
				c.close()
				return nil, fmt.Errorf("perf_event_open(fuse:fuse_request_send, cpu %d): %w", cpu, err)
			}
			fds = append(fds, fd)
			if err := unix.IoctlSetString(fd, unix.PERF_EVENT_IOC_SET_FILTER, f); err != nil {
				c.fds = append(c.fds, fds)
				c.close()
				return nil, fmt.Errorf("perf filter %q: %w", f, err)
			}
		}
		c.fds = append(c.fds, fds)
	}
	for _, fds := range c.fds {
		for _, fd := range fds {
			if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
				c.close()
				return nil, fmt.Errorf("enable perf counter: %w", err)
			}
		}
	}
	return c, nil
}

// stop disables the counters, reads them and closes them. The result has
// "total" and, with a breakdown, each type that was counted, plus "other"
// for the rest.
func (c *reqCounter) stop() (map[string]uint64, error) {
	defer c.close()
	for _, fds := range c.fds {
		for _, fd := range fds {
			unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_DISABLE, 0)
		}
	}
	out := map[string]uint64{}
	buf := make([]byte, 8)
	for i, fds := range c.fds {
		var sum uint64
		for _, fd := range fds {
			n, err := unix.Read(fd, buf)
			if err != nil || n != 8 {
				return nil, fmt.Errorf("read perf counter: %d bytes, %v", n, err)
			}
			sum += binary.NativeEndian.Uint64(buf)
		}
		out[c.kinds[i]] = sum
	}
	if len(c.kinds) > 1 {
		var typed uint64
		for _, k := range c.kinds[1:] {
			typed += out[k]
		}
		if out["total"] >= typed {
			out["other"] = out["total"] - typed
		}
	}
	return out, nil
}

func (c *reqCounter) close() {
	for _, fds := range c.fds {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	c.fds = nil
}
