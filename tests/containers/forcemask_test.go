package containers_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// fmWorkSh runs as root in a kept container on a force_mask store: changes
// as root, then as the image's uid 1000 (su), which may only do what the
// owners and modes the container sees allow.
const fmWorkSh = `cd /data
echo new > new.txt
mkdir newdir; chmod 700 newdir; chown 1000:1000 newdir
chmod 600 mode.txt; chown 1234:5678 mode.txt
chmod 4755 rename.txt
rm delete.txt; rm -r deldir
touch /caps/ping
su user -c 'umask 022; cd /data/home
echo mine > mine.txt; mkdir minedir; chmod 750 minedir
echo more >> own.txt; chmod 600 own.txt
(echo x >> /data/append.txt) 2>/dev/null || echo "append to a root file: refused"
chmod 777 /data/mode.txt 2>/dev/null || echo "chmod of a file of another: refused"
ls /data/private >/dev/null 2>&1 || echo "list a 0750 root directory: refused"
cat /data/private/p.txt >/dev/null 2>&1 || echo "read in it: refused"
id -u; cat own.txt'
`

// fmListSh lists /data and /caps as the container sees them.
const fmListSh = `find /data /caps | sort | while read -r f; do stat -c '%n %A %u:%g %F' "$f"; done`

const fmWantWork = `append to a root file: refused
chmod of a file of another: refused
list a 0750 root directory: refused
read in it: refused
1000
own
more
`

// fmWantList is what fmListSh prints after fmWorkSh. rename.txt is
// set-user-ID: "-rwsr-xr-x" is replaced by "-rwxr-xr-x" in the
// committed image (fmSuidLost).
const fmWantList = `/caps drwxr-xr-x 0:0 directory
/caps/ping -rwxr-xr-x 0:0 regular file
/data drwxr-xr-x 0:0 directory
/data/append.txt -rw-r--r-- 0:0 regular file
/data/dir drwxr-xr-x 0:0 directory
/data/dir/sub drwxr-xr-x 0:0 directory
/data/dir/sub/deep.txt -rw-r--r-- 0:0 regular file
/data/dir/top.txt -rw-r--r-- 0:0 regular file
/data/hard.txt -rw-r--r-- 0:0 regular file
/data/home drwxr-xr-x 1000:1000 directory
/data/home/mine.txt -rw-r--r-- 1000:1000 regular file
/data/home/minedir drwxr-x--- 1000:1000 directory
/data/home/own.txt -rw------- 1000:1000 regular file
/data/mode.txt -rw------- 1234:5678 regular file
/data/new.txt -rw-r--r-- 0:0 regular file
/data/newdir drwx------ 1000:1000 directory
/data/opq drwxr-xr-x 0:0 directory
/data/opq/old.txt -rw-r--r-- 0:0 regular file
/data/private drwxr-x--- 0:0 directory
/data/private/p.txt -rw-r----- 0:0 regular file
/data/rename.txt -rwsr-xr-x 0:0 regular file
`

// fmSuidLost: containers/storage 1.43 records an extracted file's mode as
// os.FileMode&07777 (pkg/archive), which drops the set-id and sticky bits
// (Go keeps them above 07777): a committed image loses them.
func fmSuidLost(s string) string {
	return strings.Replace(s, "/data/rename.txt -rwsr-xr-x", "/data/rename.txt -rwxr-xr-x", 1)
}

const fmWantDiff = `A /data/home/mine.txt
A /data/home/minedir
A /data/new.txt
A /data/newdir
C /caps
C /caps/ping
C /data
C /data/home
C /data/home/own.txt
C /data/mode.txt
C /data/rename.txt
C /etc
D /data/deldir
D /data/delete.txt
`

