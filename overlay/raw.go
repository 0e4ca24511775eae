package overlay

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFS wraps go-fuse's node bridge to see what the bridge drops before it
// calls node and file methods: the kill-privilege flags
// (WriteIn.WriteFlags, OpenIn.Mode, CreateIn.OpenFlags) and the caller's
// umask (CreateIn.Umask, MkdirIn.Umask, MknodIn.Umask), which goverlay
// applies itself under FUSE_DONT_MASK (create.go). It marks the request,
// and the node code asks killRequested or umask with the request's
// context. A request is identified by its cancel channel, which go-fuse
// gives each request in flight (and reuses only once the request is done).
// Both are go-fuse internals, not its API: raw_test.go pins them.
type rawFS struct {
	fuse.RawFileSystem
	// stats counts opens by the I/O mode the kernel was given.
	stats *stats
	// guard is the mount's (guard.go), for what go-fuse calls outside
	// its dispatch of requests.
	guard *guard
	marks sync.Map // <-chan struct{} → reqMark
	// opens holds, for each OPEN and CREATE in flight, the handle the
	// node opened, whose I/O mode sets the reply's flags and backing
	// file (opened).
	opens sync.Map // <-chan struct{} → **handle
	// server registers backing files (passthrough.go); set at INIT.
	server atomic.Pointer[fuse.Server]
	// dirs serves the READDIRs of directories opened without a request
	// (diropen.go).
	dirs dirStreams
	// noOpen: regular files open without a request (noopen.go).
	noOpen bool
	// listEvery: directories open with a request, and the kernel
	// caches no listing (strictatime; diropen.go).
	listEvery bool
	// mask is what the mount's mask changes in replies (mask.go).
	mask replyMask
	// inos holds, for each GETATTR in flight, the inode number it
	// answers with instead of its node's, or 0 (reportIno); parted is set
	// once a copy-up parted a lower hard link, before which GETATTR
	// leaves inos alone.
	inos   sync.Map // <-chan struct{} → uint64
	parted atomic.Bool
	// flight has the write-back WRITEs in flight (wberr.go).
	flight wbFlight
}

// partedSeen records that a node may report an inode number other than
// its own (node.part).
func (r *rawFS) partedSeen() {
	if r != nil {
		r.parted.Store(true)
	}
}

// reportIno has the GETATTR of ctx answer with inode number ino: go-fuse
// answers with the node's own (rawBridge.getattr()). Other requests that
// go-fuse serves with the node's Getattr keep the node's number.
func (r *rawFS) reportIno(ctx context.Context, ino uint64) {
	c, ok := ctx.(*fuse.Context)
	if !ok || r == nil {
		return
	}
	if _, ok := r.inos.Load(c.Cancel); ok {
		r.inos.Store(c.Cancel, ino)
	}
}

// GetAttr answers with the inode number reportIno gave, once a copy-up
// parted a lower hard link.
func (r *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
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

// Flush of a file opened without a request has nothing to flush.
func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if in.Fh == 0 {
		// A file opened without a request (noopen.go): nothing to
		// flush, as for any handle (handle.Flush); ENOSYS ends the
		// FLUSHes of the mount (fuse_flush()).
		return fuse.ENOSYS
	}
	return r.RawFileSystem.Flush(cancel, in)
}

// reqMark is what rawFS saw on a request.
type reqMark struct {
	flags reqFlags
	umask uint32
	// unique is a write-back WRITE's request ID: the kernel numbers
	// requests in the order it queues them (fuse_get_unique()), and
	// writes back a file's pages in the order of their offsets, so a
	// WRITE with a higher ID was sent after one with a lower (wberr.go);
	// nodeID is the kernel's number of its file.
	unique, nodeID uint64
}

// reqFlags are what rawFS saw on a request.
type reqFlags uint8

const (
	// flagKill: FUSE_WRITE_KILL_SUIDGID or FUSE_OPEN_KILL_SUIDGID.
	flagKill reqFlags = 1 << iota
	// flagCacheWrite: FUSE_WRITE_CACHE, a page the kernel writes back
	// from its cache; without a writeback cache, a page of an mmap.
	flagCacheWrite
)

func (r *rawFS) mark(cancel <-chan struct{}, m reqMark) func() {
	if m == (reqMark{}) {
		return func() {}
	}
	r.marks.Store(cancel, m)
	return func() { r.marks.Delete(cancel) }
}

// writeMark is what a WRITE request carries for its handler.
func writeMark(in *fuse.WriteIn) reqMark {
	m := reqMark{flags: writeFlags(in)}
	if m.flags&flagCacheWrite != 0 {
		m.unique, m.nodeID = in.Unique, in.NodeId
	}
	return m
}

func writeFlags(in *fuse.WriteIn) (f reqFlags) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		f |= flagKill
	}
	if in.WriteFlags&fuse.WRITE_CACHE != 0 {
		f |= flagCacheWrite
	}
	return f
}

func killFlag(on bool) reqFlags {
	if on {
		return flagKill
	}
	return 0
}

// Write and Writev both need the wrapper: the server calls Writev first.
func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	m := writeMark(in)
	defer r.flight.start(m)()
	defer r.mark(cancel, m)()
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	m := writeMark(in)
	defer r.flight.start(m)()
	defer r.mark(cancel, m)()
	return r.RawFileSystem.Writev(cancel, in, data)
}

