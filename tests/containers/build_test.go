package containers_test

import (
	"crypto/md5"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/testutil"
)

// containerfile is what TestPodmanBuild and BenchmarkPodmanBuild build
// FROM the test image: 2,000 new files; chown -R and chmod -R of trees of
// the image; a rename and a deletion of image directories and files; a
// .deb installed with busybox's dpkg.
const containerfile = `FROM localhost/bb
RUN mkdir /gen && cd /gen && for d in $(seq 1 20); do mkdir d$d; for f in $(seq 1 100); do echo "$d/$f" > d$d/f$f; done; done
RUN chown -R 1000:1000 /usr/share/doc && chmod -R go-rwx /usr/share/zoneinfo
RUN mv /usr/share/man /usr/share/man.moved && rm -rf /usr/share/locale && rm /data/delete.txt && mv /data/dir /data/dir.moved
COPY gvhello.deb /tmp/
RUN mkdir -p /var/lib/dpkg/info && touch /var/lib/dpkg/status && dpkg -i /tmp/gvhello.deb && rm /tmp/gvhello.deb
`

// checkBuildSh, in the image, prints the built image's state without
// timestamps or inode numbers.
const checkBuildSh = `cd /gen
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
gvhello
cat /etc/gvhello.conf /etc/gvhello.state
stat -c '%n %a %u:%g' /usr/bin/gvhello /etc/gvhello.conf /usr/share/doc/gvhello/copyright
dpkg -l | grep gvhello
ls -a /tmp
`

const wantBuildCheck = `gen: 2000 files in 20 directories, md5 %s
/usr/share/doc:
      1 0:0 644 regular file
      2 0:0 755 directory
    200 1000:1000 644 regular file
     50 1000:1000 755 directory
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
hello from gvhello
greeting=hello
configured
/usr/bin/gvhello 755 0:0
/etc/gvhello.conf 644 0:0
/usr/share/doc/gvhello/copyright 644 0:0
ii  gvhello        1.0
.
..
`

// genMD5 is the md5 of /gen's files (dirs directories of 100) concatenated
// in sorted path order, as checkBuildSh computes it.
func genMD5(dirs int) string {
	var names []string
	for d := 1; d <= dirs; d++ {
		for f := 1; f <= 100; f++ {
			names = append(names, fmt.Sprintf("./d%d/f%d", d, f))
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		var d, f int
		fmt.Sscanf(n, "./d%d/f%d", &d, &f)
		fmt.Fprintf(&b, "%d/%d\n", d, f)
	}
	return fmt.Sprintf("%x", md5.Sum([]byte(b.String())))
}

// buildSetup adds the trees the Containerfile works on to the image's root
// folder and makes the build context (Containerfile and gvhello.deb), whose
// path it returns.
func buildSetup(t testing.TB, rootfs string) string {
	t.Helper()
	l := addBuildTrees(t, rootfs)
	l.File("check-build.sh", checkBuildSh, 0o755)

	// gvhello.deb: a program, a conffile, a document and a postinst;
	// gzip, which busybox's dpkg reads.
	pkg := testutil.NewLayer(t, filepath.Join(t.TempDir(), "gvhello"))
	pkg.File("DEBIAN/control", "Package: gvhello\nVersion: 1.0\nArchitecture: all\nMaintainer: goverlay tests <root@localhost>\nDescription: a tiny package for the podman build test\n", 0o644).
		File("DEBIAN/conffiles", "/etc/gvhello.conf\n", 0o644).
		File("DEBIAN/postinst", "#!/bin/sh\necho configured > /etc/gvhello.state\n", 0o755).
		File("usr/bin/gvhello", "#!/bin/sh\necho hello from gvhello\n", 0o755).
		File("etc/gvhello.conf", "greeting=hello\n", 0o644).
		File("usr/share/doc/gvhello/copyright", "public domain\n", 0o644)
	filepath.Walk(pkg.Root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			os.Chmod(p, 0o755) // dpkg-deb wants 0755 for DEBIAN, whatever the umask
		}
		return nil
	})
	ctx := filepath.Join(t.TempDir(), "ctx")
	if err := os.Mkdir(ctx, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", pkg.Root, filepath.Join(ctx, "gvhello.deb")).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(ctx, "Containerfile"), []byte(containerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// addBuildTrees adds to the image's root folder the trees the
// Containerfiles work on (usr/share/doc, zoneinfo, man, locale) and
// returns the layer.
func addBuildTrees(t testing.TB, rootfs string) *testutil.Layer {
	t.Helper()
	l := testutil.NewLayer(t, rootfs)
	for d := 1; d <= 50; d++ {
		for f := 1; f <= 4; f++ {
			l.File(fmt.Sprintf("usr/share/doc/pkg%d/f%d", d, f), fmt.Sprintf("doc %d %d\n", d, f), 0o644)
		}
	}
	for d := 1; d <= 20; d++ {
		for f := 1; f <= 10; f++ {
			l.File(fmt.Sprintf("usr/share/zoneinfo/z%d/f%d", d, f), fmt.Sprintf("z %d %d\n", d, f), 0o644)
			l.File(fmt.Sprintf("usr/share/man/man%d/f%d.1", d, f), fmt.Sprintf("m %d %d\n", d, f), 0o644)
		}
		for f := 1; f <= 5; f++ {
			l.File(fmt.Sprintf("usr/share/locale/l%d/LC_MESSAGES/f%d.mo", d, f), fmt.Sprintf("l %d %d\n", d, f), 0o644)
		}
	}
	return l
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
// (containerfile: thousands of new files, chown -R and chmod -R of image
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
		{"podman run of the built image", fmt.Sprintf(wantBuildCheck, genMD5(20))},
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
			got = append(got, step{want[0].name, p.must(ctr("--rm", "localhost/built", "sh", "/check-build.sh")...)})
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
