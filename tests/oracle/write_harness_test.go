package oracle_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The write-path oracle: a scenario is a lower layer and a script of
// operations. The script runs through goverlay and through the kernel
// overlay over two identical copies of the lower, each with a fresh upper;
// the merged views and the upper layers they leave must be the same, and
// each overlay must read the upper layer the other one wrote.

// kernelWriteOpts are the kernel overlay's options for the write
// scenarios, given explicitly whatever this machine's module defaults
// (/sys/module/overlay/parameters/*; here redirect_dir=N) are: goverlay
// implements neither the inode index nor metacopy. redirect_dir is off
// unless the scenario asks for it, on both overlays (goverlay's default is
// on): a directory with lower instances then cannot be renamed (EXDEV).
func kernelWriteOpts(redirect bool) []string {
	return []string{"redirect_dir=" + onOff(redirect), "index=off", "metacopy=off", "xino=off"}
}

// goverlayWriteOpts are goverlay's, to match.
func goverlayWriteOpts(redirect bool) []string {
	return []string{"-o", "redirect_dir=" + onOff(redirect)}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// wscenario is one write scenario.
type wscenario struct {
	name string
	// lower builds the lower layer; Finish then sets every mtime to
	// testutil.FixedTime, and after (if set) may change times.
	lower func(t testing.TB, l *testutil.Layer)
	after func(t testing.TB, l *testutil.Layer)
	// run is the script. It runs once per overlay, in a subtest named
	// after the overlay, and asserts the kernel's behaviour: a failure
	// under "kernel" means the script is wrong, not goverlay.
	run func(t *testing.T, mnt string)
	// check makes claims on the kernel's final view, so that the
	// scenario provably tests what it says.
	check func(t testing.TB, kt testutil.Tree)
	// verify, if set, makes claims that a Snapshot cannot see (it
	// leaves out overlay-private xattrs) on every mount of the result:
	// the live ones and those over the other overlay's upper.
	verify func(t *testing.T, mnt string)
	// redirect mounts both overlays with redirect_dir=on.
	redirect bool
}

// wstack is a lower layer with a fresh upper and work dir beside it.
type wstack struct {
	lower, upper, work string
	redirect           bool
	// opens mounts goverlay with -o noopen=0: every open a request,
	// passthrough as root.
	opens bool
}

func newWStack(t testing.TB, sc wscenario) wstack {
	t.Helper()
	return newWStackIn(t, sc, t.TempDir())
}

// newWStackIn builds sc's stack in the existing, empty directory base.
func newWStackIn(t testing.TB, sc wscenario, base string) wstack {
	t.Helper()
	st := wstack{
		lower:    filepath.Join(base, "lower"),
		upper:    filepath.Join(base, "upper"),
		work:     filepath.Join(base, "work"),
		redirect: sc.redirect,
	}
	l := testutil.NewLayer(t, st.lower)
	if sc.lower != nil {
		sc.lower(t, l)
	}
	l.Finish()
	if sc.after != nil {
		sc.after(t, l)
	}
	for _, d := range []string{st.upper, st.work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The upper root's own mtime is FixedTime too, so that it compares
	// exactly when no script touches it.
	setMtime(t, st.upper, testutil.FixedTime)
	return st
}

func (s wstack) goverlay(t testing.TB) *testutil.Mounted {
	t.Helper()
	extra := goverlayWriteOpts(s.redirect)
	if s.opens {
		extra = append(extra, "-o", "noopen=0")
	}
	return testutil.Mount(t, testutil.Options{Lower: []string{s.lower}, Upper: s.upper, Work: s.work, Extra: extra})
}

func (s wstack) kernel(t testing.TB) string {
	t.Helper()
	return testutil.KernelOverlay(t, []string{s.lower}, s.upper, s.work, kernelWriteOpts(s.redirect)...)
}

// compareUppers unmounts g, goverlay's mount of gs, checks that it left
// its workdir empty, and compares its upper layer with ks's, the kernel's,
// with the times since since normalised (normTimes; with dirs, every
// directory's).
func compareUppers(t *testing.T, ks, gs wstack, g *testutil.Mounted, since time.Time, dirs bool) {
	t.Helper()
	g.Unmount(t)
	testutil.WorkEmpty(t, gs.work)
	kraw := testutil.UpperLayout(t, ks.upper)
	kl, gl := normTimes(layoutOf(t, ks.upper), since, dirs), normTimes(layoutOf(t, gs.upper), since, dirs)
	xattrBlocks(t, ks.upper, kraw, kl, gl)
	compareW(t, "upper layers", kl, gl, testutil.DiffOptions{A: "kernel's upper", B: "goverlay's upper"})
}

func setMtime(t testing.TB, path string, tm time.Time) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(tm.UnixNano()), unix.NsecToTimespec(tm.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

// runScript runs sc on mnt in a subtest named label.
func runScript(t *testing.T, sc wscenario, label, mnt string) bool {
	t.Helper()
	return t.Run(label, func(t *testing.T) { sc.run(t, mnt) })
}

// verifyOn runs sc.verify, if any, on mnt in a subtest.
func verifyOn(t *testing.T, sc wscenario, label, mnt string) {
	t.Helper()
	if sc.verify != nil {
		t.Run("verify "+label, func(t *testing.T) { sc.verify(t, mnt) })
	}
}

// recent is the Mtime given to every entry changed during the test: two
// runs of one script cannot agree on the clock, only on which entries
// were touched. Explicit times (utimensat) and times kept from the lower
// layer are older than the test and compare exactly.
const recent = -1

// normTimes returns a copy of tr with every mtime at or after since
// replaced by recent, and, with dirs, every directory's mtime by 0.
func normTimes(tr testutil.Tree, since time.Time, dirs bool) testutil.Tree {
	out := tr.Clone()
	s := since.UnixNano()
	for _, n := range out {
		if n.Mtime >= s {
			n.Mtime = recent
		}
		if dirs && n.Type == "dir" {
			n.Mtime = 0
		}
	}
	return out
}

// ownXattr is true for the xattrs an overlay keeps for itself on its upper
// layer and that the other one need not write: the kernel's origin and
// impure marks (file handles and a cache flag) and the uuid it stamps on
// the upper root of a new overlay (uuid=auto, Linux 6.6+: a random id for
// its file handles), goverlay's inode numbers. trusted.overlay.opaque is
// compared.
func ownXattr(name string) bool {
	switch {
	case name == "trusted.overlay.origin", name == "trusted.overlay.impure", name == "trusted.overlay.uuid":
		return true
	case strings.HasPrefix(name, "trusted.overlay.goverlay."):
		return true
	}
	return false
}

// layoutOf is the upper layer's layout without the overlays' own xattrs.
// A whiteout's link count and hard-link group are left out too: the
// kernel (5.8+) makes every whiteout a hard link of one shared whiteout
// inode kept in its workdir, goverlay makes each one anew; both are char
// 0/0 devices, which is the format.
// dropUnchangedCopies removes from kl, the kernel's upper layout, the
// regular files it copied up and left as they were, which gl, goverlay's,
// does not hold: an open for writing that writes nothing copies a file up
// on the kernel overlay (ovl_open()), while goverlay, whose files open
// without a request, copies it up at its first change (goverlay(1),
// DIFFERENCES FROM THE KERNEL OVERLAY). Such a copy is the lower file again: same type,
// mode, owners, content and xattrs; the mount shows the same either way,
// which the merged views compare.
func dropUnchangedCopies(kl, gl, lower testutil.Tree) {
	for p, k := range kl {
		l := lower[p]
		if _, ok := gl[p]; ok || l == nil || k.Type != "file" || l.Type != "file" {
			continue
		}
		if k.Mode == l.Mode && k.UID == l.UID && k.GID == l.GID && k.Hash == l.Hash &&
			k.Size == l.Size && maps.Equal(k.Xattrs, l.Xattrs) {
			delete(kl, p)
		}
	}
}

func layoutOf(t testing.TB, dir string) testutil.Tree {
	t.Helper()
	tr := testutil.UpperLayout(t, dir).Clone()
	for _, n := range tr {
		if n.Type == "whiteout" {
			n.Nlink, n.Link = 0, ""
		}
		for k := range n.Xattrs {
			if ownXattr(k) {
				delete(n.Xattrs, k)
			}
		}
		if len(n.Xattrs) == 0 {
			n.Xattrs = nil
		}
	}
	return tr
}

// xattrBlocks forgives, in k (a tree of the kernel's), the one extra
// filesystem block of a file whose upper copy carries the kernel's own
// xattrs (kraw is the raw layout of the kernel's upper): origin is a file
// handle of some 30 bytes, and with the file's own xattrs it may overflow
// the inode's in-line xattr space (ext4: ~100 bytes) into an xattr block,
// which st_blocks counts.
func xattrBlocks(t testing.TB, upper string, kraw, k, g testutil.Tree) {
	t.Helper()
	var sfs unix.Statfs_t
	if err := unix.Statfs(upper, &sfs); err != nil {
		t.Fatal(err)
	}
	block := sfs.Bsize / 512
	for p, kn := range k {
		gn, raw := g[p], kraw[p]
		if gn == nil || raw == nil || kn.Type != "file" || kn.Blocks-gn.Blocks != block {
			continue
		}
		for x := range raw.Xattrs {
			if ownXattr(x) {
				kn.Blocks = gn.Blocks
				break
			}
		}
	}
}

// compareW fails t with every difference between two trees.
func compareW(t testing.TB, what string, a, b testutil.Tree, o testutil.DiffOptions) {
	t.Helper()
	d := testutil.DiffWith(a, b, o)
	if len(d) == 0 {
		return
	}
	const maxShown = 60
	shown := d
	if len(shown) > maxShown {
		shown = shown[:maxShown]
	}
	t.Errorf("%s: %d difference(s) (%s vs %s):\n  %s", what, len(d), o.A, o.B, strings.Join(shown, "\n  "))
	if testing.Verbose() {
		t.Logf("%s:\n%s\n%s:\n%s", o.A, a, o.B, b)
	}
}

// sameBinary builds the goverlay binary before any subtest starts. The
// harness's leak check reads the binary's path at the end of every test
// that mounted anything, without synchronisation: a subtest that mounts
// only kernel overlays must not end while another one builds it.
func sameBinary(t testing.TB) {
	t.Helper()
	testutil.Binary(t)
}

// TestWriteScenarios runs every write scenario in both directions:
//
//	A: goverlay and the kernel side by side over fresh uppers: same merged
//	   view, same upper layout; then the kernel over goverlay's upper
//	   shows what goverlay showed.
//	B: the kernel writes an upper; goverlay over it shows what the
//	   kernel showed.
func TestWriteScenarios(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	for _, sc := range writeScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			t.Run("A", func(t *testing.T) { directionA(t, sc) })
			t.Run("B", func(t *testing.T) { directionB(t, sc) })
		})
	}
}

