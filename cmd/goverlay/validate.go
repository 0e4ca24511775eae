package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

// The checks below run before anything is mounted, so that a mistake ends
// with one line saying what is wrong and how to fix it, instead of a mount
// that fails half-way or, worse, one that works and misbehaves. Each check
// is a function of paths so that tests can exercise it on temp dirs.

// Hooks for tests; they are the real system calls otherwise.
var (
	devFusePath = "/dev/fuse"
	faccessat   = unix.Faccessat
	statfs      = unix.Statfs
	geteuid     = os.Geteuid
	// kernelRelease is uname -r ("" when uname(2) fails).
	kernelRelease = func() string {
		var u unix.Utsname
		if unix.Uname(&u) != nil {
			return ""
		}
		return unix.ByteSliceToString(u.Release[:])
	}
)

// layerRef is one directory of the stack with its role for messages.
type layerRef struct {
	role string // "lowerdir", "upperdir" or "workdir"
	path string
}

func (c *config) layerRefs() []layerRef {
	var refs []layerRef
	for _, l := range c.Lower {
		refs = append(refs, layerRef{"lowerdir", l})
	}
	if c.Upper != "" {
		refs = append(refs, layerRef{"upperdir", c.Upper})
	}
	if c.Work != "" {
		refs = append(refs, layerRef{"workdir", c.Work})
	}
	return refs
}

// validate runs every check in the order a user would fix things: the
// command line, then each path, then how the paths relate, then FUSE.
func validate(c *config) error {
	if err := checkRequired(c); err != nil {
		return err
	}
	if c.passthroughOn {
		// Passthrough is granted in the reply to an OPEN.
		if c.noOpenGiven && !c.OpenRequests {
			return failf(exitUsage, "options passthrough=on and noopen=1 exclude each other: passthrough is set up when a file is opened, and with noopen=1 opens do not reach goverlay; drop one of them")
		}
		c.OpenRequests = true
	}
	if c.ShareCache {
		// Lower files get passthrough, set up in the reply to an OPEN.
		switch {
		case c.noOpenGiven && !c.OpenRequests:
			return failf(exitUsage, "options sharecache=on and noopen=1 exclude each other: lower files are shared through passthrough, which is set up when a file is opened; drop one of them")
		case c.NoPassthrough:
			return failf(exitUsage, "options sharecache=on and passthrough=off exclude each other: lower files are shared through passthrough; drop one of them")
		case c.Writeback == overlay.WritebackOn:
			return failf(exitUsage, "options sharecache=on and writeback=1 exclude each other: the kernel grants passthrough only without the writeback cache; drop one of them")
		}
		c.OpenRequests = true
	}
	if err := overlay.CheckKernel(kernelRelease()); err != nil {
		return failf(exitFuse, "%w", err)
	}
	refs := c.layerRefs()
	for _, r := range refs {
		if err := checkDir(r.role, r.path); err != nil {
			return err
		}
	}
	if err := checkDir("mountpoint", c.Mountpoint); err != nil {
		return err
	}
	if err := checkDistinct(refs); err != nil {
		return err
	}
	if err := checkNesting(refs, c.Mountpoint); err != nil {
		return err
	}
	if err := checkOverlap(refs); err != nil {
		return err
	}
	// One read of the mount table for both checks: it grows with every
	// mount on the host, and a mount server reads it for each mount.
	mounts, err := readMountinfo(mountinfoPath)
	if err != nil {
		mounts = nil // no mount table to look at (no /proc): nothing to compare
	}
	if err := checkKernelOverlays(c, mounts); err != nil {
		return err
	}
	if err := checkSameMount(c, mounts); err != nil {
		return err
	}
	if c.Upper != "" {
		if err := checkSameFilesystem(c.Upper, c.Work); err != nil {
			return err
		}
		// A read-only mount never writes to its upper; kernel
		// overlayfs, too, accepts an upper on a read-only filesystem
		// then.
		if !c.ReadOnly {
			if err := checkWritable("upperdir", c.Upper); err != nil {
				return err
			}
			if err := checkWritable("workdir", c.Work); err != nil {
				return err
			}
		}
	}
	if err := checkUnprivileged(c); err != nil {
		return err
	}
	return checkDevFuse()
}

