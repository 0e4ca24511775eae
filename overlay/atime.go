package overlay

import (
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// Access times.
//
// The kernel's FUSE client never updates the atime of a FUSE file itself:
// every FUSE inode is S_NOATIME (fuse_iget()), whatever the mount's flags.
// It drops the atime it holds after a READ, READDIR or READLINK it sent
// (fuse_invalidate_atime()), and after a passthrough read, so that the
// next stat asks; the rest is the daemon's. goverlay applies the mount's
// noatime, relatime (the default) or strictatime, and nodiratime, as the
// kernel overlay does (ovl_update_time(): the upper file's atime, never a
// lower file's), where it learns of a read:
//
//   - A READ of an upper file is a pread of an fd opened without
//     O_NOATIME on the daemon's clone of the upper mount, whose atime flags
//     are the mount's (lower/atime.go): the upper filesystem updates the
//     file's atime in the read itself, as touch_atime() decides. So does
//     the kernel's own read of a passthrough file, on the same clone.
//   - A READDIR that reads the listing (dirHandle.load) reads the upper
//     directory so (lower.Chain.ReadDirAccess). With strictatime the
//     kernel caches no listing (diropen.go), so that every listing does.
//   - An open for reading, with noopen=0 (Open): a file the kernel has
//     cached is read without a READ (FOPEN_KEEP_CACHE), so the open is the
//     one sign of those reads goverlay gets (touchOpened).
//
// Every read of a lower layer, and the mount's own reads of the upper one
// (a copy-up's, an emptiness check's), are opened O_NOATIME. What cannot
// match the kernel overlay is in the man page (ACCESS TIMES): reads the
// kernel serves from its page cache with noopen=1 never reach the daemon,
// nor listings it serves from its cache (it keeps none with strictatime).

// atimeOf is the access-time policy of the mount flags opts
// (Options.KernelOptions): strictatime wins over noatime, as in the
// kernel's path_mount(), and relatime is the default.
func atimeOf(opts []string) lower.Atime {
	a := lower.Atime{NoDirs: slices.Contains(opts, "nodiratime")}
	switch {
	case slices.Contains(opts, "strictatime"):
		a.Mode = lower.Strictatime
	case slices.Contains(opts, "noatime"):
		a.Mode = lower.Noatime
	}
	return a
}

// createFlags are the open flags of a new upper file the kernel creates
// with open flags flags: backingFlags, and O_NOATIME with noatime, since
// the file's fd may serve reads (noopen.go keeps it for the node).
func (f *FS) createFlags(flags uint32) int {
	b := backingFlags(flags)
	if f.atime.Never(false) {
		b |= unix.O_NOATIME
	}
	return b
}

// relatimeSpan is how old an atime may get before relatime updates it
// anyway (relatime_need_update(), fs/inode.c).
const relatimeSpan = 24 * time.Hour

// touchOpened updates the atime of n's upper file, just opened for
// reading as fd by an OPEN, as the mount's policy says: with relatime
// only when relatime_need_update() would, which n remembers it would not
// until the file changes (atimeCheck). It reads one byte through fd, which
// updates atime in the upper filesystem's read (file_accessed()) and
// changes nothing else (utimensat(2) would set ctime too), and has the
// kernel drop the file's attributes, so that stat shows the new atime.
func (n *node) touchOpened(fd int) {
	a := n.ofs.atime
	switch a.Mode {
	case lower.Noatime:
		return
	case lower.Relatime:
		if n.atimeCheck() {
			return
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			return
		}
		at := st.Atim.Nano()
		if at > st.Mtim.Nano() && at > st.Ctim.Nano() && time.Now().UnixNano() < at+int64(relatimeSpan) {
			n.setAtimeFresh(at + int64(relatimeSpan))
			return
		}
	}
	var b [1]byte
	if _, err := unix.Pread(fd, b[:], 0); err != nil {
		return
	}
	if a.Mode == lower.Relatime {
		n.setAtimeFresh(time.Now().Add(relatimeSpan).UnixNano())
	}
	n.NotifyContent(-1, 0)
}

// atimeChecking is rareFields.atimeFresh while an open checks the atime:
// a change meanwhile (atimeStale) makes it 0, and the check's result is
// then not recorded (setAtimeFresh).
const atimeChecking = -1

// atimeCheck reports whether n's upper file is known to need no atime
// update under relatime: an open updated or checked it less than a day
// ago, and nothing changed the file since (atimeStale), nor can without
// the daemon seeing it (a passthrough writer). If not, the caller checks
// it, and records the result with setAtimeFresh.
func (n *node) atimeCheck() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.rareMadeLocked()
	if r.openPassthrough == 0 && time.Now().UnixNano() < r.atimeFresh.Load() {
		return true
	}
	r.atimeFresh.Store(atimeChecking)
	return false
}

// setAtimeFresh records that n's upper file needs no atime update under
// relatime until until (Unix nanoseconds), unless it changed since
// atimeCheck.
func (n *node) setAtimeFresh(until int64) {
	if r := n.rare.Load(); r != nil {
		r.atimeFresh.CompareAndSwap(atimeChecking, until)
	}
}

// atimeStale forgets that n's atime is fresh: the upper file's mtime or
// ctime changed, or may have.
func (n *node) atimeStale() {
	if r := n.rare.Load(); r != nil && r.atimeFresh.Load() != 0 {
		r.atimeFresh.Store(0)
	}
}
