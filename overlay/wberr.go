package overlay

// Write-back errors: what the upper layer holds after a WRITE the kernel
// wrote back from its cache failed (a full upper, a quota, an I/O error),
// and what the mount shows then.
//
// The kernel's writeback cache takes write(2) into the FUSE inode's pages
// and writes them back later, in WRITE requests flagged FUSE_WRITE_CACHE
// (writeback.go); without it, the pages of a shared writable mapping come
// the same way. A failed one is reported to the application at close(2)
// and fsync(2) only (fuse_writepage_end() records it with
// mapping_set_error()), and the kernel keeps its pages, now clean, and the
// size its writes gave the file. Two things then go wrong unless the
// daemon steps in:
//
//   - Holes. goverlay serves a file's WRITEs in parallel, so a WRITE at a
//     later offset may reach the upper file before one at an earlier
//     offset, leaving a hole between them for a moment. If the earlier
//     one then fails, the hole stays: a file with zeros in the middle
//     that the application never wrote. Each pass of the kernel's
//     writeback sends a file's pages in the order of their offsets
//     (write_cache_pages()), and numbers its requests in the order it
//     queues them (fuse_get_unique()), so a WRITE with a lower request
//     ID was sent before. A WRITE that would begin beyond the upper
//     file's end (a gap) first waits for the WRITEs of the file with
//     lower IDs that are in flight (wbFlight): they fill the gap, or fail
//     and it fails too (below). One sent earlier that goverlay has read
//     but not yet begun to serve escapes the wait; for it, when a WRITE
//     fails at X, the upper file is cut back to X, or to where the first
//     gap a later WRITE opened began if that is further: it then ends
//     where the application's data stopped reaching the disk (unless the
//     upper filesystem refuses the truncation itself, as btrfs can over
//     its quota). From then on, until the failure has been
//     reported (FSYNC) or the kernel truncates or forgets the file, a
//     WRITE that would start beyond the upper file's end fails with the
//     same error instead of opening a new gap. Data that no sync ever
//     confirmed is all this drops: fsync(2) and close(2) wait for every
//     WRITE in flight and so report the failure.
//   - Data on no disk. The kernel keeps showing the pages it failed to
//     write, and the size its writes gave the file (with the writeback
//     cache the kernel keeps a regular file's size itself and ignores the
//     daemon's, fuse_get_cache_mask()). goverlay drops the file's
//     directory entries (FUSE_NOTIFY_INVAL_ENTRY) before it answers the
//     failed WRITE, so the kernel evicts the inode with its pages once
//     the last descriptor is closed (FUSE inodes are not kept unused,
//     fuse_super_operations' drop_inode), and the next lookup shows the
//     upper file as it is, or the lower file when its copy-up failed.
//     While a descriptor stays open, the kernel keeps the pages and the
//     size. Invalidating the pages (FUSE_NOTIFY_INVAL_INODE) would not
//     help: it can only follow the answer (the kernel waits for the end
//     of a page's writeback to drop it), and it holds the inode while it
//     runs, so a close(2) in that window leaves the inode cached, stale
//     size included, for the next lookup to find.
//
// write(2) itself cannot fail with ENOSPC under the writeback cache: it
// never reaches the daemon. writeback=0 sends every write(2) through
// goverlay (or passthrough), which then returns the upper filesystem's
// error from write(2) as the kernel overlay does (docs/ARCHITECTURE.md).

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// wbGapsKept bounds the gaps a node remembers: a gap matters only while the
// WRITEs sent before the one that opened it are in flight, at most the
// kernel's background requests (max_background).
const wbGapsKept = 32

// wbState is a node's record of its write-back WRITEs (rareFields.wb),
// guarded by rareFields.timesMu.
type wbState struct {
	// err is the first error of a write-back WRITE since the last
	// reset (wbReset); 0 when none failed.
	err syscall.Errno
	// gaps are the latest WRITEs that began beyond the upper file's end.
	gaps []wbGap
}

// wbGap is a write-back WRITE that began beyond the upper file's end,
// which was at from.
type wbGap struct {
	from   int64
	unique uint64
}

// wbEntryWait bounds how long a failed WRITE's answer waits for the
// kernel to drop the file's directory entries: the notification takes the
// directory's lock, whose holder may wait for the file's lock, held by a
// caller waiting for this WRITE (fsync(2) holds it while it writes back).
// Past it, the entries are dropped once the lock is free.
const wbEntryWait = 200 * time.Millisecond

// cacheWrite writes data at off of fd, n's upper file, for a WRITE the
// kernel wrote back from its cache (flagCacheWrite), under the rules
// above; strip says it goes through mmapWrite (strippable).
func (n *node) cacheWrite(ctx context.Context, fd int, data [][]byte, off int64, strip bool) (int, error) {
	m := n.ofs.raw.seen(ctx)
	done, failedAt, err := n.cacheWriteLocked(fd, data, off, strip, m.unique, false)
	if errors.Is(err, errGap) {
		// First let the WRITEs sent before this one fill the gap,
		// or fail.
		n.ofs.raw.flight.waitEarlier(m)
		done, failedAt, err = n.cacheWriteLocked(fd, data, off, strip, m.unique, true)
	}
	if failedAt >= 0 {
		n.dropUnwritten()
	}
	return done, err
}

