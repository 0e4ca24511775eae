package overlay

import (
	"context"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// parentNode returns the directory that holds n and n's name in it.
func (n *node) parentNode() (string, *node) {
	name, p := n.Parent()
	if p == nil {
		return "", nil
	}
	return name, p.Operations().(*node)
}

// upperDir returns directory n's instance in the upper layer, copying n
// and its ancestors up first (Linux: ovl_copy_up() copies parents first).
//
// It takes n's copyMu, then its parent's (lock order: doc.go).
func (n *node) upperDir(ctx context.Context) (*lower.Dir, error) {
	if n.ofs.upper == nil {
		return nil, syscall.EROFS
	}
	if top := n.top(); top.Layer.Upper {
		return top.Dir, nil
	}
	n.copyMu.Lock()
	defer n.copyMu.Unlock()
	top := n.top()
	if top.Layer.Upper {
		return top.Dir, nil // raced with another copy-up
	}
	name, p := n.parentNode()
	if p == nil {
		return nil, syscall.EROFS // the root always has an upper instance
	}
	pd, err := p.upperDir(ctx)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := top.StatSelf(&st); err != nil {
		return nil, err
	}
	src := upper.Source{Dir: top.Dir, Name: "", Stat: st, Override: n.ofs.copyOverride(top.Dir, "", &st)}
	if err := n.ofs.upper.CopyUp(src, pd, name, false, 0); err != nil {
		return nil, err
	}
	ud, err := pd.OpenDir(name)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.chain = append(lower.Chain{{Dir: ud}}, n.chain...)
	n.mu.Unlock()
	// The directory is now merged, which changes its link count as the
	// kernel overlay reports it (1): the kernel must not keep the old
	// attributes. Asynchronous: a notification must not wait on a
	// request in flight.
	go n.ofs.guard.guarded("a merged directory's notification", func() { n.NotifyContent(-1, 0) })()
	return ud, nil
}

// top returns a directory's topmost instance.
func (n *node) top() lower.Member {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.chain[0]
}

// location returns where a non-directory is: its directory in the topmost
// layer that has it, and its name there.
func (n *node) location() (lower.Member, string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.firstLinkLocked()
	return l.dir, l.name
}

// gone reports, for a request that met the node while its last name was
// being removed, that the file is gone: its name may be a whiteout now.
func (n *node) gone() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.unlinked
}

