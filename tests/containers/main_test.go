// Package containers_test proves goverlay as the mount_program of
// containers/storage: TestStorageArgv drives the binary with the exact
// argv, working directory, stdio and unmount sequence containers/storage
// uses (no podman needed), and TestPodman runs real podman containers on a
// scratch store with goverlay as mount_program, with fuse-overlayfs as the
// reference. See README.md.
package containers_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// fuseOverlayfs is the reference mount program.
const fuseOverlayfs = "/usr/bin/fuse-overlayfs"

// plainBinary builds ./cmd/goverlay without the race detector into a
// directory of t's (so that a process running it is ours, and the file
// goes with the test). Podman runs the mount program for every container
// start, commit and diff; the race build is slower to start and serve, and
// podman never reports the daemon's exit status, so the race detector's
// exit code 66 would be lost anyway. TestStorageArgv, which does see the
// daemon's exit status, uses the race build of testutil.Binary. It is
// linked statically, as make builds it, so that the builds measured here
// start the program users install.
func plainBinary(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "goverlay")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/goverlay")
	cmd.Dir = testutil.ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/goverlay: %v\n%s", err, out)
	}
	return bin
}

// selfMountinfo lists the test's own mounts.
const selfMountinfo = "/proc/self/mountinfo"

// mountsBelow lists the mounts at or below dir with their types, as the
// mountinfo file shows them (selfMountinfo, or another mount namespace's).
func mountsBelow(mountinfo, dir string) []testutil.MountEntry {
	ms, err := testutil.MountsIn(mountinfo)
	if err != nil {
		return nil
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	var out []testutil.MountEntry
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// detach lazily unmounts every mount at or below dir, deepest first, and
// describes what it detached.
func detach(dir string) []string {
	ms := mountsBelow(selfMountinfo, dir)
	sort.Slice(ms, func(i, j int) bool { return len(ms[i].Point) > len(ms[j].Point) })
	var out []string
	for _, m := range ms {
		err := unix.Unmount(m.Point, unix.MNT_DETACH)
		out = append(out, fmt.Sprintf("%s (%s, detach: %v)", m.Point, m.FSType, err))
	}
	return out
}

// waitProcsGone waits, up to timeout, for every process running exe with
// an argument containing substr to exit (polling each one's pidfd: no
// sleeping), then kills what is left and returns the PIDs it had to kill
// with their command lines.
func waitProcsGone(exe, substr string, timeout time.Duration, name string) []string {
	deadline := time.Now().Add(timeout)
	var killed []string
	for _, pid := range testutil.FindProcsMentioning(exe, substr) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		p, err := testutil.Track(pid, name)
		if err != nil {
			continue // gone meanwhile
		}
		if !p.Wait(time.Until(deadline)) {
			p.Kill()
			killed = append(killed, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")))
		}
	}
	return killed
}

// subreaper sets or clears PR_SET_CHILD_SUBREAPER on the test process and
// returns the previous setting.
func subreaper(on bool) bool {
	var prev int32
	_ = unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&prev)), 0, 0, 0)
	v := 0
	if on {
		v = 1
	}
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, uintptr(v), 0, 0, 0)
	return prev != 0
}

// lookTools skips the test unless every tool is on PATH.
func lookTools(t testing.TB, pkgs map[string]string) {
	t.Helper()
	var missing []string
	for tool, pkg := range pkgs {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, fmt.Sprintf("%s (package %s)", tool, pkg))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Skipf("not installed: %s; .ci/run installs them", strings.Join(missing, ", "))
	}
}
