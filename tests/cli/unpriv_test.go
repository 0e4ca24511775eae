package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// userBinary copies the test binary where an unprivileged user may run it
// (the build directory is 0700).
func userBinary(t *testing.T) string { return testutil.UserBinary(t) }

// userLayout makes lower (root's, readable by all), and upper, work and
// mnt owned by uid:gid, under a directory everyone may search.
func userLayout(t *testing.T, uid, gid int) (base, lower, upper, work, mnt string) {
	t.Helper()
	base = t.TempDir()
	openUp(t, base)
	must(t, os.Chmod(base, 0o755))
	l := testutil.NewLayer(t, filepath.Join(base, "lower"))
	l.File("file", "hello\n", 0o644)
	upper, work, mnt = filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "mnt")
	for _, d := range []string{upper, work, mnt} {
		must(t, os.Mkdir(d, 0o755))
		must(t, os.Chown(d, uid, gid))
	}
	return base, l.Root, upper, work, mnt
}

// runAs runs bin with args as uid:gid, no supplementary groups.
func runAs(t *testing.T, uid, gid int, bin string, args ...string) testutil.Result {
	t.Helper()
	return testutil.Run(t, cmdTimeout, []string{"GORACE=atexit_sleep_ms=0"}, "setpriv",
		append([]string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups", bin}, args...)...)
}

// TestUnprivilegedMount: a user other than root mounts through
// fusermount3 with layers of its own; the workdir's work directory is
// opened up to its owner (the kernel's mode 0 would lock the user out);
// the user and root read its statistics, no one else.
func TestUnprivilegedMount(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	uid, gid := unprivileged(t)
	bin := userBinary(t)
	_, lower, upper, work, mnt := userLayout(t, uid, gid)
	r := runAs(t, uid, gid, bin, "-o", "lowerdir="+lower+",upperdir="+upper+",workdir="+work, mnt)
	if r.Code != 0 {
		if testutil.IsMounted(mnt) {
			testutil.AdoptOf(t, mnt, bin)
		}
		t.Fatalf("unprivileged mount: %s", r)
	}
	m := testutil.AdoptOf(t, mnt, bin)
	if w := runAs(t, uid, gid, "/bin/sh", "-c", `echo new > "$0"/new && cat "$0"/file`, mnt); w.Code != 0 || w.Stdout != "hello\n" {
		t.Errorf("write and read through the mount as uid %d: %s", uid, w)
	}
	fi, err := os.Stat(filepath.Join(work, "work"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("workdir/work: %v, %v; want mode 0700", fi, err)
	}
	if data, err := os.ReadFile(filepath.Join(upper, "new")); err != nil || string(data) != "new\n" {
		t.Errorf("upper/new: %q, %v", data, err)
	}
	// The statistics, for the owner and for root (whom the mount itself
	// refuses: no allow_other), from the daemon's socket in the owner's
	// directory; not for another user.
	for _, who := range []string{"owner", "root"} {
		var st testutil.Stats
		if who == "owner" {
			r := runAs(t, uid, gid, bin, "stats", "--json", mnt)
			if err := json.Unmarshal([]byte(r.Stdout), &st); r.Code != 0 || err != nil {
				t.Errorf("goverlay stats as uid %d: %s (%v)", uid, r, err)
			}
		} else {
			st = testutil.ReadStats(t, m)
		}
		if st.Mountpoint != mnt || st.PID != m.PID || len(st.Lower) != 1 || st.Lower[0] != lower || st.Upper != upper {
			t.Errorf("goverlay stats as %s: mountpoint %q, pid %d, lowerdir %q, upperdir %q; want %q, %d, %q, %q",
				who, st.Mountpoint, st.PID, st.Lower, st.Upper, mnt, m.PID, lower, upper)
		}
	}
	if r := runAs(t, 65534, 65534, bin, "stats", mnt); r.Code != 2 || !strings.Contains(r.Stderr, "only root and the mount's owner (uid "+strconv.Itoa(uid)+") may") {
		t.Errorf("goverlay stats as uid 65534: %s; want exit 2 saying who may read them", r)
	}
	m.Unmount(t)
}

// TestUnprivilegedRefused: what would fail only half-way through an
// unprivileged mount is found first, told in words, and leaves the workdir
// as it was.
func TestUnprivilegedRefused(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	uid, gid := unprivileged(t)
	bin := userBinary(t)
	for _, c := range []struct {
		name    string
		prepare func(base, lower, mnt string) string // returns the mountpoint
		want    []string
	}{
		{"mountpoint of root's", func(base, lower, mnt string) string {
			m := filepath.Join(base, "rootmnt")
			must(t, os.Mkdir(m, 0o755))
			return m
		}, []string{"mountpoint", "not writable by uid " + strconv.Itoa(uid), "fusermount3"}},
		{"unreadable lower", func(base, lower, mnt string) string {
			must(t, os.Chmod(lower, 0o700))
			return mnt
		}, []string{"lowerdir", "cannot be read by uid " + strconv.Itoa(uid), "chmod a+rX"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base, lower, upper, work, mnt := userLayout(t, uid, gid)
			mnt = c.prepare(base, lower, mnt)
			r := runAs(t, uid, gid, bin, "-o", "lowerdir="+lower+",upperdir="+upper+",workdir="+work, mnt)
			if testutil.IsMounted(mnt) {
				testutil.AdoptOf(t, mnt, bin)
				t.Fatalf("mounted: %s", r)
			}
			if r.Code != 2 || len(r.StderrLines()) != 1 {
				t.Errorf("%s; want exit 2 and one line", r)
			}
			for _, w := range c.want {
				if !strings.Contains(r.Stderr, w) {
					t.Errorf("stderr %q lacks %q", r.Stderr, w)
				}
			}
			if ents, err := os.ReadDir(work); err != nil || len(ents) != 0 {
				t.Errorf("workdir holds %v (%v) after a refused mount; want it untouched", ents, err)
			}
		})
	}
}

// TestUnprivilegedMetacopyFallsBack: a user's daemon may not write the
// trusted.overlay.metacopy xattr, so metacopy=on falls back to off, as the
// kernel overlay does where the upper refuses xattrs: a chmod copies the
// file up whole instead of failing.
func TestUnprivilegedMetacopyFallsBack(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	uid, gid := unprivileged(t)
	bin := userBinary(t)
	_, lower, upper, work, mnt := userLayout(t, uid, gid)
	must(t, os.Chown(filepath.Join(lower, "file"), uid, gid))
	r := runAs(t, uid, gid, bin, "-o", "lowerdir="+lower+",upperdir="+upper+",workdir="+work+",metacopy=on", mnt)
	if r.Code != 0 {
		if testutil.IsMounted(mnt) {
			testutil.AdoptOf(t, mnt, bin)
		}
		t.Fatalf("unprivileged mount: %s", r)
	}
	m := testutil.AdoptOf(t, mnt, bin)
	if w := runAs(t, uid, gid, "/bin/sh", "-c", `chmod 600 "$0"/file && cat "$0"/file`, mnt); w.Code != 0 || w.Stdout != "hello\n" {
		t.Errorf("chmod and read through the mount as uid %d: %s", uid, w)
	}
	m.Unmount(t)
	if data, err := os.ReadFile(filepath.Join(upper, "file")); err != nil || string(data) != "hello\n" {
		t.Errorf("upper/file: %q, %v; want the whole file", data, err)
	}
}
