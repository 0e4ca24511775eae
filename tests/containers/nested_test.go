package containers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/containers/buildspec"
	"github.com/goverlay/goverlay/tests/testutil"
)

// nestName is the outer container's name, in the outer store.
const nestName = "nest"

// nest is podman inside a rootless podman container: outer runs the
// container; pid is its init's (as the host sees it), whose mountinfo
// shows the mounts of the podman inside.
type nest struct {
	outer *podman
	pid   int
}

// nestedSetup is what a nested build does first: podman's tools and the
// rootless ones, the test user with subordinate ids, the image's root
// folder and the build context of TestPodmanBuild.
func nestedSetup(t testing.TB) (rootfs, ctx string, uid, gid int) {
	rootfs = podmanSetup(t, rootlessTools, map[string]string{
		"dpkg-deb": "dpkg", "chroot": "coreutils", "catatonit": "catatonit",
	})
	ctx = buildSetup(t, rootfs)
	uid, gid = testutil.TestUser(t)
	ensureSubIDs(t, testutil.TestUserName)
	return rootfs, ctx, uid, gid
}

// nestRootfs makes the outer container's image: no program of its own
// (the host's /usr is mounted on its /usr), the links of a merged /usr,
// and what podman reads in /etc.
func nestRootfs(t testing.TB) string {
	l := testutil.NewLayer(t, filepath.Join(t.TempDir(), "nest"))
	for _, d := range []string{"bin", "lib", "lib64", "sbin"} {
		l.Symlink(d, "usr/"+d)
	}
	l.Dir("usr", 0o755).Dir("root", 0o700).Dir("run", 0o755).Dir("var/lib", 0o755).
		Dir("tmp", 0o777|os.ModeSticky).Dir("var/tmp", 0o777|os.ModeSticky).
		File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644).
		File("etc/group", "root:x:0:\n", 0o644).
		// podman import and build commit through the signature policy
		// (containers-policy.json(5)), and fail without one.
		File("etc/containers/policy.json", `{"default":[{"type":"insecureAcceptAnything"}]}`+"\n", 0o644)
	return l.Root
}

// nestedPath is where the outer container has prog: the host's own path
// under /usr, /NAME for a program mounted in by newNest.
func nestedPath(prog mountProgram) string {
	if strings.HasPrefix(prog.path, "/usr/") {
		return prog.path
	}
	return "/" + prog.name
}

// newNest starts the outer container, detached, as the test user with
// rootless podman on its native overlay driver, so that the container's
// root is a kernel overlay: `--device /dev/fuse --cap-add SYS_ADMIN`,
// catatonit as init (it reaps the mount programs' daemons), the host's
// /usr read-only, each of progs not under /usr at /NAME, and the build
// context ctx at /ctx.
func newNest(t testing.TB, uid, gid int, ctx string, progs []mountProgram) *nest {
	t.Helper()
	outer := newRootlessPodman(t, mountProgram{"native", ""}, uid, gid)
	outer.importImage(nestRootfs(t), "localhost/nest")
	testutil.OpenUp(t, ctx)
	args := []string{"-d", "--name", nestName, "--init", "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
		"-v", "/usr:/usr:ro", "-v", ctx + ":/ctx:ro"}
	for _, prog := range progs {
		if in := nestedPath(prog); in != prog.path {
			testutil.OpenUp(t, prog.path)
			args = append(args, "-v", prog.path+":"+in+":ro")
		}
	}
	outer.must(ctr(append(args, "localhost/nest", "sleep", "infinity")...)...)
	out := outer.must("inspect", "--format", "{{.State.Pid}}", nestName)
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if t.Failed() || err != nil {
		t.Fatalf("the outer container did not start (pid %q: %v)", out, err)
	}
	return &nest{outer: outer, pid: pid}
}

// store is the folder of a store in the outer container's root, named
// after the outer store so that the leftovers check finds only this
// test's mount programs.
func (n *nest) store(name string) string {
	return "/var/lib/" + filepath.Base(n.outer.store) + "-" + name
}

// podman sets up podman in the outer container, as root of its user
// namespace, on a store of its own in the container's root, with prog as
// mount_program. podman build runs there with `--isolation chroot` and
// no `--network` (chroot isolation refuses any but the host's): with the
// default OCI isolation runc fails the first RUN step ("error during
// container init: operation not permitted"). The cleanup resets the
// store and checks for leftovers: the programs by the host's file
// (mounted in, it is the same inode), the mounts in the container's
// mount namespace.
func (n *nest) podman(t testing.TB, prog mountProgram) *podman {
	store := n.store(prog.name)
	p := &podman{
		t: t, prog: prog, store: store,
		flags:      storeFlags(store, nestedPath(prog)),
		env:        n.outer.env,
		wrap:       n.outer.argv("exec", "-i", nestName),
		buildFlags: []string{"--isolation", "chroot"},
		mountinfo:  fmt.Sprintf("/proc/%d/mountinfo", n.pid),
	}
	t.Cleanup(p.cleanup)
	return p
}

