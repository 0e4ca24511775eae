package overlay

// Passthrough (Linux 6.9+): the kernel reads and writes an open file's
// backing file itself, without a request to the daemon.
//
// Only files already in the upper layer are opened in passthrough mode.
// go-fuse keeps one backing file per node, and the kernel one per inode:
// a lower file opened that way would stay the backing file of its node
// after a copy-up, and a later writer would write the lower layer. A lower
// file opened for writing is copied up first, so writers do get
// passthrough.
//
// Privileges (README.md, "NOSEC and privilege removal"): a passthrough
// write never reaches the daemon and runs with the daemon's credentials
// (fs/fuse/passthrough.c), so neither
// the WRITE kill flag nor the backing filesystem clears suid. What does
// reach the daemon, before the write, is the kernel's own attempt to
// remove privileges through file_remove_privs() on the FUSE inode: with
// FUSE_HANDLE_KILLPRIV_V2 it arrives as an empty SETATTR (no attribute
// bits). Setattr takes an empty SETATTR on a regular file as that request
// and strips the file (killPrivsNow).

// openMode decides the I/O mode of a new handle of n and counts it.
//
// Writers get passthrough: that is where it pays (no WRITE request per
// write). Readers get the page cache (FOPEN_KEEP_CACHE), which serves
// repeated reads and execs without a backing file to set up per open; a
// reader joins passthrough only while a passthrough handle is open, since
// the kernel refuses to mix the two modes on one inode (ETXTBSY). For the
// same reason a writer stays cached while a cached handle is open.
func (n *node) openMode(upper, write bool) (passthrough bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.rareMadeLocked()
	switch {
	case !upper || !n.ofs.passthrough.Load():
	case write:
		passthrough = r.openCached == 0
	default:
		passthrough = r.openPassthrough > 0
	}
	if passthrough {
		r.openPassthrough++
	} else {
		r.openCached++
	}
	return passthrough
}

// closed uncounts a released handle.
func (n *node) closed(passthrough bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.rareMadeLocked()
	if passthrough {
		r.openPassthrough--
		// Its writes changed the file without the daemon.
		r.atimeFresh.Store(0)
	} else {
		r.openCached--
	}
	n.dropTempLocked()
}
