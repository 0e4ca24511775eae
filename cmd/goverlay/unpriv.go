package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

// haveSetuidFusermount is setuidFusermount, a hook for tests.
var haveSetuidFusermount = setuidFusermount

// checkUnprivileged checks, for a user other than root, what would
// otherwise fail half-way through the mount, after the workdir has been
// set up: layers the user cannot read, a mountpoint fusermount3 will not
// mount on, no fusermount3 to mount with. Root of a user namespace
// (unshare -r, rootless podman) counts as root here: it mounts FUSE
// itself, and every layer is its own.
func checkUnprivileged(c *config) error {
	if geteuid() == 0 {
		return nil
	}
	uid := geteuid()
	for _, r := range c.layerRefs() {
		if err := faccessat(unix.AT_FDCWD, r.path, unix.R_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
			return failf(exitBadLayer, "%s %s cannot be read by uid %d (%w); give that user read and search permission on it (chmod a+rX), or mount as root", r.role, show(r.path), uid, err)
		}
	}
	// fusermount3 mounts only on a directory the user may write to
	// (check_perm() in util/fusermount.c, libfuse).
	if err := faccessat(unix.AT_FDCWD, c.Mountpoint, unix.W_OK, unix.AT_EACCESS); err != nil {
		return failf(exitBadLayer, "mountpoint %s is not writable by uid %d; fusermount3 mounts only on a directory the user may write to: use one you own, or mount as root", show(c.Mountpoint), uid)
	}
	if !haveSetuidFusermount() {
		return failf(exitFuse, "no setuid-root fusermount3 on PATH (%s); a user other than root mounts FUSE through it: install fuse3, or mount as root", os.Getenv("PATH"))
	}
	return nil
}

// mountError says why the mount was refused in words: fusermount3 prints
// its reason on stderr itself, so goverlay points there instead of at a
// wait status.
func mountError(mnt string, err error) error {
	var fe *overlay.FusermountError
	if !errors.As(err, &fe) {
		return failf(exitMount, "mounting on %s failed: %w; run with -f -d to see the mount call", show(mnt), err)
	}
	how := fmt.Sprintf("exit status %d", fe.Status.ExitStatus())
	if fe.Status.Signaled() {
		how = "killed by " + unix.SignalName(fe.Status.Signal())
	}
	return failf(exitMount, "fusermount3 refused to mount on %s (%s; its reason is on the line above): a user other than root may mount only on a directory it may write to, and allow_other needs user_allow_other in /etc/fuse.conf", show(mnt), how)
}
