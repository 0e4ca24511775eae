package upper

import (
	"errors"
	"fmt"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// A rename has the shape of a copy-up: what it needs in the upper layer is
// prepared first (copy-ups, a redirect, an opaque mark), each change
// recorded in an Undo; one renameat2 is the commit point; if anything
// fails before it, the Undo puts the marks back, so a failed rename leaves
// no redirect or opaque mark behind. Copy-ups are not undone: an object
// copied up shows the same through the mount.

// Undo records how to put back what the preparation of an operation
// changed in the upper layer. The zero value is ready and empty.
type Undo struct {
	steps []func() error
}

func (u *Undo) push(f func() error) { u.steps = append(u.steps, f) }

// Run puts back everything recorded, the last change first, and forgets
// it. It returns the first error met; the other steps run all the same.
func (u *Undo) Run() error {
	var first error
	for i := len(u.steps) - 1; i >= 0; i-- {
		if err := u.steps[i](); err != nil && first == nil {
			first = err
		}
	}
	u.steps = nil
	return first
}

// SetRedirect records on the upper directory d where its lower instances
// are (the kernel's overlay.redirect format: a name in the same parent, or
// an absolute path from the root, resolved in the layers below). u learns
// how to put back the value d had before, if any.
func (l *Layer) SetRedirect(d *lower.Dir, path string, u *Undo) error {
	attr := l.opts.XattrPrefix + "redirect"
	// d itself: the /proc magic link must be followed (DoPath).
	var old []byte
	had := false
	err := d.DoPath("", func(p string) error {
		v, err := xattr.Get(p, attr)
		switch {
		case err == nil:
			old, had = v, true
		case !errors.Is(err, xattr.ENOATTR):
			return err
		}
		return xattr.Set(p, attr, []byte(path))
	})
	if err != nil {
		return err
	}
	u.push(func() error {
		return d.DoPath("", func(p string) error {
			if had {
				return xattr.Set(p, attr, old)
			}
			return xattr.Remove(p, attr)
		})
	})
	return nil
}

// MarkOpaque is SetOpaque for a rename: a directory already opaque is left
// as it is, and u learns how to take a new mark off again.
func (l *Layer) MarkOpaque(d *lower.Dir, name string, u *Undo) error {
	attr := l.opts.XattrPrefix + "opaque"
	sub, err := d.OpenDir(name)
	if err != nil {
		return fmt.Errorf("mark opaque: %w", err)
	}
	defer sub.Close()
	if v, err := sub.Getxattr("", attr); err == nil && string(v) == "y" {
		return nil
	}
	var st unix.Stat_t
	if sub.Stat(lower.OpaqueMarker, &st) == nil {
		return nil
	}
	if err := l.SetOpaque(d, name); err != nil {
		return err
	}
	u.push(func() error {
		err := d.DoPath(name, func(p string) error { return xattr.LRemove(p, attr) })
		if err == nil || !errors.Is(err, xattr.ENOATTR) {
			return err
		}
		// SetOpaque fell back to the marker file.
		return d.Do(func(fd int) error {
			return unix.Unlinkat(fd, name+"/"+lower.OpaqueMarker, 0)
		})
	})
	return nil
}

// RenameOptions say how Rename moves an entry.
type RenameOptions struct {
	// Flags are the caller's renameat2 flags: RENAME_NOREPLACE,
	// RENAME_EXCHANGE.
	Flags uint
	// Whiteout leaves a whiteout at the old name: a lower layer has it.
	Whiteout bool
	// Over tells what holds the new name in the target directory.
	Over Over
	// Opaque marks the moved directory opaque: it lands on a name a
	// lower directory has, or in a merged directory.
	Opaque bool
}

// Rename moves oname in the upper directory od to nname in nd (both
// already in the upper layer). Its renameat2 is the commit point of the
// caller's rename: on failure, what Rename marked is taken off again, and
// so is what the caller prepared, recorded in u (u.Run). On success u is
// emptied: the rename is done.
func (l *Layer) Rename(od *lower.Dir, oname string, nd *lower.Dir, nname string, o RenameOptions, u *Undo) error {
	err := l.rename(od, oname, nd, nname, o, u)
	if err != nil {
		if uerr := u.Run(); uerr != nil {
			err = fmt.Errorf("%w (and putting the upper layer back: %v)", err, uerr)
		}
		return err
	}
	u.steps = nil
	return nil
}

func (l *Layer) rename(od *lower.Dir, oname string, nd *lower.Dir, nname string, o RenameOptions, u *Undo) error {
	if o.Opaque {
		if err := l.MarkOpaque(od, oname, u); err != nil {
			return err
		}
	}
	ofd, orelease, err := od.Pin()
	if err != nil {
		return err
	}
	defer orelease()
	nfd, nrelease, err := nd.Pin()
	if err != nil {
		return err
	}
	defer nrelease()
	if o.Flags&unix.RENAME_EXCHANGE != 0 {
		return unix.Renameat2(ofd, oname, nfd, nname, unix.RENAME_EXCHANGE)
	}
	if o.Over == OverWhiteout {
		// Swap with the whiteout: it lands at the old name, which is
		// exactly right when that name needs a whiteout.
		if err := unix.Renameat2(ofd, oname, nfd, nname, unix.RENAME_EXCHANGE); err != nil {
			return err
		}
		if !o.Whiteout {
			// Best effort: a whiteout where no lower layer has the
			// name hides nothing.
			unix.Unlinkat(ofd, oname, 0)
		}
		return nil
	}
	rflags := o.Flags & unix.RENAME_NOREPLACE
	if o.Whiteout && l.Whiteouts == KernelWhiteouts {
		rflags |= unix.RENAME_WHITEOUT
	}
	err = unix.Renameat2(ofd, oname, nfd, nname, rflags)
	if rflags&unix.RENAME_WHITEOUT != 0 && errors.Is(err, unix.EINVAL) {
		rflags &^= unix.RENAME_WHITEOUT
		err = unix.Renameat2(ofd, oname, nfd, nname, rflags)
	}
	if err != nil {
		return err
	}
	if o.Over == OverAUFSWhiteout {
		unix.Unlinkat(nfd, lower.WhiteoutPrefix+nname, 0)
	}
	if o.Whiteout && rflags&unix.RENAME_WHITEOUT == 0 {
		if err := l.Whiteout(od, oname); err != nil {
			// Without its whiteout the old name would show the
			// lower object again: move back, and fail.
			if berr := unix.Renameat2(nfd, nname, ofd, oname, unix.RENAME_NOREPLACE); berr != nil {
				return fmt.Errorf("whiteout %q: %w (and moving back: %v)", oname, err, berr)
			}
			return fmt.Errorf("whiteout %q: %w", oname, err)
		}
	}
	return nil
}
