package oracle_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// Operations of the metacopy scenarios: metadata changes that copy up no
// data with metacopy=on, and the data changes that then copy it in.

func (c *cx) chown(rel string, uid, gid int) {
	c.rec(fmt.Sprintf("chown %s %d:%d", rel, uid, gid), unix.Lchown(c.p(rel), uid, gid))
}

func (c *cx) chmod(rel string, mode uint32) {
	c.rec(fmt.Sprintf("chmod %s %o", rel, mode), unix.Chmod(c.p(rel), mode))
}

// touch sets rel's times without opening it (utimensat(2)).
func (c *cx) touch(rel string, sec int64) {
	ts := []unix.Timespec{{Sec: sec}, {Sec: sec}}
	c.rec(fmt.Sprintf("touch %s %d", rel, sec), unix.UtimesNanoAt(unix.AT_FDCWD, c.p(rel), ts, unix.AT_SYMLINK_NOFOLLOW))
}

func (c *cx) setxattr(rel, name, value string) {
	c.rec("setxattr "+rel+" "+name, unix.Lsetxattr(c.p(rel), name, []byte(value), 0))
}

func (c *cx) rmxattr(rel, name string) {
	c.rec("removexattr "+rel+" "+name, unix.Lremovexattr(c.p(rel), name))
}

func (c *cx) truncate(rel string, size int64) {
	c.rec(fmt.Sprintf("truncate %s %d", rel, size), unix.Truncate(c.p(rel), size))
}

