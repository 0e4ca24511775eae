package containers_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// Deadlines of TestStorageArgv. None of them is a timing assertion: each
// bounds a wait for something that must happen.
const (
	mountDeadline  = 30 * time.Second // the program returns once mounted
	stderrDeadline = 10 * time.Second // EOF on stderr once it returned
	exitDeadline   = 10 * time.Second // the daemon exits once unmounted
)

// A mountProgram is goverlay or the reference, fuse-overlayfs.
type mountProgram struct{ name, path string }

// storagePrograms is goverlay (the race build: this test sees the
// daemon's exit status, so a data race fails it) and, when installed,
// fuse-overlayfs, whose behaviour the expectations were checked against.
func storagePrograms(t *testing.T) []mountProgram {
	ps := []mountProgram{{"goverlay", testutil.Binary(t)}}
	if _, err := os.Stat(fuseOverlayfs); err == nil {
		ps = append(ps, mountProgram{"fuse-overlayfs", fuseOverlayfs})
	} else {
		t.Logf("fuse-overlayfs not installed: goverlay only, no reference run")
	}
	return ps
}

// csStore lays out a containers/storage overlay home as it is with a mount
// program: layers extracted in the AUFS whiteout format, each layer's diff
// reachable through a short link in l/, and a container layer with diff,
// work and merged.
type csStore struct {
	home               string // d.home: STORE/overlay, the program's cwd
	top, bottom        string // the image layers' diff directories
	topEmpty, topMerge string // the read-only mount's empty lower and mount point
	lowerdir           string // <home>/l/AAA:<home>/l/BBB
	upper, work        string
	merged             string
}

const (
	topID    = "aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111"
	bottomID = "bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222"
	ctrID    = "cccc3333cccc3333cccc3333cccc3333cccc3333cccc3333cccc3333cccc3333"
)

func newCSStore(t *testing.T) *csStore {
	t.Helper()
	home := filepath.Join(t.TempDir(), "overlay")
	s := &csStore{
		home:     home,
		top:      filepath.Join(home, topID, "diff"),
		bottom:   filepath.Join(home, bottomID, "diff"),
		topEmpty: filepath.Join(home, topID, "empty"),
		topMerge: filepath.Join(home, topID, "merged"),
		lowerdir: filepath.Join(home, "l", "AAAATOPLINK") + ":" + filepath.Join(home, "l", "BBBBBOTTOMLINK"),
		upper:    filepath.Join(home, ctrID, "diff"),
		work:     filepath.Join(home, ctrID, "work"),
		merged:   filepath.Join(home, ctrID, "merged"),
	}
	b := testutil.NewLayer(t, s.bottom)
	b.File("bin/tool", "#!/bin/sh\necho tool\n", 0o755).
		File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644).
		File("etc/hosts", "127.0.0.1 localhost\n", 0o644).
		File("gone.txt", "gone\n", 0o644).
		File("gonedir/f", "f\n", 0o644).
		File("keep.txt", "bottom\n", 0o644).
		File("opq/old.txt", "old\n", 0o644).
		File("dir/sub/deep.txt", "deep\n", 0o644).
		File("home/user/own.txt", "own\n", 0o644)
	// containers/storage writes AUFS whiteouts as empty mode-0 files.
	a := testutil.NewLayer(t, s.top)
	a.File(".wh.gone.txt", "", 0).
		File(".wh.gonedir", "", 0).
		File("etc/.wh.hosts", "", 0).
		File("opq/.wh..wh..opq", "", 0).
		File("opq/new.txt", "new\n", 0o644).
		File("keep.txt", "top\n", 0o644).
		File("top.txt", "top only\n", 0o644)
	for _, d := range []string{filepath.Join(home, "l"), s.topEmpty, s.topMerge, s.upper, s.work, s.merged} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(s.upper, 0o755); err != nil {
		t.Fatal(err)
	}
	for link, id := range map[string]string{"AAAATOPLINK": topID, "BBBBBOTTOMLINK": bottomID} {
		if err := os.Symlink("../"+id+"/diff", filepath.Join(home, "l", link)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// rwOpts is the option string of a container mount; extra is appended
// after workdir as containers/storage appends its mount data.
func (s *csStore) rwOpts(extra string) string {
	return "lowerdir=" + s.lowerdir + ",upperdir=" + s.upper + ",workdir=" + s.work + "," + extra
}

// The merged view of the store's two layers, as `view` prints it.
var csView = []string{
	"bin d 755",
	"bin/tool f 755 \"#!/bin/sh\\necho tool\\n\"",
	"dir d 755",
	"dir/sub d 755",
	"dir/sub/deep.txt f 644 \"deep\\n\"",
	"etc d 755",
	"etc/passwd f 644 \"root:x:0:0:root:/root:/bin/sh\\n\"",
	"home d 755",
	"home/user d 755",
	"home/user/own.txt f 644 \"own\\n\"",
	"keep.txt f 644 \"top\\n\"",
	"opq d 755",
	"opq/new.txt f 644 \"new\\n\"",
	"top.txt f 644 \"top only\\n\"",
}

// view lists the tree under root, sorted: path, type, permissions and,
// for regular files, the content.
func view(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := ""
		switch {
		case fi.IsDir():
			line = fmt.Sprintf("%s d %o", rel, fi.Mode().Perm())
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line = fmt.Sprintf("%s f %o %q", rel, fi.Mode().Perm(), data)
		default:
			line = fmt.Sprintf("%s %v", rel, fi.Mode().Type())
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Errorf("walking %s: %v", root, err)
	}
	sort.Strings(out)
	return out
}

// owners maps each path under root ("." for root itself) to "uid:gid".
func owners(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = fmt.Sprintf("%d:%d", st.Uid, st.Gid)
		return nil
	})
	if err != nil {
		t.Errorf("walking %s: %v", root, err)
	}
	return out
}

