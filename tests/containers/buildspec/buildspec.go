// Package buildspec is the podman build that the container tests
// (TestPodmanBuild and its kin in tests/containers) and `goverlay bench
// --workloads build` run: the Containerfile, the script that prints the
// built image's state and what it must print, the test image's root
// folder (static busybox and a few files, built from the host's files:
// nothing is downloaded) and the build context (the Containerfile and a
// tiny .deb made with the host's dpkg-deb).
package buildspec

import (
	"crypto/md5"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Image is the name the test image is imported as; the Containerfile
// builds FROM it.
const Image = "localhost/bb"

// Containerfile is what is built FROM the test image: 2,000 new files;
// chown -R and chmod -R of trees of the image; a rename and a deletion of
// image directories and files; a .deb installed with busybox's dpkg.
const Containerfile = `FROM ` + Image + `
RUN mkdir /gen && cd /gen && for d in $(seq 1 20); do mkdir d$d; for f in $(seq 1 100); do echo "$d/$f" > d$d/f$f; done; done
RUN chown -R 1000:1000 /usr/share/doc && chmod -R go-rwx /usr/share/zoneinfo
RUN mv /usr/share/man /usr/share/man.moved && rm -rf /usr/share/locale && rm /data/delete.txt && mv /data/dir /data/dir.moved
COPY gvhello.deb /tmp/
RUN mkdir -p /var/lib/dpkg/info && touch /var/lib/dpkg/status && dpkg -i /tmp/gvhello.deb && rm /tmp/gvhello.deb
`

// CheckScript is the image's file (AddTrees writes it) that prints the
// built image's state without timestamps or inode numbers.
const CheckScript = "/check-build.sh"

// CheckSh is CheckScript's text.
const CheckSh = `cd /gen
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

// WantCheckFormat is what CheckSh prints in the built image, with %s
// for /gen's md5 (GenMD5(20)); WantCheck fills it in.
const WantCheckFormat = `gen: 2000 files in 20 directories, md5 %s
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

// WantCheck is what CheckSh prints in the image built of Containerfile.
func WantCheck() string { return fmt.Sprintf(WantCheckFormat, GenMD5(20)) }

// GenMD5 is the md5 of /gen's files (dirs directories of 100)
// concatenated in sorted path order, as CheckSh computes it.
func GenMD5(dirs int) string {
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

// Busybox is the static busybox the image is made of.
const Busybox = "/bin/busybox"

// Missing says which tool the image and the build context need is
// missing here, and from which Debian package it comes, or "".
func Missing() string {
	if why := NoBusybox(); why != "" {
		return why
	}
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		return "dpkg-deb is not installed (package dpkg)"
	}
	return ""
}

// NoBusybox says why the image cannot be made here (Rootfs: no static
// busybox), or "".
func NoBusybox() string {
	f, err := elf.Open(Busybox)
	if err != nil {
		return fmt.Sprintf("%s: %v (package busybox-static)", Busybox, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return Busybox + " is dynamically linked: install busybox-static"
		}
	}
	return ""
}

// Rootfs makes the test image's root folder in dir: static busybox with
// a link per applet, /etc/passwd and group, a sticky /tmp, and the /data
// files the Containerfile renames and deletes. NoBusybox says whether it
// can.
func Rootfs(dir string) error {
	if why := NoBusybox(); why != "" {
		return errors.New(why)
	}
	w := writer{root: dir}
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return err
	}
	w.file("bin/busybox", string(bb), 0o755)
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && w.err == nil {
			w.err = os.Symlink("busybox", filepath.Join(dir, "bin", a))
		}
	}
	w.file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/:/bin/sh\n", 0o644)
	w.file("etc/group", "root:x:0:\nuser:x:1000:\n", 0o644)
	w.dir("tmp", 0o777|os.ModeSticky)
	w.file("data/delete.txt", "delete me\n", 0o644)
	w.file("data/dir/top.txt", "top\n", 0o644)
	w.file("data/dir/sub/deep.txt", "deep\n", 0o644)
	return w.err
}

