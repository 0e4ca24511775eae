package containers_test

import (
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/containers/buildspec"
	"github.com/goverlay/goverlay/tests/testutil"
)

// buildSetup adds the trees the Containerfile (buildspec.Containerfile)
// works on and the check script to the image's root folder and makes the
// build context (Containerfile and gvhello.deb), whose path it returns.
func buildSetup(t testing.TB, rootfs string) string {
	t.Helper()
	ctx := filepath.Join(t.TempDir(), "ctx")
	if err := buildspec.Setup(rootfs, ctx, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// addBuildTrees adds to the image's root folder the trees the
// Containerfiles work on (usr/share/doc, zoneinfo, man, locale).
func addBuildTrees(t testing.TB, rootfs string) {
	t.Helper()
	if err := buildspec.AddTrees(rootfs); err != nil {
		t.Fatal(err)
	}
}

// buildDeadline bounds one podman build (a loaded machine makes a build
// through a mount program take minutes).
const buildDeadline = 8 * time.Minute

// build runs podman build --no-cache (every step runs) of ctx, tagged tag,
// with what this machine needs, fails the test unless it succeeds, and
// returns its wall time.
func (p *podman) build(tag, ctx string) time.Duration {
	p.t.Helper()
	args := append(append([]string{"build"}, p.buildFlags...), "--no-cache", "-q", "-t", tag, ctx)
	start := time.Now()
	r := p.execWithin(buildDeadline, args...)
	took := time.Since(start)
	p.t.Logf("podman build with %s: exit %d in %v", p.prog.name, r.Code, took.Round(10*time.Millisecond))
	if r.Code != 0 {
		p.t.Errorf("podman %s with %s: %s", strings.Join(args, " "), p.prog.name, r)
	}
	return took
}

// The diffs after the build: the image's last layer (the .deb) against its
// parent, and a container's changes to the built image.
const (
	wantImageDiff = `A /etc/gvhello.conf
A /etc/gvhello.state
A /usr/bin
A /usr/bin/gvhello
A /usr/share/doc/gvhello
A /usr/share/doc/gvhello/copyright
A /var
A /var/lib
A /var/lib/dpkg
A /var/lib/dpkg/info
A /var/lib/dpkg/info/gvhello.conffiles
A /var/lib/dpkg/info/gvhello.list
A /var/lib/dpkg/info/gvhello.postinst
A /var/lib/dpkg/status
A /var/lib/dpkg/status.udeb.bak
C /etc
C /tmp
C /usr
C /usr/share
C /usr/share/doc
D /tmp/gvhello.deb
`
	changeSh = `echo changed >> /gen/d1/f1 && rm -r /usr/share/man.moved/man1 && mv /gen/d2 /gen/d2.moved && chmod 600 /etc/gvhello.conf && chown 0:0 /usr/share/doc/pkg1/f1`
)

// TestPodmanBuild runs podman build of a Containerfile FROM the test image
// (buildspec.Containerfile: thousands of new files, chown -R and chmod -R of image
// trees, a rename and deletions of image directories, a .deb installed)
// with podman's kernel overlay driver and with goverlay, then podman run of
// the result, podman diff of its last layer and of a container that
// changes it. Every output must be the expected one and goverlay's the
// same as the kernel driver's. Each build's wall time is logged;
// BenchmarkPodmanBuild measures it, with fuse-overlayfs as the peer (left
// out here: a third build would double the test's time).
func TestPodmanBuild(t *testing.T) {
	rootfs := podmanSetup(t, map[string]string{"dpkg-deb": "dpkg"})
	ctx := buildSetup(t, rootfs)
	want := []step{
		{"podman run of the built image", buildspec.WantCheck()},
		{"podman diff of the image", wantImageDiff},
		{"podman diff of a container", ""}, // the kernel driver's, below
	}
	results := map[string][]step{}
	for _, prog := range []mountProgram{{"kernel", ""}, {"goverlay", plainBinary(t)}} {
		t.Run(prog.name, func(t *testing.T) {
			p := newPodman(t, prog)
			p.importImage(rootfs, "localhost/bb")
			p.build("localhost/built", ctx)
			if t.Failed() {
				return
			}
			var got []step
			got = append(got, step{want[0].name, p.must(ctr("--rm", "localhost/built", "sh", buildspec.CheckScript)...)})
			got = append(got, step{want[1].name, sortedLines(p.must("diff", "localhost/built"))})
			p.must(ctr("--name", "chk", "localhost/built", "sh", "-c", changeSh)...)
			got = append(got, step{want[2].name, sortedLines(p.must("diff", "chk"))})
			p.must("rm", "chk")
			p.leftovers("after podman rm")
			results[prog.name] = got
		})
	}
	ref := results["kernel"]
	if ref == nil {
		return
	}
	for i, w := range want {
		if w.out != "" && ref[i].out != w.out {
			t.Errorf("%s with the kernel driver (- want, + got):\n%s", w.name, diffLines(strings.Split(w.out, "\n"), strings.Split(ref[i].out, "\n")))
		}
	}
	t.Logf("podman diff of a container, kernel driver:\n%s", ref[2].out)
	// With a mount program containers/storage diffs naively, through
	// mounts (pkg/archive's ChangesDirs), which also reports every
	// directory with a change below it; the kernel driver's diff
	// (OverlayChanges) reports only directories that changed themselves.
	ref[2].out = withParents(ref[2].out)
	if got := results["goverlay"]; got != nil {
		for i, s := range ref {
			if got[i].out != s.out {
				t.Errorf("%s with goverlay differs from the kernel driver's (- kernel, + goverlay):\n%s", s.name,
					diffLines(strings.Split(s.out, "\n"), strings.Split(got[i].out, "\n")))
			}
		}
	}
}

// withParents adds to podman diff's sorted output a "C" line for every
// directory above a listed path that is not listed itself, as
// containers/storage's naive diff reports them, and sorts it again.
func withParents(diff string) string {
	listed := map[string]bool{}
	lines := strings.Split(strings.TrimSpace(diff), "\n")
	for _, l := range lines {
		if _, p, ok := strings.Cut(l, " "); ok {
			listed[p] = true
		}
	}
	for _, l := range lines {
		_, p, _ := strings.Cut(l, " ")
		for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
			if !listed[d] {
				listed[d] = true
				lines = append(lines, "C "+d)
			}
		}
	}
	return sortedLines(strings.Join(lines, "\n"))
}

// sortedLines sorts the lines of s (podman diff's order is not stable).
func sortedLines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(l)
	return strings.Join(l, "\n") + "\n"
}