func ownerOf(t *testing.T, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Errorf("lstat %s: %v", p, err)
		return "?"
	}
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

// diffLines reports how got differs from want, line by line.
func diffLines(want, got []string) string {
	w := map[string]bool{}
	for _, l := range want {
		w[l] = true
	}
	g := map[string]bool{}
	for _, l := range got {
		g[l] = true
	}
	var b strings.Builder
	for _, l := range want {
		if !g[l] {
			fmt.Fprintf(&b, "  - %s\n", l)
		}
	}
	for _, l := range got {
		if !w[l] {
			fmt.Fprintf(&b, "  + %s\n", l)
		}
	}
	if b.Len() == 0 && len(want) != len(got) {
		fmt.Fprintf(&b, "  (same lines, %d wanted, %d got: duplicates)\n", len(want), len(got))
	}
	return b.String()
}

func checkView(t *testing.T, what, root string, want []string) {
	t.Helper()
	if d := diffLines(want, view(t, root)); d != "" {
		t.Errorf("%s: the tree differs (- want, + got):\n%s", what, d)
	}
}

// whiteoutFormat says how rel is whited out in upper: "char 0/0" (kernel
// format), "aufs" (.wh.NAME) or "" (not at all).
func whiteoutFormat(upper, rel string) string {
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(upper, rel), &st) == nil &&
		st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
		return "char 0/0"
	}
	if _, err := os.Lstat(filepath.Join(upper, filepath.Dir(rel), ".wh."+filepath.Base(rel))); err == nil {
		return "aufs"
	}
	return ""
}

// csMount is one run of a mount program, as containers/storage runs it.
type csMount struct {
	prog   mountProgram
	merged string
	stderr string // what the program printed on stderr
	daemon *testutil.Proc
}

