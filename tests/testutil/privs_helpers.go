package testutil

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverlay/goverlay/overlay"
)

// TestUserName is the unprivileged user tests run writers as.
const TestUserName = "goverlaytest"

// TestUser returns the uid and gid of TestUserName, creating the user (no
// home directory, no login shell) if needed. It skips the test without
// useradd or setpriv.
func TestUser(t testing.TB) (uid, gid int) {
	t.Helper()
	for _, tool := range []string{"setpriv", "useradd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	u, err := user.Lookup(TestUserName)
	if err != nil {
		out, uerr := exec.Command("useradd", "-M", "-s", "/usr/sbin/nologin", TestUserName).CombinedOutput()
		// Another test process may have added it meanwhile (useradd
		// then says "exists", or that /etc/passwd is locked).
		if u, err = user.Lookup(TestUserName); err != nil {
			t.Fatalf("useradd %s: %v: %s; then: %v", TestUserName, uerr, out, err)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// OpenUp makes the directories above dir, up to os.TempDir(), searchable
// by everyone (t.TempDir makes them 0700), so that another user can reach
// dir.
func OpenUp(t testing.TB, dir string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for d := filepath.Dir(dir); d != "/" && strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// UserBinary copies the test binary where every user may run it (its
// build directory is root's alone), under t.TempDir().
func UserBinary(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	OpenUp(t, dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "goverlay")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// Stats is what `goverlay stats --json MOUNTPOINT` prints: the daemon's
// own type, decoded from the command's output.
type Stats = overlay.Stats

// ReadStats runs `goverlay stats --json` on the mount and decodes it; the
// keys the test relies on must all be present.
func ReadStats(t testing.TB, m *Mounted) Stats {
	t.Helper()
	return ReadStatsWith(t, m.Dir, nil)
}

// ReadStatsWith is ReadStats of the mount on dir, the command run under
// wrap: e.g. nsenter into the namespaces of a mount made in them.
func ReadStatsWith(t testing.TB, dir string, wrap []string) Stats {
	t.Helper()
	argv := append(append(append([]string{}, wrap...), Binary(t)), "stats", "--json", dir)
	// The race-enabled binary sleeps 1s at exit (GORACE atexit_sleep_ms)
	// unless told not to.
	r := Run(t, 30*time.Second, []string{"GORACE=atexit_sleep_ms=0"}, argv[0], argv[1:]...)
	if r.Code != 0 {
		t.Fatalf("goverlay stats --json %s: %s", dir, r)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.Stdout), &raw); err != nil {
		t.Fatalf("goverlay stats --json %s: %v\n%s", dir, err, r.Stdout)
	}
	for _, k := range []string{"nosec", "capability_reads", "privilege_checks", "privilege_checks_skipped",
		"removed_suid", "removed_sgid", "removed_capabilities", "opens_passthrough", "opens_through_goverlay"} {
		if _, ok := raw[k]; !ok {
			t.Fatalf("goverlay stats --json %s: no %q in %s", dir, k, r.Stdout)
		}
	}
	var s Stats
	if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil {
		t.Fatalf("goverlay stats --json %s: %v\n%s", dir, err, r.Stdout)
	}
	return s
}

var (
	helpersMu    sync.Mutex
	helpersBuilt = map[string]string{} // abs package dir → binary
	helpersErr   = map[string]string{}
)

// BuildHelper builds the main package in pkgDir (relative to the test's
// working directory, e.g. "./testdata/helper") once per test process into
// the harness's build directory, which Main removes at the end. The
// binary and its directory are readable and executable by every user, so
// that tests can run it as another user.
func BuildHelper(t testing.TB, pkgDir string) string {
	t.Helper()
	// The harness's build directory exists once Binary has run (unless
	// GOVERLAY_TEST_BINARY names a prebuilt binary).
	Binary(t)
	abs, err := filepath.Abs(pkgDir)
	if err != nil {
		t.Fatal(err)
	}
	helpersMu.Lock()
	defer helpersMu.Unlock()
	if bin, ok := helpersBuilt[abs]; ok {
		return bin
	}
	if e, ok := helpersErr[abs]; ok {
		t.Fatal(e)
	}
	fail := func(msg string) {
		helpersErr[abs] = msg
		t.Fatal(msg)
	}
	if buildDir == "" {
		dir, err := os.MkdirTemp("", "goverlay-bin-")
		if err != nil {
			fail(err.Error())
		}
		buildDir = dir
	}
	if err := os.Chmod(buildDir, 0o755); err != nil {
		fail(err.Error())
	}
	bin := filepath.Join(buildDir, "helper-"+strconv.Itoa(len(helpersBuilt))+"-"+filepath.Base(abs))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = abs
	if out, err := cmd.CombinedOutput(); err != nil {
		fail("go build " + pkgDir + ": " + err.Error() + "\n" + string(out))
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		fail(err.Error())
	}
	helpersBuilt[abs] = bin
	return bin
}
