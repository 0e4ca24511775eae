// Package privs_test checks that goverlay removes privileges (setuid,
// setgid, security.capability) after writes, truncates and chowns exactly
// as the kernel's overlayfs on ext4 does, through real mounts of both over
// identical layers, for writers with and without CAP_FSETID.
//
// The kernel side is described in goverlay(1) (NOSEC) and
// docs/ARCHITECTURE.md: with -o nosec=on goverlay negotiates
// FUSE_HANDLE_KILLPRIV_V2 and clears privileges itself on the kernel's
// kill flags; with -o nosec=off the kernel clears them through SETATTR and
// REMOVEXATTR. Each runs with passthrough, with every write a request and
// with the kernel's writeback cache, as root and rootless (both overlays
// mounted by an unprivileged user in its own user namespace).
package privs_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// opTimeout bounds one writer process (all of its operations).
const opTimeout = 60 * time.Second

const capFsetid = 4 // CAP_FSETID, linux/capability.h

// helper is the operations binary (testdata/helper), built once.
func helper(t testing.TB) string {
	t.Helper()
	return testutil.BuildHelper(t, "./testdata/helper")
}

// writer is who performs an operation.
type writer struct {
	name string
	// fsetid: the writer has CAP_FSETID; root: it may chown.
	fsetid, root bool
	// uid and gid are the writer's (fs)uid and (fs)gid as it sees them;
	// it has no supplementary groups. diskGid is its gid on disk (not the
	// same in a user namespace).
	uid, gid, diskGid int
	// capFsetid: CAP_FSETID is in the writer's effective set (in its own
	// user namespace; fsetid is about the initial one).
	capFsetid bool
	// argv turns a helper command line into this writer's.
	argv func(cmd []string) []string
}

func writers(t testing.TB) []writer {
	t.Helper()
	uid, gid := testutil.TestUser(t)
	if _, err := exec.LookPath("capsh"); err != nil {
		t.Skip("capsh not installed (libcap2-bin)")
	}
	return []writer{
		{name: "root", fsetid: true, capFsetid: true, root: true, uid: 0, gid: 0, diskGid: 0,
			argv: func(cmd []string) []string { return cmd }},
		{name: "root-nofsetid", fsetid: false, root: true, uid: 0, gid: 0, diskGid: 0,
			argv: func(cmd []string) []string {
				return append([]string{"capsh", "--drop=cap_fsetid", "--", "-c", `exec "$0" "$@"`}, cmd...)
			}},
		{name: "user", fsetid: false, root: false, uid: uid, gid: gid, diskGid: gid,
			argv: func(cmd []string) []string {
				return append([]string{"setpriv", "--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups"}, cmd...)
			}},
	}
}

// opResult is one line of the helper's output.
type opResult struct {
	ok  bool
	err string
	// detail is what follows "ok" (the state operation's answer).
	detail string
}

// runOps runs the helper as w with (op, path) pairs and returns each
// path's result. It checks the helper's own account of its identity, so
// that a writer that is not what its name says fails the test instead of
// silently testing something else.
func runOps(t testing.TB, w writer, pairs [][2]string) map[string]opResult {
	t.Helper()
	cmd := []string{helper(t)}
	for _, p := range pairs {
		cmd = append(cmd, p[0], p[1])
	}
	argv := w.argv(cmd)
	r := testutil.Run(t, opTimeout, nil, argv[0], argv[1:]...)
	if r.TimedOut || (r.Code != 0 && r.Code != 1) {
		t.Fatalf("writer %s: %s", w.name, r)
	}
	res := map[string]opResult{}
	sc := bufio.NewScanner(strings.NewReader(r.Stdout))
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			checkIdentity(t, w, line)
			continue
		}
		f := strings.SplitN(line, " ", 4)
		if len(f) < 3 {
			t.Fatalf("writer %s: bad helper line %q", w.name, line)
		}
		switch f[2] {
		case "ok":
			r := opResult{ok: true}
			if len(f) == 4 {
				r.detail = f[3]
			}
			res[f[1]] = r
		case "err":
			msg := ""
			if len(f) == 4 {
				msg = f[3]
			}
			res[f[1]] = opResult{err: f[0] + ": " + msg}
		default:
			t.Fatalf("writer %s: bad helper line %q", w.name, line)
		}
	}
	if first {
		t.Fatalf("writer %s printed nothing: %s", w.name, r)
	}
	for _, p := range pairs {
		if _, ok := res[p[1]]; !ok {
			t.Fatalf("writer %s: no result for %s %s: %s", w.name, p[0], p[1], r)
		}
	}
	return res
}

