package containers_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// These tests run the mount programs the way rootless podman does: as the
// unprivileged test user, as root of a user namespace that maps the user to
// 0 and its subordinate ids (/etc/subuid, through newuidmap/newgidmap) to
// 1…, made by `unshare --map-auto --map-root-user -m`. /dev/fuse is reached
// through a device node the test makes and owns to the user, bind-mounted
// over /dev/fuse inside the namespace's own mount namespace: no change to
// the host's /dev/fuse.

// nsIDRange is one line of /proc/PID/uid_map: ids NS… are host ids HOST….
type nsIDRange struct{ ns, host, n uint32 }

// unprivNS is a scratch folder the test user owns, with a view of the user
// namespace the scripts run in.
type unprivNS struct {
	base           string // owned by the user, 0755, reachable by it
	uid, gid       int    // the user, outside
	uidMap, gidMap []nsIDRange
	goverlay       string // the race build, copied into base
}

// hostID is the host id of namespace id id.
func hostID(t *testing.T, m []nsIDRange, id uint32) uint32 {
	t.Helper()
	for _, r := range m {
		if id >= r.ns && id-r.ns < r.n {
			return r.host + (id - r.ns)
		}
	}
	t.Fatalf("namespace id %d is not mapped (%v)", id, m)
	return 0
}

// unmappedHostID is a host id the namespace does not map.
func unmappedHostID(m []nsIDRange) uint32 {
	id := uint32(3000000)
	for again := true; again; {
		again = false
		for _, r := range m {
			if id >= r.host && id-r.host < r.n {
				id, again = r.host+r.n, true
			}
		}
	}
	return id
}

// ensureSubIDs makes sure the user has subordinate uids and gids; a fresh
// useradd may not have given any. What it adds it removes again.
func ensureSubIDs(t testing.TB, user string) {
	t.Helper()
	for _, f := range []struct{ file, add, del string }{
		{"/etc/subuid", "--add-subuids", "--del-subuids"},
		{"/etc/subgid", "--add-subgids", "--del-subgids"},
	} {
		data, _ := os.ReadFile(f.file)
		found := false
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, user+":") {
				found = true
			}
		}
		if found {
			continue
		}
		const r = "100000-165535"
		if out, err := exec.Command("usermod", f.add, r, user).CombinedOutput(); err != nil {
			t.Fatalf("no %s entry for %s, and usermod %s %s failed: %v: %s", f.file, user, f.add, r, err, out)
		}
		del := f.del
		t.Cleanup(func() {
			if out, err := exec.Command("usermod", del, r, user).CombinedOutput(); err != nil {
				t.Errorf("usermod %s %s %s: %v: %s", del, r, user, err, out)
			}
		})
	}
}

// newUnprivNS makes the scratch folder and reads the namespace's maps.
func newUnprivNS(t *testing.T) *unprivNS {
	t.Helper()
	testutil.RequireRoot(t)
	lookTools(t, rootlessTools)
	uid, gid := testutil.TestUser(t)
	ensureSubIDs(t, testutil.TestUserName)
	s := &unprivNS{base: t.TempDir(), uid: uid, gid: gid}
	testutil.OpenUp(t, s.base)
	if err := os.Chmod(s.base, 0o755); err != nil {
		t.Fatal(err)
	}
	// The user's own /dev/fuse (misc 10:229).
	if err := unix.Mknod(filepath.Join(s.base, "fuse"), unix.S_IFCHR|0o600, int(unix.Mkdev(10, 229))); err != nil {
		t.Fatal(err)
	}
	s.goverlay = filepath.Join(s.base, "goverlay")
	copyFile(t, testutil.Binary(t), s.goverlay, 0o755)
	for _, p := range []string{s.base, filepath.Join(s.base, "fuse"), s.goverlay} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	out, err := s.command("cat /proc/self/uid_map; echo --; cat /proc/self/gid_map").CombinedOutput()
	if err != nil {
		t.Fatalf("unshare --map-auto --map-root-user as %s: %v: %s", testutil.TestUserName, err, out)
	}
	maps := [][]nsIDRange{nil, nil}
	i := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 1 && f[0] == "--" {
			i = 1
			continue
		}
		if len(f) != 3 {
			t.Fatalf("unexpected line in the namespace's id maps: %q", sc.Text())
		}
		var v [3]uint32
		for j := range v {
			n, err := strconv.ParseUint(f[j], 10, 32)
			if err != nil {
				t.Fatalf("unexpected line in the namespace's id maps: %q", sc.Text())
			}
			v[j] = uint32(n)
		}
		maps[i] = append(maps[i], nsIDRange{v[0], v[1], v[2]})
	}
	s.uidMap, s.gidMap = maps[0], maps[1]
	// The namespace must be the rootless podman one: the user is 0, and
	// at least 65536 ids in all.
	for _, m := range maps {
		total := uint32(0)
		for _, r := range m {
			total += r.n
		}
		if len(m) < 2 || total < 65536 {
			t.Fatalf("the namespace maps %v: want the user as 0 and its subordinate ids (a full map); is newuidmap setuid and /etc/subuid right?\n%s", m, out)
		}
	}
	if hostID(t, s.uidMap, 0) != uint32(uid) || hostID(t, s.gidMap, 0) != uint32(gid) {
		t.Fatalf("the namespace's 0 is not the user: %v %v", s.uidMap, s.gidMap)
	}
	t.Logf("namespace maps: uid %v, gid %v", s.uidMap, s.gidMap)
	writeFuncs(t, s)
	return s
}