// BenchmarkPodmanBuild times TestPodmanBuild's podman build --no-cache
// (wall time, including the commit of every step's layer) with podman's
// kernel overlay driver, fuse-overlayfs and goverlay, each on its own
// scratch store:
//
//	go test -run '^$' -bench 'PodmanBuild$' -benchtime 3x ./tests/containers/
func BenchmarkPodmanBuild(b *testing.B) {
	rootfs := podmanSetup(b, map[string]string{"dpkg-deb": "dpkg"})
	ctx := buildSetup(b, rootfs)
	type variant struct {
		prog     mountProgram
		name     string
		metacopy bool // overlay.mountopt=metacopy=on, as Fedora's storage.conf has it
		// uring: the build runs while the kernel offers FUSE over
		// io_uring, which goverlay then serves its mounts over.
		uring bool
	}
	var variants []variant
	for _, prog := range append([]mountProgram{{"kernel", ""}}, podmanPrograms(b)...) {
		variants = append(variants, variant{prog, prog.name, false, false})
		if prog.name != "fuse-overlayfs" { // it has no metacopy
			variants = append(variants, variant{prog, prog.name + "-metacopy", true, false})
		}
		if prog.name == "goverlay" {
			variants = append(variants, variant{prog, prog.name + "-uring", false, true})
		}
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			bench := func() {
				p := newPodman(b, v.prog)
				if v.metacopy {
					p.flags = append(p.flags, "--storage-opt", "overlay.mountopt=metacopy=on")
				}
				p.importImage(rootfs, "localhost/bb")
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					p.build("localhost/built", ctx)
					b.StopTimer()
					p.must("rmi", "localhost/built")
					b.StartTimer()
				}
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/build")
			}
			if !v.uring {
				bench()
				return
			}
			testutil.NeedUring(b)
			testutil.WithUringOffered(b, bench)
		})
	}
}