// copyUp makes sure non-directory n is in the upper layer with what kind
// asks for: its data (copyData), none (copyNoData: an open with O_TRUNC),
// or, with metacopy=on, its metadata alone (copyMeta; metacopy.go). A
// metacopy file already in the upper layer gets its data for copyData and
// copyNoData (copyDataIn).
func (n *node) copyUp(ctx context.Context, kind copyKind) error {
	if n.ofs.upper == nil {
		return syscall.EROFS
	}
	if par, _ := n.location(); par.Layer.Upper && (kind == copyMeta || n.metacopyData() == nil) {
		return nil
	}
	n.copyMu.Lock()
	defer n.copyMu.Unlock()
	par, srcName := n.location()
	if par.Layer.Upper {
		// Raced with another copy-up, or a metacopy file.
		return n.copyDataIn(kind)
	}
	n.mu.Lock()
	orphan := n.orphanLower
	n.mu.Unlock()
	if orphan {
		err := n.copyUpOrphan(par, srcName, kind != copyNoData)
		n.invalidateNoSec()
		return err
	}
	name, p := n.parentNode()
	if p == nil {
		return syscall.ESTALE
	}
	pd, err := p.upperDir(ctx)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := par.Stat(srcName, &st); err != nil {
		return err
	}
	// A file with one name keeps its inode number; a lower hard link
	// broken by the copy-up gets the copy's, as with the kernel overlay
	// without index=on.
	var ino uint64
	if st.Nlink == 1 {
		ino = n.StableAttr().Ino
	}
	data := n.metacopyData() // a lower metacopy file's data
	meta := kind == copyMeta && n.ofs.opts.Metacopy && st.Mode&unix.S_IFMT == unix.S_IFREG
	src := upper.Source{Dir: par.Dir, Name: srcName, Stat: st, Override: n.ofs.copyOverride(par.Dir, srcName, &st), Data: data, Meta: meta}
	if meta && data == nil {
		if data, err = lower.NewDataFile(par.Dir, srcName); err != nil {
			return err
		}
	}
	n.ofs.hooks.beforePublish.run(name)
	if err := n.ofs.upper.CopyUp(src, pd, name, kind != copyNoData, ino); err != nil {
		if meta && src.Data == nil {
			data.Close()
		}
		return err
	}
	if !meta {
		data = nil
	}
	// The switch holds locMu: an open that found the lower file has
	// counted its handle (openMode) before a writer, which opens only
	// after this, chooses its I/O mode; otherwise a reader of the lower
	// file could be cached while the writer goes passthrough, and the
	// kernel fails the second open with EIO (fuse_file_io_open()).
	n.locMu.Lock()
	n.mu.Lock()
	n.onlyLinkLocked(link{lower.Member{Dir: pd}, name})
	n.mu.Unlock()
	n.setData(data)
	n.locMu.Unlock()
	var ust unix.Stat_t
	ustOK := pd.Stat(name, &ust) == nil
	if ustOK {
		n.ofs.registerUpperFile(n, &ust)
	}
	n.invalidateNoSec()
	n.ofs.stats.copyUps.Add(1)
	if st.Nlink > 1 {
		n.part(p, name, meta || !ustOK, &ust)
	}
	return nil
}

// part makes n, a lower hard link that its copy-up just made a file of
// its own, show the copy's identity: the inode number a lookup of the
// copy (name in p, stat ust) gives (FS.stableAttr), which the kernel
// overlay shows from the copy-up on (ovl_getattr(): a broken hard link
// does not report its origin's number). A metacopy copy (meta) reports
// its lower file's number, as before.
//
// The node itself stays numbered after the lower file, so it reports the
// copy's number in its attributes (fillAttr; go-fuse's GETATTR needs
// rawFS.GetAttr for it), and the kernel drops its own before the request
// that copied n up is answered: attributes only (offset -1), which waits
// for no lock or request (fuse_reverse_inval_inode()). Then the kernel
// looks the name up again, and meets a node of the copy's own (Lookup,
// and READDIRPLUS: dirHandle.Lookup). That notification drops the
// directory entry, which takes the directory's lock: asynchronous, since
// the request in flight may hold the lock of the file that a holder of
// the directory's lock waits for.
func (n *node) part(p *node, name string, meta bool, ust *unix.Stat_t) {
	n.mu.Lock()
	r := n.rareMadeLocked()
	r.parted = true
	if !meta {
		r.partedIno = n.ofs.ino.ino(ust.Dev, ust.Ino)
	}
	n.mu.Unlock()
	n.ofs.raw.partedSeen()
	n.NotifyContent(-1, 0)
	go n.ofs.guard.guarded("a parted hard link's notification", func() {
		n.ofs.hooks.partedNotify.run(name)
		p.NotifyEntry(name)
	})()
}

// isParted reports whether n is a lower hard link its copy-up parted.
func (n *node) isParted() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.partedLocked()
}

// partedLocked is isParted.
//
// Preconditions: n.mu is held.
func (n *node) partedLocked() bool {
	r := n.rareLocked()
	return r != nil && r.parted
}

// upperIno reads the inode number an upper object had before its copy-up.
func (f *FS) upperIno(d *lower.Dir, name string) (uint64, bool) {
	v, err := d.Getxattr(name, f.upper.XattrPrefix()+upper.InoXattr)
	if err != nil {
		return 0, false
	}
	ino, err := strconv.ParseUint(string(v), 10, 64)
	return ino, err == nil
}