// TestPodmanForceMask runs podman with goverlay as mount_program on a
// store with force_mask=shared (containers/storage then extracts every
// layer with mode 0755, owned by root, the image's owner and mode in
// user.containers.override_stat, and passes xattr_permissions=2 to the
// mount program), with fuse-overlayfs 1.10 as the reference: changes as
// root and as a non-root user, a lower file deleted, podman diff, commit,
// a run of the committed image, a binary needing its file capability. The
// container must see the image's owners and modes and its own changes;
// the store must hold the forced mode and the override xattr. goverlay is
// checked; fuse-overlayfs's differences are logged (goverlay(1), CONTAINERS).
func TestPodmanForceMask(t *testing.T) {
	rootfs := podmanSetup(t)
	l := testutil.NewLayer(t, rootfs).
		File("data/home/own.txt", "own\n", 0o644).
		File("data/private/p.txt", "p\n", 0o640)
	for _, c := range []struct {
		rel  string
		mode os.FileMode
		uid  int
	}{{"data/home", 0o755, 1000}, {"data/home/own.txt", 0o644, 1000}, {"data/private", 0o750, 0}} {
		if err := os.Chmod(l.P(c.rel), c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(l.P(c.rel), c.uid, c.uid); err != nil {
			t.Fatal(err)
		}
	}

	progs := podmanPrograms(t)
	results := map[string][]step{}
	for _, prog := range progs {
		t.Run(prog.name, func(t *testing.T) {
			p := newPodman(t, prog)
			p.flags = append(p.flags, "--storage-opt", "overlay.force_mask=shared")
			results[prog.name] = forceMaskFlow(t, p, rootfs)
		})
	}
	// Where fuse-overlayfs differs: recorded, not asserted.
	ref, got := results["fuse-overlayfs"], results["goverlay"]
	for i := 0; i < len(ref) && i < len(got); i++ {
		if ref[i].out != got[i].out {
			t.Logf("%s: fuse-overlayfs differs (- fuse-overlayfs, + goverlay):\n%s", ref[i].name,
				diffLines(strings.Split(ref[i].out, "\n"), strings.Split(got[i].out, "\n")))
		}
	}
}

// forceMaskFlow runs the containers and checks goverlay's outputs and
// the store; it returns every step's output.
func forceMaskFlow(t *testing.T, p *podman, rootfs string) []step {
	prog := p.prog
	var steps []step
	// check runs podman; goverlay must exit 0 and print want (after
	// norm, if any); fuse-overlayfs's failures and output are recorded.
	check := func(name, want string, norm func(string) string, args ...string) string {
		t.Helper()
		r := p.run(args...)
		out := r.Stdout
		if r.Code != 0 {
			out += "exit " + r.String()
		}
		t.Logf("%s:\n%s", name, out)
		steps = append(steps, step{name, out})
		got := out
		if norm != nil {
			got = norm(got)
		}
		if got != want && prog.name == "goverlay" {
			t.Errorf("%s with goverlay printed (- want, + got):\n%s", name,
				diffLines(strings.Split(want, "\n"), strings.Split(got, "\n")))
		}
		return out
	}
	inspect := func(args ...string) string {
		t.Helper()
		return strings.TrimSpace(p.must(args...))
	}

	p.importImage(rootfs, "localhost/bb")
	image := inspect("image", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", "localhost/bb")
	checkForcedLayer(t, prog, true, image, map[string]string{
		"":                   "0:0:0755",
		"data/home":          "1000:1000:0755",
		"data/home/own.txt":  "1000:1000:0644",
		"data/private":       "0:0:0750",
		"data/private/p.txt": "0:0:0640",
		"data/mode.txt":      "0:0:0644",
		"caps/ping":          "0:0:0755",
	}, "the image's layer")
	if lxattr(filepath.Join(image, "caps/ping"), "security.capability") == "" {
		t.Errorf("the image's layer: caps/ping has no security.capability")
	}

	check("podman run (as root and as uid 1000)", fmWantWork+fmWantList, nil,
		ctr("--name", "fm", "localhost/bb", "sh", "-c", fmWorkSh+fmListSh)...)
	if t.Failed() {
		return steps
	}
	upper := inspect("inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", "fm")
	checkForcedUpper(t, prog, upper, map[string]string{
		"data/new.txt":       "0:0:0644:file",
		"data/newdir":        "1000:1000:0700:dir",
		"data/mode.txt":      "1234:5678:0600:file",
		"data/rename.txt":    "0:0:4755:file",
		"data/home":          "1000:1000:0755:dir",
		"data/home/mine.txt": "1000:1000:0644:file",
		"data/home/minedir":  "1000:1000:0750:dir",
		"data/home/own.txt":  "1000:1000:0600:file",
		"caps/ping":          "0:0:0755:file",
	})
	if got := statLine(filepath.Join(upper, "data/delete.txt")); got != "0:0 0000 char-0-0" && prog.name == "goverlay" {
		t.Errorf("upper data/delete.txt is %q, want a whiteout (char 0/0)", got)
	}
	if lxattr(filepath.Join(upper, "caps/ping"), "security.capability") == "" && prog.name == "goverlay" {
		t.Errorf("the copy-up of caps/ping lost its security.capability")
	}

	diff := strings.Split(strings.TrimSpace(p.must("diff", "fm")), "\n")
	sort.Strings(diff)
	steps = append(steps, step{"podman diff", strings.Join(diff, "\n") + "\n"})
	if got := strings.Join(diff, "\n") + "\n"; got != fmWantDiff {
		msg := diffLines(strings.Split(fmWantDiff, "\n"), strings.Split(got, "\n"))
		if prog.name == "goverlay" {
			t.Errorf("podman diff with goverlay (- want, + got):\n%s", msg)
		} else {
			t.Logf("podman diff with fuse-overlayfs (- goverlay's, + fuse-overlayfs's):\n%s", msg)
		}
	}

	p.must("commit", "-q", "fm", "localhost/bb-fm")
	committed := inspect("image", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", "localhost/bb-fm")
	// containers/storage 1.43 writes "UID:GID:MODE" without the type,
	// and loses the set-user-ID bit (fmSuidLost).
	checkForcedLayer(t, prog, false, committed, map[string]string{
		"data/mode.txt":      "1234:5678:0600",
		"data/newdir":        "1000:1000:0700",
		"data/home/mine.txt": "1000:1000:0644",
		"data/home/own.txt":  "1000:1000:0600",
	}, "the committed layer")
	if got := statLine(filepath.Join(committed, "data/.wh.delete.txt")); !strings.HasSuffix(got, " file") {
		t.Errorf("the committed layer: data/.wh.delete.txt is %q, want an AUFS whiteout (a file)", got)
	}
	check("committed image, podman run --rm", fmSuidLost(fmWantList), func(s string) string {
		if f := fmSuidLost(s); f != s {
			t.Logf("the committed image keeps rename.txt's set-user-ID bit (containers/storage fixed?)")
			return f
		}
		return s
	}, ctr("--rm", "localhost/bb-fm", "sh", "-c", fmListSh)...)
	check("ping as uid 1000, committed image", wantPing, nil,
		ctr("--rm", "--user", "1000", "localhost/bb-fm", "sh", "-c", pingSh)...)
	check("uid 1000 in its home, committed image", "mine\nown\nmore\nmine\n", nil,
		ctr("--rm", "--user", "1000", "localhost/bb-fm", "sh", "-c",
			"cd /data/home && cat mine.txt own.txt && echo mine >> mine.txt && tail -n1 mine.txt")...)
	// What containers/storage 1.43 makes of the root and /tmp
	// (goverlay(1), CONTAINERS): recorded only.
	r := p.run(ctr("--rm", "localhost/bb", "stat", "-c", "%n %A %u:%g", "/", "/tmp")...)
	t.Logf("%s: / and /tmp with force_mask=shared: %s", prog.name, strings.TrimSpace(r.Stdout))
	p.must("rm", "fm")
	p.leftovers("after podman rm")
	return steps
}

// checkForcedLayer checks an image layer as containers/storage extracts
// it with force_mask=shared: every object but symlinks really owned by
// root with mode 0755 and carrying an override xattr; want gives some of
// the xattrs' values (rel "" is the layer's root): for every program if
// everyone (what containers/storage makes of its own input), else for
// goverlay only (a layer committed from what the program showed).
func checkForcedLayer(t *testing.T, prog mountProgram, everyone bool, root string, want map[string]string, what string) {
	t.Helper()
	if root == "" {
		t.Errorf("%s: no directory", what)
		return
	}
	n := 0
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		n++
		if got := statLine(p); !strings.HasPrefix(got, "0:0 0755 ") {
			t.Errorf("%s: %s is really %q, want 0:0 0755 (force_mask=shared)", what, rel, got)
		}
		if lxattr(p, containersXattr) == "" {
			t.Errorf("%s: %s has no %s", what, rel, containersXattr)
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
	for rel, w := range want {
		switch got := lxattr(filepath.Join(root, rel), containersXattr); {
		case got == w:
		case everyone || prog.name == "goverlay":
			t.Errorf("%s: %q has %s=%q, want %q", what, rel, containersXattr, got, w)
		default:
			t.Logf("%s: %s: %q has %s=%q (goverlay: %q)", what, prog.name, rel, containersXattr, got, w)
		}
	}
	t.Logf("%s: %d objects, all 0:0 0755 with %s", what, n, containersXattr)
}

// checkForcedUpper checks the container's upper layer: with goverlay,
// every object but symlinks and whiteouts really owned by root with mode
// 0755 (its choice: no set-id or world-writable file of root's on the
// host), its owner and mode as the container sees them in the override
// (want); fuse-overlayfs's are recorded.
func checkForcedUpper(t *testing.T, prog mountProgram, upper string, want map[string]string) {
	t.Helper()
	err := filepath.Walk(upper, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		got := statLine(p)
		if fi.Mode()&os.ModeSymlink != 0 || strings.HasSuffix(got, " char-0-0") || strings.HasPrefix(fi.Name(), ".wh.") {
			return nil
		}
		if !strings.HasPrefix(got, "0:0 0755 ") || lxattr(p, containersXattr) == "" {
			if prog.name == "goverlay" {
				t.Errorf("upper %s is really %q with %s=%q, want 0:0 0755 and an override", rel, got, containersXattr, lxattr(p, containersXattr))
			} else {
				t.Logf("%s: upper %s is really %q, %s=%q, %s=%q", prog.name, rel, got,
					containersXattr, lxattr(p, containersXattr), fuseUserXattr, lxattr(p, fuseUserXattr))
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("upper: %v", err)
	}
	for _, rel := range sortedKeys(want) {
		got := lxattr(filepath.Join(upper, rel), containersXattr)
		switch {
		case got == want[rel]:
		case prog.name == "goverlay":
			t.Errorf("upper %s has %s=%q, want %q", rel, containersXattr, got, want[rel])
		default:
			t.Logf("%s: upper %s has %s=%q, %s=%q (goverlay: %q)", prog.name, rel, containersXattr, got,
				fuseUserXattr, lxattr(filepath.Join(upper, rel), fuseUserXattr), want[rel])
		}
	}
}