// AddTrees adds to the image's root folder the trees the Containerfiles
// work on (usr/share/doc, zoneinfo, man, locale).
func AddTrees(rootfs string) error {
	w := writer{root: rootfs}
	for d := 1; d <= 50; d++ {
		for f := 1; f <= 4; f++ {
			w.file(fmt.Sprintf("usr/share/doc/pkg%d/f%d", d, f), fmt.Sprintf("doc %d %d\n", d, f), 0o644)
		}
	}
	for d := 1; d <= 20; d++ {
		for f := 1; f <= 10; f++ {
			w.file(fmt.Sprintf("usr/share/zoneinfo/z%d/f%d", d, f), fmt.Sprintf("z %d %d\n", d, f), 0o644)
			w.file(fmt.Sprintf("usr/share/man/man%d/f%d.1", d, f), fmt.Sprintf("m %d %d\n", d, f), 0o644)
		}
		for f := 1; f <= 5; f++ {
			w.file(fmt.Sprintf("usr/share/locale/l%d/LC_MESSAGES/f%d.mo", d, f), fmt.Sprintf("l %d %d\n", d, f), 0o644)
		}
	}
	return w.err
}

// Setup adds the trees the Containerfile works on and CheckScript to the
// image's root folder, and makes the build context (Containerfile and
// gvhello.deb) in the new directory ctx. scratch is an existing
// directory for the package's tree, left empty.
func Setup(rootfs, ctx, scratch string) error {
	if err := AddTrees(rootfs); err != nil {
		return err
	}
	w := writer{root: rootfs}
	w.file(strings.TrimPrefix(CheckScript, "/"), CheckSh, 0o755)
	if w.err != nil {
		return w.err
	}
	// gvhello.deb: a program, a conffile, a document and a postinst;
	// gzip, which busybox's dpkg reads.
	pkg, err := os.MkdirTemp(scratch, "gvhello-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(pkg)
	w = writer{root: pkg}
	w.file("DEBIAN/control", "Package: gvhello\nVersion: 1.0\nArchitecture: all\nMaintainer: goverlay tests <root@localhost>\nDescription: a tiny package for the podman build test\n", 0o644)
	w.file("DEBIAN/conffiles", "/etc/gvhello.conf\n", 0o644)
	w.file("DEBIAN/postinst", "#!/bin/sh\necho configured > /etc/gvhello.state\n", 0o755)
	w.file("usr/bin/gvhello", "#!/bin/sh\necho hello from gvhello\n", 0o755)
	w.file("etc/gvhello.conf", "greeting=hello\n", 0o644)
	w.file("usr/share/doc/gvhello/copyright", "public domain\n", 0o644)
	if w.err != nil {
		return w.err
	}
	// dpkg-deb wants 0755 for DEBIAN, whatever the umask.
	err = filepath.Walk(pkg, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := os.Mkdir(ctx, 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", pkg, filepath.Join(ctx, "gvhello.deb")).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb --build: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return os.WriteFile(filepath.Join(ctx, "Containerfile"), []byte(Containerfile), 0o644)
}

// Step is one instruction of a Containerfile: its number (from 1, as
// podman build's "STEP n/m:" lines count) and its text.
type Step struct {
	N    int
	Text string
}

// Instruction is the step's instruction (RUN, COPY, ...).
func (s Step) Instruction() string {
	i, _, _ := strings.Cut(s.Text, " ")
	return strings.ToUpper(i)
}

// Steps are the instructions of a Containerfile with one instruction a
// line (as Containerfile is), in order.
func Steps(containerfile string) []Step {
	var steps []Step
	for _, line := range strings.Split(containerfile, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			steps = append(steps, Step{len(steps) + 1, line})
		}
	}
	return steps
}

// writer writes files and directories below root, keeping the first
// error. Modes are set after creation, whatever the umask.
type writer struct {
	root string
	err  error
}

func (w *writer) parent(rel string) string {
	p := filepath.Join(w.root, rel)
	if w.err == nil {
		w.err = os.MkdirAll(filepath.Dir(p), 0o755)
	}
	return p
}

func (w *writer) file(rel, content string, mode os.FileMode) {
	p := w.parent(rel)
	if w.err == nil {
		w.err = os.WriteFile(p, []byte(content), mode)
	}
	if w.err == nil {
		w.err = os.Chmod(p, mode)
	}
}

func (w *writer) dir(rel string, mode os.FileMode) {
	p := w.parent(rel)
	if w.err == nil {
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			w.err = err
		}
	}
	if w.err == nil {
		w.err = os.Chmod(p, mode)
	}
}
