// Package overlay is goverlay's FUSE filesystem: one node per merged inode
// over the layers that package lower reads, the upper layer that package
// upper writes, and the privilege removal of package privs. It is the only
// package that speaks to go-fuse, and the only place an error becomes the
// errno a request is answered with (FS.errno).
//
// # Layer model
//
// A directory node holds a chain: its instance in each layer that
// contributes to it, topmost first, cut at the first opaque one. A
// non-directory node holds its links: each name it has, as the directory
// in the topmost layer that has the file and the name there. A copy-up
// (copyup.go) puts a node's instance on top of the chain, or moves its
// links to the upper layer; a rename or unlink changes its links. Open
// files are handles; a handle opened before a copy-up switches to the upper
// file at its next use (handle.current).
//
// # Locks
//
// From outermost to innermost; a lock is only taken while holding locks
// listed above it, never the other way round:
//
//  1. node.copyMu serialises the copy-up of one node. A copy-up takes its
//     node's copyMu, then its parent's (upperDir copies the ancestors
//     first): child before parent, and copy-up only walks up the tree, so
//     it cannot cycle. An unlink holds the file's copyMu from its lookup to
//     the removal (remove.go), and a rename the copyMu of the file it
//     replaces, taken after its own copy-ups (rename.go). A metacopy file's data copy-in holds it,
//     and its locMu for reading while the data is copied (metacopy.go).
//  2. node.locMu is held for reading while a name of the node is used for a
//     system call, and for writing while a copy-up, rename or unlink
//     changes the node's names, so no system call meets a name half moved.
//     Rename holds several, in address order (lockNames); nothing else
//     holds more than one.
//     A node's timesMu (rareFields, timesLock), with the writeback
//     cache, serialises setting a file's times (Setattr, under locMu)
//     with a written-back page's restoring of its mtime (keepMtime) and
//     a metacopy file's data copy-in; nothing of ours is taken under it
//     (timesLock takes node.mu before it, not under it), so a write asks
//     for locMu before it takes timesMu.
//  3. handle.mu guards a handle's fds (fd, upper, stale). It is taken
//     before node.mu and a lower.Dir's mu: handle.current reads the node's
//     location and opens the upper file under it.
//  4. node.mu guards the fields a copy-up or rename changes: chain,
//     redirect, link0 and links, key, unlinked, tmp, orphan, orphanLower, data (a
//     metacopy file's, which its data copy-in drops under locMu held for
//     writing, as a copy-up switches links), the open-handle counts and
//     the shared fd of a file opened without a request (fd, noopen.go);
//     redirect, data, the counts, the names after the first (links) and
//     key live in rareFields, made under it.
//     Functions named ...Locked need it held (their "Preconditions:" line
//     says so).
//  5. dirHandle.mu guards an open directory's listing and position; nothing
//     is taken under it.
//  6. lower.Dir's mu guards one directory fd (open, pins, parent and name).
//     A node.mu may be held when it is taken (OnForget, linkTemp). A Dir
//     takes its own mu before its parent's (a reopen walks up), so it is
//     child before parent. A Dir's listing lock (lsMu), held while its
//     listing is read, is taken before its mu.
//  7. The fd cache's and the listing cache's locks (lower/fdcache.go,
//     lower/listing.go) are innermost: they are taken under a Dir's mu or
//     lsMu, and the fd cache only ever TryLocks a Dir's mu under its own,
//     so it never waits for one.
//
// The inode-number map's lock (ino.go), the idle directory streams'
// lock (dirStreams.mu, diropen.go) and the ring of shared fds (fdRing.mu,
// noopen.go) are leaves: nothing of ours is taken under them (an evicted
// directory stream is closed through go-fuse under dirStreams.mu, and its
// dirHandle's release takes nothing). The tables that need no lock of
// ours (upperFiles, keptIDs, raw's request marks) are sync.Maps.
//
// Calls into go-fuse's inode tree (GetChild, Parent, NewInode) may be made
// under any of these: go-fuse's own locks are taken and released inside
// them.
package overlay
