package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

type targetKind int

const (
	kindNative targetKind = iota
	kindKernel
	kindFuseOverlayfs
	kindGoverlay
)

// targetDef is one way of presenting the layers.
type targetDef struct {
	name string
	kind targetKind
	// opts are extra -o options for goverlay (for the kernel overlay on
	// kernel-metacopy), and the build workloads' mountopt. The goverlay
	// target passes none: nosec=inherit and passthrough on are the
	// defaults.
	opts []string
	desc string
	// rootless targets are mounted, and their workloads run, by an
	// unprivileged user in a user namespace of its own (rootless.go).
	rootless bool
	// baseline: the goverlay target mounts Config.Baseline, not
	// Config.Binary; "all" leaves it out.
	baseline bool
	// uring: the kernel offers FUSE over io_uring while the target
	// mounts (offerUring).
	uring bool
	// named: run only when asked for by name; "all" leaves it out.
	named bool
	// mountCmd: mounted by the goverlay-mount beside the binary, through
	// the shared server, with no --pidfile (goverlay-mount leaves that
	// to goverlay); the server's PID comes from the mount's stats.
	mountCmd bool
}

// binary is the goverlay executable the target mounts.
func (t *targetDef) binary(c Config) string {
	if t.baseline {
		return c.Baseline
	}
	return c.Binary
}