// storageMount runs `PROG -o OPTS MERGED` with the working directory
// home, stdin and stdout on /dev/null and stderr a pipe read to EOF, like
// containers/storage's mountProgram.Run() with Stderr a bytes.Buffer: Run
// returns only at EOF, so a daemon that kept the pipe would hang podman.
// It fails the test unless the program exits 0, the pipe reaches EOF
// within stderrDeadline of that, and exactly one process (the daemon)
// serves merged.
func storageMount(t *testing.T, prog mountProgram, home, opts, merged string) *csMount {
	t.Helper()
	m := &csMount{prog: prog, merged: merged}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), mountDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog.path, "-o", opts, merged)
	cmd.Dir = home
	cmd.Stderr = w // Stdin and Stdout nil: /dev/null
	raceLog := filepath.Join(t.TempDir(), "race")
	if prog.name == "goverlay" {
		// The race build: reports to files we show, no 1 s sleep at
		// exit.
		cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0 log_path="+raceLog)
	}
	var buf bytes.Buffer
	eof := make(chan error, 1)
	go func() {
		_, err := io.Copy(&buf, r)
		eof <- err
	}()
	err = cmd.Start()
	w.Close() // only the program (and what it forks) holds it now
	if err == nil {
		err = cmd.Wait()
	}
	returned := ctx.Err() == nil
	select {
	case <-eof:
	case <-time.After(stderrDeadline):
		t.Errorf("%s returned (%v), but its stderr pipe was still open %v later: a process it started keeps it (containers/storage, and so podman, would hang here)",
			prog.name, err, stderrDeadline)
		r.Close() // unblocks the reader
		<-eof
	}
	r.Close()
	m.stderr = buf.String()
	t.Logf("%s -o %s %s\n  exit: %v\n  stderr: %q", prog.name, opts, merged, err, m.stderr)
	pids := testutil.FindProcs(prog.path, merged)
	if len(pids) == 1 {
		if p, terr := testutil.Track(pids[0], t.Name()); terr == nil {
			m.daemon = p
		}
	}
	t.Cleanup(func() {
		races, _ := filepath.Glob(raceLog + ".*")
		for _, r := range races {
			data, _ := os.ReadFile(r)
			t.Errorf("the race detector reported, in %s:\n%s", r, data)
		}
		// Whatever happened: nothing left mounted or running.
		if testutil.IsMounted(merged) {
			t.Errorf("%s still mounted at the end of the test: detached it", merged)
			_ = unix.Unmount(merged, unix.MNT_DETACH)
		}
		if m.daemon != nil && !m.daemon.Wait(exitDeadline) {
			t.Errorf("%s daemon %d still running at the end of the test: killed it", prog.name, m.daemon.PID)
			m.daemon.Kill()
		}
	})
	switch {
	case !returned:
		t.Fatalf("%s did not return within %v", prog.name, mountDeadline)
	case err != nil:
		t.Fatalf("%s -o %s: %v; stderr: %s", prog.name, opts, err, m.stderr)
	case !testutil.IsMounted(merged):
		t.Fatalf("%s returned 0 but %s is not mounted", prog.name, merged)
	case len(pids) != 1:
		t.Fatalf("want one %s process serving %s, found %v", prog.name, merged, pids)
	}
	return m
}

// storageUnmount is containers/storage's Put for a mount program:
// `fusermount3 -u`, then `fusermount -u`, and if both failed syncfs and
// umount2(MNT_DETACH). It returns which step unmounted.
func storageUnmount(merged string) (how string, errs []string) {
	for _, v := range []string{"fusermount3", "fusermount"} {
		out, err := exec.Command(v, "-u", merged).CombinedOutput()
		if err == nil {
			return v + " -u", errs
		}
		errs = append(errs, fmt.Sprintf("%s -u: %v: %s", v, err, bytes.TrimSpace(out)))
	}
	if fd, err := unix.Open(merged, unix.O_DIRECTORY, 0); err == nil {
		_ = unix.Syncfs(fd)
		unix.Close(fd)
	}
	if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
		errs = append(errs, fmt.Sprintf("umount2(MNT_DETACH): %v", err))
		return "", errs
	}
	return "umount2(MNT_DETACH)", errs
}