// checkRequired checks the options that must be given together. These are
// command-line mistakes, hence exitUsage.
func checkRequired(c *config) error {
	switch {
	case len(c.Lower) == 0:
		return failf(exitUsage, "no lowerdir given; add -o lowerdir=DIR[:DIR...] (topmost layer first)")
	case c.Upper != "" && c.Work == "":
		return failf(exitUsage, "upperdir is given without workdir; add workdir=DIR on the upperdir's filesystem, or drop upperdir for a read-only overlay")
	case c.Work != "" && c.Upper == "":
		return failf(exitUsage, "workdir is given without upperdir; add upperdir=DIR, or drop workdir for a read-only overlay")
	}
	return nil
}

// fileID is what the checks need from stat(2).
type fileID struct {
	mode     uint32
	dev, ino uint64
}

// statSync stats path bypassing cached attributes. A dead FUSE mount
// answers a plain stat(2) of its root from the attribute cache, so only a
// forced refresh reports ENOTCONN there.
func statSync(path string) (fileID, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_STATX_FORCE_SYNC, unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_INO, &stx)
	if err == nil {
		return fileID{uint32(stx.Mode), unix.Mkdev(stx.Dev_major, stx.Dev_minor), stx.Ino}, nil
	}
	if !errors.Is(err, unix.ENOSYS) {
		return fileID{}, err
	}
	var st unix.Stat_t // kernels before 4.11
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{st.Mode, uint64(st.Dev), st.Ino}, nil
}

// checkDir checks that path exists and is a directory.
func checkDir(role, path string) error {
	st, err := statSync(path)
	if err != nil {
		return statProblem(role, path, err)
	}
	if st.mode&unix.S_IFMT != unix.S_IFDIR {
		return failf(exitBadLayer, "%s %s is not a directory; give a directory", role, show(path))
	}
	return nil
}

// statProblem explains a failed stat(2) of a layer or the mountpoint.
func statProblem(role, path string, err error) error {
	p := show(path)
	switch {
	case errors.Is(err, unix.ENOTCONN):
		// A FUSE server died without unmounting: the mount stays and
		// every access fails until someone detaches it.
		return failf(exitBadLayer, "%s %s is a dead FUSE mount (transport endpoint is not connected); clear it with: fusermount3 -u %s (or: umount -l %s)", role, p, shellQuote(path), shellQuote(path))
	case errors.Is(err, unix.ENOENT):
		return failf(exitBadLayer, "%s %s does not exist; create it or fix the path", role, p)
	case errors.Is(err, unix.ENOTDIR):
		return failf(exitBadLayer, "%s %s does not exist (part of the path is not a directory); fix the path", role, p)
	case errors.Is(err, unix.EACCES):
		return failf(exitBadLayer, "%s %s cannot be reached (permission denied); give uid %d search permission on its parent directories", role, p, geteuid())
	case errors.Is(err, unix.ELOOP):
		return failf(exitBadLayer, "%s %s has a symbolic-link loop; fix the link", role, p)
	}
	return failf(exitBadLayer, "cannot stat %s %s: %w; check the path", role, p, err)
}

// checkDistinct rejects a directory used twice in the stack. It compares
// (st_dev, st_ino), so a symlink, a bind mount or "a/../a" spelling of the
// same directory is caught too.
func checkDistinct(refs []layerRef) error {
	type key struct{ dev, ino uint64 }
	seen := map[key]layerRef{}
	for _, r := range refs {
		st, err := statSync(r.path)
		if err != nil {
			return statProblem(r.role, r.path, err)
		}
		k := key{st.dev, st.ino}
		if prev, ok := seen[k]; ok {
			return failf(exitBadLayer, "%s %s and %s %s are the same directory; every layer needs its own directory",
				prev.role, show(prev.path), r.role, show(r.path))
		}
		seen[k] = r
	}
	return nil
}