var allTargets = []*targetDef{
	{name: "native", kind: kindNative, desc: "the upper directory itself, no overlay (holds a copy of the lower)"},
	{name: "kernel", kind: kindKernel, desc: "kernel overlayfs (mount -t overlay)"},
	{name: "fuse-overlayfs", kind: kindFuseOverlayfs, desc: "fuse-overlayfs, when installed"},
	{name: "goverlay", kind: kindGoverlay, desc: "goverlay with its defaults: nosec=inherit, noopen=1 (files open without a request; writes take the writeback cache)"},
	{name: "goverlay-uring", kind: kindGoverlay, uring: true, desc: "goverlay with its defaults, mounted while the kernel offers FUSE over io_uring (enable_uring=Y): requests go through one io_uring queue per CPU"},
	{name: "goverlay-opens", kind: kindGoverlay, opts: []string{"noopen=0"}, desc: "goverlay -o noopen=0: every open a request, passthrough where the kernel grants it"},
	{name: "goverlay-sharecache", kind: kindGoverlay, opts: []string{"sharecache=on"}, desc: "goverlay -o sharecache=on: lower files open with passthrough to the lower file, so mounts of one image share its pages (every open a request)"},
	{name: "goverlay-shared", kind: kindGoverlay, opts: []string{"daemon=shared"}, named: true, desc: "goverlay -o daemon=shared: one process serves every mount (asked for by name)"},
	{name: "goverlay-mount", kind: kindGoverlay, mountCmd: true, named: true, desc: "goverlay-mount: goverlay -o daemon=shared from a small C program that starts fast (asked for by name)"},
	{name: "goverlay-host", kind: kindGoverlay, mountCmd: true, named: true, opts: []string{"sharecache=on"}, desc: "goverlay-mount -o sharecache=on: a container host's setup, one server for every mount and the image's pages shared (asked for by name)"},
	{name: "goverlay-nosec-off", kind: kindGoverlay, opts: []string{"nosec=off"}, desc: "goverlay -o nosec=off"},
	{name: "goverlay-nopassthrough", kind: kindGoverlay, opts: []string{"noopen=0", "passthrough=off"}, desc: "goverlay -o noopen=0,passthrough=off: every open a request, the writeback cache instead of passthrough"},
	{name: "goverlay-writeback", kind: kindGoverlay, opts: []string{"noopen=0", "writeback=1"}, desc: "goverlay -o noopen=0,writeback=1: every open a request, the writeback cache, not passthrough"},
	{name: "goverlay-writethrough", kind: kindGoverlay, opts: []string{"passthrough=off", "writeback=0"}, desc: "goverlay -o passthrough=off,writeback=0: every write a request"},
	{name: "kernel-rootless", kind: kindKernel, rootless: true, desc: "kernel overlayfs -o userxattr, mounted by an unprivileged user in its own user namespace"},
	{name: "fuse-overlayfs-rootless", kind: kindFuseOverlayfs, rootless: true, desc: "fuse-overlayfs, mounted by an unprivileged user in its own user namespace"},
	{name: "goverlay-rootless", kind: kindGoverlay, rootless: true, desc: "goverlay -o userxattr, mounted by an unprivileged user in its own user namespace (the defaults: noopen=1, the writeback cache)"},
	{name: "goverlay-uring-rootless", kind: kindGoverlay, rootless: true, uring: true, desc: "goverlay -o userxattr rootless, mounted while the kernel offers FUSE over io_uring (enable_uring=Y, set by the bench as root)"},
	{name: "goverlay-opens-rootless", kind: kindGoverlay, rootless: true, opts: []string{"noopen=0"}, desc: "goverlay -o userxattr,noopen=0 rootless: every open a request"},
	{name: "goverlay-rootless-writethrough", kind: kindGoverlay, rootless: true, opts: []string{"writeback=0"}, desc: "goverlay -o userxattr,writeback=0 rootless: every write a request"},
	{name: "goverlay-metacopy", kind: kindGoverlay, named: true, opts: []string{"metacopy=on"}, desc: "goverlay -o metacopy=on (redirect_dir=on with it): a chown, chmod or rename of a lower file copies up its metadata only; the build workloads set podman's mountopt = \"metacopy=on\""},
	{name: "kernel-metacopy", kind: kindKernel, named: true, opts: []string{"metacopy=on"}, desc: "kernel overlayfs -o metacopy=on; the build workloads set podman's mountopt = \"metacopy=on\" for its own overlay driver"},
	{name: "goverlay-nosec-off-nopassthrough", kind: kindGoverlay, opts: []string{"nosec=off", "noopen=0", "passthrough=off"}, desc: "goverlay -o nosec=off,noopen=0,passthrough=off"},
	// goverlay as it runs on the kernels container hosts have: the
	// features a kernel profile hides are neither asked for nor used
	// (man page: KERNEL FEATURES); asked for by name.
	{name: "goverlay-5.15", kind: kindGoverlay, named: true, opts: []string{"mask=linux-5.15"}, desc: "goverlay -o mask=linux-5.15: as on Ubuntu 22.04's kernel (and RHEL 9's, upstream): no passthrough, io_uring, FOPEN_NOFLUSH, fchmodat2 or *xattrat"},
	{name: "goverlay-5.15-nosec-off", kind: kindGoverlay, named: true, opts: []string{"mask=linux-5.15", "nosec=off"}, desc: "goverlay -o mask=linux-5.15,nosec=off"},
	{name: "goverlay-6.1", kind: kindGoverlay, named: true, opts: []string{"mask=linux-6.1"}, desc: "goverlay -o mask=linux-6.1: as on Debian 12's kernel: no passthrough, io_uring, fchmodat2 or *xattrat"},
	{name: "goverlay-6.8", kind: kindGoverlay, named: true, opts: []string{"mask=linux-6.8"}, desc: "goverlay -o mask=linux-6.8: as on Ubuntu 24.04's kernel: no passthrough, io_uring or *xattrat"},
}

func findTarget(name string) *targetDef {
	for _, t := range allTargets {
		if t.name == name {
			return t
		}
	}
	return nil
}

func targetNames() []string {
	var n []string
	for _, t := range allTargets {
		n = append(n, t.name)
	}
	return n
}

