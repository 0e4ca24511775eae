package lower

import (
	"errors"
	"fmt"
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
	// Redirect is the topmost instance's overlay.redirect, if any (of a
	// directory, or of a metacopy file).
	Redirect string
	// Data is set for a metacopy file (its topmost instance has
	// overlay.metacopy): where its data is. The caller owns it and must
	// Close it. Stat then has the data file's st_blocks, as the kernel
	// reports them (Linux: ovl_getattr()), and LowerDev and LowerIno
	// are the first lower file's, whose inode number the file reports
	// (zero when that file has other names).
	Data               *DataFile
	LowerDev, LowerIno uint64
}

// Close closes what the entry holds open: a directory's chain, a metacopy
// file's data.
func (e *Entry) Close() {
	e.Chain.Close()
	if e.Data != nil {
		e.Data.Close()
	}
}

// metacopy finds the data of regular file e, entry name of c[k], when it
// is a metacopy file.
func (e *Entry) metacopy(c Chain, k int, name string, layers []*Layer) error {
	meta, err := c[k].IsMetacopy(name)
	if err != nil || !meta {
		return err
	}
	data, first, err := c.findData(k, name, layers)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := data.Stat(&st); err != nil {
		data.Close()
		return err
	}
	e.Data = data
	if first.Nlink == 1 {
		// A lower hard link's number is its other names' too, which
		// stay lower files of their own.
		e.LowerDev, e.LowerIno = first.Dev, first.Ino
	}
	e.Stat.Blocks = st.Blocks
	if r, ok, _ := c[k].FileRedirect(name); ok {
		e.Redirect = r
	}
	return nil
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
//     directory with lower instances was renamed) is merged with what the
//     redirect names in the layers below the one that holds it, and a
//     directory found there may redirect again, to the layers below its
//     own: a chain of renames, one per layer, is followed to its end. A
//     relative redirect is another name in the same parent; an absolute
//     one a path from the root of each layer below (layers is the whole
//     stack, topmost first), which directories on the way rewrite with
//     their own redirects (walkRedirect).
//
// It returns unix.ENOENT when the name is absent or whited out, and a
// *RedirectError when a redirect it has to follow is malformed.
func (c Chain) Lookup(name string, layers []*Layer) (*Entry, error) {
	if len(name) > unix.NAME_MAX {
		// As the layer would answer, listing or not.
		return nil, unix.ENAMETOOLONG
	}
	var e *Entry
	curName := name
	bottom := layers[len(layers)-1]
	for k := 0; k < len(c); k++ {
		m := c[k]
		if !validName(curName) {
			// A relative redirect "." or "..", or one a NUL cut
			// short: lookup_one_len() refuses the name.
			return nil, &RedirectError{Layer: m.Layer.Path, Value: curName, Err: unix.EACCES}
		}
		ls := m.listing()
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
		if errors.Is(err, unix.ENOENT) || (e != nil && errors.Is(err, unix.ENAMETOOLONG)) {
			// A ".wh.NAME" only matters to the layers below: in the
			// last one (a directory only the upper layer has, say)
			// there is nothing to hide, and no need to ask.
			if k < len(c)-1 && m.hides(ls, curName) {
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
				if st.Mode&unix.S_IFMT == unix.S_IFREG {
					if err := e.metacopy(c, k, curName, layers); err != nil {
						return nil, err
					}
				}
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
			// A member of c found by walking from its layer's root
			// (walkRedirect): reopen from the root too.
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
		if m.Layer == bottom {
			// Nothing below to redirect to: the kernel does not read
			// the bottom layer's redirects (d->last), so a malformed
			// one there is no error.
			break
		}
		r, ok, err := d.redirect()
		if err != nil {
			e.Chain.Close()
			return nil, err
		}
		if !ok {
			continue
		}
		if len(e.Chain) == 1 {
			e.Redirect = r
		}
		if r == "" || r[0] != '/' {
			// The same parent, another name: the parent's instances
			// below this one.
			curName = r
			continue
		}
		// From the root of each layer below this one.
		if err := e.followAbsolute(layers, m.Layer.Index+1, r); err != nil {
			e.Chain.Close()
			return nil, err
		}
		break
	}
	if e == nil {
		return nil, unix.ENOENT
	}
	return e, nil
}

// followAbsolute merges into e the directories at the absolute path p in
// the layers from index from down (Linux: ovl_lookup() switching to the
// root's layers, poe = roe). Each layer is walked with the path as the
// layers above left it (walkRedirect), until one hides the rest.
func (e *Entry) followAbsolute(layers []*Layer, from int, p string) error {
	bottom := layers[len(layers)-1]
	for _, l := range layers {
		if l.Index < from {
			continue
		}
		w, err := walkRedirect(l, p, l == bottom)
		if err != nil {
			return err
		}
		p = w.next
		if w.dir != nil {
			e.Chain = append(e.Chain, Member{Dir: w.dir, XWhiteouts: w.xwhiteouts})
			if w.opaque {
				e.Opaque = true
			}
		}
		if w.stop {
			break
		}
	}
	return nil
}

// walked is what walkRedirect found in one layer.
type walked struct {
	// dir is the directory at the end of the path, reopening itself from
	// the layer root (Dir.rebase); nil when the layer has none.
	dir        *Dir
	xwhiteouts bool
	// opaque: dir is opaque.
	opaque bool
	// stop: the layers below are hidden (a whiteout, a non-directory or
	// an opaque directory on the way or at the end).
	stop bool
	// next is the path to look for in the layers below: p with the
	// redirects of the directories on the way applied.
	next string
}

// walkRedirect walks the absolute path p (a valid redirect) from the root
// of layer l, one O_NOFOLLOW step at a time, as ovl_lookup_layer() does:
//   - a missing component ends the walk in this layer only, unless a
//     ".wh.NAME" beside it hides it below;
//   - a whiteout or a non-directory on the way or at the end hides the
//     path in the layers below;
//   - an opaque directory hides the layers below, but the walk goes on in
//     this layer, and an absolute redirect further down lifts the stop;
//   - a directory on the way (or at the end) with a redirect rewrites the
//     path for the layers below: an absolute one replaces the part walked
//     so far, a relative one the last component of it (the kernel's
//     ovl_check_redirect() with prelen and post).
//
// The bottom layer's opaque and redirect marks are not read (d->last). A
// "." or ".." component is refused with EACCES, as lookup_one_len() does,
// and a malformed redirect on the way is a *RedirectError.
func walkRedirect(l *Layer, p string, bottom bool) (walked, error) {
	comps := strings.Split(p[1:], "/")
	var w walked
	prefix := "" // the path so far, as the layers below will see it
	d := l.root
	drop := func() {
		if d != l.root {
			d.Close()
		}
	}
	for i, c := range comps {
		rest := func() string { return prefix + "/" + strings.Join(comps[i:], "/") }
		if !validName(c) {
			drop()
			return w, &RedirectError{Layer: l.Path, Value: p, Err: unix.EACCES}
		}
		var st unix.Stat_t
		err := d.Stat(c, &st)
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENAMETOOLONG):
			w.stop = w.stop || d.hasEntry(WhiteoutPrefix+c)
			w.next = rest()
			drop()
			return w, nil
		case err != nil:
			drop()
			return w, err
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			// A whiteout or a file hides the path below.
			w.stop = true
			w.next = rest()
			drop()
			return w, nil
		}
		next, err := d.OpenDir(c)
		if err != nil {
			drop()
			return w, err
		}
		hidden := d.hasEntry(WhiteoutPrefix + c)
		drop()
		d = next
		last := i == len(comps)-1
		step := "/" + c
		if !bottom {
			opaque, xw := d.isOpaque()
			if last {
				w.xwhiteouts = xw
			}
			if opaque || hidden {
				w.stop = true
				w.opaque = w.opaque || last
			} else {
				r, ok, err := d.redirect()
				if err != nil {
					d.Close()
					return w, err
				}
				switch {
				case !ok:
				case r != "" && r[0] == '/':
					prefix, step = "", r
					w.stop = false
				default:
					step = "/" + r
				}
			}
		}
		prefix += step
	}
	d.rebase(comps)
	w.dir, w.next = d, prefix
	return w, nil
}

// RedirectError is a redirect a lookup could not follow: malformed
// (EINVAL: empty, an empty component, or a relative value with a "/"; Linux:
// fs/overlayfs/util.c ovl_get_redirect_xattr()), or naming "." or ".."
// (EACCES, as lookup_one_len() refuses them). The kernel fails the lookup
// with the same errno.
type RedirectError struct {
	// Layer is the layer's directory, Value the redirect.
	Layer, Value string
	Err          unix.Errno
}

func (e *RedirectError) Error() string {
	if e.Err == unix.EINVAL {
		return fmt.Sprintf("invalid redirect %q in layer %s", e.Value, e.Layer)
	}
	return fmt.Sprintf("redirect %q refused in layer %s: %v", e.Value, e.Layer, e.Err)
}

func (e *RedirectError) Unwrap() error { return e.Err }

// redirect reads a directory's overlay.redirect: ok is false when it has
// none; the value when it is an absolute path without empty components or a single
// name, a *RedirectError (EINVAL) otherwise (Linux:
// ovl_get_redirect_xattr()). Like the kernel, which reads it as a C
// string, it ends the value at a NUL. A "." or ".." in it passes here and
// is refused where it is looked up. It is never followed through a
// symlink: every step opens with O_NOFOLLOW.
func (d *Dir) redirect() (r string, ok bool, err error) { return d.FileRedirect("") }

// validRedirect reports whether r has the form of a redirect: a relative
// name without "/", or an absolute path without empty components. The
// value counts up to its first NUL.
func validRedirect(r string) bool {
	if r == "" {
		return false
	}
	if i := strings.IndexByte(r, 0); i >= 0 {
		r = r[:i]
	}
	if r == "" || r[0] != '/' {
		return !strings.Contains(r, "/")
	}
	for _, c := range strings.Split(r[1:], "/") {
		if c == "" {
			return false
		}
	}
	return true
}

// validName reports whether a redirect's name (or component) is one a
// lookup may take: not empty, ".", or "..".
func validName(name string) bool {
	return name != "" && name != "." && name != ".."
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
