package overlay

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/upper"
)

// The fast-exec bit of a directory says "anyone may search it": x for
// owner, group and others, and no access ACL (decided once, not on each
// lookup). It is computed when the directory's node is made and again
// only when its mode, owner or ACL changes through the mount, or it is
// copied up (copy-up keeps mode and ACL, so the bit stays).
//
// It decides how long the kernel may trust the directory's attributes.
// FUSE routes every MAY_EXEC of a path walk through fuse_permission(),
// which refreshes stale attributes with a GETATTR (fs/fuse/dir.c): a
// fast-exec directory's attributes never go stale (trustTimeout), so a warm
// path walk sends nothing. That is safe because nothing but this mount
// changes a directory's mode, owner or ACL, and each such change reaches
// the kernel in the SETATTR/SETXATTR reply. A restricted directory gets
// restrictedTimeout, the conservative choice for the directories whose
// permission answer can differ by caller.

// computeFastExec sets n's fast-exec bit from st, n's topmost instance.
func (n *node) computeFastExec(st *unix.Stat_t) {
	fast := st.Mode&0o111 == 0o111
	if fast {
		top := n.top()
		if _, err := top.Getxattr("", upper.ACLAccessXattr); err == nil {
			fast = false
		}
	}
	n.fastExec.Store(fast)
	if fast {
		n.ofs.stats.fastExecDirs.Add(1)
	} else {
		n.ofs.stats.restrictedDirs.Add(1)
	}
}

// refreshFastExec recomputes the bit of directory n after a change of its
// mode, owner or ACL.
func (n *node) refreshFastExec() {
	if !n.isDir() {
		return
	}
	var st unix.Stat_t
	if n.stat(&st) == nil {
		n.computeFastExec(&st)
	}
}

// attrTimeout is how long the kernel may keep n's attributes.
func (n *node) attrTimeout() time.Duration {
	if n.isDir() && !n.fastExec.Load() {
		return restrictedTimeout
	}
	return trustTimeout
}

// setEntryTimeouts fills the timeouts of a LOOKUP-style reply for child n.
func (n *node) setEntryTimeouts(out *fuse.EntryOut) {
	out.SetEntryTimeout(trustTimeout)
	out.SetAttrTimeout(n.attrTimeout())
}