// errGap: a write-back WRITE would begin beyond the upper file's end, and
// has not yet waited for the earlier ones (cacheWrite).
var errGap = errors.New("a gap before the write")

// cacheWriteLocked is cacheWrite under n's times lock; failedAt is where
// the upper file's data stops being what was written, or -1. It writes
// nothing and returns errGap for a gap unless waited.
func (n *node) cacheWriteLocked(fd int, data [][]byte, off int64, strip bool, unique uint64, waited bool) (done int, failedAt int64, err error) {
	defer n.timesLock()()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, -1, err
	}
	wb := n.wbLocked(false)
	if wb != nil && wb.err != 0 && off > st.Size {
		return 0, off, wb.err
	}
	if off > st.Size && unique != 0 && !waited {
		return 0, -1, errGap
	}
	total := 0
	for _, b := range data {
		total += len(b)
	}
	for done < total {
		var k int
		rest := advance(data, done)
		if strip {
			k, err = mmapWrite(fd, joined(rest), off+int64(done))
		} else {
			k, err = unix.Pwritev(fd, rest, off+int64(done))
		}
		done += max(k, 0)
		if err != nil {
			break
		}
		if k == 0 {
			err = unix.ENOSPC
			break
		}
	}
	if n.ofs.writeback.Load() {
		// The kernel keeps the mtime (keepMtime).
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, st.Mtim}
		if terr := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err == nil && terr != nil {
			err = terr
		}
	}
	if done < total {
		at := off + int64(done)
		n.wbFailedLocked(fd, at, unique, err)
		return done, at, err
	}
	if err == nil && off > st.Size && unique != 0 {
		wb = n.wbLocked(true)
		if len(wb.gaps) == wbGapsKept {
			wb.gaps = append(wb.gaps[:0], wb.gaps[1:]...)
		}
		wb.gaps = append(wb.gaps, wbGap{from: st.Size, unique: unique})
	}
	return done, -1, err
}

// wbFailedLocked records that a write-back WRITE, request unique, left
// the upper file fd's data at at, and cuts off what WRITEs sent after it
// put beyond a gap.
//
// Preconditions: n's times lock is held.
func (n *node) wbFailedLocked(fd int, at int64, unique uint64, err error) {
	wb := n.wbLocked(true)
	if wb.err == 0 {
		// The application learns of it at close(2) or fsync(2), as
		// EIO unless ENOSPC: the log says what it was.
		n.ofs.log.Printf("writing back inode %d failed at offset %d: %v", n.StableAttr().Ino, at, err)
		var e syscall.Errno
		if !errors.As(err, &e) {
			e = syscall.EIO
		}
		wb.err = e
	}
	cut := int64(-1)
	kept := wb.gaps[:0]
	for _, g := range wb.gaps {
		if unique != 0 && g.unique > unique {
			if cut < 0 || g.from < cut {
				cut = g.from
			}
			continue
		}
		kept = append(kept, g)
	}
	wb.gaps = kept
	if cut < 0 || fd < 0 {
		return
	}
	cut = max(cut, at)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Size > cut {
		unix.Ftruncate(fd, cut)
	}
}

// writeFailed records a write-back WRITE at off that failed before it
// reached an upper file (its copy-up failed), and drops what the kernel
// shows of it.
func (n *node) writeFailed(ctx context.Context, off int64, err error) {
	if n.ofs.raw.seen(ctx).flags&flagCacheWrite == 0 {
		return
	}
	unlock := n.timesLock()
	n.wbFailedLocked(-1, off, n.ofs.raw.seen(ctx).unique, err)
	unlock()
	n.dropUnwritten()
}

// wbLocked returns n's write-back record, made if create and there is
// none.
//
// Preconditions: n's times lock is held.
func (n *node) wbLocked(create bool) *wbState {
	r := n.rare.Load()
	if r.wb == nil && create {
		r.wb = &wbState{}
	}
	return r.wb
}

// wbReset forgets a failed write-back: it was reported (FSYNC), or the
// kernel truncated the file or forgot it, and with them its pages.
func (n *node) wbReset() {
	r := n.rare.Load()
	if r == nil {
		return
	}
	r.timesMu.Lock()
	r.wb = nil
	r.timesMu.Unlock()
}

// dropUnwritten makes the kernel let go of what it shows of n beyond the
// upper file's data once the file is closed: it drops n's directory
// entry now (bounded by wbEntryWait), so that the last close evicts the
// inode.
func (n *node) dropUnwritten() {
	n.ofs.willWait()
	done := make(chan struct{})
	go n.ofs.guard.guarded("the notification of an unwritten file", func() {
		defer close(done)
		if name, p := n.Parent(); p != nil {
			p.NotifyEntry(name)
		}
	})()
	select {
	case <-done:
	case <-time.After(wbEntryWait):
	}
}

