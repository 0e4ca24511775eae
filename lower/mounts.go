package lower

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Where a layer is opened.
//
// A layer is the directory tree of one filesystem as the kernel overlay
// takes it (Linux: fs/overlayfs/super.c ovl_get_layers() with
// clone_private_mount()): a private clone of the layer's mount, without
// the mounts inside it. A tmpfs mounted on L/sub, a bind mount, the
// overlay's own mountpoint bound into a layer: none is part of the layer,
// and the overlay shows L's own sub. So each layer root is opened through
// a detached, non-recursive clone of its mount (open_tree(2) with
// OPEN_TREE_CLONE), which keeps whatever the mount had (read-only, an
// id mapping) and lives as long as the daemon's fds in it; the upper
// layer and its workdir are opened through one clone of the mount that
// holds both, since a copy-up renames from one into the other and
// rename(2) does not cross mounts. Where the daemon may not clone (it
// needs CAP_SYS_ADMIN over the mount namespace; a mount with locked mounts
// under it cannot be cloned without them; a kernel before 5.2 has no
// open_tree(2)), a layer is opened in place and no walk enters a mount
// inside it: openDirAt refuses with EXDEV. A kernel before 5.12 clones
// but has no mount_setattr(2) to make the clone private: see openCloned.
//
// A clone's atime flags are the layer's access-time policy, as the kernel
// overlay sets its own clones' (atime.go): noatime for a lower layer, the
// mount's for the upper one.

// Cloned reports whether the layer was opened through a private clone of
// its mount (see above).
func (l *Layer) Cloned() bool { return l.cloned }

// openRoot opens directory path as a layer root: through a clone of its
// mount where it can and clone says so, in place otherwise. lacked is the
// feature whose absence (or mask) made it take a fallback, if any.
func openRoot(path string, clone bool, masked Features) (fd int, cloned bool, lacked Features, err error) {
	if clone {
		fds, notPrivate, err := openCloned(path, []string{"."}, Atime{Mode: Noatime}, masked)
		if err == nil {
			return fds[0], true, notPrivate, nil
		}
		lacked = lackedOf(err)
	}
	fd1, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	return fd1, false, lacked, err
}

// lackedOf is the feature a lackedErr names, or 0.
func lackedOf(err error) Features {
	var l lackedErr
	if errors.As(err, &l) {
		return l.f
	}
	return 0
}

// openCloned opens the directories rels, relative to dir, in one
// detached non-recursive clone of dir's mount with the atime flags of
// atime, and checks that each is the directory dir/rel is in the mount
// namespace (a mount inside dir on the way would make it another one). It
// fails with a lacked error where the kernel has no open_tree(2), or
// masked hides it; lacked says MountSetattr where the clone could not be
// made private (nor given its atime flags).
func openCloned(dir string, rels []string, atime Atime, masked Features) (fds []int, lacked Features, err error) {
	if masked.Has(OpenTree) {
		return nil, 0, lackedErr{OpenTree}
	}
	tfd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, 0, absent(OpenTree, err)
	}
	defer unix.Close(tfd)
	// Private, as clone_private_mount() makes it: a mount made later
	// under the layer, in a peer of its mount, does not appear in it.
	// Without mount_setattr(2) (before Linux 5.12) the clone stays in
	// its mount's peer group (clone_mnt()). It is still the layer
	// without the mounts inside it, which is the point; one made later
	// under the layer in a peer may appear in it, and is then refused
	// as a mount inside a layer opened in place is: EXDEV. That beats
	// opening the layer in place, where every mount inside it is.
	switch {
	case masked.Has(MountSetattr):
		lacked = MountSetattr
	default:
		err := unix.MountSetattr(tfd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Propagation: unix.MS_PRIVATE})
		if errors.Is(err, unix.ENOSYS) {
			lacked = MountSetattr
		} else if err != nil {
			return nil, 0, err
		}
	}
	if lacked == 0 {
		// Best effort: a mount whose atime flags are locked (one a
		// less privileged user namespace got from its parent) keeps
		// them, and O_NOATIME still keeps what must not change
		// unchanged.
		unix.MountSetattr(tfd, "", unix.AT_EMPTY_PATH, atime.mountAttr())
	}
	fail := func(err error) ([]int, Features, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, 0, err
	}
	for _, rel := range rels {
		fd, err := unix.Openat2(tfd, rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH,
		})
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
		var in, out unix.Stat_t
		if err := unix.Fstat(fd, &in); err != nil {
			return fail(err)
		}
		if err := unix.Stat(filepath.Join(dir, rel), &out); err != nil {
			return fail(err)
		}
		if in.Dev != out.Dev || in.Ino != out.Ino {
			return fail(unix.EXDEV)
		}
	}
	return fds, lacked, nil
}

// OpenUpper opens the upper layer at upper (index 0 of the stack) and its
// workdir at work, both through one clone of the mount that holds them
// where it can (see above), with access-time policy atime. The workdir's
// fd is the caller's.
func OpenUpper(upper, work string, atime Atime) (*Layer, int, error) {
	return OpenUpperMasked(upper, work, atime, 0)
}

// OpenUpperMasked is OpenUpper taking the system calls of masked for
// absent (features.go).
func OpenUpperMasked(upper, work string, atime Atime, masked Features) (*Layer, int, error) {
	ru, err1 := filepath.EvalSymlinks(upper)
	rw, err2 := filepath.EvalSymlinks(work)
	var lacked Features
	if err := errors.Join(err1, err2); err == nil {
		common := commonDir(ru, rw)
		relU, _ := filepath.Rel(common, ru)
		relW, _ := filepath.Rel(common, rw)
		fds, notPrivate, err := openCloned(common, []string{relU, relW}, atime, masked)
		if err == nil {
			l, err := newLayer(upper, 0, true, fds[0], true, masked, notPrivate)
			if err != nil {
				unix.Close(fds[1])
				return nil, -1, err
			}
			l.atime = atime
			return l, fds[1], nil
		}
		lacked = lackedOf(err)
	}
	l, err := OpenLayerMasked(upper, 0, true, masked)
	if err != nil {
		return nil, -1, err
	}
	l.atime = atime
	l.Counters.Fallbacks.ran(lacked)
	wfd, err := unix.Open(work, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		l.Close()
		return nil, -1, fmt.Errorf("open workdir %q: %w", work, err)
	}
	return l, wfd, nil
}

// commonDir is the deepest directory holding both a and b (absolute,
// clean).
func commonDir(a, b string) string {
	for !within(b, a) {
		a = filepath.Dir(a)
	}
	return a
}

func within(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}
