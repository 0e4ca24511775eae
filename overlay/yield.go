package overlay

import (
	"runtime"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Keeping the Go runtime's sysmon asleep.
//
// go-fuse serves a request in the goroutine that read it from /dev/fuse,
// and that goroutine then reads the next one: a busy reader runs request
// after request without ever passing through the scheduler, so the
// schedtick of its P does not move. The runtime's sysmon takes that for
// a goroutine running too long: once a P's schedtick has not changed for
// 10 ms (forcePreemptNS) while its goroutine sits in a system call, here
// the read(2) of /dev/fuse between two requests, sysmon takes the P away
// (retake() in runtime/proc.go), and every P it takes puts sysmon back to
// waking every 20 µs for the next millisecond and more. On a mount that
// is kept busy (an exec loop, a tree read), that was most of the daemon's
// context switches, and two thirds of its CPU on the exec step of the
// containers group (docs/BENCHMARKS.md).
//
// So each request first calls yield, which passes through the scheduler
// (runtime.Gosched) when the P it runs on has not done so for
// yieldEvery. The clock is per P: sync.Pool hands a goroutine the
// private object of the P it runs on.

// yieldEvery is well under forcePreemptNS (10 ms), so that a P that
// serves requests now and then is never seen with the same schedtick by
// two sysmon passes 10 ms apart.
const yieldEvery = 4 * time.Millisecond

// yieldClock is when goroutines on one P last passed through the
// scheduler by yield.
type yieldClock struct{ last time.Time }

var yieldClocks = sync.Pool{New: func() any { return new(yieldClock) }}

// yield calls runtime.Gosched when this P has not yielded for yieldEvery.
func yield() {
	c := yieldClocks.Get().(*yieldClock)
	if now := time.Now(); now.Sub(c.last) >= yieldEvery {
		c.last = now
		runtime.Gosched()
	}
	yieldClocks.Put(c)
}

// The requests rawFS does not otherwise wrap, and that a busy mount
// receives often, yield first; the ones it wraps call yield themselves.

func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return r.RawFileSystem.Lookup(cancel, h, name, out)
}

func (r *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	yield()
	if !r.parted.Load() {
		return r.RawFileSystem.GetAttr(cancel, in, out)
	}
	r.inos.Store(cancel, uint64(0))
	st := r.RawFileSystem.GetAttr(cancel, in, out)
	if v, ok := r.inos.LoadAndDelete(cancel); ok && v.(uint64) != 0 && st.Ok() {
		out.Ino = v.(uint64)
	}
	return st
}

func (r *rawFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	yield()
	return r.RawFileSystem.SetAttr(cancel, in, out)
}

func (r *rawFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	yield()
	return r.RawFileSystem.GetXAttr(cancel, h, attr, dest)
}

func (r *rawFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	yield()
	return r.RawFileSystem.Read(cancel, in, buf)
}

func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	yield()
	if in.Fh == 0 {
		// A file opened without a request (noopen.go): nothing to
		// flush, as for any handle (handle.Flush); ENOSYS ends the
		// FLUSHes of the mount (fuse_flush()).
		return fuse.ENOSYS
	}
	return r.RawFileSystem.Flush(cancel, in)
}

func (r *rawFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	yield()
	return r.RawFileSystem.Readlink(cancel, h)
}

func (r *rawFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	yield()
	return r.RawFileSystem.Unlink(cancel, h, name)
}

func (r *rawFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	yield()
	return r.RawFileSystem.Rmdir(cancel, h, name)
}

func (r *rawFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return r.RawFileSystem.Symlink(cancel, h, target, name, out)
}

func (r *rawFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	yield()
	return r.RawFileSystem.Rename(cancel, in, oldName, newName)
}

func (r *rawFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return r.RawFileSystem.Link(cancel, in, name, out)
}

func (r *rawFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	yield()
	return r.RawFileSystem.Fsync(cancel, in)
}

func (r *rawFS) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	yield()
	return r.RawFileSystem.Statx(cancel, in, out)
}
