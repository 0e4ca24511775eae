// Package privs removes privileges from files the way the kernel does after
// a write, a truncate or a chown (Linux: fs/inode.c file_remove_privs(),
// security/commoncap.c cap_inode_killpriv()), and keeps the per-inode fact
// that makes most of that work unnecessary.
//
// It knows nothing of FUSE: callers hand it a file (a directory fd and a
// name), and it reports what it did.
package privs

import (
	"errors"
	"sync/atomic"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// CapabilityXattr holds a file's capabilities (setcap(8)).
const CapabilityXattr = "security.capability"

// Killed says what Strip removed.
type Killed struct {
	Suid, Sgid, Caps bool
}

// Any reports whether anything was removed.
func (k Killed) Any() bool { return k.Suid || k.Sgid || k.Caps }

// File is a regular file in a layer: entry Name of the directory with fd
// Dir, and its path through /proc for the l*xattr calls.
type File struct {
	Dir      int
	Name     string
	ProcPath string
}

// Strip removes what a write by a caller without CAP_FSETID must remove,
// with the uapi semantics of FUSE_HANDLE_KILLPRIV_V2 (linux/fuse.h): clear
// S_ISUID; clear S_ISGID when the group may execute; remove
// security.capability. mode is the file's current mode.
//
// It reports whether the file now carries none of the three (clean), which
// is what NoSec caches.
func Strip(f File, mode uint32) (k Killed, clean bool, err error) {
	newMode := mode
	if mode&unix.S_ISUID != 0 {
		newMode &^= unix.S_ISUID
		k.Suid = true
	}
	if mode&unix.S_ISGID != 0 && mode&unix.S_IXGRP != 0 {
		newMode &^= unix.S_ISGID
		k.Sgid = true
	}
	if newMode != mode {
		if err := unix.Fchmodat(f.Dir, f.Name, newMode&07777, 0); err != nil {
			return Killed{}, false, err
		}
	}
	switch err := xattr.LRemove(f.ProcPath, CapabilityXattr); {
	case err == nil:
		k.Caps = true
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
	default:
		return k, false, err
	}
	// sgid without g+x is not a privilege (mandatory locking, once) and
	// stays, as in the kernel: the file is then not clean.
	return k, newMode&(unix.S_ISUID|unix.S_ISGID) == 0, nil
}

// Check establishes whether f carries no suid, no sgid and no
// security.capability: one getxattr, the mode being known.
func Check(f File, mode uint32) (clean bool, err error) {
	if mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return false, nil
	}
	_, err = xattr.LGet(f.ProcPath, CapabilityXattr)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
		return true, nil
	}
	return false, err
}

// NoSec is the per-inode fact "this file carries no suid, no sgid and no
// security.capability". Set only after a full check; cleared by everything
// that can make it false (chmod, setxattr/removexattr of a security.* name,
// copy-up, a rename over the file), after the change. A chown cannot: it
// adds no set-id bit and no capability.
//
// A check races with a change: Begin before the check returns a generation
// that Set must still find, so a check that read the file before a change
// cannot record its stale answer after the change's Clear.
type NoSec struct{ state atomic.Uint64 } // generation<<1 | known

// Known reports whether the fact holds.
func (n *NoSec) Known() bool { return n.state.Load()&1 != 0 }

// Begin starts a check.
func (n *NoSec) Begin() uint64 { return n.state.Load() &^ 1 }

// Set records the fact, unless a Clear came after Begin returned gen.
func (n *NoSec) Set(gen uint64) { n.state.CompareAndSwap(gen, gen|1) }

// Clear forgets the fact.
func (n *NoSec) Clear() {
	for {
		s := n.state.Load()
		if n.state.CompareAndSwap(s, (s&^1)+2) {
			return
		}
	}
}

// Counters count the privilege work of a mount, for `goverlay stats`.
type Counters struct {
	// CapGetxattr counts GETXATTR(security.capability) requests served.
	CapGetxattr atomic.Uint64
	// CapGetxattrCached counts those answered from NoSec without asking
	// the upper layer.
	CapGetxattrCached atomic.Uint64
	// Checks counts kill requests that had to look at the file.
	Checks atomic.Uint64
	// Skipped counts kill requests answered by NoSec alone.
	Skipped atomic.Uint64
	// KilledSuid, KilledSgid, KilledCaps count removals by kind.
	KilledSuid, KilledSgid, KilledCaps atomic.Uint64
}

// Count adds what Strip removed.
func (c *Counters) Count(k Killed) {
	if k.Suid {
		c.KilledSuid.Add(1)
	}
	if k.Sgid {
		c.KilledSgid.Add(1)
	}
	if k.Caps {
		c.KilledCaps.Add(1)
	}
}
