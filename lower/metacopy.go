package lower

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// MetacopyXattr, under the overlay's prefix, marks a regular file that
// holds only its metadata: its data is a lower layer's file (Linux:
// fs/overlayfs/overlayfs.h OVL_XATTR_METACOPY). Its value is empty (or,
// with verity, a digest goverlay does not check).
const MetacopyXattr = "metacopy"

// MetacopyError is a metacopy file whose data a lookup could not reach:
// refused on a mount without metacopy=on (EPERM, whether its data exists
// or not), or no lower regular file holds it (EIO). The kernel fails the lookup with the same errno
// (Linux: fs/overlayfs/namei.c ovl_lookup(), "refusing to follow metacopy
// origin", "metacopy with no lower data found").
type MetacopyError struct {
	// Layer is the layer's directory, Name the file's name.
	Layer, Name string
	Err         unix.Errno
}

func (e *MetacopyError) Error() string {
	if e.Err == unix.EPERM {
		return fmt.Sprintf("refusing to follow metacopy file %q of layer %s: the mount is not metacopy=on", e.Name, e.Layer)
	}
	return fmt.Sprintf("metacopy file %q of layer %s: no lower data found", e.Name, e.Layer)
}

func (e *MetacopyError) Unwrap() error { return e.Err }

// DataFile is where a metacopy file's data is: regular file Name of Dir, a
// directory of a lower layer that reopens itself from its layer's root, so
// that it does not depend on the directories the lookup went through. The
// holder closes it (Close).
type DataFile struct {
	Dir  *Dir
	Name string
}

// Open opens the data file.
func (f *DataFile) Open(flags int) (int, error) { return f.Dir.Open(f.Name, flags) }

// Stat reads the data file's attributes.
func (f *DataFile) Stat(st *unix.Stat_t) error { return f.Dir.Stat(f.Name, st) }

// Close closes its directory for good.
func (f *DataFile) Close() { f.Dir.Close() }

// IsMetacopy reports whether regular file name of d carries an
// overlay.metacopy xattr (either prefix), with one listxattr.
func (d *Dir) IsMetacopy(name string) (bool, error) {
	names, err := d.Listxattr(name)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return false, nil
		}
		return false, err
	}
	for _, a := range names {
		if a == TrustedPrefix+MetacopyXattr || a == UserPrefix+MetacopyXattr {
			return true, nil
		}
	}
	return false, nil
}

// FileRedirect reads the overlay.redirect of entry name of d (a moved or
// hard-linked metacopy file), or of d itself when name is "" (redirect);
// see redirect for what is accepted.
func (d *Dir) FileRedirect(name string) (r string, ok bool, err error) {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		v, err := d.Getxattr(name, prefix+"redirect")
		if err != nil {
			continue
		}
		r := string(v)
		if !validRedirect(r) {
			return "", false, &RedirectError{Layer: d.Layer.Path, Value: r, Err: unix.EINVAL}
		}
		if i := strings.IndexByte(r, 0); i >= 0 {
			r = r[:i]
		}
		return r, true, nil
	}
	return "", false, nil
}

// pathFromRoot is d's path from its layer's root, which lower layers never
// change; false for a Dir that cannot tell it.
func (d *Dir) pathFromRoot() ([]string, bool) {
	var rev []string
	for x := d; ; {
		x.mu.Lock()
		parent, name, path := x.parent, x.name, x.path
		x.mu.Unlock()
		switch {
		case parent != nil:
			rev = append(rev, name)
			x = parent
		case path != nil || x == x.Layer.root:
			slices.Reverse(rev)
			return append(slices.Clone(path), rev...), true
		default:
			return nil, false
		}
	}
}

// rootedDir is a Dir for directory d that reopens itself through its path
// from the layer root; the caller owns it.
func rootedDir(d *Dir) (*Dir, error) {
	p, ok := d.pathFromRoot()
	if !ok {
		return nil, unix.EIO
	}
	var st unix.Stat_t
	if err := d.StatSelf(&st); err != nil {
		return nil, err
	}
	if p == nil {
		p = []string{}
	}
	return &Dir{Layer: d.Layer, path: p, dev: st.Dev, ino: st.Ino, fd: -1}, nil
}