// precheck says why the target cannot run here at all, or "".
func (t *targetDef) precheck(c Config) string {
	if t.rootless {
		if why := rootlessPrecheck(); why != "" {
			return why
		}
	}
	if t.uring {
		if _, err := os.Stat(enableUring); err != nil {
			return "this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)"
		}
		if os.Geteuid() != 0 {
			return "offering FUSE over io_uring (enable_uring=Y) needs root"
		}
	}
	switch t.kind {
	case kindKernel:
		if os.Geteuid() != 0 && !t.rootless {
			return "mounting kernel overlayfs needs root"
		}
	case kindFuseOverlayfs:
		if _, err := exec.LookPath("fuse-overlayfs"); err != nil {
			return "fuse-overlayfs is not installed (not found in PATH)"
		}
	case kindGoverlay:
		bin := t.binary(c)
		if bin == "" && t.baseline {
			return "no baseline binary (--baseline)"
		}
		if bin == "" {
			return "no goverlay binary beside goverlay-bench or in PATH (--binary PATH names one)"
		}
		if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Sprintf("goverlay binary %s is not an executable file", bin)
		}
		if m := filepath.Join(filepath.Dir(bin), "goverlay-mount"); t.mountCmd && unix.Access(m, unix.X_OK) != nil {
			return fmt.Sprintf("no goverlay-mount beside %s (make builds it)", bin)
		}
	}
	return ""
}