// unmount runs storageUnmount and checks that fusermount3 did it, that
// the mount is gone and that the daemon exited 0.
func (m *csMount) unmount(t *testing.T) {
	t.Helper()
	how, errs := storageUnmount(m.merged)
	if how != "fusermount3 -u" {
		t.Errorf("unmounting %s: want fusermount3 -u to succeed; unmounted by %q after: %s", m.merged, how, strings.Join(errs, "; "))
	}
	if testutil.IsMounted(m.merged) {
		t.Errorf("%s still mounted after %s", m.merged, how)
	}
	if m.daemon == nil {
		return
	}
	if !m.daemon.Wait(exitDeadline) {
		t.Errorf("%s daemon %d still running %v after %s: killed it", m.prog.name, m.daemon.PID, exitDeadline, how)
		m.daemon.Kill()
		return
	}
	if ok, known, desc := m.daemon.Status(); !ok {
		if known {
			t.Errorf("%s daemon %d: %s, want exit status 0", m.prog.name, m.daemon.PID, desc)
		} else {
			t.Logf("%s daemon %d: %s", m.prog.name, m.daemon.PID, desc)
		}
	}
}

// storageLeakCheck makes the end of t check that no process of prog
// serves anything under home and nothing is mounted there.
func storageLeakCheck(t *testing.T, prog mountProgram, home string) {
	t.Cleanup(func() {
		for _, k := range waitProcsGone(prog.path, home, exitDeadline, t.Name()) {
			t.Errorf("%s process left running: %s (killed)", prog.name, k)
		}
		if d := detach(home); len(d) > 0 {
			t.Errorf("mounts left under %s: %q", home, d)
		}
	})
}

// noWarnings fails the test if goverlay warned about options that are
// all supported. fuse-overlayfs 1.10 warns "unknown argument ignored:
// lazytime" on every mount and about the empty option of ",,volatile":
// only recorded.
func noWarnings(t *testing.T, prog mountProgram, m *csMount, what string) {
	t.Helper()
	w := warnings(m.stderr)
	switch {
	case len(w) == 0:
	case prog.name == "goverlay":
		t.Errorf("goverlay warned on %s: %q", what, w)
	default:
		t.Logf("%s warns on %s: %q", prog.name, what, w)
	}
}

// warnings is the stderr lines that are not goverlay's NOSEC notice,
// which it prints with -d or --log only.
func warnings(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "NOSEC") {
			out = append(out, l)
		}
	}
	return out
}

// TestStorageArgv mounts and unmounts with containers/storage's exact argv
// (drivers/overlay/overlay.go: exec.Command(mountProgram, "-o", label,
// target) with Dir = home and Stderr a buffer; Put: fusermount3 -u,
// fusermount -u, umount2(MNT_DETACH)), over layers in the AUFS whiteout
// format, for goverlay and for fuse-overlayfs as the reference.
func TestStorageArgv(t *testing.T) {
	testutil.RequireRoot(t)
	lookTools(t, map[string]string{"fusermount3": "fuse3"})
	for _, prog := range storagePrograms(t) {
		t.Run(prog.name, func(t *testing.T) {
			t.Run("container", func(t *testing.T) { storageContainer(t, prog) })
			t.Run("read-only", func(t *testing.T) { storageReadOnly(t, prog) })
			t.Run("context-xino", func(t *testing.T) { storageContextXino(t, prog) })
			// containers/storage's optsAppendMappings writes a ":"
			// before every triplet, the first one too.
			t.Run("uidmapping", func(t *testing.T) {
				storageUIDMapping(t, prog, ",,uidmapping=:0:100000:65536,gidmapping=:0:100000:65536")
			})
			t.Run("uidmapping-no-leading-colon", func(t *testing.T) {
				storageUIDMapping(t, prog, ",,uidmapping=0:100000:65536,gidmapping=0:100000:65536")
			})
			t.Run("squash", func(t *testing.T) { storageSquash(t, prog) })
		})
	}
}

