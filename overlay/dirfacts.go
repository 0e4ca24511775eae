package overlay

// A new object takes from its directory the group, where the directory is
// setgid, and the default ACL, where it has one (owner, inherit). Most
// directories have neither, and asking costs a stat and a getxattr of the
// directory on every create. A directory's dirFacts remembers that it has
// neither, once read. Like the fast-exec bit (fastexec.go) it is dropped
// whenever the directory's mode, owner or ACLs change through the mount,
// the only way they change.
//
// The word holds a generation above the fact bits. forgetDirFacts, called
// after a change, clears the bits and moves to the next generation, so
// that a reading taken before the change and stored after it finds
// another generation and is dropped, instead of bringing back what the
// change undid.

const (
	// factNoSetgid: the directory is not setgid.
	factNoSetgid = 1 << iota
	// factNoDefaultACL: the directory's upper instance has no default
	// ACL (read as absent, not only unread).
	factNoDefaultACL
	// factMadeHere: the directory was made through the mount, in the
	// upper layer alone, and so holds no whiteout of either format:
	// goverlay writes whiteouts only for names of lower layers, and it
	// has none. A create in it needs no probe for one; the create's own
	// O_EXCL open, link or RENAME_NOREPLACE fails on a taken name. Never
	// forgotten: no change of mode, owner or ACL gives it a lower layer.
	factMadeHere
	// factBits is the number of fact bits below the generation.
	factBits = iota
)

// dirFact reports whether directory n is known to have fact, and the word
// to pass to rememberDirFact once it was read.
func (n *node) dirFact(fact uint32) (bool, uint32) {
	w := n.dirFacts.Load()
	return w&fact != 0, w
}

// rememberDirFact records that n, read after dirFact returned w, has fact,
// unless its facts were forgotten since.
func (n *node) rememberDirFact(w, fact uint32) {
	for {
		now := n.dirFacts.Load()
		if now>>factBits != w>>factBits || n.dirFacts.CompareAndSwap(now, now|fact) {
			return
		}
	}
}

// forgetDirFacts drops what n's dirFacts knows, after a change of n's
// mode, owner or ACLs.
func (n *node) forgetDirFacts() {
	for {
		w := n.dirFacts.Load()
		if n.dirFacts.CompareAndSwap(w, (w>>factBits+1)<<factBits|w&factMadeHere) {
			return
		}
	}
}
