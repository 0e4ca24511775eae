package reliability_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// permOp is one operation run as the unprivileged test user; it returns
// the error and, for reads, what it saw.
type permOp struct {
	what string
	fn   func(mnt string) (string, error)
}

func pe(what string, fn func(p func(string) string) error) permOp {
	return permOp{what, func(mnt string) (string, error) {
		return "", fn(func(rel string) string { return filepath.Join(mnt, rel) })
	}}
}

// permOps are pjdfstest-style checks: chmod, chown, link, rename, unlink,
// open, truncate, utimes, xattrs, mkdir, symlink and mknod as a user other
// than the owner, in sticky, 0700, read-only and writable directories, on
// files owned by root, by the user and by another user.
func permOps(uid, gid int) []permOp {
	ts := []unix.Timespec{unix.NsecToTimespec(1e9), unix.NsecToTimespec(2e9)}
	openErr := func(flags int) func(p func(string) string, rel string) error {
		return func(p func(string) string, rel string) error {
			fd, err := unix.Open(p(rel), flags|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}
	}
	rd, wr, creat := openErr(unix.O_RDONLY), openErr(unix.O_WRONLY), openErr(unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL)
	return []permOp{
		pe("chmod root's file", func(p func(string) string) error { return unix.Chmod(p("rootfile"), 0o666) }),
		pe("chmod own file", func(p func(string) string) error { return unix.Chmod(p("userfile"), 0o600) }),
		pe("chown own file to another user", func(p func(string) string) error { return unix.Chown(p("userfile"), 65534, 65534) }),
		pe("chown own file to itself", func(p func(string) string) error { return unix.Chown(p("userfile"), uid, gid) }),
		pe("chgrp own file to a group not its own", func(p func(string) string) error { return unix.Chown(p("userfile"), -1, 0) }),
		pe("chmod g+s own file of another group (sgid dropped)", func(p func(string) string) error { return unix.Chmod(p("usergrp"), 0o2755) }),
		pe("chmod root's file in own directory", func(p func(string) string) error { return unix.Chmod(p("userdir/rootf"), 0o600) }),
		pe("link root's 0600 file (protected_hardlinks)", func(p func(string) string) error { return unix.Link(p("rootsecret"), p("open/ln")) }),
		pe("link own file", func(p func(string) string) error { return unix.Link(p("userfile"), p("open/ln2")) }),
		pe("rename other's file in sticky dir", func(p func(string) string) error { return unix.Rename(p("sticky/others"), p("sticky/x")) }),
		pe("rename own file in sticky dir", func(p func(string) string) error { return unix.Rename(p("sticky/mine"), p("sticky/mine2")) }),
		pe("rename own file onto other's in sticky dir", func(p func(string) string) error { return unix.Rename(p("sticky/mine2"), p("sticky/others")) }),
		pe("unlink other's file in sticky dir", func(p func(string) string) error { return unix.Unlink(p("sticky/others")) }),
		pe("unlink root's file in sticky dir", func(p func(string) string) error { return unix.Unlink(p("sticky/rootf")) }),
		pe("rmdir other's dir in sticky dir", func(p func(string) string) error { return unix.Rmdir(p("sticky/otherdir")) }),
		pe("unlink own file in sticky dir", func(p func(string) string) error { return unix.Unlink(p("sticky/mine2")) }),
		pe("open root's 0644 file for writing", func(p func(string) string) error { return wr(p, "rootfile") }),
		pe("open root's 0600 file for reading", func(p func(string) string) error { return rd(p, "rootsecret") }),
		pe("open root's 0666 file for writing (copy-up as the user)", func(p func(string) string) error { return wr(p, "rootrw") }),
		pe("open other's 0644 file O_TRUNC", func(p func(string) string) error { return openErr(unix.O_WRONLY|unix.O_TRUNC)(p, "otherfile") }),
		pe("truncate root's 0644 file", func(p func(string) string) error { return unix.Truncate(p("rootfile"), 1) }),
		pe("truncate root's 0666 file", func(p func(string) string) error { return unix.Truncate(p("rootrw"), 3) }),
		pe("utimes explicit on root's file", func(p func(string) string) error { return unix.UtimesNano(p("rootfile"), ts) }),
		pe("utimes explicit on root's 0666 file", func(p func(string) string) error { return unix.UtimesNano(p("rootrw"), ts) }),
		pe("utimes now on root's 0666 file", func(p func(string) string) error {
			return unix.UtimesNanoAt(unix.AT_FDCWD, p("rootrw"), nil, 0)
		}),
		pe("utimes now on root's 0644 file", func(p func(string) string) error {
			return unix.UtimesNanoAt(unix.AT_FDCWD, p("rootfile"), nil, 0)
		}),
		pe("utimes explicit on own file", func(p func(string) string) error { return unix.UtimesNano(p("userfile"), ts) }),
		pe("stat in a 0700 root dir", func(p func(string) string) error { var st unix.Stat_t; return unix.Lstat(p("private/f"), &st) }),
		pe("list a 0700 root dir", func(p func(string) string) error { return rd(p, "private") }),
		pe("create in a 0700 root dir", func(p func(string) string) error { return creat(p, "private/new") }),
		pe("mkdir in a 0755 root dir", func(p func(string) string) error { return unix.Mkdir(p("ro/newdir"), 0o755) }),
		pe("create in a 0755 root dir", func(p func(string) string) error { return creat(p, "ro/new") }),
		pe("unlink in a 0755 root dir", func(p func(string) string) error { return unix.Unlink(p("ro/f")) }),
		pe("rename out of a 0755 root dir", func(p func(string) string) error { return unix.Rename(p("ro/f"), p("open/f")) }),
		pe("symlink in a 0755 root dir", func(p func(string) string) error { return unix.Symlink("t", p("ro/sl")) }),
		pe("create in a 0777 dir", func(p func(string) string) error { return creat(p, "open/newfile") }),
		pe("mkdir in a 0777 dir", func(p func(string) string) error { return unix.Mkdir(p("open/newdir"), 0o700) }),
		pe("rename root's file in a 0777 dir", func(p func(string) string) error { return unix.Rename(p("open/rootf"), p("open/rootf2")) }),
		pe("unlink own file in a 0777 dir", func(p func(string) string) error { return unix.Unlink(p("open/mine")) }),
		pe("symlink in a 0777 dir", func(p func(string) string) error { return unix.Symlink("target", p("open/sl")) }),
		pe("mkfifo in a 0777 dir", func(p func(string) string) error { return unix.Mknod(p("open/fifo"), unix.S_IFIFO|0o640, 0) }),
		pe("create in own new dir", func(p func(string) string) error { return creat(p, "open/newdir/f") }),
		pe("setxattr on root's 0644 file", func(p func(string) string) error { return unix.Setxattr(p("rootfile"), "user.x", []byte("1"), 0) }),
		pe("setxattr on own file", func(p func(string) string) error { return unix.Setxattr(p("userfile"), "user.x", []byte("1"), 0) }),
		pe("removexattr on root's file", func(p func(string) string) error { return unix.Removexattr(p("rootxattr"), "user.r") }),
		pe("setxattr trusted.* on own file", func(p func(string) string) error {
			return unix.Setxattr(p("userfile"), "trusted.x", []byte("1"), 0)
		}),
		pe("unlink root's file in own dir", func(p func(string) string) error { return unix.Unlink(p("userdir/rootf")) }),
		pe("rmdir own dir in the root-owned mount root", func(p func(string) string) error { return unix.Rmdir(p("userdir")) }),
		pe("access W_OK on root's 0644 file", func(p func(string) string) error {
			return unix.Faccessat(unix.AT_FDCWD, p("rootfile"), unix.W_OK, unix.AT_EACCESS)
		}),
		pe("access X_OK on a 0644 file", func(p func(string) string) error {
			return unix.Faccessat(unix.AT_FDCWD, p("userfile"), unix.X_OK, unix.AT_EACCESS)
		}),
		{"read root's 0644 file", func(mnt string) (string, error) {
			b, err := os.ReadFile(filepath.Join(mnt, "rootfile"))
			return string(b), err
		}},
		{"read own copied-up file", func(mnt string) (string, error) {
			b, err := os.ReadFile(filepath.Join(mnt, "rootrw"))
			return string(b), err
		}},
	}
}

// buildPerm is the lower layer of the permission checks (uid:gid is the
// test user's).
func buildPerm(uid, gid int) func(l []*testutil.Layer, _ *testutil.Layer) {
	return func(ls []*testutil.Layer, _ *testutil.Layer) {
		l := ls[0]
		l.File("rootfile", "root's\n", 0o644).File("rootsecret", "secret\n", 0o600).File("rootrw", "rw\n", 0o666).
			File("rootxattr", "x", 0o644).Xattr("rootxattr", "user.r", "1").
			File("userfile", "mine\n", 0o644).Chown("userfile", uid, gid).
			File("usergrp", "grp\n", 0o755).Chown("usergrp", uid, 0).Chmod("usergrp", 0o755).
			File("otherfile", "other\n", 0o644).Chown("otherfile", 65534, 65534).
			Dir("sticky", os.ModeSticky|0o777).
			File("sticky/mine", "m", 0o644).Chown("sticky/mine", uid, gid).
			File("sticky/others", "o", 0o644).Chown("sticky/others", 65534, 65534).
			File("sticky/rootf", "r", 0o644).
			Dir("sticky/otherdir", 0o777).Chown("sticky/otherdir", 65534, 65534).Chmod("sticky/otherdir", 0o777).
			Dir("private", 0o700).File("private/f", "p", 0o644).Chmod("private", 0o700).
			Dir("ro", 0o755).File("ro/f", "ro", 0o644).
			Dir("open", 0o777).File("open/rootf", "rf", 0o644).File("open/mine", "m", 0o644).Chown("open/mine", uid, gid).Chmod("open", 0o777).
			Dir("userdir", 0o755).File("userdir/rootf", "rf", 0o644).Chown("userdir", uid, gid).Chmod("userdir", 0o755)
	}
}

// TestUnprivilegedLikeKernel runs permOps as the unprivileged test user
// (its own uid and gid, no supplementary groups, no capabilities) on
// goverlay and on the kernel overlay over identical layers: every
// operation must fail or succeed alike, with the same errno and the same
// data read, and both must end with the same tree.
func TestUnprivilegedLikeKernel(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	uid, gid := testutil.TestUser(t)
	start := time.Now()
	build := buildPerm(uid, gid)
	ks, gs := newStack(t, 1, build), newStack(t, 1, build)
	testutil.OpenUp(t, ks.base)
	testutil.OpenUp(t, gs.base)
	kmnt := mountK(t, ks)
	g := mountG(t, gs)
	ops := permOps(uid, gid)
	run := func(mnt string) []string {
		var res []string
		err := testutil.AsUser(uid, gid, nil, func() {
			for _, op := range ops {
				out, err := op.fn(mnt)
				var e unix.Errno
				errors.As(err, &e)
				r := errName(e)
				if err != nil && e == 0 {
					r = err.Error()
				}
				if out != "" {
					r += " " + fmt.Sprintf("%q", out)
				}
				res = append(res, r)
			}
		})
		if err != nil {
			t.Fatalf("as uid %d: %v", uid, err)
		}
		return res
	}
	kres, gres := run(kmnt), run(g.Dir)
	var table []string
	for i, op := range ops {
		mark := " "
		if kres[i] != gres[i] {
			mark = "≠"
			t.Errorf("as uid %d, %s: goverlay %s, kernel %s", uid, op.what, gres[i], kres[i])
		}
		table = append(table, fmt.Sprintf("%s %-55s kernel %-10s goverlay %s", mark, op.what, kres[i], gres[i]))
	}
	t.Logf("results:\n%s", strings.Join(table, "\n"))
	// Controls: the checks test what they say on the kernel.
	for i, op := range ops {
		want := map[string]string{
			"chmod root's file": "EPERM", "create in a 0777 dir": "OK", "unlink other's file in sticky dir": "EPERM",
			"access W_OK on root's 0644 file": "EACCES", "rename own file in sticky dir": "OK",
		}[op.what]
		if want != "" && kres[i] != want {
			t.Errorf("control: kernel %s: %s", op.what, kres[i])
		}
	}
	gt := normalize(testutil.Snapshot(t, g.Dir), start)
	kt := normalize(testutil.Snapshot(t, kmnt), start)
	reportDiff(t, "the trees after the operations, goverlay vs kernel", diffTrees(gt, kt, "goverlay", "kernel"))
}
