package overlay

import (
	"errors"
	"syscall"
	"time"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// Metacopy (-o metacopy=on), in the kernel overlay's format (Linux:
// fs/overlayfs/copy_up.c ovl_need_meta_copy_up()): a change of a lower
// regular file's metadata alone (chown, chmod, utimes, xattrs, link,
// rename) copies up its metadata only. The upper file is then a hole of
// the file's size with an empty overlay.metacopy xattr, and the node keeps
// where the data is (node.data, found by lower.Chain.Lookup for metacopy
// files on disk): reads open that lower file, attributes are the upper
// file's but for st_blocks (the data file's) and st_ino (the lower
// file's). The first change of the data (an open for writing, a truncate)
// copies the data into the upper file in place (copyDataIn).

// copyKind says what a copy-up must bring.
type copyKind int

const (
	// copyData: the file's data is needed (an open for writing).
	copyData copyKind = iota
	// copyNoData: the data is about to be discarded (O_TRUNC, a
	// truncate to 0): a regular file arrives empty.
	copyNoData
	// copyMeta: only metadata changes; with metacopy=on a regular file
	// is copied up without its data.
	copyMeta
)

// metacopyData returns where n's data is when n is a metacopy file, else
// nil.
func (n *node) metacopyData() *lower.DataFile {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dataLocked()
}

// copyDataIn makes n, a file of the upper layer, a file of its own if it
// is a metacopy file: its data is copied in (none for copyNoData), and
// from then on read from the upper file.
//
// Preconditions: n.copyMu is held.
func (n *node) copyDataIn(kind copyKind) error {
	data := n.metacopyData()
	if data == nil || kind == copyMeta {
		return nil
	}
	n.locMu.RLock()
	par, name := n.location()
	// The number it reported came from its lower file: keep it. With
	// the writeback cache the kernel keeps the file's mtime, and may have
	// set it (a SETATTR served before the WRITE that copies the data
	// in): the copy keeps it, under timesMu (after locMu, doc.go), so
	// that no SETATTR of the times falls between its stat and its
	// restoring of the mtime.
	o := upper.DataInOptions{Data: kind == copyData, Ino: n.StableAttr().Ino}
	n.ofs.hooks.beforeDataIn.run(name)
	unlockTimes := func() {}
	if n.ofs.writeback.Load() {
		o.KeepMtime = true
		unlockTimes = n.timesLock()
	}
	err := n.ofs.upper.CopyDataIn(par.Dir, name, data, o)
	unlockTimes()
	n.locMu.RUnlock()
	if err != nil {
		return err
	}
	// As the switch of a copy-up (copyUp): a reader of the lower data
	// counted before a writer chooses its I/O mode.
	n.locMu.Lock()
	n.mu.Lock()
	n.setDataLocked(nil)
	n.mu.Unlock()
	n.locMu.Unlock()
	data.Close()
	n.invalidateNoSec()
	n.ofs.stats.copyUps.Add(1)
	return nil
}

// setData records where n's data is from now on (nil: its own), and
// closes what it replaces.
//
// Preconditions: n.locMu is held for writing.
func (n *node) setData(d *lower.DataFile) {
	n.mu.Lock()
	old := n.dataLocked()
	n.setDataLocked(d)
	n.mu.Unlock()
	if old != nil && old != d {
		old.Close()
	}
}

// metacopyRedirect gives n, a metacopy file about to move or get another
// name, a redirect to its data, as the kernel does (Linux:
// fs/overlayfs/dir.c ovl_set_redirect(), ovl_set_link_redirect()): its old
// name when it stays in its parent (absolute false), else its path in the
// merged view. One it has already is kept when it is absolute, or the file
// stays in its parent. It returns the redirect written, "" if none.
func (n *node) metacopyRedirect(absolute bool, undo *upper.Undo) (string, syscall.Errno) {
	if n.metacopyData() == nil {
		return "", 0
	}
	n.mu.Lock()
	old := n.redirectLocked()
	n.mu.Unlock()
	if old != "" && (!absolute || old[0] == '/') {
		return "", 0
	}
	path, e := n.redirectFor(absolute)
	if e != 0 {
		return "", e
	}
	n.locMu.RLock()
	par, name := n.location()
	err := n.ofs.upper.SetFileRedirect(par.Dir, name, path, undo)
	n.locMu.RUnlock()
	if errors.Is(err, syscall.EOPNOTSUPP) {
		// As for a directory (prepareMove), and the kernel's
		// ovl_check_setxattr(): mv copies.
		return "", syscall.EXDEV
	}
	if err != nil {
		return "", n.ofs.errno(err)
	}
	return path, 0
}

// warnMetacopy logs a metacopy file a lookup of name could not follow, at
// most once a second, as the kernel's ratelimited warning.
func (f *FS) warnMetacopy(name string, me *lower.MetacopyError) {
	now := time.Now().UnixNano()
	last := f.metacopyWarned.Load()
	if now-last < int64(time.Second) || !f.metacopyWarned.CompareAndSwap(last, now) {
		return
	}
	f.log.Printf("lookup %q: %v", name, me)
}
