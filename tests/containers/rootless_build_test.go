package containers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/containers/buildspec"
	"github.com/goverlay/goverlay/tests/testutil"
)

// rootlessContainerfile is what TestPodmanBuildRootless and
// BenchmarkPodmanBuildRootless build FROM the test image, as an ordinary
// user: 3,000 new small files; chown -R and chmod -R of image trees; mv
// and rm -rf of image directories.
const rootlessContainerfile = `FROM localhost/bb
RUN mkdir /gen && cd /gen && for d in $(seq 1 30); do mkdir d$d; for f in $(seq 1 100); do echo "$d/$f" > d$d/f$f; done; done
RUN chown -R 1000:1000 /usr/share/doc && chmod -R go-rwx /usr/share/zoneinfo
RUN mv /usr/share/man /usr/share/man.moved && rm -rf /usr/share/locale && rm /data/delete.txt && mv /data/dir /data/dir.moved
`

// checkRootlessBuildSh prints the built image's state, as buildspec.CheckSh
// does, without what the .deb step adds.
const checkRootlessBuildSh = `cd /gen
echo "gen: $(find . -type f | wc -l) files in $(find . -mindepth 1 -type d | wc -l) directories, md5 $(find . -type f | sort | xargs cat | md5sum | cut -c1-32)"
for t in /usr/share/doc /usr/share/zoneinfo; do
	echo "$t:"
	find $t | xargs stat -c '%u:%g %a %F' | sort | uniq -c
done
ls /usr/share
echo "man.moved: $(find /usr/share/man.moved -type f | wc -l) files"
cat /usr/share/man.moved/man3/f2.1
ls -d /usr/share/man /usr/share/locale /data/delete.txt /data/dir 2>&1
ls -R /data/dir.moved
`

const wantRootlessBuildCheck = `gen: 3000 files in 30 directories, md5 %s
/usr/share/doc:
    200 1000:1000 644 regular file
     51 1000:1000 755 directory
/usr/share/zoneinfo:
    200 0:0 600 regular file
     21 0:0 700 directory
doc
man.moved
zoneinfo
man.moved: 200 files
m 3 2
ls: /usr/share/man: No such file or directory
ls: /usr/share/locale: No such file or directory
ls: /data/delete.txt: No such file or directory
ls: /data/dir: No such file or directory
/data/dir.moved:
sub
top.txt

/data/dir.moved/sub:
deep.txt
`

// rootlessBuildPrograms are the storages a rootless build runs on:
// podman's native overlay driver (the kernel overlay in the user's
// namespace), fuse-overlayfs when installed, and goverlay.
func rootlessBuildPrograms(t testing.TB) []mountProgram {
	return append([]mountProgram{{"native", ""}}, podmanPrograms(t)...)
}

// rootlessBuildSetup does what every rootless build does first: podman's
// tools, the test user with subordinate ids, the image's root folder
// with the trees the Containerfile changes. It returns the root folder
// and the user.
func rootlessBuildSetup(t testing.TB) (rootfs string, uid, gid int) {
	rootfs = podmanSetup(t, rootlessTools)
	addBuildTrees(t, rootfs)
	uid, gid = testutil.TestUser(t)
	ensureSubIDs(t, testutil.TestUserName)
	return rootfs, uid, gid
}