// command is `sh -c SCRIPT sh ARGS…` run as the user, as root of a new user
// namespace (full map) with its own mount namespace, from base, with the
// user's device node as /dev/fuse.
func (s *unprivNS) command(script string, args ...string) *exec.Cmd {
	argv := []string{"--reuid", strconv.Itoa(s.uid), "--regid", strconv.Itoa(s.gid), "--clear-groups",
		"unshare", "--map-auto", "--map-root-user", "-m", "sh", "-c", script, "sh"}
	cmd := exec.Command("setpriv", append(argv, args...)...)
	cmd.Dir = s.base
	cmd.Env = append(os.Environ(), "BASE="+s.base, "GORACE=atexit_sleep_ms=0 log_path="+filepath.Join(s.base, "race"))
	return cmd
}

// chown sets the owner of rel (under base) to the host ids of namespace
// ids uid and gid.
func (s *unprivNS) chown(t *testing.T, rel string, uid, gid uint32) {
	t.Helper()
	if err := os.Lchown(filepath.Join(s.base, rel), int(hostID(t, s.uidMap, uid)), int(hostID(t, s.gidMap, gid))); err != nil {
		t.Fatal(err)
	}
}

// hostOwner is "uid:gid" of namespace ids.
func (s *unprivNS) hostOwner(t *testing.T, uid, gid uint32) string {
	return fmt.Sprintf("%d:%d", hostID(t, s.uidMap, uid), hostID(t, s.gidMap, gid))
}

// nsPrelude starts every script: the user's /dev/fuse, and an unmount of
// mnt when the script ends early; st and try from funcs.sh. mount_up PROG OPTS [WRAPPER…] mounts
// lower/upper/work at mnt, keeping goverlay's pid for the test.
const nsPrelude = `set -e
cd "$BASE"
mount --bind fuse /dev/fuse
trap 'umount mnt 2>/dev/null || umount -l mnt 2>/dev/null || true' EXIT
n=0
mount_up() {
	prog=$1 opts=$2; shift 2
	n=$((n+1))
	case "$prog" in
	*/goverlay) "$@" "$prog" -o "lowerdir=lower,upperdir=upper,workdir=work,$opts" --pidfile="$BASE/daemon.pid" mnt
		cp daemon.pid "daemon.$n.kept" ;;
	*) "$@" "$prog" -o "lowerdir=lower,upperdir=upper,workdir=work,$opts" mnt ;;
	esac
}
. ./funcs.sh
`