// storageContainer: a --rm container's mount (",,volatile" after the
// workdir), changes through it, then the same container started again
// with a kept container's options ("…/work,") over the same upper.
func storageContainer(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	m := storageMount(t, prog, s.home, s.rwOpts(",volatile"), s.merged)
	noWarnings(t, prog, m, "the plain container options")
	checkView(t, "the merged view of AUFS-format layers", s.merged, csView)

	mp := func(rel string) string { return filepath.Join(s.merged, rel) }
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	check("create new.txt", os.WriteFile(mp("new.txt"), []byte("new file\n"), 0o644))
	f, err := os.OpenFile(mp("keep.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString("appended\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	check("append to the lower keep.txt", err)
	check("remove the top layer's top.txt", os.Remove(mp("top.txt")))
	check("remove the bottom layer's bin/tool", os.Remove(mp("bin/tool")))
	check("remove the lower directory dir", os.RemoveAll(mp("dir")))
	check("chmod the lower etc/passwd", os.Chmod(mp("etc/passwd"), 0o600))
	check("create opq/more.txt in the opaque dir", os.WriteFile(mp("opq/more.txt"), []byte("more\n"), 0o644))
	after := []string{
		"bin d 755",
		"etc d 755",
		"etc/passwd f 600 \"root:x:0:0:root:/root:/bin/sh\\n\"",
		"home d 755",
		"home/user d 755",
		"home/user/own.txt f 644 \"own\\n\"",
		"keep.txt f 644 \"top\\nappended\\n\"",
		"new.txt f 644 \"new file\\n\"",
		"opq d 755",
		"opq/more.txt f 644 \"more\\n\"",
		"opq/new.txt f 644 \"new\\n\"",
	}
	checkView(t, "after the changes", s.merged, after)
	m.unmount(t)

	// What the mount left in the upper layer.
	for _, rel := range []string{"top.txt", "bin/tool", "dir"} {
		wf := whiteoutFormat(s.upper, rel)
		if wf == "" {
			t.Errorf("upper has no whiteout for the removed %s", rel)
		}
		t.Logf("%s: whiteout of %s in upper: %s", prog.name, rel, wf)
	}
	for rel, want := range map[string]string{"new.txt": "new file\n", "keep.txt": "top\nappended\n"} {
		if got, err := os.ReadFile(filepath.Join(s.upper, rel)); err != nil || string(got) != want {
			t.Errorf("upper %s = %q, %v; want %q", rel, got, err, want)
		}
	}

	// podman start of the same container: a kept container's options.
	m2 := storageMount(t, prog, s.home, s.rwOpts(""), s.merged)
	checkView(t, "mounted again over the same upper", s.merged, after)
	m2.unmount(t)
}

// storageReadOnly: the mount containers/storage makes of one image layer
// (podman commit, diff, image mount): lowerdir=<diff>:<empty>, no upper.
func storageReadOnly(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	m := storageMount(t, prog, s.home, "lowerdir="+s.top+":"+s.topEmpty, s.topMerge)
	noWarnings(t, prog, m, "a read-only layer mount")
	checkView(t, "a read-only mount of the top layer alone", s.topMerge, []string{
		"etc d 755",
		"keep.txt f 644 \"top\\n\"",
		"opq d 755",
		"opq/new.txt f 644 \"new\\n\"",
		"top.txt f 644 \"top only\\n\"",
	})
	err := os.WriteFile(filepath.Join(s.topMerge, "x"), nil, 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("creating a file on the read-only mount: %v, want EROFS", err)
	}
	if err := os.Remove(filepath.Join(s.topMerge, "top.txt")); !errors.Is(err, syscall.EROFS) {
		t.Errorf("removing a file on the read-only mount: %v, want EROFS", err)
	}
	m.unmount(t)
}

// storageContextXino: the data options containers/storage may add, an
// SELinux label quoted with a comma inside it and xino=off. They may be
// ignored with a warning, but must not break the mount, and the comma in
// the quotes must not split the option.
func storageContextXino(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	opts := s.rwOpts(`,volatile,xino=off,context="system_u:object_r:container_file_t:s0:c1,c2"`)
	m := storageMount(t, prog, s.home, opts, s.merged)
	ws := warnings(m.stderr)
	t.Logf("%s warnings for context=/xino=: %q", prog.name, ws)
	for _, w := range ws {
		split := strings.Contains(w, "c2") && !strings.Contains(w, "c1,c2")
		switch {
		case split && prog.name == "goverlay":
			t.Errorf("goverlay split the quoted context label at its comma: %q", w)
		case split:
			// fuse-overlayfs 1.10: "unknown argument ignored: c2\"";
			// harmless, as it ignores context= anyway.
			t.Logf("%s splits the quoted context label at its comma: %q", prog.name, w)
		case strings.Contains(w, "volatile") || strings.Contains(w, "lowerdir"):
			t.Errorf("%s warned about a supported option: %q", prog.name, w)
		}
	}
	checkView(t, "with context= and xino=off", s.merged, csView)
	if err := os.WriteFile(filepath.Join(s.merged, "new.txt"), []byte("x"), 0o644); err != nil {
		t.Errorf("write with context= and xino=off: %v", err)
	}
	m.unmount(t)
}

// overflowID is /proc/sys/kernel/overflowuid (and gid), which unmapped ids
// are shown as.
func overflowID(t *testing.T, which string) int {
	data, err := os.ReadFile("/proc/sys/kernel/overflow" + which)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// asUser runs sh -c script with the given uid and gid (no supplementary
// groups) in dir.
func asUser(uid, gid int, dir, script string) error {
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// storageUIDMapping: uidmapping=:0:100000:65536,gidmapping=:0:100000:65536,
// as containers/storage passes `--uidmap 0:100000:65536` (ContainerID:
// HostID:Size triplets, each after a ":", the first one too), and the
// documented form without the leading colon. fuse-overlayfs's semantics, checked against 1.10: the
// layers keep container ids on disk, the mount shows host ids. An on-disk
// id N in [0,65536) is shown as 100000+N, an on-disk id outside it as the
// overflow id; a file created through the mount by host uid 100000+N is
// stored as N, one created by an unmapped uid (0) as the overflow id, and
// chown maps back the same way.
func storageUIDMapping(t *testing.T, prog mountProgram, extra string) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	// On disk: container ids. home/user is the container's uid 1000;
	// odd.txt is owned by an id the mapping does not cover.
	for _, p := range []string{filepath.Join(s.bottom, "home/user"), filepath.Join(s.bottom, "home/user/own.txt")} {
		if err := os.Lchown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	testutil.NewLayer(t, s.top).File("odd.txt", "odd\n", 0o644).Chown("odd.txt", 200000, 200000)
	testutil.OpenUp(t, s.merged)
	over := fmt.Sprintf("%d:%d", overflowID(t, "uid"), overflowID(t, "gid"))

	m := storageMount(t, prog, s.home, s.rwOpts(extra[1:]), s.merged)
	t.Logf("%s warnings for uidmapping=/gidmapping=: %q", prog.name, warnings(m.stderr))
	got := owners(t, s.merged)
	for rel, want := range map[string]string{
		".":                 "100000:100000", // the upper dir, 0:0 on disk
		"bin/tool":          "100000:100000",
		"etc":               "100000:100000",
		"home/user":         "101000:101000",
		"home/user/own.txt": "101000:101000",
		"odd.txt":           over,
	} {
		if got[rel] != want {
			t.Errorf("through uidmapping=0:100000:65536, %s is owned by %s, want %s (fuse-overlayfs's semantics: on-disk N shows as 100000+N, unmapped as the overflow id)", rel, got[rel], want)
		}
	}

	// The container's root is host uid 100000.
	if err := asUser(100000, 100000, s.merged, "echo by-container-root > created.txt"); err != nil {
		t.Errorf("uid 100000 creating a file in the mount's root (shown as owned by 100000): %v", err)
	} else if o := ownerOf(t, filepath.Join(s.upper, "created.txt")); o != "0:0" {
		t.Errorf("a file created through the mount by uid 100000 is stored as %s on disk, want 0:0", o)
	}
	if err := os.WriteFile(filepath.Join(s.merged, "by-root.txt"), []byte("x"), 0o644); err != nil {
		t.Errorf("root creating a file through the mount: %v", err)
	} else if o := ownerOf(t, filepath.Join(s.upper, "by-root.txt")); o != over {
		t.Errorf("a file created through the mount by the unmapped uid 0 is stored as %s on disk, want the overflow id %s", o, over)
	}
	if err := os.Lchown(filepath.Join(s.merged, "etc/passwd"), 101000, 101000); err != nil {
		t.Errorf("chown 101000:101000 of a lower file through the mount: %v", err)
	} else {
		if o := ownerOf(t, filepath.Join(s.merged, "etc/passwd")); o != "101000:101000" {
			t.Errorf("after chown 101000:101000 through the mount, it shows %s", o)
		}
		if o := ownerOf(t, filepath.Join(s.upper, "etc/passwd")); o != "1000:1000" {
			t.Errorf("chown 101000:101000 through the mount is stored as %s on disk, want 1000:1000", o)
		}
	}
	m.unmount(t)
}

// storageSquash: squash_to_uid=H,squash_to_gid=H, which containers/storage
// passes for a single-id, size-1 mapping (--uidmap 0:H:1): every file is
// shown as owned by H:H, and chown through the mount does not fail.
func storageSquash(t *testing.T, prog mountProgram) {
	const h = "4321:4321"
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	if err := os.Lchown(filepath.Join(s.bottom, "home/user/own.txt"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	m := storageMount(t, prog, s.home, s.rwOpts(",squash_to_uid=4321,squash_to_gid=4321"), s.merged)
	t.Logf("%s warnings for squash_to_uid=/squash_to_gid=: %q", prog.name, warnings(m.stderr))
	if err := os.WriteFile(filepath.Join(s.merged, "new.txt"), []byte("x"), 0o644); err != nil {
		t.Errorf("creating a file through the mount: %v", err)
	}
	got := owners(t, s.merged)
	var rels []string
	for rel := range got {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	for _, rel := range rels {
		if got[rel] != h {
			t.Errorf("with squash_to_uid=4321,squash_to_gid=4321, %s is owned by %s, want %s", rel, got[rel], h)
		}
	}
	if err := os.Lchown(filepath.Join(s.merged, "keep.txt"), 5, 5); err != nil {
		t.Errorf("chown 5:5 through the squashing mount: %v, want success", err)
	}
	if o := ownerOf(t, filepath.Join(s.merged, "keep.txt")); o != h {
		t.Errorf("after chown 5:5 keep.txt shows %s, want %s", o, h)
	}
	m.unmount(t)
	// Differs between the two and is only recorded: fuse-overlayfs 1.10
	// applies the chown on disk (5:5), goverlay leaves the owner alone.
	t.Logf("%s: after chown 5:5 through the squashing mount, upper keep.txt is %s on disk; new.txt is %s",
		prog.name, ownerOf(t, filepath.Join(s.upper, "keep.txt")), ownerOf(t, filepath.Join(s.upper, "new.txt")))
}