// pageSize is the kernel's page size, the unit of its page cache.
var pageSize = unix.Getpagesize()

// advance returns data without its first k bytes.
func advance(data [][]byte, k int) [][]byte {
	for len(data) > 0 && k >= len(data[0]) {
		k -= len(data[0])
		data = data[1:]
	}
	if k == 0 || len(data) == 0 {
		return data
	}
	return append([][]byte{data[0][k:]}, data[1:]...)
}

// joined is data in one buffer.
func joined(data [][]byte) []byte {
	if len(data) == 1 {
		return data[0]
	}
	var b []byte
	for _, d := range data {
		b = append(b, d...)
	}
	return b
}

// seekFlushWait bounds how long SEEK_DATA and SEEK_HOLE wait for the
// kernel to write a file's pages back (seekFlush). It is reached only when
// every thread that could serve those WRITEs waits in a seek itself.
const seekFlushWait = 5 * time.Second

// seekFlush has the kernel write back n's dirty pages from off on and
// drop them, before SEEK_DATA or SEEK_HOLE is answered from the upper
// file. The kernel sends FUSE_LSEEK without writing back first
// (fuse_lseek()), so data still in its cache (the writeback cache's, a
// shared mapping's) would be a hole to the upper file: SEEK_DATA would
// skip it, and a copy by SEEK_DATA lose it. The invalidation
// (FUSE_NOTIFY_INVAL_INODE) writes each dirty page back before it drops
// it (invalidate_inode_pages2_range(), fuse_launder_folio()), in WRITEs
// other threads serve; it waits for no lock the seek holds (fuse_lseek()
// holds the inode's). A passthrough file's pages are the upper file's
// own, and need none of this.
func (n *node) seekFlush(off uint64) {
	done := make(chan struct{})
	go n.ofs.guard.guarded("a seek's flush", func() {
		defer close(done)
		n.NotifyContent(int64(off)&^int64(pageSize-1), 0)
	})()
	select {
	case <-done:
	case <-time.After(seekFlushWait):
		n.ofs.log.Printf("SEEK_DATA/SEEK_HOLE: the kernel did not write the file's cached pages back within %v; answered from the upper file as it is", seekFlushWait)
	}
}

// wbFlight is the set of write-back WRITEs in flight, by file: from
// rawFS's entry to its answer.
type wbFlight struct {
	mu   sync.Mutex
	cond sync.Cond
	// ids are the request IDs in flight of each file (kernel node
	// ID); a file has a few at most (max_background).
	ids map[uint64][]uint64
}

// start records m's WRITE as in flight, if it is a write-back one, and
// returns what ends that.
func (f *wbFlight) start(m reqMark) func() {
	if m.unique == 0 {
		return func() {}
	}
	f.mu.Lock()
	if f.ids == nil {
		f.ids = make(map[uint64][]uint64)
		f.cond.L = &f.mu
	}
	f.ids[m.nodeID] = append(f.ids[m.nodeID], m.unique)
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		ids := f.ids[m.nodeID]
		for i, u := range ids {
			if u == m.unique {
				ids = append(ids[:i], ids[i+1:]...)
				break
			}
		}
		if len(ids) == 0 {
			delete(f.ids, m.nodeID)
		} else {
			f.ids[m.nodeID] = ids
		}
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

// waitEarlier waits until no write-back WRITE of m's file sent before m's
// is in flight. Those it waits for wait for none sent after them, so the
// wait ends. One sent before but not yet begun to be served (go-fuse
// starts a goroutine a request, and the runtime runs the newest first;
// an io_uring queue's threads take its entries as each is free) is given
// wbGapGrace to show up.
func (f *wbFlight) waitEarlier(m reqMark) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var (
		timer    *time.Timer
		deadline time.Time
		seen     bool
	)
	for tries := 0; ; tries++ {
		earlier := false
		for _, u := range f.ids[m.nodeID] {
			if u < m.unique {
				earlier = true
				break
			}
		}
		switch {
		case earlier:
			seen = true
		case seen:
			return
		case tries < 3:
			// Let a goroutine started just before this one
			// begin.
			f.mu.Unlock()
			runtime.Gosched()
			f.mu.Lock()
			continue
		case timer == nil:
			deadline = time.Now().Add(wbGapGrace)
			timer = time.AfterFunc(wbGapGrace, func() {
				f.mu.Lock()
				f.cond.Broadcast()
				f.mu.Unlock()
			})
			defer timer.Stop()
		case !time.Now().Before(deadline):
			return
		}
		f.cond.Wait()
	}
}

// wbGapGrace is how long a WRITE that opens a gap waits for an earlier
// WRITE of its file to be served (waitEarlier): a gap the application
// made, a sparse file's, costs its first write-back this much.
const wbGapGrace = time.Millisecond