// checkNesting rejects layers that contain one another where it breaks the
// overlay: workdir and upperdir (a copy-up renames from one into the other,
// and the kernel overlayfs refuses it too), and any layer and the
// mountpoint (the mount would hide the layer, or the overlay would show
// itself inside itself). Symbolic links are resolved first; a path equal
// to the other counts as inside.
func checkNesting(refs []layerRef, mountpoint string) error {
	realMnt, err := realPath("mountpoint", mountpoint)
	if err != nil {
		return err
	}
	var upper, work *layerRef
	var realUpper, realWork string
	for i := range refs {
		r := &refs[i]
		real, err := realPath(r.role, r.path)
		if err != nil {
			return err
		}
		switch {
		case real == realMnt && r.role == "lowerdir":
			// Mounting over a lower layer hides it from everyone
			// but the overlay, which opened it before the mount
			// (kernel overlay and fuse-overlayfs accept it too).
		case real == realMnt:
			return failf(exitBadLayer, "mountpoint %s is the %s itself; mount the overlay on a directory outside every layer", describe(mountpoint, realMnt), r.role)
		case within(real, realMnt):
			return failf(exitBadLayer, "%s %s is inside the mountpoint %s; the mount would hide it, move the layer or the mountpoint", r.role, describe(r.path, real), describe(mountpoint, realMnt))
		case within(realMnt, real):
			return failf(exitBadLayer, "mountpoint %s is inside %s %s; the overlay would contain itself, mount it outside every layer", describe(mountpoint, realMnt), r.role, describe(r.path, real))
		}
		switch r.role {
		case "upperdir":
			upper, realUpper = r, real
		case "workdir":
			work, realWork = r, real
		}
	}
	if upper == nil || work == nil {
		return nil
	}
	if within(realWork, realUpper) {
		return failf(exitBadLayer, "workdir %s is inside upperdir %s; use two separate directories, neither inside the other", describe(work.path, realWork), describe(upper.path, realUpper))
	}
	if within(realUpper, realWork) {
		return failf(exitBadLayer, "upperdir %s is inside workdir %s; use two separate directories, neither inside the other", describe(upper.path, realUpper), describe(work.path, realWork))
	}
	return nil
}

// checkOverlap rejects a lowerdir inside another layer or containing
// one, as the kernel overlay does (it fails the mount with ELOOP,
// "overlapping lowerdir path"): the overlay would show the layer twice,
// and writes into the outer layer would change a lower layer under the
// mount. An upperdir or workdir inside a lowerdir is allowed, as by the
// kernel.
func checkOverlap(refs []layerRef) error {
	reals := make([]string, len(refs))
	for i, r := range refs {
		real, err := realPath(r.role, r.path)
		if err != nil {
			return err
		}
		reals[i] = real
	}
	for i, l := range refs {
		if l.role != "lowerdir" {
			continue
		}
		for j, r := range refs {
			if i == j {
				continue
			}
			if within(reals[i], reals[j]) {
				return failf(exitBadLayer, "lowerdir %s is inside %s %s; layers must not overlap (the kernel overlay refuses it too): use directories that do not contain one another",
					describe(l.path, reals[i]), r.role, describe(r.path, reals[j]))
			}
		}
	}
	return nil
}

// checkSameFilesystem checks that workdir and upperdir share a filesystem:
// a copy-up is prepared in workdir and renamed into upperdir, and rename(2)
// does not cross filesystems.
func checkSameFilesystem(upper, work string) error {
	su, err := statSync(upper)
	if err != nil {
		return statProblem("upperdir", upper, err)
	}
	sw, err := statSync(work)
	if err != nil {
		return statProblem("workdir", work, err)
	}
	if su.dev != sw.dev {
		return failf(exitBadLayer, "workdir %s is on another filesystem than upperdir %s; put both on one filesystem", show(work), show(upper))
	}
	return nil
}