// findData finds the data of metacopy file name of c[k] in the layers
// below (Linux: ovl_lookup() going on below a metacopy upper): the file's
// redirect, if it has one, else the same name in the parent's instances
// below; past lower metacopy files (stacked layers), each of which may
// redirect again, to the first regular file without overlay.metacopy. first
// is the attributes of the first lower file met (the kernel's lower inode,
// whose number the file reports).
func (c Chain) findData(k int, name string, layers []*Layer) (data *DataFile, first unix.Stat_t, err error) {
	top := c[k]
	refuse := func(e unix.Errno) error { return &MetacopyError{Layer: top.Layer.Path, Name: name, Err: e} }
	if !top.Layer.Metacopy {
		// Refused as soon as it is met, in any layer, data below or
		// not (Linux 6.18: ovl_lookup() "refusing to follow metacopy
		// origin").
		return nil, first, refuse(unix.EPERM)
	}
	r, ok, err := top.FileRedirect(name)
	if err != nil {
		return nil, first, err
	}
	var (
		abs       string // an absolute path being followed; "" while in c
		cur       = name // the name in c's members below
		next      = k + 1
		fromLayer = top.Layer.Index + 1
		haveFirst bool
	)
	if ok {
		if r[0] == '/' {
			abs = r
		} else {
			cur = r
		}
	}
	bottom := layers[len(layers)-1]
	for {
		var cand *Dir // owned
		var candName string
		var st unix.Stat_t
		if abs == "" {
			found := false
			for ; next < len(c); next++ {
				m := c[next]
				if !validName(cur) {
					return nil, first, &RedirectError{Layer: m.Layer.Path, Value: cur, Err: unix.EACCES}
				}
				err := m.Stat(cur, &st)
				if errors.Is(err, unix.ENOENT) {
					if m.hasEntry(WhiteoutPrefix + cur) {
						return nil, first, refuse(unix.EIO)
					}
					continue
				}
				if err != nil {
					return nil, first, err
				}
				found = true
				break
			}
			if !found || st.Mode&unix.S_IFMT != unix.S_IFREG {
				return nil, first, refuse(unix.EIO)
			}
			m := c[next]
			next++
			if cand, err = rootedDir(m.Dir); err != nil {
				return nil, first, err
			}
			candName = cur
		} else {
			var l *Layer
			for _, x := range layers {
				if x.Index >= fromLayer {
					l = x
					break
				}
			}
			if l == nil {
				return nil, first, refuse(unix.EIO)
			}
			fromLayer = l.Index + 1
			d, base, rest, stop, err := walkFile(l, abs, l == bottom)
			if err != nil {
				return nil, first, err
			}
			if d == nil {
				if stop {
					return nil, first, refuse(unix.EIO)
				}
				abs = rest
				continue
			}
			err = d.Stat(base, &st)
			switch {
			case errors.Is(err, unix.ENOENT):
				hidden := d.hasEntry(WhiteoutPrefix + base)
				d.Close()
				if stop || hidden {
					return nil, first, refuse(unix.EIO)
				}
				abs = rest
				continue
			case err != nil:
				d.Close()
				return nil, first, err
			case st.Mode&unix.S_IFMT != unix.S_IFREG:
				d.Close()
				return nil, first, refuse(unix.EIO)
			}
			cand, candName = d, base
			abs = rest
		}
		if !haveFirst {
			first, haveFirst = st, true
		}
		meta, err := cand.IsMetacopy(candName)
		if err != nil {
			cand.Close()
			return nil, first, err
		}
		if !meta {
			return &DataFile{Dir: cand, Name: candName}, first, nil
		}
		// A lower metacopy file: on below it, where its own redirect
		// says.
		r, ok, err := cand.FileRedirect(candName)
		if err != nil {
			cand.Close()
			return nil, first, err
		}
		if ok {
			switch {
			case r[0] == '/':
				abs = r
			case abs != "":
				abs = abs[:strings.LastIndexByte(abs, '/')+1] + r
			default:
				cur = r
			}
			if abs != "" {
				fromLayer = cand.Layer.Index + 1
			}
		}
		cand.Close()
	}
}

// walkFile walks the absolute path p of a file in layer l: the directory
// that holds it (owned by the caller; nil when l has none), its base name,
// the path to look for in the layers below (p with the redirects of the
// directories on the way applied), and whether l hides those layers.
func walkFile(l *Layer, p string, bottom bool) (d *Dir, base, rest string, stop bool, err error) {
	i := strings.LastIndexByte(p, '/')
	dir, base := p[:i], p[i+1:]
	if !validName(base) {
		return nil, "", "", false, &RedirectError{Layer: l.Path, Value: p, Err: unix.EACCES}
	}
	if dir == "" {
		d, err := rootedDir(l.root)
		return d, base, p, false, err
	}
	w, err := walkRedirect(l, dir, bottom)
	if err != nil {
		return nil, "", "", false, err
	}
	return w.dir, base, w.next + "/" + base, w.stop, nil
}

// NewDataFile is the DataFile of regular file name of d, for a metacopy
// copy-up of it.
func NewDataFile(d *Dir, name string) (*DataFile, error) {
	rd, err := rootedDir(d)
	if err != nil {
		return nil, err
	}
	return &DataFile{Dir: rd, Name: name}, nil
}
