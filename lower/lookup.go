package lower

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Member is one instance of a merged directory: the directory in one layer.
type Member struct {
	*Dir
	// XWhiteouts is set when the directory is marked overlay.opaque="x" and
	// so may hold xattr whiteouts.
	XWhiteouts bool
}

// Chain is a merged directory: its instances in the layers, topmost first,
// ending at the first opaque one.
type Chain []Member

// Close closes every member's fd.
func (c Chain) Close() {
	for _, m := range c {
		m.Close()
	}
}

// RootChain is the merged root of the layers, topmost first. Layer roots
// are always merged (Linux: ovl_fill_super() stacks all root dentries).
func RootChain(layers []*Layer) Chain {
	c := make(Chain, len(layers))
	for i, l := range layers {
		c[i] = Member{Dir: l.root}
	}
	return c
}

// Entry is what a name resolves to in a merged directory.
type Entry struct {
	// Stat is the topmost instance's stat.
	Stat unix.Stat_t
	// Parent is the directory, in the topmost layer that has the entry,
	// that holds it under its name.
	Parent Member
	// Chain is set for a directory: its opened instances, topmost first.
	// The caller owns it and must Close it.
	Chain Chain
	// Opaque is set when the directory's chain was cut by an opaque marker
	// (as opposed to reaching the bottom layer or a non-directory).
	Opaque bool
}

// IsDir reports whether the entry is a directory.
func (e *Entry) IsDir() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR }

// Lookup resolves name in the merged directory c, walking the layers top to
// bottom (Linux: fs/overlayfs/namei.c ovl_lookup()):
//   - a whiteout (char 0/0, ".wh.NAME", or an xattr whiteout in an "x"
//     directory) hides the name in the layers below it;
//   - a non-directory ends the walk, and hides any directory below it;
//   - a directory is merged with the directories of the same name below it
//     until one of them is opaque or a layer has a non-directory there.
//
// It returns unix.ENOENT when the name is absent or whited out.
func (c Chain) Lookup(name string) (*Entry, error) {
	var e *Entry
	for _, m := range c {
		var st unix.Stat_t
		err := m.Stat(name, &st)
		if errors.Is(err, unix.ENOENT) {
			if m.hasEntry(WhiteoutPrefix + name) {
				break
			}
			continue
		}
		if err != nil {
			if e != nil {
				// Stop merging at an unreadable layer rather than
				// fail a lookup that already succeeded above.
				break
			}
			return nil, err
		}
		if IsWhiteout(&st) || (m.XWhiteouts && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == 0 && m.isXattrWhiteout(name)) {
			break
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if e == nil {
			e = &Entry{Stat: st, Parent: m}
			if !isDir {
				break
			}
		} else if !isDir {
			// A non-directory below a directory is hidden.
			break
		}
		d, err := m.OpenDir(name)
		if err != nil {
			if len(e.Chain) == 0 {
				return nil, err
			}
			break
		}
		opaque, xw := d.isOpaque()
		e.Chain = append(e.Chain, Member{Dir: d, XWhiteouts: xw})
		if opaque {
			e.Opaque = true
			break
		}
	}
	if e == nil {
		return nil, unix.ENOENT
	}
	return e, nil
}

// hasEntry reports whether name exists in d. Errors, such as a whiteout name
// that would be too long, count as absent.
func (d *Dir) hasEntry(name string) bool {
	var st unix.Stat_t
	return d.Stat(name, &st) == nil
}