// checkIdentity checks the helper's "id uid=U gid=G groups=... capeff=HEX".
func checkIdentity(t testing.TB, w writer, line string) {
	t.Helper()
	kv := map[string]string{}
	for _, f := range strings.Fields(strings.TrimPrefix(line, "id ")) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	capeff, err := strconv.ParseUint(kv["capeff"], 16, 64)
	if err != nil {
		t.Fatalf("writer %s: bad identity line %q", w.name, line)
	}
	if kv["uid"] != strconv.Itoa(w.uid) || kv["gid"] != strconv.Itoa(w.gid) || kv["groups"] != "" {
		t.Fatalf("writer %s runs as %q, want uid=%d gid=%d and no supplementary groups", w.name, line, w.uid, w.gid)
	}
	if has := capeff&(1<<capFsetid) != 0; has != w.capFsetid {
		t.Fatalf("writer %s: CAP_FSETID in the effective set is %v, want %v (%q)", w.name, has, w.capFsetid, line)
	}
}

// fileState is what privilege removal can change in a file.
type fileState struct {
	exists bool
	mode   uint32 // the 07777 bits
	cap    bool   // security.capability present
	err    string
}

func (s fileState) String() string {
	if s.err != "" {
		return "error: " + s.err
	}
	if !s.exists {
		return "absent"
	}
	c := "no cap"
	if s.cap {
		c = "cap"
	}
	return fmt.Sprintf("%04o %s", s.mode, c)
}

func stateOf(path string) fileState {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fileState{}
		}
		return fileState{err: err.Error()}
	}
	s := fileState{exists: true, mode: st.Mode & 0o7777}
	switch _, err := unix.Lgetxattr(path, "security.capability", nil); {
	case err == nil:
		s.cap = true
	case errors.Is(err, unix.ENODATA):
	default:
		s.err = "getxattr security.capability: " + err.Error()
	}
	return s
}

// setcap gives path cap_net_raw+ep with setcap(8).
func setcap(t testing.TB, path string) {
	t.Helper()
	if _, err := exec.LookPath("setcap"); err != nil {
		t.Skip("setcap not installed (libcap2-bin)")
	}
	if out, err := exec.Command("setcap", "cap_net_raw+ep", path).CombinedOutput(); err != nil {
		t.Fatalf("setcap cap_net_raw+ep %s: %v: %s", path, err, out)
	}
}

// stack is a lower, upper and work dir for one overlay mount.
type stack struct {
	lower, upper, work string
}