// runUnpriv runs script for prog in s (the program's path is $1, its
// options $2), checks that no daemon or mount outlives it, that every
// goverlay daemon exited 0 and the race detector said nothing, and returns
// the script's output without the programs' notices (lines starting with
// "goverlay:", "unknown argument ignored").
func (s *unprivNS) runUnpriv(t *testing.T, prog mountProgram, opts, script string) string {
	t.Helper()
	t.Cleanup(func() {
		for _, k := range waitProcsGone(prog.path, s.base+"/", exitDeadline, t.Name()) {
			t.Errorf("%s process left running: %s (killed)", prog.name, k)
		}
		if d := detach(s.base); len(d) > 0 {
			t.Errorf("mounts left under %s: %q", s.base, d)
		}
	})
	out, err := s.command(nsPrelude+script, prog.path, opts).CombinedOutput()
	t.Logf("%s -o …,%s in unshare --map-auto --map-root-user -m as %s:\n%s", prog.name, opts, testutil.TestUserName, out)
	if err != nil {
		t.Fatalf("the script failed: %v", err)
	}
	if prog.name == "goverlay" {
		kept, _ := filepath.Glob(filepath.Join(s.base, "daemon.*.kept"))
		if len(kept) == 0 {
			t.Errorf("no pidfile kept: the daemon's exit status is not checked")
		}
		for _, k := range kept {
			checkRootlessDaemon(t, k)
			os.Remove(k)
		}
	}
	races, _ := filepath.Glob(filepath.Join(s.base, "race.*"))
	for _, r := range races {
		data, _ := os.ReadFile(r)
		t.Errorf("the race detector reported:\n%s", data)
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if strings.HasPrefix(line, "goverlay:") || strings.HasPrefix(line, "unknown argument ignored") {
			continue
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// unprivPrograms is goverlay (race build, -o userxattr as containers/storage
// rootless would need it) and fuse-overlayfs when installed (it picks its
// xattr namespace by itself).
func (s *unprivNS) programs() []mountProgram {
	progs := []mountProgram{{"goverlay", s.goverlay}}
	if _, err := os.Stat(fuseOverlayfs); err == nil {
		progs = append(progs, mountProgram{"fuse-overlayfs", fuseOverlayfs})
	}
	return progs
}

func progOpts(prog mountProgram, opts string) string {
	if prog.name == "goverlay" {
		return "userxattr," + opts
	}
	return opts
}

// freshLayers makes empty upper, work and mnt and a lower with files
// (relative name → content, mode 0644), all owned by the user.
func (s *unprivNS) freshLayers(t *testing.T, files ...string) {
	t.Helper()
	for _, d := range []string{"upper", "work", "mnt"} {
		os.RemoveAll(filepath.Join(s.base, d))
		if err := os.Mkdir(filepath.Join(s.base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.RemoveAll(filepath.Join(s.base, "lower"))
	l := testutil.NewLayer(t, filepath.Join(s.base, "lower"))
	for i := 0; i+1 < len(files); i += 2 {
		l.File(files[i], files[i+1], 0o644)
	}
	if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", s.uid, s.gid),
		filepath.Join(s.base, "lower"), filepath.Join(s.base, "upper"), filepath.Join(s.base, "work"), filepath.Join(s.base, "mnt")).CombinedOutput(); err != nil {
		t.Fatalf("chown -R: %v: %s", err, out)
	}
}

// idmapLayers makes lower (namespace owners: / 0, root0.txt 0, d and all
// in it 1000, out3000.txt 3000, far.txt a host id the namespace does not
// map), and empty upper, work and mnt owned by the user (0).
func (s *unprivNS) idmapLayers(t *testing.T) {
	t.Helper()
	for _, d := range []string{"upper", "work", "mnt"} {
		os.RemoveAll(filepath.Join(s.base, d))
		if err := os.Mkdir(filepath.Join(s.base, d), 0o755); err != nil {
			t.Fatal(err)
		}
		s.chown(t, d, 0, 0)
	}
	os.RemoveAll(filepath.Join(s.base, "lower"))
	testutil.NewLayer(t, filepath.Join(s.base, "lower")).
		File("root0.txt", "root0\n", 0o644).File("out3000.txt", "out\n", 0o644).File("far.txt", "far\n", 0o644).
		File("d/u1000.txt", "u1000\n", 0o644).File("d/app.txt", "app\n", 0o644).File("d/gone.txt", "gone\n", 0o644)
	for rel, id := range map[string]uint32{"lower": 0, "lower/root0.txt": 0, "lower/out3000.txt": 3000,
		"lower/d": 1000, "lower/d/u1000.txt": 1000, "lower/d/app.txt": 1000, "lower/d/gone.txt": 1000} {
		s.chown(t, rel, id, id)
	}
	far := int(unmappedHostID(s.uidMap))
	if err := os.Lchown(filepath.Join(s.base, "lower/far.txt"), far, int(unmappedHostID(s.gidMap))); err != nil {
		t.Fatal(err)
	}
}

// idmapScript: in the namespace, with uidmapping=0:10000:2000 (and the
// same for gids; namespace ids): the view, then container uid 1000 (10000+
// 1000 through the mount) creates, mkdirs, appends (copy-up), deletes and
// chowns; then the namespace's root chowns to mapped ids, to an id the
// mount does not map, to one the namespace does not map, and creates.
const idmapScript = `mount_up "$1" "$2"
echo "== view"
st mnt mnt/root0.txt mnt/d mnt/d/u1000.txt mnt/d/app.txt mnt/out3000.txt mnt/far.txt
echo "== as 11000 (container uid 1000)"
setpriv --reuid 11000 --regid 11000 --clear-groups sh -c '
	set -e
	. ./funcs.sh
	echo "$(id -u):$(id -g)"
	echo new > mnt/d/new.txt
	mkdir mnt/d/newdir
	echo more >> mnt/d/app.txt
	rm mnt/d/gone.txt
	st mnt/d/new.txt mnt/d/newdir mnt/d/app.txt
	try chown 10500:10500 mnt/d/new.txt
	cat mnt/d/app.txt'
echo "== as root of the namespace"
try chown 10500:10500 mnt/d/u1000.txt
try chown 5000:5000 mnt/root0.txt
try chown 70000:70000 mnt/out3000.txt
echo byroot > mnt/byroot.txt
st mnt/d/u1000.txt mnt/root0.txt mnt/out3000.txt mnt/byroot.txt
ls mnt mnt/d
umount mnt
`

// TestUnprivIDMap: uidmapping=/gidmapping= through a real mount made by
// the unprivileged user in a user namespace with a full subordinate-id map,
// goverlay against fuse-overlayfs 1.10 (same merged view, same owners on
// disk). The mapping direction is fuse-overlayfs's (see goverlay(1)): on-disk
// (namespace) id N in [0,2000) shows as 10000+N, anything else as the
// overflow id; new files and chown map back; an id the mount does not map
// is stored as the overflow id; one the namespace does not map fails with
// EINVAL in the kernel before reaching the program.
func TestUnprivIDMap(t *testing.T) {
	s := newUnprivNS(t)
	ov := overflowID(t, "uid")
	if og := overflowID(t, "gid"); og != ov {
		t.Skipf("the expectations assume overflowuid = overflowgid (%d, %d)", ov, og)
	}
	o := strconv.Itoa(ov)
	want := strings.Join([]string{
		"== view",
		"mnt 10000:10000",
		"mnt/root0.txt 10000:10000",
		"mnt/d 11000:11000",
		"mnt/d/u1000.txt 11000:11000",
		"mnt/d/app.txt 11000:11000",
		"mnt/out3000.txt " + o + ":" + o,
		"mnt/far.txt " + o + ":" + o,
		"== as 11000 (container uid 1000)",
		"11000:11000",
		"mnt/d/new.txt 11000:11000",
		"mnt/d/newdir 11000:11000",
		"mnt/d/app.txt 11000:11000",
		"chown 10500:10500 mnt/d/new.txt: changing ownership of 'mnt/d/new.txt': Operation not permitted",
		"app",
		"more",
		"== as root of the namespace",
		"chown 10500:10500 mnt/d/u1000.txt: ok",
		"chown 5000:5000 mnt/root0.txt: ok",
		"chown 70000:70000 mnt/out3000.txt: changing ownership of 'mnt/out3000.txt': Invalid argument",
		"mnt/d/u1000.txt 10500:10500",
		"mnt/root0.txt " + o + ":" + o,
		"mnt/out3000.txt " + o + ":" + o,
		"mnt/byroot.txt " + o + ":" + o,
		"mnt:", "byroot.txt", "d", "far.txt", "out3000.txt", "root0.txt", "",
		"mnt/d:", "app.txt", "new.txt", "newdir", "u1000.txt",
	}, "\n")
	const opts = "uidmapping=0:10000:2000,gidmapping=0:10000:2000"
	ids := func(u uint32) string { return s.hostOwner(t, u, u) }
	wantDisk := map[string]string{
		".":           ids(0),
		"d":           ids(1000),
		"d/new.txt":   ids(1000), // created by 11000
		"d/newdir":    ids(1000),
		"d/app.txt":   ids(1000), // copied up
		"d/u1000.txt": ids(500),  // chown 10500
		"root0.txt":   ids(uint32(ov)),
		"byroot.txt":  ids(uint32(ov)), // created by the namespace's 0, which the mount does not map
	}
	disks := map[string]map[string]string{}
	for _, prog := range s.programs() {
		t.Run(prog.name, func(t *testing.T) {
			s.idmapLayers(t)
			got := s.runUnpriv(t, prog, progOpts(prog, opts), idmapScript)
			if got != want {
				t.Errorf("%s through -o %s (- want, + got):\n%s", prog.name, opts,
					diffLines(strings.Split(want, "\n"), strings.Split(got, "\n")))
			}
			disk := owners(t, filepath.Join(s.base, "upper"))
			for rel, w := range wantDisk {
				if disk[rel] != w {
					t.Errorf("%s: upper/%s is owned by %s on the host, want %s", prog.name, rel, disk[rel], w)
				}
			}
			if wf := whiteoutFormat(filepath.Join(s.base, "upper"), "d/gone.txt"); wf == "" {
				t.Errorf("%s: no whiteout for d/gone.txt in upper", prog.name)
			}
			disks[prog.name] = disk
		})
	}
	if a, b := disks["goverlay"], disks["fuse-overlayfs"]; a != nil && b != nil {
		if d := diffOwners(a, b); d != "" {
			t.Errorf("host owners in upper differ, goverlay vs fuse-overlayfs:\n%s", d)
		}
	}
}

// squashScript: the view, a file created and a chown by the namespace's
// root, the view again.
const squashScript = `mount_up "$1" "$2"
st mnt mnt/root0.txt mnt/d mnt/d/u1000.txt mnt/out3000.txt mnt/far.txt
echo byroot > mnt/byroot.txt
try chown 5:5 mnt/d/u1000.txt
st mnt/byroot.txt mnt/d/u1000.txt
umount mnt
`

// TestUnprivSquash: squash_to_uid/squash_to_gid (what containers/storage
// passes for a size-1 map) and squash_to_root, through a mount made by the
// unprivileged user in the full-map namespace, goverlay against
// fuse-overlayfs: every file shows the squashed owner, whatever its
// on-disk id (also ones the namespace or the map does not cover), chown
// succeeds and still shows it, and a new file is stored with its creator's
// id (the namespace's 0, the user on the host).
func TestUnprivSquash(t *testing.T) {
	s := newUnprivNS(t)
	for _, c := range []struct{ name, opts, owner string }{
		{"squash_to_uid", "squash_to_uid=4321,squash_to_gid=4321", "4321:4321"},
		{"squash_to_root", "squash_to_root", "0:0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lines := []string{"mnt", "mnt/root0.txt", "mnt/d", "mnt/d/u1000.txt", "mnt/out3000.txt", "mnt/far.txt"}
			for i := range lines {
				lines[i] += " " + c.owner
			}
			lines = append(lines, "chown 5:5 mnt/d/u1000.txt: ok", "mnt/byroot.txt "+c.owner, "mnt/d/u1000.txt "+c.owner)
			want := strings.Join(lines, "\n")
			for _, prog := range s.programs() {
				t.Run(prog.name, func(t *testing.T) {
					s.idmapLayers(t)
					got := s.runUnpriv(t, prog, progOpts(prog, c.opts), squashScript)
					if got != want {
						t.Errorf("%s through -o %s (- want, + got):\n%s", prog.name, c.opts,
							diffLines(strings.Split(want, "\n"), strings.Split(got, "\n")))
					}
					upper := filepath.Join(s.base, "upper")
					if o, w := ownerOf(t, filepath.Join(upper, "byroot.txt")), s.hostOwner(t, 0, 0); o != w {
						t.Errorf("%s: a file the namespace's root created through the squashing mount is %s on the host, want %s", prog.name, o, w)
					}
					// Recorded, not asserted (as in TestStorageArgv's
					// squash): fuse-overlayfs applies the chown on disk,
					// goverlay leaves the owner alone.
					t.Logf("%s: after chown 5:5, upper d/u1000.txt is %s on the host (namespace 5 is %s, 1000 is %s)",
						prog.name, ownerOf(t, filepath.Join(upper, "d/u1000.txt")), s.hostOwner(t, 5, 5), s.hostOwner(t, 1000, 1000))
				})
			}
		})
	}
}

// writeFuncs puts st (print owners) and try (run, print "ok" or the
// error without the command's name) into base/funcs.sh, for the scripts
// and the shells setpriv starts inside them.
func writeFuncs(t *testing.T, s *unprivNS) {
	t.Helper()
	p := filepath.Join(s.base, "funcs.sh")
	funcs := "st() { stat -c '%n %u:%g' \"$@\"; }\n" +
		"try() { if \"$@\" 2>/tmp/err.$$; then echo \"$*: ok\"; else echo \"$*: $(sed 's/^[^:]*: //' /tmp/err.$$)\"; fi; rm -f /tmp/err.$$; }\n"
	if err := os.WriteFile(p, []byte(funcs), 0o644); err != nil {
		t.Fatal(err)
	}
}

// diffOwners lists the paths whose owners differ between a and b.
func diffOwners(a, b map[string]string) string {
	keys := map[string]bool{}
	for _, m := range []map[string]string{a, b} {
		for k := range m {
			// fuse-overlayfs's own opaque marks in new directories.
			if !strings.HasPrefix(filepath.Base(k), ".wh..") {
				keys[k] = true
			}
		}
	}
	var out []string
	for k := range keys {
		if a[k] != b[k] {
			out = append(out, fmt.Sprintf("%s: %q vs %q", k, a[k], b[k]))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// whiteoutScript: under nomknod (mknod fails with EPERM), delete a lower
// file and a lower directory and replace another by a new one, list;
// then mount again without the filter and list again.
const whiteoutScript = `mount_up "$1" "$2" "$NOMKNOD"
try rm mnt/gone.txt
try rm -r mnt/gonedir
try rm -r mnt/opq
mkdir mnt/opq
echo new > mnt/opq/new.txt
ls -A mnt mnt/opq
umount mnt
echo "== again"
mount_up "$1" "$2"
ls -A mnt mnt/opq
umount mnt
`

// TestUnprivWhiteoutFallback: where mknod is refused (a seccomp filter,
// as some container hosts have), deletions through a mount made by the
// unprivileged user in the full-map namespace, with -o userxattr, fall
// back to AUFS whiteouts (.wh.NAME, empty regular files) and
// user.overlay.opaque, which a later mount reads back; no trusted.* xattr
// and no device node lands in the upper layer. fuse-overlayfs 1.10 (whose
// own fallback is the same .wh. format) gives the same output.
func TestUnprivWhiteoutFallback(t *testing.T) {
	s := newUnprivNS(t)
	nomknod := testutil.BuildHelper(t, "./testdata/nomknod")
	want := strings.Join([]string{
		"rm mnt/gone.txt: ok", "rm -r mnt/gonedir: ok", "rm -r mnt/opq: ok",
		"mnt:", "keep.txt", "opq", "", "mnt/opq:", "new.txt",
		"== again",
		"mnt:", "keep.txt", "opq", "", "mnt/opq:", "new.txt",
	}, "\n")
	for _, prog := range s.programs() {
		t.Run(prog.name, func(t *testing.T) {
			s.freshLayers(t, "gone.txt", "gone\n", "keep.txt", "keep\n", "gonedir/f", "f\n", "opq/old.txt", "old\n")
			t.Setenv("NOMKNOD", nomknod)
			got := s.runUnpriv(t, prog, progOpts(prog, ""), whiteoutScript)
			if got != want {
				t.Errorf("%s under nomknod (- want, + got):\n%s", prog.name,
					diffLines(strings.Split(want, "\n"), strings.Split(got, "\n")))
			}
			upper := filepath.Join(s.base, "upper")
			t.Logf("%s: upper: %v; upper/opq: %v, xattrs %s", prog.name, names(t, upper), names(t, filepath.Join(upper, "opq")),
				xattrs(t, filepath.Join(upper, "opq")))
			if prog.name != "goverlay" {
				return // its opaque marks are its own (user.fuseoverlayfs.opaque, .wh..wh..opq)
			}
			for _, rel := range []string{"gone.txt", "gonedir"} {
				if wf := whiteoutFormat(upper, rel); wf != "aufs" {
					t.Errorf("upper: whiteout of %s is %q, want aufs (.wh.%s)", rel, wf, rel)
				}
			}
			buf := make([]byte, 16)
			n, err := unix.Lgetxattr(filepath.Join(upper, "opq"), "user.overlay.opaque", buf)
			if err != nil || string(buf[:n]) != "y" {
				t.Errorf("upper/opq: user.overlay.opaque = %q, %v; want \"y\"", buf[:max(n, 0)], err)
			}
			err = filepath.Walk(upper, func(p string, fi os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				if fi.Mode()&(os.ModeDevice|os.ModeCharDevice) != 0 {
					t.Errorf("a device node in upper under nomknod: %s", p)
				}
				if fi.Mode().IsRegular() && strings.HasPrefix(fi.Name(), ".wh.") && fi.Size() != 0 {
					t.Errorf("whiteout %s is not empty", p)
				}
				for _, x := range strings.Fields(xattrs(t, p)) {
					if strings.HasPrefix(x, "trusted.") {
						t.Errorf("a trusted.* xattr in the upper layer of a userxattr mount: %s %s", p, x)
					}
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// noUserxattrScript renames a lower directory and a lower file, replaces
// a lower directory, lists, and lists again after a remount.
const noUserxattrScript = `mount_up "$1" "$2"
try mv mnt/dir mnt/dir.moved
try mv mnt/file.txt mnt/file.moved
try rm -r mnt/opq
mkdir mnt/opq
ls -A mnt mnt/dir.moved mnt/opq
cat mnt/dir.moved/sub/deep.txt
umount mnt
echo "== again"
mount_up "$1" "$2"
ls -A mnt mnt/dir.moved mnt/opq
umount mnt
`

// TestUnprivNoUserxattr: the program as rootless podman runs it, root of
// the full-map user namespace and no -o userxattr (containers/storage
// passes none): trusted.* xattrs are refused there (EPERM), so renaming a
// lower directory cannot leave a redirect and must answer EXDEV, as the
// kernel does where the upper refuses the xattr, for mv to copy; a
// replaced directory is marked opaque with the .wh..wh..opq file instead.
// goverlay answered EPERM to the rename (found by TestRootlessPodman:
// "mv: can't rename 'dir': Operation not permitted"). fuse-overlayfs,
// which answers EXDEV to every directory rename, prints the same.
func TestUnprivNoUserxattr(t *testing.T) {
	s := newUnprivNS(t)
	want := strings.Join([]string{
		"mv mnt/dir mnt/dir.moved: ok", "mv mnt/file.txt mnt/file.moved: ok", "rm -r mnt/opq: ok",
		"mnt:", "dir.moved", "file.moved", "opq", "",
		"mnt/dir.moved:", "sub", "top.txt", "",
		"mnt/opq:",
		"deep",
		"== again",
		"mnt:", "dir.moved", "file.moved", "opq", "",
		"mnt/dir.moved:", "sub", "top.txt", "",
		"mnt/opq:",
	}, "\n")
	for _, prog := range s.programs() {
		t.Run(prog.name, func(t *testing.T) {
			s.freshLayers(t, "file.txt", "file\n", "dir/top.txt", "top\n", "dir/sub/deep.txt", "deep\n", "opq/old.txt", "old\n")
			got := s.runUnpriv(t, prog, "", noUserxattrScript)
			if got != want {
				t.Errorf("%s without userxattr (- want, + got):\n%s", prog.name,
					diffLines(strings.Split(want, "\n"), strings.Split(got, "\n")))
			}
			upper := filepath.Join(s.base, "upper")
			t.Logf("%s: upper: %v; upper/opq: %v, xattrs %s; upper/dir.moved xattrs %s", prog.name, names(t, upper),
				names(t, filepath.Join(upper, "opq")), xattrs(t, filepath.Join(upper, "opq")), xattrs(t, filepath.Join(upper, "dir.moved")))
			if _, err := os.Lstat(filepath.Join(upper, "opq", ".wh..wh..opq")); prog.name == "goverlay" && err != nil {
				t.Errorf("goverlay: the replaced directory has no .wh..wh..opq marker: %v", err)
			}
		})
	}
}