// checkBuild mounts the built image (podman image mount), checks that
// p's program serves the mount (a FUSE mount of its type in the
// container's mount namespace, a process of the host's file), runs
// check-build.sh in the image's root there and returns its output.
// podman run cannot run a container in the outer one: runc finds no
// cgroup it may create ("mkdir /sys/fs/cgroup/…: read-only file system").
func (n *nest) checkBuild(p *podman) string {
	p.t.Helper()
	mnt := strings.TrimSpace(p.must("image", "mount", "localhost/built"))
	served := false
	for _, m := range mountsBelow(p.mountinfo, p.store) {
		served = served || (m.Point == mnt && m.FSType == "fuse."+p.prog.name)
	}
	if !served || len(testutil.FindProcsMentioning(p.prog.path, mnt)) == 0 {
		p.t.Errorf("the image's mount %s: mounted by %s: %v, %s processes serving it: %v; mounts under the store: %v",
			mnt, p.prog.name, served, p.prog.path, testutil.FindProcsMentioning(p.prog.path, mnt), mountsBelow(p.mountinfo, p.store))
	}
	outer := *n.outer
	outer.t = p.t
	out := outer.must("exec", nestName, "chroot", mnt, "/bin/sh", buildspec.CheckScript)
	p.must("image", "unmount", "localhost/built")
	return out
}

// kernelRefused checks that podman in the outer container cannot use the
// kernel overlay: with no mount_program and no fuse-overlayfs on PATH,
// containers/storage's overlay Init refuses a store on an overlay. (With
// fuse-overlayfs on PATH, Init takes it as mount_program by itself, since
// SupportsNativeOverlay finds the kernel overlay unusable there.)
func (n *nest) kernelRefused(t *testing.T) {
	t.Helper()
	args := append([]string{"exec", nestName, "env", "PATH=/nonexistent", "/usr/bin/podman"}, storeFlags(n.store("kernel"), "")...)
	r := n.outer.run(append(args, "info")...)
	const want = "Error: 'overlay' is not supported over overlayfs, a mount_program is required"
	if r.Code != 125 || !strings.Contains(r.Stderr, want) {
		t.Errorf("podman --storage-driver overlay info without a mount_program in the outer container: %s\nwant exit 125 and %q", r, want)
	}
}

// TestPodmanBuildNested runs TestPodmanBuild's podman build --no-cache
// (its Containerfile and context) with podman inside a rootless podman
// container, as root of the container's user namespace, on a store in the
// container's root (a kernel overlay, on which the kernel overlay driver
// is refused, as kernelRefused checks): goverlay as mount_program, and
// fuse-overlayfs for comparison. The built image must hold what
// TestPodmanBuild's images hold (check-build.sh, run in the image's
// mount) and podman diff of its last layer must be that of the host's
// build. See README.md.
func TestPodmanBuildNested(t *testing.T) {
	rootfs, ctx, uid, gid := nestedSetup(t)
	progs := podmanPrograms(t)
	n := newNest(t, uid, gid, ctx, progs)
	n.kernelRefused(t)
	want := []step{
		{"check-build.sh in the built image", buildspec.WantCheck()},
		// A naive diff, as goverlay's on the host: withParents.
		{"podman diff of the image", withParents(wantImageDiff)},
	}
	for _, prog := range progs {
		t.Run(prog.name, func(t *testing.T) {
			p := n.podman(t, prog)
			p.importImage(rootfs, "localhost/bb")
			p.build("localhost/built", "/ctx")
			if t.Failed() {
				return
			}
			got := []string{n.checkBuild(p), sortedLines(p.must("diff", "localhost/built"))}
			for i, w := range want {
				if got[i] != w.out {
					t.Errorf("%s with %s (- want, + got):\n%s", w.name, prog.name, diffLines(strings.Split(w.out, "\n"), strings.Split(got[i], "\n")))
				}
			}
			p.leftovers("after the build")
		})
	}
}

// BenchmarkPodmanBuildNested times TestPodmanBuildNested's podman build
// --no-cache in the outer container with fuse-overlayfs and goverlay as
// mount_program, each on its own store there, and reports them as
// benchBuilds does, against fuse-overlayfs:
//
//	go test -run '^$' -bench PodmanBuildNested -benchtime 3x ./tests/containers/
func BenchmarkPodmanBuildNested(b *testing.B) {
	rootfs, ctx, uid, gid := nestedSetup(b)
	progs := podmanPrograms(b)
	n := newNest(b, uid, gid, ctx, progs)
	var stores []*buildStore
	for _, prog := range progs {
		p := n.podman(b, prog)
		p.importImage(rootfs, "localhost/bb")
		stores = append(stores, &buildStore{p: p, ctx: "/ctx"})
	}
	benchBuilds(b, stores)
}