// newStack makes base/{lower,upper,work}, with build filling the lower.
// The upper dir is 0755 (it is the mount's root directory), unlike a
// t.TempDir.
func newStack(t testing.TB, base string, build func(l *testutil.Layer)) stack {
	t.Helper()
	l := testutil.NewLayer(t, filepath.Join(base, "lower"))
	build(l)
	s := stack{lower: l.Root, upper: filepath.Join(base, "upper"), work: filepath.Join(base, "work")}
	for _, d := range []string{s.upper, s.work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// pair is goverlay and the kernel overlay over two identical stacks.
type pair struct {
	g      *testutil.Mounted
	k      string // the kernel overlay's mount point
	gs, ks stack
}

// mountPair builds the lower twice and mounts goverlay (with -o goOpts)
// on one copy, the kernel overlay on the other; both mount points are
// reachable by the test user.
func mountPair(t testing.TB, goOpts string, build func(l *testutil.Layer)) pair {
	t.Helper()
	base := t.TempDir()
	p := pair{
		gs: newStack(t, filepath.Join(base, "g"), build),
		ks: newStack(t, filepath.Join(base, "k"), build),
	}
	p.k = testutil.KernelOverlay(t, []string{p.ks.lower}, p.ks.upper, p.ks.work)
	p.g = testutil.Mount(t, testutil.Options{
		Lower: []string{p.gs.lower}, Upper: p.gs.upper, Work: p.gs.work,
		Extra: []string{"-o", goOpts},
	})
	testutil.OpenUp(t, p.k)
	testutil.OpenUp(t, p.g.Dir)
	return p
}

// The helpers below say what goOpts give under the mask of
// GOVERLAY_TEST_MASK (testutil.Hides), which turns off what it hides
// whatever the options ask.

// nosecOn says whether goOpts ask for nosec=on.
func nosecOn(goOpts string) bool {
	return strings.Contains(goOpts, "nosec=on") && !testutil.Hides("killpriv_v2")
}

// noOpen says whether goOpts leave files opening without a request
// (noopen=1, the default; passthrough=on implies noopen=0).
func noOpen(goOpts string) bool {
	return !strings.Contains(goOpts, "noopen=0") && !strings.Contains(goOpts, "passthrough=on") && !testutil.Hides("no_open")
}

// passthroughOn says whether goOpts leave passthrough on: with OPEN
// requests, where neither passthrough=off nor writeback=1 turns it off.
func passthroughOn(goOpts string) bool {
	return !noOpen(goOpts) && !strings.Contains(goOpts, "passthrough=off") && !strings.Contains(goOpts, "writeback=1") &&
		!testutil.Hides("passthrough")
}

// writebackOn says whether goOpts give the writeback cache: asked for, or
// the default where passthrough is off.
func writebackOn(goOpts string) bool {
	return !testutil.Hides("writeback_cache") && (strings.Contains(goOpts, "writeback=1") ||
		!passthroughOn(goOpts) && !strings.Contains(goOpts, "writeback=0"))
}

// combos are the mount options of the matrix: {nosec on, off} × {the
// write paths: passthrough, every write a request, the writeback cache},
// files opening without a request (the default) except with passthrough,
// and the writeback cache with OPEN requests once.
var combos = []string{
	"nosec=on,passthrough=on",
	"nosec=on,passthrough=off,writeback=0",
	"nosec=off,passthrough=on",
	"nosec=off,passthrough=off,writeback=0",
	"nosec=on,writeback=1",
	"nosec=off,writeback=1",
	"nosec=on,noopen=0,writeback=1",
}

// subtestName is goOpts as a subtest name: no "," or "=", which t.TempDir
// would put in paths that go into mount options.
func subtestName(goOpts string) string {
	return strings.NewReplacer(",", "_", "=", "-").Replace(goOpts)
}

// checkMountMode checks what `goverlay stats` says about the options the
// mount was given.
func checkMountMode(t testing.TB, s testutil.Stats, goOpts string, rootless bool) {
	t.Helper()
	if s.NoSec != nosecOn(goOpts) {
		t.Errorf("-o %s: goverlay stats says nosec=%v (%s)", goOpts, s.NoSec, s.NoSecReason)
	}
	wantWB, wantPT := writebackOn(goOpts), passthroughOn(goOpts)
	if rootless {
		// Passthrough is never granted: the writeback cache unless
		// writeback=0.
		wantWB, wantPT = !strings.Contains(goOpts, "writeback=0") && !testutil.Hides("writeback_cache"), false
	}
	if s.NoOpen != noOpen(goOpts) {
		t.Errorf("-o %s: goverlay stats says noopen %v", goOpts, s.NoOpen)
	}
	if s.Writeback != wantWB || s.Passthrough != wantPT {
		t.Errorf("-o %s: goverlay stats says writeback cache %v, passthrough %v (%s)", goOpts, s.Writeback, s.Passthrough, s.IOReason)
	}
}
