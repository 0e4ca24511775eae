package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The daemon-memory workloads: what the daemon keeps per inode the kernel
// caches (target ≤ 1 KiB), what it keeps idle (target ≤ 20 MiB RSS), and
// that the memory comes back once the kernel forgets the inodes
// (`echo 2 > /proc/sys/vm/drop_caches`). They read the FUSE daemon's
// VmRSS, so they apply only to the targets that have one.

// How long the daemon's RSS may take to settle after a drop of the
// dentries and inodes (the kernel sends its FORGETs after the write to
// drop_caches returns, and the daemon then frees what it held), and how
// long it must stay without a new low to count as settled.
const (
	rssSettleLimit = 5 * time.Second
	rssSettleQuiet = time.Second
	rssPoll        = 100 * time.Millisecond
)

// hasDaemon says whether t is served by a FUSE daemon whose memory the
// mem-* workloads can read.
func hasDaemon(t *targetDef) bool {
	return t.kind == kindGoverlay || t.kind == kindFuseOverlayfs
}

// noDaemon says why a workload that reads a FUSE daemon's memory means
// nothing on t, or "" when t has a daemon.
func noDaemon(t *targetDef) string {
	if hasDaemon(t) {
		return ""
	}
	return "no FUSE daemon"
}

// memPerInode drops the dentries and inodes (the kernel FORGETs the
// daemon's; the daemon returns to idle), waits for the daemon's RSS to
// settle, walks tree/ as findCold does (every entry stat'ed, so the
// kernel holds an inode for each and the daemon a record), and reads the
// RSS again. It returns the growth in bytes per entry walked.
func memPerInode(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	pid, err := daemonPID(inst)
	if err != nil {
		return sample{}, err
	}
	before, err := idleRSS(ctx, pid)
	if err != nil {
		return sample{}, err
	}
	fd, err := sysOpen(filepath.Join(inst.root, dcTreeDir), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return sample{}, err
	}
	seen, err := walkFd(ctx, fd, make([]byte, direntBuf))
	if err != nil {
		return sample{}, err
	}
	if want := int64(b.dc.treeEntries()); seen != want {
		return sample{}, fmt.Errorf("the walk found %d entries, want %d", seen, want)
	}
	after, err := procRSS(pid)
	if err != nil {
		return sample{}, err
	}
	return sample{value: float64(after-before) / float64(seen)}, nil
}

// memIdle drops the dentries and inodes and returns the daemon's RSS in
// MiB once it has settled.
func memIdle(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	pid, err := daemonPID(inst)
	if err != nil {
		return sample{}, err
	}
	rss, err := idleRSS(ctx, pid)
	if err != nil {
		return sample{}, err
	}
	return sample{value: float64(rss) / (1 << 20)}, nil
}

// idleRSS drops the dentries and inodes (the kernel then FORGETs the
// daemon's) and returns pid's RSS once it has settled.
func idleRSS(ctx context.Context, pid int) (int64, error) {
	unix.Sync()
	if err := dropCaches(2); err != nil {
		return 0, err
	}
	return settleRSS(ctx, pid)
}

// settleRSS polls process pid's VmRSS until it has made no new low for
// rssSettleQuiet, or for at most rssSettleLimit, and returns the lowest
// value seen, in bytes.
func settleRSS(ctx context.Context, pid int) (int64, error) {
	low, err := procRSS(pid)
	if err != nil {
		return 0, err
	}
	start, lastLow := time.Now(), time.Now()
	for time.Since(lastLow) < rssSettleQuiet && time.Since(start) < rssSettleLimit {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(rssPoll):
		}
		rss, err := procRSS(pid)
		if err != nil {
			return 0, err
		}
		if rss < low {
			low, lastLow = rss, time.Now()
		}
	}
	return low, nil
}

// procRSS is process pid's resident set size in bytes (VmRSS).
func procRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("the daemon's memory: %w", err)
	}
	return parseVmRSS(data)
}

// parseVmRSS finds VmRSS in the text of /proc/PID/status and returns it
// in bytes.
func parseVmRSS(status []byte) (int64, error) {
	return parseKB(status, "VmRSS", "/proc/PID/status")
}

// parseKB finds the line "key: N kB" in text (of file, for the error)
// and returns N in bytes.
func parseKB(text []byte, key, file string) (int64, error) {
	for _, line := range strings.Split(string(text), "\n") {
		v, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			break
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in kB in %s", key, file)
}

// daemonPID is the PID of the daemon that serves inst: goverlay's from
// its pidfile; fuse-overlayfs's, which daemonizes without one, the
// process found in /proc whose command line ends with the mountpoint.
// It is looked up once per round.
func daemonPID(inst *instance) (int, error) {
	if inst.pid > 0 {
		return inst.pid, nil
	}
	if inst.def.kind == kindFuseOverlayfs {
		inst.pid = findDaemon("fuse-overlayfs", inst.root)
	}
	if inst.pid <= 0 {
		return 0, fmt.Errorf("no daemon process found for %s", inst.root)
	}
	return inst.pid, nil
}

// findDaemon returns the PID of a process whose program is named prog
// and whose last argument is mnt, or 0.
func findDaemon(prog, mnt string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone, or not ours to read
		}
		if cmdlineMatches(cmdline, prog, mnt) {
			return pid
		}
	}
	return 0
}

// cmdlineMatches says whether a NUL-separated /proc/PID/cmdline runs a
// program named prog with mnt as its last argument.
func cmdlineMatches(cmdline []byte, prog, mnt string) bool {
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	return len(args) >= 2 && filepath.Base(string(args[0])) == prog && string(args[len(args)-1]) == mnt
}
