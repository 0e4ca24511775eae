package fuseserve

import (
	"runtime"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The /dev/fuse readers and the Go scheduler.
//
// A reader of /dev/fuse (the inline one, or go-fuse's up to GOMAXPROCS
// under io_uring) waits for its next request in read(2) holding its P,
// and two behaviours of the Go runtime's sysmon make that costly:
// addSpareProcs and yield work around them.

// addSpareProcs gives the Go scheduler two Ps more than go-fuse has
// readers. Each reader waits for the next request in read(/dev/fuse)
// holding its P. While every P is held so, the runtime's sysmon takes
// the Ps away from the blocked readers (runtime/proc.go retake(): a P in
// a system call is left alone only while another P is idle) and keeps
// polling every 20 µs; a reader woken by a request then finds its P gone,
// parks, and waits for another thread to hand it one. With an idle P
// left over, a woken reader takes its own P back at once, and sysmon
// backs off to its 10 ms poll. go-fuse runs GOMAXPROCS readers at most
// (fuse.NewServer: between 2 and 16, plus one that is starting).
func addSpareProcs() {
	readers := min(max(runtime.GOMAXPROCS(0), 2), 16) + 1
	if procs := readers + 2; procs > runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(procs)
	}
}

// Keeping the Go runtime's sysmon asleep.
//
// A reader serves a request in the goroutine that read it from
// /dev/fuse, and that goroutine then reads the next one: a busy reader runs request
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

// The requests a busy mount receives often yield first: handler wraps
// the filesystem go-fuse and the rings serve (serve.go).

func (h *handler) Lookup(cancel <-chan struct{}, in *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return h.RawFileSystem.Lookup(cancel, in, name, out)
}

func (h *handler) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	yield()
	return h.RawFileSystem.GetAttr(cancel, in, out)
}

func (h *handler) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	yield()
	return h.RawFileSystem.SetAttr(cancel, in, out)
}

func (h *handler) GetXAttr(cancel <-chan struct{}, in *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	yield()
	return h.RawFileSystem.GetXAttr(cancel, in, attr, dest)
}

func (h *handler) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	yield()
	return h.RawFileSystem.Open(cancel, in, out)
}

func (h *handler) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	yield()
	return h.RawFileSystem.Create(cancel, in, name, out)
}

func (h *handler) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	yield()
	return h.RawFileSystem.Tmpfile(cancel, in, out)
}

func (h *handler) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	yield()
	return h.RawFileSystem.Read(cancel, in, buf)
}

// Write and Writev both: the server calls Writev first.
func (h *handler) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	yield()
	return h.RawFileSystem.Write(cancel, in, data)
}

func (h *handler) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	yield()
	return h.RawFileSystem.Writev(cancel, in, data)
}

func (h *handler) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	yield()
	return h.RawFileSystem.Flush(cancel, in)
}

func (h *handler) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	yield()
	h.RawFileSystem.Release(cancel, in)
}

func (h *handler) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	yield()
	return h.RawFileSystem.ReadDir(cancel, in, out)
}

func (h *handler) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	yield()
	return h.RawFileSystem.ReadDirPlus(cancel, in, out)
}

func (h *handler) Readlink(cancel <-chan struct{}, in *fuse.InHeader) ([]byte, fuse.Status) {
	yield()
	return h.RawFileSystem.Readlink(cancel, in)
}

func (h *handler) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return h.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (h *handler) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return h.RawFileSystem.Mknod(cancel, in, name, out)
}

func (h *handler) Unlink(cancel <-chan struct{}, in *fuse.InHeader, name string) fuse.Status {
	yield()
	return h.RawFileSystem.Unlink(cancel, in, name)
}

func (h *handler) Rmdir(cancel <-chan struct{}, in *fuse.InHeader, name string) fuse.Status {
	yield()
	return h.RawFileSystem.Rmdir(cancel, in, name)
}

func (h *handler) Symlink(cancel <-chan struct{}, in *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return h.RawFileSystem.Symlink(cancel, in, target, name, out)
}

func (h *handler) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	yield()
	return h.RawFileSystem.Rename(cancel, in, oldName, newName)
}

func (h *handler) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	yield()
	return h.RawFileSystem.Link(cancel, in, name, out)
}

func (h *handler) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	yield()
	return h.RawFileSystem.Fsync(cancel, in)
}

func (h *handler) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	yield()
	return h.RawFileSystem.Statx(cancel, in, out)
}