// TestWriteScenariosOpens is direction A of TestWriteScenarios with every
// open a request (-o noopen=0), which gives passthrough as root, instead of
// files opened by the kernel alone and the writeback cache.
func TestWriteScenariosOpens(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	for _, sc := range writeScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			directionAWith(t, sc, true)
		})
	}
}

func directionA(t *testing.T, sc wscenario) { directionAWith(t, sc, false) }

func directionAWith(t *testing.T, sc wscenario, opens bool) {
	ks, gs := newWStack(t, sc), newWStack(t, sc)
	gs.opens = opens
	kmnt := ks.kernel(t)
	g := gs.goverlay(t)
	since := time.Now().Add(-time.Second)
	if !runScript(t, sc, "kernel", kmnt) {
		t.Fatalf("the script fails on the kernel overlay: the scenario is wrong")
	}
	runScript(t, sc, "goverlay", g.Dir)

	kt := testutil.Snapshot(t, kmnt)
	if sc.check != nil {
		sc.check(t, kt)
	}
	gt := testutil.Snapshot(t, g.Dir)
	kraw := testutil.UpperLayout(t, ks.upper)
	nk, ng := normTimes(kt, since, false), normTimes(gt, since, false)
	xattrBlocks(t, ks.upper, kraw, nk, ng)
	compareW(t, "merged views after the script", nk, ng, testutil.DiffOptions{A: "kernel", B: "goverlay"})
	verifyOn(t, sc, "kernel", kmnt)
	verifyOn(t, sc, "goverlay", g.Dir)

	g.Unmount(t)
	testutil.WorkEmpty(t, gs.work)
	kl, gl := normTimes(layoutOf(t, ks.upper), since, false), normTimes(layoutOf(t, gs.upper), since, false)
	xattrBlocks(t, ks.upper, kraw, kl, gl)
	if !opens {
		dropUnchangedCopies(kl, gl, layoutOf(t, ks.lower))
	}
	compareW(t, "upper layers after the script", kl, gl,
		testutil.DiffOptions{A: "kernel's upper", B: "goverlay's upper"})

	// On-disk compatibility: the kernel reads goverlay's upper as
	// goverlay did, times included.
	rmnt := gs.kernel(t)
	compareW(t, "the kernel over goverlay's upper", gt, testutil.Snapshot(t, rmnt),
		testutil.DiffOptions{A: "goverlay (live)", B: "kernel over goverlay's upper"})
	verifyOn(t, sc, "kernel over goverlay's upper", rmnt)
}

