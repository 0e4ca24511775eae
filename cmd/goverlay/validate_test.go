package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// layout is a temp directory with the usual overlay directories.
type layout struct {
	root, l1, l2, upper, work, mnt string
}

func newLayout(t *testing.T) layout {
	t.Helper()
	root := t.TempDir()
	l := layout{root: root,
		l1: filepath.Join(root, "l1"), l2: filepath.Join(root, "l2"),
		upper: filepath.Join(root, "upper"), work: filepath.Join(root, "work"),
		mnt: filepath.Join(root, "mnt")}
	for _, d := range []string{l.l1, l.l2, l.upper, l.work, l.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func (l layout) config() *config {
	return &config{Lower: []string{l.l1, l.l2}, Upper: l.upper, Work: l.work, Mountpoint: l.mnt}
}

// wantFail checks the exit code and the exact message of err.
func wantFail(t *testing.T, err error, code int, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", msg)
	}
	if got := exitCodeOf(err); got != code {
		t.Errorf("exit code %d, want %d (%v)", got, code, err)
	}
	if err.Error() != msg {
		t.Errorf("message\n got %q\nwant %q", err.Error(), msg)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("message is not one line: %q", err.Error())
	}
}

func TestValidateOK(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	l := newLayout(t)
	if err := validate(l.config()); err != nil {
		t.Fatalf("validate: %v", err)
	}
	c := l.config()
	c.Upper, c.Work = "", ""
	if err := validate(c); err != nil {
		t.Fatalf("validate read-only: %v", err)
	}
}

func TestCheckRequired(t *testing.T) {
	wantFail(t, checkRequired(&config{Mountpoint: "/m"}), exitUsage,
		"no lowerdir given; add -o lowerdir=DIR[:DIR...] (topmost layer first)")
	wantFail(t, checkRequired(&config{Lower: []string{"/a"}, Upper: "/u"}), exitUsage,
		"upperdir is given without workdir; add workdir=DIR on the upperdir's filesystem, or drop upperdir for a read-only overlay")
	wantFail(t, checkRequired(&config{Lower: []string{"/a"}, Work: "/w"}), exitUsage,
		"workdir is given without upperdir; add upperdir=DIR, or drop workdir for a read-only overlay")
}

func TestCheckDir(t *testing.T) {
	l := newLayout(t)
	file := filepath.Join(l.root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkDir("lowerdir", l.l1); err != nil {
		t.Errorf("directory: %v", err)
	}
	missing := filepath.Join(l.root, "missing")
	wantFail(t, checkDir("lowerdir", missing), exitBadLayer, "lowerdir "+missing+" does not exist; create it or fix the path")
	wantFail(t, checkDir("upperdir", file), exitBadLayer, "upperdir "+file+" is not a directory; give a directory")
	wantFail(t, checkDir("mountpoint", file+"/x"), exitBadLayer, "mountpoint "+file+"/x does not exist (part of the path is not a directory); fix the path")
	loop := filepath.Join(l.root, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	wantFail(t, checkDir("workdir", loop), exitBadLayer, "workdir "+loop+" has a symbolic-link loop; fix the link")
	spaced := filepath.Join(l.root, "a b")
	wantFail(t, checkDir("lowerdir", spaced), exitBadLayer, `lowerdir "`+spaced+`" does not exist; create it or fix the path`)
	// The validation as a whole reports a missing mountpoint.
	c := l.config()
	c.Mountpoint = missing
	wantFail(t, validate(c), exitBadLayer, "mountpoint "+missing+" does not exist; create it or fix the path")
}

func TestDeadFuseMountMessage(t *testing.T) {
	// A dead FUSE mount cannot be made without mounting; check the
	// message built from the errno the kernel gives.
	wantFail(t, statProblem("mountpoint", "/mnt/x", unix.ENOTCONN), exitBadLayer,
		"mountpoint /mnt/x is a dead FUSE mount (transport endpoint is not connected); clear it with: fusermount3 -u /mnt/x (or: umount -l /mnt/x)")
	wantFail(t, statProblem("lowerdir", "/mnt/it's", unix.ENOTCONN), exitBadLayer,
		`lowerdir /mnt/it's is a dead FUSE mount (transport endpoint is not connected); clear it with: fusermount3 -u '/mnt/it'\''s' (or: umount -l '/mnt/it'\''s')`)
	old := geteuid
	geteuid = func() int { return 1000 }
	defer func() { geteuid = old }()
	wantFail(t, statProblem("upperdir", "/x/u", unix.EACCES), exitBadLayer,
		"upperdir /x/u cannot be reached (permission denied); give uid 1000 search permission on its parent directories")
	wantFail(t, statProblem("upperdir", "/x/u", unix.EIO), exitBadLayer,
		"cannot stat upperdir /x/u: input/output error; check the path")
}

func TestCheckDistinct(t *testing.T) {
	l := newLayout(t)
	link := filepath.Join(l.root, "link")
	if err := os.Symlink(l.l1, link); err != nil {
		t.Fatal(err)
	}
	if err := checkDistinct(l.config().layerRefs()); err != nil {
		t.Errorf("distinct layers: %v", err)
	}
	wantFail(t, checkDistinct([]layerRef{{"lowerdir", l.l1}, {"lowerdir", l.l2}, {"lowerdir", l.l1}}), exitBadLayer,
		"lowerdir "+l.l1+" and lowerdir "+l.l1+" are the same directory; every layer needs its own directory")
	wantFail(t, checkDistinct([]layerRef{{"lowerdir", link}, {"upperdir", l.l1 + "/."}}), exitBadLayer,
		"lowerdir "+link+" and upperdir "+l.l1+"/. are the same directory; every layer needs its own directory")
	c := l.config()
	c.Work = c.Upper
	wantFail(t, validate(c), exitBadLayer,
		"upperdir "+l.upper+" and workdir "+l.upper+" are the same directory; every layer needs its own directory")
}

func TestCheckNesting(t *testing.T) {
	l := newLayout(t)
	if err := checkNesting(l.config().layerRefs(), l.mnt); err != nil {
		t.Fatalf("flat layout: %v", err)
	}
	mk := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inUpper := mk(filepath.Join(l.upper, "work"))
	wantFail(t, checkNesting([]layerRef{{"upperdir", l.upper}, {"workdir", inUpper}}, l.mnt), exitBadLayer,
		"workdir "+inUpper+" is inside upperdir "+l.upper+"; use two separate directories, neither inside the other")
	inWork := mk(filepath.Join(l.work, "upper"))
	wantFail(t, checkNesting([]layerRef{{"upperdir", inWork}, {"workdir", l.work}}, l.mnt), exitBadLayer,
		"upperdir "+inWork+" is inside workdir "+l.work+"; use two separate directories, neither inside the other")
	inMnt := mk(filepath.Join(l.mnt, "lower"))
	wantFail(t, checkNesting([]layerRef{{"lowerdir", inMnt}}, l.mnt), exitBadLayer,
		"lowerdir "+inMnt+" is inside the mountpoint "+l.mnt+"; the mount would hide it, move the layer or the mountpoint")
	mntInLower := mk(filepath.Join(l.l2, "mnt"))
	wantFail(t, checkNesting([]layerRef{{"lowerdir", l.l1}, {"lowerdir", l.l2}}, mntInLower), exitBadLayer,
		"mountpoint "+mntInLower+" is inside lowerdir "+l.l2+"; the overlay would contain itself, mount it outside every layer")
	// Mounting on a lower layer itself is allowed (the overlay opens
	// its layers before the mount covers them); on the upper is not.
	if err := checkNesting([]layerRef{{"lowerdir", l.l1}}, l.l1); err != nil {
		t.Errorf("mountpoint on the lowerdir itself: %v", err)
	}
	wantFail(t, checkNesting([]layerRef{{"upperdir", l.upper}}, l.upper), exitBadLayer,
		"mountpoint "+l.upper+" is the upperdir itself; mount the overlay on a directory outside every layer")
	wantFail(t, checkNesting([]layerRef{{"lowerdir", "/"}}, l.mnt), exitBadLayer,
		"mountpoint "+l.mnt+" is inside lowerdir /; the overlay would contain itself, mount it outside every layer")

	// Symbolic links are followed: a link outside the mountpoint that
	// leads into it is still inside.
	link := filepath.Join(l.root, "sneaky")
	if err := os.Symlink(inMnt, link); err != nil {
		t.Fatal(err)
	}
	wantFail(t, checkNesting([]layerRef{{"upperdir", link}}, l.mnt), exitBadLayer,
		"upperdir "+link+" ("+inMnt+") is inside the mountpoint "+l.mnt+"; the mount would hide it, move the layer or the mountpoint")
	// A sibling whose name shares a prefix is not inside.
	sib := mk(l.mnt + "2")
	if err := checkNesting([]layerRef{{"lowerdir", sib}}, l.mnt); err != nil {
		t.Errorf("prefix sibling: %v", err)
	}
}

func TestCheckSameFilesystem(t *testing.T) {
	l := newLayout(t)
	if err := checkSameFilesystem(l.upper, l.work); err != nil {
		t.Fatalf("same filesystem: %v", err)
	}
	var a, b unix.Stat_t
	if unix.Stat("/dev/shm", &a) != nil || unix.Stat(l.root, &b) != nil || a.Dev == b.Dev {
		t.Skip("/dev/shm is missing or on the temp dir's filesystem")
	}
	shm, err := os.MkdirTemp("/dev/shm", "goverlay-test-")
	if err != nil {
		t.Skip(err)
	}
	defer os.RemoveAll(shm)
	wantFail(t, checkSameFilesystem(l.upper, shm), exitBadLayer,
		"workdir "+shm+" is on another filesystem than upperdir "+l.upper+"; put both on one filesystem")
}

func TestCheckWritable(t *testing.T) {
	l := newLayout(t)
	if err := checkWritable("upperdir", l.upper); err != nil {
		t.Fatalf("writable dir: %v", err)
	}
	oldStatfs, oldAccess, oldEuid := statfs, faccessat, geteuid
	defer func() { statfs, faccessat, geteuid = oldStatfs, oldAccess, oldEuid }()
	geteuid = func() int { return 1000 }

	// Root passes access(2) anywhere but on a read-only filesystem;
	// statfs tells that case apart.
	statfs = func(path string, buf *unix.Statfs_t) error {
		buf.Flags = unix.ST_RDONLY
		return nil
	}
	wantFail(t, checkWritable("upperdir", l.upper), exitBadLayer,
		"upperdir "+l.upper+" is on a read-only filesystem; remount it read-write, or add -o ro for a read-only overlay")
	statfs = oldStatfs

	faccessat = func(int, string, uint32, int) error { return unix.EROFS }
	wantFail(t, checkWritable("workdir", l.work), exitBadLayer,
		"workdir "+l.work+" is on a read-only filesystem; remount it read-write, or add -o ro for a read-only overlay")
	faccessat = func(int, string, uint32, int) error { return unix.EACCES }
	wantFail(t, checkWritable("upperdir", l.upper), exitBadLayer,
		"upperdir "+l.upper+" is not writable (permission denied); give uid 1000 write permission or pick another directory")

	// validate skips the check for a read-only mount.
	if _, err := os.Stat("/dev/fuse"); err == nil {
		faccessat = func(_ int, p string, mode uint32, _ int) error {
			if mode&unix.W_OK != 0 && (p == l.upper || p == l.work) {
				return unix.EACCES
			}
			return nil
		}
		defer func(f func() bool) { haveSetuidFusermount = f }(haveSetuidFusermount)
		haveSetuidFusermount = func() bool { return true }
		c := l.config()
		c.ReadOnly = true
		if err := validate(c); err != nil {
			t.Errorf("ro with an unwritable upper: %v", err)
		}
	}
	faccessat = oldAccess

	if os.Geteuid() != 0 {
		// Unprivileged: the real access(2) sees the mode.
		geteuid = oldEuid
		if err := os.Chmod(l.upper, 0o555); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(l.upper, 0o755)
		if err := checkWritable("upperdir", l.upper); err == nil || exitCodeOf(err) != exitBadLayer {
			t.Errorf("0555 upper: %v", err)
		}
	}
}

func TestCheckDevFuse(t *testing.T) {
	old := devFusePath
	defer func() { devFusePath = old }()
	dir := t.TempDir()

	devFusePath = filepath.Join(dir, "fuse")
	wantFail(t, checkDevFuse(), exitFuse,
		devFusePath+" does not exist; load the fuse module (modprobe fuse), or in a container add --device /dev/fuse")

	if err := os.WriteFile(devFusePath, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	wantFail(t, checkDevFuse(), exitFuse,
		devFusePath+` is not a character device; recreate it with "mknod -m 0666 /dev/fuse c 10 229"`)

	devFusePath = dir // opening a directory for writing fails with EISDIR
	wantFail(t, checkDevFuse(), exitFuse,
		"cannot open "+dir+": is a directory; check that it is the FUSE device (character device 10,229)")

	devFusePath = "/dev/fuse"
	if _, err := os.Stat(devFusePath); err != nil {
		t.Skip("no /dev/fuse")
	}
	if err := checkDevFuse(); err != nil {
		t.Errorf("/dev/fuse: %v", err)
	}
}

// TestCheckKernel: a kernel older than the minimum fails the mount before
// any layer is looked at, with exit status 3 and the release and minimum
// named; an unreadable release is let through.
func TestCheckKernel(t *testing.T) {
	old := kernelRelease
	defer func() { kernelRelease = old }()
	c := &config{Lower: []string{"/nonexistent/lower"}, Mountpoint: "/nonexistent/mnt"}
	kernelRelease = func() string { return "5.10.0-28-amd64" }
	wantFail(t, validate(c), exitFuse,
		"Linux 5.10.0-28-amd64 is older than 5.11, the oldest goverlay runs on (it needs openat2 with RESOLVE_NO_XDEV and FUSE_HANDLE_KILLPRIV_V2): upgrade the kernel")
	for _, rel := range []string{"5.11.0", "6.18.44", ""} {
		kernelRelease = func() string { return rel }
		if err := validate(c); exitCodeOf(err) != exitBadLayer {
			t.Errorf("release %q: %v, want the missing lowerdir's exit status %d", rel, err, exitBadLayer)
		}
	}
}

func TestWithinAndShow(t *testing.T) {
	for _, tc := range []struct {
		path, dir string
		want      bool
	}{
		{"/a/b", "/a", true}, {"/a", "/a", true}, {"/ab", "/a", false}, {"/a", "/a/b", false}, {"/x", "/", true},
	} {
		if got := within(tc.path, tc.dir); got != tc.want {
			t.Errorf("within(%q, %q) = %v", tc.path, tc.dir, got)
		}
	}
	for in, want := range map[string]string{"/a/b": "/a/b", "/a b": `"/a b"`, "/a\nb": `"/a\nb"`, "": `""`} {
		if got := show(in); got != want {
			t.Errorf("show(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckOverlap(t *testing.T) {
	l := newLayout(t)
	if err := checkOverlap(l.config().layerRefs()); err != nil {
		t.Fatalf("flat layout: %v", err)
	}
	mk := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lo := mk(filepath.Join(l.upper, "lo"))
	wantFail(t, checkOverlap([]layerRef{{"lowerdir", lo}, {"upperdir", l.upper}, {"workdir", l.work}}), exitBadLayer,
		"lowerdir "+lo+" is inside upperdir "+l.upper+"; layers must not overlap (the kernel overlay refuses it too): use directories that do not contain one another")
	wlo := mk(filepath.Join(l.work, "lo"))
	wantFail(t, checkOverlap([]layerRef{{"lowerdir", wlo}, {"upperdir", l.upper}, {"workdir", l.work}}), exitBadLayer,
		"lowerdir "+wlo+" is inside workdir "+l.work+"; layers must not overlap (the kernel overlay refuses it too): use directories that do not contain one another")
	sub := mk(filepath.Join(l.l1, "sub"))
	for _, refs := range [][]layerRef{{{"lowerdir", l.l1}, {"lowerdir", sub}}, {{"lowerdir", sub}, {"lowerdir", l.l1}}} {
		wantFail(t, checkOverlap(refs), exitBadLayer,
			"lowerdir "+sub+" is inside lowerdir "+l.l1+"; layers must not overlap (the kernel overlay refuses it too): use directories that do not contain one another")
	}
	// An upperdir or workdir inside a lowerdir: the kernel accepts it.
	up, work := mk(filepath.Join(l.l2, "u")), mk(filepath.Join(l.l2, "w"))
	if err := checkOverlap([]layerRef{{"lowerdir", l.l2}, {"upperdir", up}, {"workdir", work}}); err != nil {
		t.Errorf("upperdir and workdir inside the lowerdir: %v", err)
	}
}

// TestNoOpenAndPassthrough: passthrough=on asks for OPEN requests
// (noopen=0), and refuses an explicit noopen=1 with a usage error.
func TestNoOpenAndPassthrough(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	l := newLayout(t)
	c := l.config()
	if err := newOptState(c).parse("passthrough=on"); err != nil {
		t.Fatal(err)
	}
	if err := validate(c); err != nil || !c.OpenRequests {
		t.Errorf("passthrough=on: OpenRequests %v, %v", c.OpenRequests, err)
	}
	c = l.config()
	if err := newOptState(c).parse("passthrough=on,noopen=1"); err != nil {
		t.Fatal(err)
	}
	wantFail(t, validate(c), exitUsage, "options passthrough=on and noopen=1 exclude each other: passthrough is set up when a file is opened, and with noopen=1 opens do not reach goverlay; drop one of them")
	c = l.config()
	if err := newOptState(c).parse("noopen=0"); err != nil {
		t.Fatal(err)
	}
	if err := validate(c); err != nil || !c.OpenRequests {
		t.Errorf("noopen=0: OpenRequests %v, %v", c.OpenRequests, err)
	}
}

// TestShareCacheOptions: sharecache=on asks for OPEN requests, and refuses
// the options that would leave it without passthrough.
func TestShareCacheOptions(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	l := newLayout(t)
	c := l.config()
	if err := newOptState(c).parse("sharecache=on"); err != nil {
		t.Fatal(err)
	}
	if err := validate(c); err != nil || !c.OpenRequests || !c.ShareCache {
		t.Errorf("sharecache=on: OpenRequests %v, ShareCache %v, %v", c.OpenRequests, c.ShareCache, err)
	}
	for opts, want := range map[string]string{
		"sharecache=on,noopen=1":        "options sharecache=on and noopen=1 exclude each other: lower files are shared through passthrough, which is set up when a file is opened; drop one of them",
		"passthrough=off,sharecache=on": "options sharecache=on and passthrough=off exclude each other: lower files are shared through passthrough; drop one of them",
		"sharecache=on,writeback=1":     "options sharecache=on and writeback=1 exclude each other: the kernel grants passthrough only without the writeback cache; drop one of them",
	} {
		c := l.config()
		if err := newOptState(c).parse(opts); err != nil {
			t.Fatal(err)
		}
		wantFail(t, validate(c), exitUsage, want)
	}
	// The last one given wins.
	c = l.config()
	if err := newOptState(c).parse("sharecache=on,sharecache=off,noopen=1"); err != nil {
		t.Fatal(err)
	}
	if err := validate(c); err != nil || c.ShareCache || c.OpenRequests {
		t.Errorf("sharecache=on,sharecache=off,noopen=1: ShareCache %v, OpenRequests %v, %v", c.ShareCache, c.OpenRequests, err)
	}
	c = l.config()
	if err := newOptState(c).parse("sharecache=yes"); err == nil || !strings.Contains(err.Error(), `option "sharecache" is on or off, not "yes"`) {
		t.Errorf("sharecache=yes: %v", err)
	}
}