// newRootlessBuild sets rootless podman up for prog with the test image
// imported and the build context in its store (the user's), and checks
// that podman uses the storage it was asked for: the native overlay
// driver has no mount_program (containers/storage would otherwise pick
// fuse-overlayfs from PATH for a rootless user). It returns podman and
// the context's path.
func newRootlessBuild(t testing.TB, prog mountProgram, rootfs string, uid, gid int) (*podman, string) {
	t.Helper()
	p := newRootlessPodman(t, prog, uid, gid)
	ctx := filepath.Join(p.store, "ctx")
	if err := os.Mkdir(ctx, 0o755); err != nil {
		t.Fatal(err)
	}
	cf := filepath.Join(ctx, "Containerfile")
	if err := os.WriteFile(cf, []byte(rootlessContainerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ctx, cf} {
		if err := os.Chown(f, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	p.importImage(rootfs, "localhost/bb")
	info := p.must("info", "--format", `{{.Store.GraphDriverName}} mount_program={{with index .Store.GraphOptions "overlay.mount_program"}}{{.Executable}}{{end}}`)
	want := "overlay mount_program=" + p.prog.path
	if got := strings.TrimSpace(info); got != want {
		t.Fatalf("podman's storage with %s: %q, want %q", prog.name, got, want)
	}
	return p, ctx
}

// TestPodmanBuildRootless runs podman build --no-cache of
// rootlessContainerfile FROM the test image as an ordinary user with
// subordinate ids (cgroupfs, runc), on podman's native rootless overlay,
// with goverlay as mount_program and with fuse-overlayfs as
// mount_program. Each built image must hold what the Containerfile made
// (podman run of a script that lists it), and the images' last layers
// must hold the same changes (podman diff). Each build's wall time is
// logged; BenchmarkPodmanBuildRootless measures it.
func TestPodmanBuildRootless(t *testing.T) {
	rootfs, uid, gid := rootlessBuildSetup(t)
	want := []step{
		{"podman run of the built image", fmt.Sprintf(wantRootlessBuildCheck, buildspec.GenMD5(30))},
		{"podman diff of the image", ""}, // the native driver's, below
	}
	results := map[string][]step{}
	var times []string
	progs := rootlessBuildPrograms(t)
	for _, prog := range progs {
		t.Run(prog.name, func(t *testing.T) {
			p, ctx := newRootlessBuild(t, prog, rootfs, uid, gid)
			took := p.build("localhost/built", ctx)
			if t.Failed() {
				return
			}
			times = append(times, fmt.Sprintf("%s %.2f s", prog.name, took.Seconds()))
			got := []step{
				{want[0].name, p.must(ctr("--rm", "localhost/built", "sh", "-c", checkRootlessBuildSh)...)},
				// containers/storage diffs through mounts with a
				// mount program, and also lists every directory
				// above a change: withParents adds those to the
				// native driver's.
				{want[1].name, withParents(sortedLines(p.must("diff", "localhost/built")))},
			}
			if got[0].out != want[0].out {
				t.Errorf("%s with %s (- want, + got):\n%s", want[0].name, prog.name, diffLines(strings.Split(want[0].out, "\n"), strings.Split(got[0].out, "\n")))
			}
			p.leftovers("after the build")
			results[prog.name] = got
		})
	}
	t.Logf("rootless podman build --no-cache: %s", strings.Join(times, ", "))
	ref := results["native"]
	if ref == nil {
		return
	}
	t.Logf("podman diff of the image, native driver: %d lines", strings.Count(ref[1].out, "\n"))
	for _, prog := range progs[1:] {
		got := results[prog.name]
		if got == nil {
			continue
		}
		for i, s := range ref {
			if got[i].out != s.out {
				t.Errorf("%s with %s differs from the native driver's (- native, + %s):\n%s", s.name, prog.name, prog.name,
					diffLines(strings.Split(s.out, "\n"), strings.Split(got[i].out, "\n")))
			}
		}
	}
}

// BenchmarkPodmanBuildRootless times TestPodmanBuildRootless's podman
// build --no-cache as an ordinary user (wall time, including the commit
// of every step's layer) on podman's native rootless overlay, with
// fuse-overlayfs and with goverlay as mount_program, each on its own
// scratch store, and reports them as benchBuilds does, against the
// native driver:
//
//	go test -run '^$' -bench PodmanBuildRootless -benchtime 3x ./tests/containers/
func BenchmarkPodmanBuildRootless(b *testing.B) {
	rootfs, uid, gid := rootlessBuildSetup(b)
	var stores []*buildStore
	for _, prog := range rootlessBuildPrograms(b) {
		p, ctx := newRootlessBuild(b, prog, rootfs, uid, gid)
		stores = append(stores, &buildStore{p: p, ctx: ctx})
		if prog.name == "goverlay" {
			if _, err := os.Stat(testutil.EnableUring); err == nil {
				prog.name += "-uring"
				p, ctx := newRootlessBuild(b, prog, rootfs, uid, gid)
				stores = append(stores, &buildStore{p: p, ctx: ctx, uring: true})
			}
		}
	}
	benchBuilds(b, stores)
}

// buildStore is one store of a build benchmark: podman on it, the build
// context as podman sees it, and each build's wall time in seconds.
type buildStore struct {
	p      *podman
	ctx    string
	builds []float64
	// uring: its builds run while the kernel offers FUSE over
	// io_uring, which goverlay then serves its mounts over.
	uring bool
}

// benchBuilds runs podman build --no-cache b.N times on every store, the
// stores in turn in every iteration so that a loaded moment hits them
// alike, and removes the image after each build (untimed). It reports
// each store's median seconds per build and, for the others, their
// medians over the first store's.
func benchBuilds(b *testing.B, stores []*buildStore) {
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, s := range stores {
			build := func() { s.builds = append(s.builds, s.p.build("localhost/built", s.ctx).Seconds()) }
			if s.uring {
				testutil.WithUringOffered(b, build)
			} else {
				build()
			}
			b.StopTimer()
			s.p.must("rmi", "localhost/built")
			b.StartTimer()
		}
	}
	b.StopTimer()
	ref := median(stores[0].builds)
	for _, s := range stores {
		m := median(s.builds)
		b.ReportMetric(m, "s/build-"+s.p.prog.name)
		if s != stores[0] && ref > 0 {
			b.ReportMetric(m/ref, "x-"+stores[0].p.prog.name+"-"+s.p.prog.name)
		}
	}
}

// median is the middle value of xs (the mean of the two middle ones for
// an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