func directionB(t *testing.T, sc wscenario) {
	ks := newWStack(t, sc)
	kmnt := ks.kernel(t)
	if !runScript(t, sc, "kernel", kmnt) {
		t.Fatalf("the script fails on the kernel overlay: the scenario is wrong")
	}
	kt := testutil.Snapshot(t, kmnt)
	verifyOn(t, sc, "kernel", kmnt)
	testutil.UnmountKernel(t, kmnt)
	g := ks.goverlay(t)
	compareW(t, "goverlay over the kernel's upper", kt, testutil.Snapshot(t, g.Dir),
		testutil.DiffOptions{A: "kernel (live)", B: "goverlay over the kernel's upper"})
	verifyOn(t, sc, "goverlay over the kernel's upper", g.Dir)
}

// sh runs the operations of a script on one mount, reporting failures
// (not fatally: a script goes on to show every difference).
type sh struct {
	t   *testing.T
	mnt string
}

func (s sh) p(rel string) string { return filepath.Join(s.mnt, rel) }

// ok reports err.
func (s sh) ok(what string, err error) bool {
	s.t.Helper()
	if err != nil {
		s.t.Errorf("%s: %v", what, err)
		return false
	}
	return true
}

// fails reports unless err is want.
func (s sh) fails(what string, err error, want unix.Errno) {
	s.t.Helper()
	if !errors.Is(err, want) {
		s.t.Errorf("%s: got %v, want %v (%s)", what, errString(err), want, unix.ErrnoName(want))
	}
}

