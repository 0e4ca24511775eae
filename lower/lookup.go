package lower

import (
	"errors"
	"strings"

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

// Forget forgets every member (Dir.Forget).
func (c Chain) Forget() {
	for _, m := range c {
		m.Forget()
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
	// Redirect is the topmost instance's overlay.redirect, if any.
	Redirect string
}

// IsDir reports whether the entry is a directory.
func (e *Entry) IsDir() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR }

// Lookup resolves name in the merged directory c, walking the layers top to
// bottom (Linux: fs/overlayfs/namei.c ovl_lookup()):
//   - a whiteout (char 0/0, ".wh.NAME", or an xattr whiteout in an "x"
//     directory) hides the name in the layers below it;
//   - a non-directory ends the walk, and hides any directory below it;
//   - a directory is merged with the directories of the same name below it
//     until one of them is opaque or a layer has a non-directory there;
//   - a directory with a redirect (overlay.redirect, written when a
//     directory with lower instances was renamed) is merged with the
//     directories at the redirect's path instead: an absolute path from
//     the root of each layer below (layers is the whole stack, topmost
//     first), or a name in the same parent.
//
// It returns unix.ENOENT when the name is absent or whited out.
func (c Chain) Lookup(name string, layers []*Layer) (*Entry, error) {
	if len(name) > unix.NAME_MAX {
		// As the layer would answer, listing or not.
		return nil, unix.ENAMETOOLONG
	}
	var e *Entry
	cur, curName := c, name
	var walked []Chain // directories opened for absolute redirects
	defer func() {
		for _, w := range walked {
			for _, m := range w {
				if m.walked() != nil {
					m.Close()
				}
			}
		}
	}()
	own := true // cur is c, whose members' listings are worth reading
	for k := 0; k < len(cur); k++ {
		m := cur[k]
		var ls *listing
		if own {
			ls = m.listing()
		} else {
			ls = m.cachedListing()
		}
		if ls != nil {
			// The layer's answer without asking it: a miss costs
			// nothing, and only a name it holds is stat'ed.
			le, ok := ls.find(curName)
			if !ok || le.whiteout {
				m.Layer.Counters.Answered.Add(1)
				if ok || ls.hides(curName) {
					break
				}
				continue
			}
		}
		var st unix.Stat_t
		m.Layer.Counters.Asked.Add(1)
		err := m.Stat(curName, &st)
		if errors.Is(err, unix.ENOENT) {
			// A ".wh.NAME" only matters to the layers below: in the
			// last one (a directory only the upper layer has, say)
			// there is nothing to hide, and no need to ask.
			if k < len(cur)-1 && m.hides(ls, curName) {
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
		// A listing already told the xattr whiteouts apart: no getxattr
		// again for a name it holds.
		if IsWhiteout(&st) || (ls == nil && m.XWhiteouts && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == 0 && m.isXattrWhiteout(curName)) {
			break
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if e == nil {
			m.ApplyOverride(curName, &st)
			e = &Entry{Stat: st, Parent: m}
			if !isDir {
				break
			}
		} else if !isDir {
			// A non-directory below a directory is hidden.
			break
		}
		d, err := m.OpenDir(curName)
		if err != nil {
			if len(e.Chain) == 0 {
				return nil, err
			}
			break
		}
		if p := m.walked(); p != nil {
			// Found below a redirect's path: reopen from the root,
			// not from the walked directory, which is closed below.
			d.rebase(append(p, curName))
		}
		opaque, xw := d.isOpaque()
		// A ".wh.NAME" beside the directory hides NAME in the layers
		// below it as much as it would without the directory.
		opaque = opaque || m.hides(ls, curName)
		e.Chain = append(e.Chain, Member{Dir: d, XWhiteouts: xw})
		if opaque {
			e.Opaque = true
			break
		}
		r, ok := d.redirect()
		if !ok {
			continue
		}
		if len(e.Chain) == 1 {
			e.Redirect = r
		}
		if r[0] != '/' {
			// The same parent, another name.
			curName = r
			continue
		}
		// From the root of each layer below.
		// The directories on the way are not closed: the chain's
		// members reopen from them when the fd cache closed theirs.
		// Idle, they leave the fd cache like any other.
		parent, base := splitRedirect(r)
		cur, curName, k = walkLayers(layers, m.Layer.Index+1, parent), base, -1
		own = false
		walked = append(walked, cur)
	}
	if e == nil {
		return nil, unix.ENOENT
	}
	return e, nil
}

// redirect reads a directory's overlay.redirect, if it has a usable one: an
// absolute path or a single name, without "." or ".." components, so that
// following it can never leave the layers (a redirect is never followed
// through a symlink either: walkLayers opens with O_NOFOLLOW).
func (d *Dir) redirect() (string, bool) {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		v, err := d.Getxattr("", prefix+"redirect")
		if err != nil {
			continue
		}
		r := string(v)
		if !validRedirect(r) {
			return "", false
		}
		return r, true
	}
	return "", false
}

func validRedirect(r string) bool {
	if r == "" || len(r) > 4096 || strings.IndexByte(r, 0) >= 0 {
		return false
	}
	if r[0] != '/' {
		return !strings.Contains(r, "/") && r != "." && r != ".."
	}
	for _, c := range strings.Split(r[1:], "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}

// splitRedirect splits an absolute redirect into its parent path and name.
func splitRedirect(r string) (parent, name string) {
	i := strings.LastIndexByte(r, '/')
	return r[:i], r[i+1:]
}

// walkLayers opens the directory at the absolute path p ("" is the root)
// in each layer from index from down, one O_NOFOLLOW step at a time, the
// way a lookup of p through the layers would find it: a layer where the
// path is missing is skipped; a whiteout or a non-directory on the way ends
// the walk for every layer below; an opaque directory on the way ends it
// after its own layer. Members other than layer roots reopen themselves
// from the root (Dir.rebase); the caller closes them when done.
func walkLayers(layers []*Layer, from int, p string) Chain {
	var out Chain
	comps := strings.FieldsFunc(p, func(r rune) bool { return r == '/' })
	for _, l := range layers {
		if l.Index < from {
			continue
		}
		d, found, last := walkLayer(l, comps)
		if found {
			out = append(out, Member{Dir: d})
		}
		if last {
			break
		}
	}
	return out
}

// walkLayer walks comps from the root of l. It reports the directory if
// the whole path is there, and whether the layers below l are hidden. The
// directory reopens itself from the root (Dir.rebase): the ones on the way
// are closed at once.
func walkLayer(l *Layer, comps []string) (d *Dir, found, last bool) {
	d = l.root
	done := func(keep *Dir) {
		if d != l.root && d != keep {
			d.Close()
		}
	}
	for _, c := range comps {
		var st unix.Stat_t
		err := d.Stat(c, &st)
		switch {
		case errors.Is(err, unix.ENOENT):
			last = d.hasEntry(WhiteoutPrefix + c)
			done(nil)
			return nil, false, last
		case err != nil:
			done(nil)
			return nil, false, false
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			// A whiteout or a file hides the path below.
			done(nil)
			return nil, false, true
		}
		next, err := d.OpenDir(c)
		if err != nil {
			done(nil)
			return nil, false, false
		}
		if opaque, _ := next.isOpaque(); opaque || d.hasEntry(WhiteoutPrefix+c) {
			last = true
		}
		done(nil)
		d = next
	}
	if d != l.root {
		d.rebase(comps)
	}
	return d, true, last
}

// hides reports whether a ".wh.NAME" entry beside name hides it in the
// layers below, from the listing ls of m when there is one.
func (m Member) hides(ls *listing, name string) bool {
	if ls != nil {
		return ls.hides(name)
	}
	return m.hasEntry(WhiteoutPrefix + name)
}

// hasEntry reports whether name exists in d. Errors, such as a whiteout name
// that would be too long, count as absent.
func (d *Dir) hasEntry(name string) bool {
	var st unix.Stat_t
	return d.Stat(name, &st) == nil
}