// checkWritable checks that the effective user may create entries in a
// writable layer. access(2) alone lets root through everywhere except a
// read-only filesystem, which statfs reports; both are checked so that the
// message can say which problem it is.
func checkWritable(role, path string) error {
	var sfs unix.Statfs_t
	if err := statfs(path, &sfs); err == nil && sfs.Flags&unix.ST_RDONLY != 0 {
		return roFilesystem(role, path)
	}
	if err := faccessat(unix.AT_FDCWD, path, unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
		if errors.Is(err, unix.EROFS) {
			return roFilesystem(role, path)
		}
		return failf(exitBadLayer, "%s %s is not writable (%w); give uid %d write permission or pick another directory", role, show(path), err, geteuid())
	}
	return nil
}

func roFilesystem(role, path string) error {
	return failf(exitBadLayer, "%s %s is on a read-only filesystem; remount it read-write, or add -o ro for a read-only overlay", role, show(path))
}

// checkDevFuse opens /dev/fuse the way the mount will. A root user needs it
// directly (go-fuse mounts with mount(2)); others can do without it when a
// setuid-root fusermount3 opens it for them.
func checkDevFuse() error {
	f, err := os.OpenFile(devFusePath, os.O_RDWR, 0)
	if err == nil {
		defer f.Close()
		fi, err := f.Stat()
		if err == nil && fi.Mode()&fs.ModeCharDevice == 0 {
			return failf(exitFuse, "%s is not a character device; recreate it with \"mknod -m 0666 /dev/fuse c 10 229\"", devFusePath)
		}
		return nil
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return failf(exitFuse, "%s does not exist; load the fuse module (modprobe fuse), or in a container add --device /dev/fuse", devFusePath)
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		if geteuid() != 0 && setuidFusermount() {
			return nil
		}
		return failf(exitFuse, "cannot open %s: permission denied; run as root, make it accessible (chmod 0666 /dev/fuse), or in a container add --device /dev/fuse", devFusePath)
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		err = errno
	}
	return failf(exitFuse, "cannot open %s: %w; check that it is the FUSE device (character device 10,229)", devFusePath, err)
}

// setuidFusermount reports whether a setuid-root fusermount3 (or
// fusermount) is on PATH; go-fuse falls back to it when mount(2) is not
// allowed.
func setuidFusermount() bool {
	for _, name := range []string{"fusermount3", "fusermount"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Uid == 0 && st.Mode&unix.S_ISUID != 0 {
			return true
		}
	}
	return false
}

// realPath resolves symbolic links so that nesting is judged on the
// directories themselves.
func realPath(role, path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", statProblem(role, path, err)
	}
	return real, nil
}

// within reports whether path is dir or inside it. Both are clean and
// absolute.
func within(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// describe shows a path, and where it leads when a symlink made it differ.
func describe(path, real string) string {
	if path == real {
		return show(path)
	}
	return show(path) + " (" + show(real) + ")"
}

// show prints a path as it is unless that would be ambiguous or break the
// one-line message (spaces, control characters, quotes): then it quotes it.
func show(path string) string {
	if path == "" {
		return `""`
	}
	for _, r := range path {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"' {
			return strconv.Quote(path)
		}
	}
	return path
}

// shellQuote quotes a path for a command the user may paste into a shell.
func shellQuote(path string) string {
	safe := path != ""
	for _, r := range path {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:@%,=", r)) {
			safe = false
			break
		}
	}
	if safe {
		return path
	}
	return "'" + strings.ReplaceAll(path, "'", `'\''`) + "'"
}

// mountinfoPath is where validate reads the mount table; a hook for tests.
var mountinfoPath = "/proc/self/mountinfo"