func errString(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return fmt.Sprintf("%v (%s)", err, unix.ErrnoName(e))
	}
	if err == nil {
		return "success"
	}
	return err.Error()
}

// write opens rel with flags and mode, writes data at the file offset
// and closes it.
func (s sh) write(rel string, flags int, mode uint32, data string) {
	s.t.Helper()
	fd, err := unix.Open(s.p(rel), flags|unix.O_CLOEXEC, mode)
	if !s.ok(fmt.Sprintf("open %s %#o", rel, flags), err) {
		return
	}
	defer unix.Close(fd)
	if data != "" {
		n, err := unix.Write(fd, []byte(data))
		if s.ok("write "+rel, err) && n != len(data) {
			s.t.Errorf("write %s: %d of %d bytes", rel, n, len(data))
		}
	}
}

// pwrite opens rel O_WRONLY (no O_TRUNC) and writes data at off.
func (s sh) pwrite(rel string, off int64, data []byte) {
	s.t.Helper()
	fd, err := unix.Open(s.p(rel), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if !s.ok("open "+rel, err) {
		return
	}
	defer unix.Close(fd)
	n, err := unix.Pwrite(fd, data, off)
	if s.ok("pwrite "+rel, err) && n != len(data) {
		s.t.Errorf("pwrite %s: %d of %d bytes", rel, n, len(data))
	}
}

// content checks rel's content.
func (s sh) content(rel string, want []byte) {
	s.t.Helper()
	got, err := os.ReadFile(s.p(rel))
	if !s.ok("read "+rel, err) {
		return
	}
	if !bytes.Equal(got, want) {
		s.t.Errorf("content of %s: %s", rel, firstDiff(got, want))
	}
}

// firstDiff describes where got departs from want.
func firstDiff(got, want []byte) string {
	n := min(len(got), len(want))
	for i := range n {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d is %#x, want %#x (len %d, want %d); got %q... want %q...",
				i, got[i], want[i], len(got), len(want), clip(got[i:]), clip(want[i:]))
		}
	}
	return fmt.Sprintf("length %d, want %d", len(got), len(want))
}

func clip(b []byte) []byte {
	if len(b) > 24 {
		return b[:24]
	}
	return b
}

// absent checks that rel does not exist.
func (s sh) absent(rel string) {
	s.t.Helper()
	var st unix.Stat_t
	s.fails("lstat "+rel, unix.Lstat(s.p(rel), &st), unix.ENOENT)
}

// stat lstat's rel.
func (s sh) stat(rel string) unix.Stat_t {
	s.t.Helper()
	var st unix.Stat_t
	s.ok("lstat "+rel, unix.Lstat(s.p(rel), &st))
	return st
}

// list checks the names readdir gives for rel (without . and ..).
func (s sh) list(rel string, want ...string) {
	s.t.Helper()
	ents, err := os.ReadDir(s.p(rel))
	if !s.ok("readdir "+rel, err) {
		return
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
		s.t.Errorf("readdir %s: %q, want %q", rel, got, want)
	}
}

// pattern is n deterministic, mostly non-zero bytes.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x>>24) | 1
	}
	return b
}