// version returns the target's version line, if it has one.
func (t *targetDef) version(c Config) string {
	var out []byte
	switch t.kind {
	case kindKernel:
		var u unix.Utsname
		if unix.Uname(&u) == nil {
			return "Linux " + unix.ByteSliceToString(u.Release[:])
		}
	case kindFuseOverlayfs:
		out, _ = exec.Command("fuse-overlayfs", "--version").CombinedOutput()
	case kindGoverlay:
		out, _ = exec.Command(t.binary(c), "--version").CombinedOutput()
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// instance is a target set up for one round.
type instance struct {
	def   *targetDef
	state *targetState
	// root is where workloads run: the mountpoint, or for native the
	// upper directory.
	root string
	dir  string
	// pid is the FUSE daemon's: goverlay's from its pidfile at mount,
	// fuse-overlayfs's looked up when a workload needs it (daemonPID).
	pid int
	// conn is a FUSE target's connection number, for the request
	// counter; 0 when there is none or no counter.
	conn uint64
	// agent runs the workloads of a rootless target (rootless.go).
	agent *agent
	// mountTook is how long the mount command took (mountOver).
	mountTook time.Duration
	// built is the round's podman build on the target, which every
	// build workload reads (podbuild.go).
	built *buildRun
}

// enableUring is the fuse module's switch for FUSE over io_uring: the
// kernel offers it in INIT only while it is Y.
const enableUring = "/sys/module/fuse/parameters/enable_uring"

// offerUring has the kernel offer FUSE over io_uring to the mounts made
// until restore is called, which puts the switch back as it was. A mount
// that took it keeps it.
func offerUring() (restore func(), err error) {
	old, err := os.ReadFile(enableUring)
	if err != nil {
		return nil, fmt.Errorf("FUSE over io_uring: %w", err)
	}
	if err := os.WriteFile(enableUring, []byte("Y"), 0); err != nil {
		return nil, fmt.Errorf("FUSE over io_uring: %w", err)
	}
	return func() { os.WriteFile(enableUring, old, 0) }, nil
}

// setup makes fresh upper and work directories under dir and mounts the
// target over the shared lower and the selected workloads' lowers. Undo
// steps go on cl.
func (t *targetDef) setup(ctx context.Context, b *bencher, dir string, cl *cleanups) (*instance, error) {
	if t.rootless {
		return t.setupRootless(ctx, b, dir, cl)
	}
	if t.kind == kindNative {
		upperDir, _, _, err := freshLayerDirs(dir, cl)
		if err != nil {
			return nil, err
		}
		// The native target sees the same files as the overlays.
		if err := copyTree(b.lower, upperDir); err != nil {
			return nil, fmt.Errorf("copy the lower into the native directory: %w", err)
		}
		inst := &instance{def: t, dir: dir, root: upperDir}
		if err := b.lendNativeDircache(upperDir, cl); err != nil {
			return nil, err
		}
		if err := b.linkNativeTree(upperDir); err != nil {
			return nil, err
		}
		return inst, prepareTarget(inst)
	}
	var fill func(upper string) error
	if b.wants("readdir-100k") {
		// The big directory's share of the upper layer.
		fill = func(upper string) error { return buildDCLayer(upper, b.dc, -1, false, true) }
	}
	lowers := append(append([]string{b.lower}, b.dcLowers...), b.ctLowers()...)
	inst, err := t.mountOver(ctx, b, dir, lowers, fill, cl)
	if err != nil {
		return nil, err
	}
	if b.tracer != nil && b.tracer.err == nil && t.kind != kindKernel {
		if inst.conn, err = fuseConnection(inst.root); err != nil {
			return nil, err
		}
	}
	return inst, prepareTarget(inst)
}

// freshLayerDirs makes empty upper, work and mnt directories under dir;
// cl removes dir.
func freshLayerDirs(dir string, cl *cleanups) (upper, work, mnt string, err error) {
	upper, work, mnt = filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
	cl.push(func() error { return os.RemoveAll(dir) })
	for _, d := range []string{upper, work, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", "", err
		}
	}
	return upper, work, mnt, nil
}

// mountOver mounts one instance of t, an overlay target (not native, not
// rootless), on dir/mnt over lowers (topmost first) with fresh upper and
// work directories under dir; fill, when not nil, fills the upper
// directory first. The instance's mountTook is how long the mount
// command took, to the mount being live. Undo steps go on cl: they
// unmount the instance, wait for its daemon to exit (goverlay's PID is
// read from its pidfile here, fuse-overlayfs's once daemonPID has looked
// it up) and remove dir.
func (t *targetDef) mountOver(ctx context.Context, b *bencher, dir string, lowers []string, fill func(upper string) error, cl *cleanups) (*instance, error) {
	inst := &instance{def: t, dir: dir}
	upperDir, work, mnt, err := freshLayerDirs(dir, cl)
	if err != nil {
		return nil, err
	}
	for _, p := range append([]string{upperDir, work, mnt}, lowers...) {
		if strings.ContainsAny(p, ",:\\") {
			return nil, fmt.Errorf("scratch path %s contains ',', ':' or '\\', which overlay options cannot carry; choose another --dir", p)
		}
	}
	if fill != nil {
		if err := fill(upperDir); err != nil {
			return nil, fmt.Errorf("fill the upper layer: %w", err)
		}
	}
	layers := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), upperDir, work)
	// Wait for the daemon to go after the unmount (pushed first, so it
	// runs last): what runs next must not share the CPU with a departing
	// daemon, and nothing the bench started outlives it.
	cl.push(func() error {
		if b.served[inst.pid] > 0 {
			// A shared server exits with its last instance.
			if b.served[inst.pid]--; b.served[inst.pid] > 0 {
				return nil
			}
		}
		if !waitGone(inst.pid, 5*time.Second) {
			return fmt.Errorf("the daemon of %s (PID %d) still runs 5 s after its unmount", mnt, inst.pid)
		}
		return nil
	})
	// Unmount whatever ends up on mnt, even if the mount command failed
	// half-way or was interrupted.
	cl.push(func() error { return unmountAll(mnt) })
	start := time.Now()
	switch t.kind {
	case kindKernel:
		err = unix.Mount("overlay", mnt, "overlay", 0, strings.Join(append([]string{layers}, t.opts...), ","))
		if err != nil {
			err = fmt.Errorf("mount -t overlay: %w", err)
		}
	case kindFuseOverlayfs:
		_, err = runMount(ctx, "fuse-overlayfs", "-o", layers, mnt)
	case kindGoverlay:
		pidfile := filepath.Join(dir, "pid")
		opts := strings.Join(append([]string{layers}, t.opts...), ",")
		var out string
		restore := func() {}
		if t.uring {
			restore, err = offerUring()
		}
		switch {
		case err == nil && t.mountCmd:
			var bin string
			if bin, err = b.mountCopy(t.binary(b.cfg)); err == nil {
				out, err = runMount(ctx, bin, "-o", opts, mnt)
			}
			restore()
		case err == nil:
			out, err = runMount(ctx, t.binary(b.cfg), "-o", opts, "--pidfile", pidfile, mnt)
			restore()
		}
		for _, line := range strings.Split(out, "\n") {
			// The NOSEC decision is in the daemon's stats, read
			// at the end of the round.
			if line = strings.TrimSpace(line); line != "" && !strings.Contains(line, "NOSEC ") {
				b.targetNote(t.name, line)
			}
		}
		if err == nil && !t.mountCmd {
			inst.pid = readPid(pidfile)
			b.countServed(t, inst.pid)
		}
	default:
		err = fmt.Errorf("%s is not an overlay target", t.name)
	}
	inst.mountTook = time.Since(start)
	if err != nil {
		return nil, err
	}
	if t.mountCmd {
		if st, err := overlay.ReadStats(mnt, os.Geteuid()); err == nil {
			inst.pid = st.PID
			b.countServed(t, inst.pid)
		}
	}
	if !isMountpoint(mnt) {
		return nil, fmt.Errorf("the mount command succeeded but nothing is mounted on %s", mnt)
	}
	cl.push(func() error { return unmountAll(mnt) })
	inst.root = mnt
	return inst, nil
}