// checkKernelOverlays refuses an upperdir or workdir that a live kernel
// overlay uses as its upperdir or workdir: the two would write one layer
// without knowing of each other, and this mount would empty the workdir
// under the other's copy-ups. The kernel overlay refuses the same
// (EBUSY: "upperdir is in-use as upperdir/workdir of another mount").
// Another goverlay is caught by the lock the mount takes on both
// (upper.ErrInUse).
//
// mounts is the mount table.
func checkKernelOverlays(c *config, mounts []mountEntry) error {
	if c.Upper == "" {
		return nil
	}
	ours := map[fileID]string{}
	for _, r := range []layerRef{{"upperdir", c.Upper}, {"workdir", c.Work}} {
		st, err := statSync(r.path)
		if err != nil {
			return statProblem(r.role, r.path, err)
		}
		ours[fileID{dev: st.dev, ino: st.ino}] = r.role + " " + show(r.path)
	}
	for _, m := range mounts {
		if m.fsType != "overlay" {
			continue
		}
		for _, opt := range strings.Split(m.superOpts, ",") {
			key, val, _ := strings.Cut(opt, "=")
			if key != "upperdir" && key != "workdir" {
				continue
			}
			st, err := statSync(unescapeMountinfo(val))
			if err != nil {
				continue
			}
			if what, ok := ours[fileID{dev: st.dev, ino: st.ino}]; ok {
				return failf(exitBadLayer, "%s is the %s of the kernel overlay mounted on %s; two mounts must not share an upperdir or workdir: unmount it first, or give this mount its own directories",
					what, key, show(m.mountpoint))
			}
		}
	}
	return nil
}

// daemonExitWait bounds how long a mount waits for the daemon of a mount
// that was just unmounted from the same mountpoint to exit.
const daemonExitWait = 5 * time.Second

// fuseMountedOn reports whether a FUSE filesystem is mounted on dir.
func fuseMountedOn(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return true
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	mounts, err := readMountinfo("/proc/self/mountinfo")
	if err != nil {
		return true // cannot tell: refuse, as before
	}
	for _, m := range mounts {
		if m.mountpoint == abs && strings.HasPrefix(m.fsType, "fuse") {
			return true
		}
	}
	return false
}

// waitReleased waits, for at most d, until the goverlay that answered for
// mnt as pid has let go of its layers: its process has exited (a zombie
// has closed its files, and with them its locks and sockets), or its
// stats socket no longer answers for mnt as pid. A shared server, which
// does not exit while it serves other mounts, closes a mount's socket
// once that mount has released its layers (overlay.FS.Close).
func waitReleased(mnt string, owner, pid int, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// pid (comm) S ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			return
		}
		if s, err := overlay.ReadStats(mnt, owner); err != nil || s.PID != pid {
			return
		}
	}
}

// checkSameMount refuses to mount on a mountpoint that a goverlay mount of
// the same layers already holds: a second copy of a mount is a mistake (a
// script run twice), not a stack. A goverlay with layers of its own, or
// any other filesystem, stacks on a busy mountpoint as on any directory.
// A mount with an upper layer is refused anyway, by the lock on it
// (upper.ErrInUse); this check is what catches a read-only one. A daemon
// whose mount is gone is waited for instead: `umount; goverlay ...` run
// back to back must work.
//
// mounts is the mount table.
func checkSameMount(c *config, mounts []mountEntry) error {
	// The daemon of a goverlay mount there runs as its owner or root;
	// one just unmounted was, most likely, this user's.
	owner := geteuid()
	if m, ok := topMountIn(mounts, overlay.ResolveMountpoint(c.Mountpoint)); ok && m.fsType == "fuse.goverlay" {
		owner = m.owner()
	}
	s, err := overlay.ReadStats(c.Mountpoint, owner)
	if err != nil || len(s.Lower) != len(c.Lower) || (s.Upper == "") != (c.Upper == "") {
		return nil // no goverlay there (or one too old to say its layers)
	}
	same := func(a, b string) bool {
		sa, ea := statSync(a)
		sb, eb := statSync(b)
		return ea == nil && eb == nil && sa.dev == sb.dev && sa.ino == sb.ino
	}
	for i := range c.Lower {
		if !same(c.Lower[i], s.Lower[i]) {
			return nil
		}
	}
	if c.Upper != "" && !same(c.Upper, s.Upper) {
		return nil
	}
	if !fuseMountedOn(c.Mountpoint) {
		// Unmounted a moment ago: its daemon answers until it has
		// released the layers and exits, which it does at once.
		waitReleased(c.Mountpoint, owner, s.PID, daemonExitWait)
		return nil
	}
	return failf(exitBadLayer, "mountpoint %s already holds a goverlay mount of the same layers (pid %d); unmount it first, or mount elsewhere", show(c.Mountpoint), s.PID)
}
