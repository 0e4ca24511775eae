package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// FixedTime is the mtime Layer.Finish gives every entry, so that two
// builds of one layer compare equal.
var FixedTime = time.Date(2020, 2, 2, 20, 20, 20, 202020, time.UTC)

// Layer builds a layer directory. Paths are relative to Root and use "/";
// every call fails the test on error. Parent directories are created 0755
// as needed. Modes are set explicitly, after any chown, so the umask and
// chown's clearing of suid/sgid do not interfere.
type Layer struct {
	t    testing.TB
	Root string
}

// NewLayer creates dir (and its parents) and returns a builder for it.
func NewLayer(t testing.TB, dir string) *Layer {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &Layer{t: t, Root: dir}
}

// P is the absolute path of rel.
func (l *Layer) P(rel string) string { return filepath.Join(l.Root, rel) }

func (l *Layer) check(err error) {
	l.t.Helper()
	if err != nil {
		l.t.Fatal(err)
	}
}

func (l *Layer) parent(rel string) string {
	l.t.Helper()
	p := l.P(rel)
	l.check(os.MkdirAll(filepath.Dir(p), 0o755))
	return p
}

// File writes a regular file.
func (l *Layer) File(rel, content string, mode os.FileMode) *Layer {
	l.t.Helper()
	p := l.parent(rel)
	l.check(os.WriteFile(p, []byte(content), mode))
	l.check(unix.Chmod(p, uint32(mode.Perm())|unixSpecial(mode)))
	return l
}

// Dir makes a directory (no error if it exists) and sets its mode.
func (l *Layer) Dir(rel string, mode os.FileMode) *Layer {
	l.t.Helper()
	p := l.parent(rel)
	if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
		l.t.Fatal(err)
	}
	l.check(unix.Chmod(p, uint32(mode.Perm())|unixSpecial(mode)))
	return l
}

// Chmod sets mode bits, with suid/sgid/sticky as os.ModeSetuid etc.
func (l *Layer) Chmod(rel string, mode os.FileMode) *Layer {
	l.t.Helper()
	l.check(unix.Chmod(l.P(rel), uint32(mode.Perm())|unixSpecial(mode)))
	return l
}

func unixSpecial(m os.FileMode) uint32 {
	var s uint32
	if m&os.ModeSetuid != 0 {
		s |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		s |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		s |= unix.S_ISVTX
	}
	return s
}

// Symlink makes rel point to target.
func (l *Layer) Symlink(rel, target string) *Layer {
	l.t.Helper()
	l.check(os.Symlink(target, l.parent(rel)))
	return l
}

// Link makes a hard link newRel to oldRel.
func (l *Layer) Link(oldRel, newRel string) *Layer {
	l.t.Helper()
	l.check(os.Link(l.P(oldRel), l.parent(newRel)))
	return l
}

// Mknod makes a node of type and mode (unix.S_IFIFO|0644, ...) and device.
func (l *Layer) Mknod(rel string, mode uint32, major, minor uint32) *Layer {
	l.t.Helper()
	p := l.parent(rel)
	l.check(unix.Mknod(p, mode, int(unix.Mkdev(major, minor))))
	l.check(unix.Chmod(p, mode&0o7777))
	return l
}

// Whiteout makes a kernel-format whiteout: a char device 0/0.
func (l *Layer) Whiteout(rel string) *Layer {
	l.t.Helper()
	return l.Mknod(rel, unix.S_IFCHR, 0, 0)
}

// AufsWhiteout makes the AUFS whiteout ".wh.NAME" for rel.
func (l *Layer) AufsWhiteout(rel string) *Layer {
	l.t.Helper()
	return l.File(filepath.Join(filepath.Dir(rel), ".wh."+filepath.Base(rel)), "", 0o644)
}

// Opaque marks directory rel opaque with trusted.overlay.opaque=y.
func (l *Layer) Opaque(rel string) *Layer {
	l.t.Helper()
	return l.Xattr(rel, "trusted.overlay.opaque", "y")
}

// AufsOpaque marks directory rel opaque with a ".wh..wh..opq" file.
func (l *Layer) AufsOpaque(rel string) *Layer {
	l.t.Helper()
	return l.File(filepath.Join(rel, ".wh..wh..opq"), "", 0o644)
}

// Xattr sets an xattr on rel without following a symlink.
func (l *Layer) Xattr(rel, name, value string) *Layer {
	l.t.Helper()
	l.check(unix.Lsetxattr(l.P(rel), name, []byte(value), 0))
	return l
}

// Chown sets the owner without following a symlink.
func (l *Layer) Chown(rel string, uid, gid int) *Layer {
	l.t.Helper()
	l.check(os.Lchown(l.P(rel), uid, gid))
	return l
}

// Setfacl runs setfacl with args on rel (skips the test without setfacl).
func (l *Layer) Setfacl(rel string, args ...string) *Layer {
	l.t.Helper()
	if _, err := exec.LookPath("setfacl"); err != nil {
		l.t.Skip("setfacl not installed (package acl)")
	}
	out, err := exec.Command("setfacl", append(args, l.P(rel))...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("setfacl %q %s: %v: %s", args, rel, err, out)
	}
	return l
}

// Finish sets every entry's mtime (and atime) to FixedTime, deepest first
// so that setting a child does not change its directory afterwards.
func (l *Layer) Finish() *Layer {
	l.t.Helper()
	var paths []string
	l.check(filepath.Walk(l.Root, func(p string, _ os.FileInfo, err error) error {
		paths = append(paths, p)
		return err
	}))
	ts := []unix.Timespec{unix.NsecToTimespec(FixedTime.UnixNano()), unix.NsecToTimespec(FixedTime.UnixNano())}
	for i := len(paths) - 1; i >= 0; i-- {
		l.check(unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], ts, unix.AT_SYMLINK_NOFOLLOW))
	}
	return l
}
