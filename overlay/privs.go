package overlay

import (
	"context"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/privs"
)

// killPrivs removes suid, sgid (with g+x) and security.capability from the
// regular file n, because the kernel asked (a KILL_SUIDGID flag: a write, a
// truncate or a chown by a caller without CAP_FSETID). With NOSEC the kernel
// asks once per inode and attribute refresh; this makes the ask cheap too:
// once a check found the file clean, NoSec answers until something that can
// change it happens (invalidateNoSec).
//
// Preconditions: n.locMu is held for reading.
func (n *node) killPrivs() error {
	c := &n.ofs.privs
	if n.nosec.Known() {
		c.Skipped.Add(1)
		return nil
	}
	return n.killPrivsNow()
}

// killPrivsNow strips n whatever NoSec says.
//
// Preconditions: n.locMu is held for reading.
func (n *node) killPrivsNow() error {
	c := &n.ofs.privs
	c.Checks.Add(1)
	gen := n.nosec.Begin()
	if n.gone() {
		return syscall.ENOENT
	}
	par, name := n.location()
	var st unix.Stat_t
	if err := par.Stat(name, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	var k privs.Killed
	var clean bool
	err := par.DoPath(name, func(p string) error {
		return par.Do(func(fd int) error {
			var err error
			k, clean, err = privs.Strip(privs.File{Dir: fd, Name: name, ProcPath: p}, st.Mode)
			return err
		})
	})
	c.Count(k)
	if err != nil {
		return err
	}
	if clean {
		n.nosec.Set(gen)
	}
	return nil
}

// killIfAsked runs killPrivs when the request of ctx carries a kill flag.
func (n *node) killIfAsked(ctx context.Context) error {
	if !n.ofs.raw.killRequested(ctx) {
		return nil
	}
	n.locMu.RLock()
	defer n.locMu.RUnlock()
	return n.killPrivs()
}

// invalidateNoSec forgets that n is clean. Called, after the change, from
// each place that can give a file suid, sgid or a capability:
//   - Setattr: chmod, chown;
//   - Setxattr, Removexattr: any security.* name (as the kernel's
//     __vfs_setxattr_noperm() clears S_NOSEC);
//   - copyUp: the upper file is a new file;
//   - Rename: the name now leads to the moved file.
func (n *node) invalidateNoSec() { n.nosec.Clear() }

// isSecurityXattr reports whether setting or removing attr can change what
// privilege removal has to do.
func isSecurityXattr(attr string) bool { return strings.HasPrefix(attr, "security.") }

// capGetxattr answers GETXATTR(security.capability), the request the kernel
// makes before writes until it trusts S_NOSEC. With NOSEC on and the file
// known clean, the answer needs no syscall. With NOSEC off the upper layer
// is always asked: that is what off means.
func (n *node) capGetxattr() (answered bool) {
	n.ofs.privs.CapGetxattr.Add(1)
	if n.ofs.nosec && n.nosec.Known() {
		n.ofs.privs.CapGetxattrCached.Add(1)
		return true
	}
	return false
}