// mountCopy is goverlay-mount beside a copy of bin, in the scratch tree,
// made once: another binary file is another server, so the goverlay-mount
// target's mounts do not meet goverlay-shared's in one process, whose
// memory would count for both.
func (b *bencher) mountCopy(bin string) (string, error) {
	dir := filepath.Join(b.root, "goverlay-mount-bin")
	m := filepath.Join(dir, "goverlay-mount")
	if _, err := os.Stat(m); err == nil {
		return m, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, f := range []struct{ from, to string }{{bin, "goverlay"}, {filepath.Join(filepath.Dir(bin), "goverlay-mount"), "goverlay-mount"}} {
		data, err := os.ReadFile(f.from)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, f.to+".tmp"), data, 0o755)
		}
		if err == nil {
			err = os.Rename(filepath.Join(dir, f.to+".tmp"), filepath.Join(dir, f.to))
		}
		if err != nil {
			return "", fmt.Errorf("copy %s for the goverlay-mount target: %w", f.from, err)
		}
	}
	return m, nil
}

// countServed counts a mount of a shared server (daemon=shared, or
// goverlay-mount) against the server's PID, which ends with its last.
func (b *bencher) countServed(t *targetDef, pid int) {
	if (slices.Contains(t.opts, "daemon=shared") || t.mountCmd) && pid > 0 {
		if b.served == nil {
			b.served = map[int]int{}
		}
		b.served[pid]++
	}
}

// lendNativeDircache moves the native target's merged dircache trees
// (built once; only read, or written and restored, by the workloads) into
// its directory for the round, and back when the round ends.
func (b *bencher) lendNativeDircache(upperDir string, cl *cleanups) error {
	if b.dcNative == "" {
		return nil
	}
	for _, name := range []string{dcTreeDir, dcBigDir} {
		from, to := filepath.Join(b.dcNative, name), filepath.Join(upperDir, name)
		if _, err := os.Lstat(from); err != nil {
			continue // not built: no workload uses it
		}
		if err := os.Rename(from, to); err != nil {
			return fmt.Errorf("move the dircache tree into the native directory: %w", err)
		}
		cl.push(func() error { return os.Rename(to, from) })
	}
	return nil
}

func (b *bencher) targetNote(target, note string) {
	for _, ts := range b.targets {
		if ts.def.name == target {
			ts.status.Notes = appendOnce(ts.status.Notes, note)
		}
	}
}