// pwrite writes data at off into rel, opened without O_TRUNC.
func (c *cx) pwrite(rel string, off int64, data string) {
	f, err := os.OpenFile(c.p(rel), os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteAt([]byte(data), off)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	c.rec(fmt.Sprintf("pwrite %s %d", rel, off), err)
}

// read records rel's size, sha256 and attributes as stat(2) and read(2)
// give them, read both ways: read(2), and through a mapping.
func (c *cx) read(rel string) {
	b, err := os.ReadFile(c.p(rel))
	if err != nil {
		c.rec("read "+rel, err)
		return
	}
	var st unix.Stat_t
	if err := unix.Lstat(c.p(rel), &st); err != nil {
		c.rec("stat "+rel, err)
		return
	}
	mapped := "-"
	if len(b) > 0 {
		f, err := os.Open(c.p(rel))
		if err != nil {
			c.rec("open "+rel, err)
			return
		}
		m, err := unix.Mmap(int(f.Fd()), 0, len(b), unix.PROT_READ, unix.MAP_SHARED)
		f.Close()
		if err != nil {
			c.rec("mmap "+rel, err)
			return
		}
		mapped = fmt.Sprintf("%x", sha256.Sum256(m))[:12]
		unix.Munmap(m)
	}
	c.out = append(c.out, fmt.Sprintf("read %s: %d bytes %x mmap %s mode %o %d:%d blocks %d nlink %d",
		rel, len(b), sha256.Sum256(b), mapped, st.Mode, st.Uid, st.Gid, st.Blocks, st.Nlink))
}

// readAll reads every name given.
func (c *cx) readAll(rels ...string) {
	for _, r := range rels {
		c.read(r)
	}
}

// aclUser1000 is the system.posix_acl_access value of "u::rw-,u:1000:r--,
// g::r--,m::r--,o::r--" (Linux: include/uapi/linux/posix_acl_xattr.h).
var aclUser1000 = func() string {
	b := []byte{2, 0, 0, 0}
	for _, e := range [][3]uint32{{0x01, 6, 0xffffffff}, {0x02, 4, 1000}, {0x04, 4, 0xffffffff}, {0x10, 4, 0xffffffff}, {0x20, 4, 0xffffffff}} {
		b = append(b, byte(e[0]), byte(e[0]>>8), byte(e[1]), byte(e[1]>>8), byte(e[2]), byte(e[2]>>8), byte(e[2]>>16), byte(e[2]>>24))
	}
	return string(b)
}()

// bigContent is a file of several extents with a hole, so that a data
// copy-in is more than one copy.
func bigContent() string {
	var b strings.Builder
	for i := range 40000 {
		fmt.Fprintf(&b, "line %06d of the big file\n", i)
	}
	return b.String()
}

// metacopyScenarios are the cycling scenarios with metacopy=on: the metadata
// of lower files changed (chown -R, chmod, touch, xattrs), files moved and
// linked, in one layer; then the same again over those metacopy files
// pushed down (stacked); then their data written and truncated. Each step
// reads every file. Each overlay reads the other's layers with
// metacopy=on, and the uppers must match (which files are metacopy files,
// their sizes, st_blocks, redirects).
var metacopyScenarios = []cscenario{
	{
		name: "metacopy", metacopy: true,
		lower: func(t testing.TB, l *testutil.Layer) {
			l.File("t/a", "aaaa\n", 0o644).File("t/b", "bbbb\n", 0o644).File("t/sub/c", "cccc\n", 0o640)
			l.File("t/big", bigContent(), 0o644).File("t/suid", "#!/bin/sh\n", 0o4755).File("t/empty", "", 0o644)
			l.File("t/x", "xxxx\n", 0o644).Xattr("t/x", "user.x", "1").File("t/w", "wwww\n", 0o644)
			l.File("t/sub/d", "dddd\n", 0o644)
		},
		steps: []cstep{
			func(c *cx) {
				for _, r := range []string{"t", "t/a", "t/b", "t/sub", "t/sub/c", "t/sub/d", "t/big", "t/suid", "t/empty", "t/x", "t/w"} {
					c.chown(r, 1000, 1000) // chown -R; t/suid loses its suid bit
				}
				c.chmod("t/a", 0o600)
				c.touch("t/b", 1000000000)
				c.setxattr("t/sub/c", "user.y", "2")
				c.rmxattr("t/x", "user.x")
				c.mv("t/a", "t/a2")       // same directory: a relative redirect
				c.mv("t/b", "t/sub/b")    // another directory: an absolute one
				c.ln("t/sub/c", "t/c.ln") // a link: an absolute one
				c.readAll("t/a2", "t/sub/b", "t/sub/c", "t/c.ln", "t/big", "t/suid", "t/empty", "t/x", "t/w", "t/sub/d")
			},
			func(c *cx) {
				// Over the metacopy files of the layer below.
				c.chmod("t/a2", 0o640)
				c.mv("t/a2", "t/sub/a3")
				c.chmod("t/big", 0o600)
				c.touch("t/sub/b", 1100000000)
				c.chown("t/sub/d", 1001, 1001)
				c.readAll("t/sub/a3", "t/sub/b", "t/big", "t/sub/d", "t/c.ln")
			},
			func(c *cx) {
				// The data: appended, written in the middle, truncated
				// up and down, rewritten with O_TRUNC.
				c.append("t/sub/a3", "more\n")
				c.pwrite("t/big", 100000, "in the middle")
				c.truncate("t/sub/b", 3)
				c.truncate("t/x", 100)
				c.write("t/c.ln", "new\n")
				c.append("t/sub/d", "+\n")
				c.readAll("t/sub/a3", "t/big", "t/sub/b", "t/x", "t/c.ln", "t/sub/c", "t/sub/d", "t/w", "t/suid")
			},
		},
		checkUpper: func(t testing.TB, i int, kl testutil.Tree) {
			meta := func(rel string) bool {
				n := kl[rel]
				if n == nil {
					return false
				}
				_, ok := n.Xattrs["trusted.overlay.metacopy"]
				return ok
			}
			redirect := func(rel string) string {
				if n := kl[rel]; n != nil {
					return n.Xattrs["trusted.overlay.redirect"]
				}
				return ""
			}
			switch i {
			case 0:
				for _, r := range []string{"t/a2", "t/sub/b", "t/sub/c", "t/c.ln", "t/big", "t/suid", "t/empty", "t/x", "t/w", "t/sub/d"} {
					claim(t, meta(r), "%s is a metacopy file", r)
				}
				claim(t, redirect("t/a2") == "a" && redirect("t/sub/b") == "/t/b" && redirect("t/c.ln") == "/t/sub/c",
					"redirects %q %q %q", redirect("t/a2"), redirect("t/sub/b"), redirect("t/c.ln"))
				claim(t, kl["t/big"].Size == int64(len(bigContent())) && kl["t/big"].Blocks < 64, "t/big a hole")
			case 1:
				claim(t, meta("t/sub/a3") && meta("t/big") && redirect("t/sub/a3") == "/t/a2", "stacked metacopy files")
			case 2:
				for _, r := range []string{"t/sub/a3", "t/big", "t/sub/b", "t/x", "t/c.ln", "t/sub/d"} {
					claim(t, kl[r] != nil && !meta(r), "%s has its data", r)
				}
			}
		},
		check: func(t testing.TB, kt testutil.Tree) {
			claim(t, kt["t/sub/a3"] != nil && kt["t/sub/a3"].Size == 10 && kt["t/c.ln"].Size == 4 && kt["t/sub/c"].Size == 5 && kt["t/sub/b"].Size == 3,
				"data written to the metacopy files")
			claim(t, kt["t/suid"].Mode&0o4000 == 0 && kt["t/suid"].UID == 1000, "chown cleared suid")
		},
	},
	{
		// Within one layer: the data written through one name of a
		// hard-linked metacopy file shows under the other; a moved one
		// truncated to 0 and written; a metacopy file mapped and read
		// while another name of it is written.
		name: "metacopy-one-layer", metacopy: true,
		lower: func(t testing.TB, l *testutil.Layer) {
			l.File("t/f", "ffff\n", 0o644).File("t/g", bigContent(), 0o644).File("t/h", "hhhh\n", 0o755)
			l.File("t/acl", "acl\n", 0o644)
		},
		steps: []cstep{
			func(c *cx) {
				c.chown("t/f", 1000, 1000)
				c.ln("t/f", "t/f.ln")
				c.read("t/f.ln")
				c.append("t/f.ln", "more\n")
				c.readAll("t/f", "t/f.ln")
				c.mkdir("u")
				c.mv("t/g", "u/g")
				c.read("u/g")
				c.truncate("u/g", 0)
				c.append("u/g", "g\n")
				c.chmod("t/h", 0o700)
				c.pwrite("t/h", 2, "HH")
				c.setxattr("t/acl", "system.posix_acl_access", aclUser1000) // setfacl -m u:1000:r
				c.readAll("u/g", "t/h", "t/acl")
			},
			func(c *cx) { c.chmod("t/f", 0o600); c.readAll("t/f", "t/f.ln", "u/g", "t/h") },
		},
		checkUpper: func(t testing.TB, i int, kl testutil.Tree) {
			if i == 0 {
				claim(t, kl["t/f"] != nil && kl["t/f"].Size == 10 && kl["t/f.ln"] != nil, "linked metacopy file written")
				_, meta := kl["t/acl"].Xattrs["trusted.overlay.metacopy"]
				claim(t, meta && kl["t/acl"].Xattrs["system.posix_acl_access"] != "", "an ACL set by a metacopy copy-up")
			}
		},
	},
}

// TestMetacopyCrashBeforeCommit: a data copy-in cut short by a crash (the
// data partly written into the upper file, overlay.metacopy still there)
// leaves a file that reads its lower data, on goverlay and on the kernel;
// and a metacopy file keeps its inode number across the copy-up and a
// remount.
func TestMetacopyCrashBeforeCommit(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	base := t.TempDir()
	l := testutil.NewLayer(t, base+"/lower")
	l.File("f", bigContent(), 0o644)
	l.Finish()
	up, work := base+"/upper", base+"/work"
	for _, d := range []string{up, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := testutil.Options{Lower: []string{l.Root}, Upper: up, Work: work, Extra: goverlayMetacopyOpts}
	g := testutil.Mount(t, opts)
	var before, after unix.Stat_t
	if err := unix.Stat(g.Dir+"/f", &before); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chown(g.Dir+"/f", 1000, 1000); err != nil {
		t.Fatal(err)
	}
	g.Unmount(t)
	if _, err := unix.Getxattr(up+"/f", "trusted.overlay.metacopy", nil); err != nil {
		t.Fatalf("chown did not make a metacopy file: %v", err)
	}
	// What a crash in the middle of the copy-in leaves.
	junk := bytes.Repeat([]byte("junk"), 4096)
	f, err := os.OpenFile(up+"/f", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(junk, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()

	g = testutil.Mount(t, opts)
	if b, err := os.ReadFile(g.Dir + "/f"); err != nil || string(b) != bigContent() {
		t.Errorf("goverlay after the crash: %d bytes, %v; want the lower data", len(b), err)
	}
	if err := unix.Stat(g.Dir+"/f", &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino || after.Uid != 1000 {
		t.Errorf("ino %d uid %d, want %d 1000", after.Ino, after.Uid, before.Ino)
	}
	g.Unmount(t)
	k := testutil.KernelOverlay(t, []string{l.Root}, up, work, kernelMetacopyOpts...)
	if b, err := os.ReadFile(k + "/f"); err != nil || string(b) != bigContent() {
		t.Errorf("the kernel after the crash: %d bytes, %v; want the lower data", len(b), err)
	}
	testutil.UnmountKernel(t, k)
}

// TestMetacopyOffRefusesLikeKernel: without metacopy=on, a metacopy file on
// disk (the kernel's, here) is refused as the kernel refuses it, with
// EPERM whether its data exists or not, in a lower layer or the upper one;
// its neighbours read normally. With metacopy=on, one without data is EIO.
func TestMetacopyOffRefusesLikeKernel(t *testing.T) {
	testutil.RequireRoot(t)
	sameBinary(t)
	base := t.TempDir()
	l := testutil.NewLayer(t, base+"/lower")
	l.File("f", "data\n", 0o644).File("gone", "gone\n", 0o644).File("plain", "plain\n", 0o644)
	l.Finish()
	up, work := base+"/upper", base+"/work"
	for _, d := range []string{up, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k := testutil.KernelOverlay(t, []string{l.Root}, up, work, kernelMetacopyOpts...)
	for _, f := range []string{"f", "gone"} {
		if err := unix.Chown(k+"/"+f, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	testutil.UnmountKernel(t, k)
	// Its data gone: the upper pushed down over a lower without it.
	l2 := testutil.NewLayer(t, base+"/lower2")
	l2.File("f", "data\n", 0o644).File("plain", "plain\n", 0o644)
	l2.Finish()
	stack := []string{up, l2.Root}

	outcome := func(mnt string) string {
		var out []string
		for _, f := range []string{"f", "gone", "plain"} {
			_, err := os.ReadFile(mnt + "/" + f)
			out = append(out, f+": "+errnoString(err))
		}
		return strings.Join(out, ", ")
	}
	want := "f: EPERM, gone: EPERM, plain: ok"
	k = testutil.KernelOverlay(t, stack, "", "", kernelROOpts...)
	if got := outcome(k); got != want {
		t.Errorf("the kernel: %s, want %s (the test is wrong)", got, want)
	}
	testutil.UnmountKernel(t, k)
	g := testutil.Mount(t, testutil.Options{Lower: stack})
	if got := outcome(g.Dir); got != want {
		t.Errorf("goverlay: %s, want %s", got, want)
	}
	g.Unmount(t)
	want = "f: ok, gone: EIO, plain: ok"
	k = testutil.KernelOverlay(t, stack, "", "", kernelMetacopyROOpts...)
	if got := outcome(k); got != want {
		t.Errorf("the kernel metacopy=on: %s, want %s (the test is wrong)", got, want)
	}
	testutil.UnmountKernel(t, k)
	g = testutil.Mount(t, testutil.Options{Lower: stack, Extra: []string{"-o", "metacopy=on"}})
	if got := outcome(g.Dir); got != want {
		t.Errorf("goverlay metacopy=on: %s, want %s", got, want)
	}
	g.Unmount(t)

	// As an upper layer, the same; with metacopy=on there, EIO without
	// the data.
	for _, want := range []string{"f: EPERM, gone: EPERM, plain: ok", "f: ok, gone: EIO, plain: ok"} {
		kopts, gopts := kernelWriteOpts(true), goverlayWriteOpts(true)
		if strings.HasPrefix(want, "f: ok") {
			kopts, gopts = kernelMetacopyOpts, goverlayMetacopyOpts
		}
		k = testutil.KernelOverlay(t, []string{l2.Root}, up, work, kopts...)
		if got := outcome(k); got != want {
			t.Errorf("the kernel, upper: %s, want %s (the test is wrong)", got, want)
		}
		testutil.UnmountKernel(t, k)
		g = testutil.Mount(t, testutil.Options{Lower: []string{l2.Root}, Upper: up, Work: work, Extra: gopts})
		if got := outcome(g.Dir); got != want {
			t.Errorf("goverlay, upper: %s, want %s", got, want)
		}
		g.Unmount(t)
	}
}