func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if r.noOpen {
		// See noopen.go: the kernel opens every regular file of
		// the mount by itself from now on.
		return fuse.ENOSYS
	}
	defer r.mark(cancel, reqMark{flags: killFlag(in.Mode&fuse.OPEN_KILL_SUIDGID != 0)})()
	h := r.opening(cancel)
	defer r.opens.Delete(cancel)
	st := r.RawFileSystem.Open(cancel, in, out)
	r.opened(st, out, *h)
	return st
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer r.mark(cancel, reqMark{flags: killFlag(in.OpenFlags&fuse.OPEN_KILL_SUIDGID != 0), umask: in.Umask})()
	h := r.opening(cancel)
	defer r.opens.Delete(cancel)
	st := r.RawFileSystem.Create(cancel, in, name, out)
	r.opened(st, &out.OpenOut, *h)
	return st
}

// Init keeps the server, which registers backing files. go-fuse calls it
// once INIT is answered, outside the recover of its dispatch
// (fuse.Server.handleInit).
func (r *rawFS) Init(srv *fuse.Server) {
	defer r.guard.recovered("INIT's setup")
	r.server.Store(srv)
	r.RawFileSystem.Init(srv)
}

// OnUnmount is the bridge's, which has the root node forget its
// directories (node.OnForget); go-fuse calls it once it has served the
// last request, outside the recover of its dispatch (fuse.Server.Serve).
func (r *rawFS) OnUnmount() {
	defer r.guard.recovered("the unmount's cleanup")
	r.RawFileSystem.OnUnmount()
}

// opening makes the slot where the node's Open or Create of the request
// of cancel leaves its handle (handleOpened).
func (r *rawFS) opening(cancel <-chan struct{}) **handle {
	h := new(*handle)
	r.opens.Store(cancel, h)
	return h
}

// handleOpened leaves h for the OPEN or CREATE of ctx to reply with.
func (r *rawFS) handleOpened(ctx context.Context, h *handle) {
	if c, ok := ctx.(*fuse.Context); ok && r != nil {
		if v, ok := r.opens.Load(c.Cancel); ok {
			*v.(**handle) = h
		}
	}
}

// opened sets the reply's flags and backing file from the I/O mode of h,
// the handle the node opened (nil for a CREATE that opened none), drops
// the flags the mask hides, and counts a regular file's open by its I/O
// mode.
func (r *rawFS) opened(st fuse.Status, out *fuse.OpenOut, h *handle) {
	if !st.Ok() {
		return
	}
	if h != nil {
		out.OpenFlags = h.kind.openFlags()
		out.BackingID = h.backing
	}
	out.OpenFlags &^= r.mask.open
	if r.stats == nil {
		return
	}
	if out.OpenFlags&fuse.FOPEN_PASSTHROUGH != 0 {
		r.stats.opensPassthrough.Add(1)
	} else {
		r.stats.opensCached.Add(1)
	}
}

func (r *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.mark(cancel, reqMark{umask: in.Umask})()
	return r.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (r *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.mark(cancel, reqMark{umask: in.Umask})()
	return r.RawFileSystem.Mknod(cancel, in, name, out)
}

// Tmpfile: O_TMPFILE carries a umask as CREATE does. Where the mask hides
// FUSE_TMPFILE, ENOSYS: the kernel then answers every O_TMPFILE open of
// the mount EOPNOTSUPP (fuse_tmpfile(), fc->no_tmpfile), as one without
// the request does.
func (r *rawFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	if r.mask.noTmpfile {
		return fuse.ENOSYS
	}
	defer r.mark(cancel, reqMark{umask: in.Umask})()
	h := r.opening(cancel)
	defer r.opens.Delete(cancel)
	st := r.RawFileSystem.Tmpfile(cancel, in, out)
	r.opened(st, &out.OpenOut, *h)
	return st
}

// seen returns what rawFS saw on the request of ctx.
func (r *rawFS) seen(ctx context.Context) reqMark {
	c, ok := ctx.(*fuse.Context)
	if !ok || r == nil {
		return reqMark{}
	}
	m, _ := r.marks.Load(c.Cancel)
	v, _ := m.(reqMark)
	return v
}

// killRequested reports whether the request of ctx carries a kill flag.
func (r *rawFS) killRequested(ctx context.Context) bool { return r.seen(ctx).flags&flagKill != 0 }

// umask is the umask of the caller of the CREATE, MKDIR, MKNOD or TMPFILE
// request of ctx.
func (r *rawFS) umask(ctx context.Context) uint32 { return r.seen(ctx).umask }

// replyMask is what a mask changes in the replies rawFS gives (mask.go).
type replyMask struct {
	// open are the FOPEN_* flags dropped from open replies.
	open uint32
	// opendir: OPENDIR is served, not answered ENOSYS (diropen.go).
	opendir bool
	// noTmpfile: TMPFILE is answered ENOSYS.
	noTmpfile bool
}

// maskedReplies is what m changes in replies.
func maskedReplies(m Mask) replyMask {
	return replyMask{open: m.openFlags(), opendir: m.has(featNoOpendir), noTmpfile: m.has(featTmpfile)}
}