// runMount runs a mount command that returns once the mount is live.
func runMount(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	// In its own process group: Ctrl-C on the terminal is ours to
	// handle, by unmounting, not the mount helper's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A daemon that kept our pipe would make us wait for EOF forever.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		if text != "" {
			return text, fmt.Errorf("%s: %v: %s", filepath.Base(name), err, oneLine(text))
		}
		return text, fmt.Errorf("%s: %v", filepath.Base(name), err)
	}
	return text, nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// waitGone waits until process pid has exited: it is gone, or a zombie.
// A daemon that detached from its mount command is init's child, and
// stays a zombie until init reaps it, which some inits do late (seconds
// later); a zombie has released its memory, its files and its /dev/fuse
// (do_exit(): exit_mm(), exit_files()), so it is gone as far as the
// bench is concerned. It says whether the process went within limit.
func waitGone(pid int, limit time.Duration) bool {
	if pid <= 0 {
		return true
	}
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) || procState(pid) == 'Z' {
			return true
		}
	}
	return false
}

// procState is the state letter of process pid in /proc/PID/stat (R, S,
// Z, ...), or 0 when it cannot be read.
func procState(pid int) byte {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f, err := statFields(data)
	if err != nil || len(f[0]) == 0 {
		return 0
	}
	return f[0][0]
}

// readStats asks a goverlay daemon for its counters: one of the bench's
// own mounts, owned by the user this process runs as.
func readStats(mnt string) (overlay.Stats, error) {
	return overlay.ReadStats(mnt, os.Geteuid())
}

// mountinfo returns the mountpoints in /proc/self/mountinfo, in order.
func mountinfo() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mps = append(mps, unescapeMountinfo(fields[4]))
		}
	}
	return mps
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isMountpoint(path string) bool {
	for _, mp := range mountinfo() {
		if mp == path {
			return true
		}
	}
	return false
}

// mountsUnder lists what is mounted at or below dir.
func mountsUnder(dir string) []string {
	var out []string
	for _, mp := range mountinfo() {
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unmountAll unmounts everything stacked on mnt: politely a few times
// while it is busy, then by detaching it.
func unmountAll(mnt string) error {
	for tries := 0; isMountpoint(mnt); tries++ {
		if tries > 20 {
			return fmt.Errorf("cannot unmount %s", mnt)
		}
		err := unix.Unmount(mnt, 0)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL):
		case errors.Is(err, unix.EBUSY) && tries < 10:
			time.Sleep(100 * time.Millisecond)
		case errors.Is(err, unix.EPERM):
			// Not root: a user's FUSE mount.
			if out, ferr := exec.Command("fusermount3", "-u", "-z", mnt).CombinedOutput(); ferr != nil {
				return fmt.Errorf("fusermount3 -u -z %s: %v: %s", mnt, ferr, oneLine(string(out)))
			}
		default:
			if derr := unix.Unmount(mnt, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %v; detach: %v", mnt, err, derr)
			}
		}
	}
	return nil
}

// removeScratch detaches anything still mounted below root, deepest
// first, and removes the tree. It never removes through a mount.
func removeScratch(root string) error {
	mps := mountsUnder(root)
	for i := len(mps) - 1; i >= 0; i-- {
		unmountAll(mps[i])
	}
	if left := mountsUnder(root); len(left) > 0 {
		return fmt.Errorf("still mounted, scratch tree %s left in place: %s", root, strings.Join(left, " "))
	}
	return os.RemoveAll(root)
}

// rootlessTargets replaces each target that has a rootless form by it
// (--rootless); the others stay.
func rootlessTargets(names []string) []string {
	var out []string
	for _, n := range names {
		if t := findTarget(n); t != nil && !t.rootless {
			if r := findTarget(n + "-rootless"); r != nil {
				n = r.name
			}
		}
		out = append(out, n)
	}
	return dedupe(out)
}
