package overlay

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFS wraps go-fuse's node bridge to see the kill-privilege flags the
// bridge drops before it calls node and file methods (notes C:
// WriteIn.WriteFlags, OpenIn.Mode, CreateIn.OpenFlags). It marks the
// request, and the node code asks killRequested with the request's
// context. A request is identified by its cancel channel, which go-fuse
// gives each request in flight (and reuses only once the request is done).
type rawFS struct {
	fuse.RawFileSystem
	marks sync.Map // <-chan struct{} → reqFlags
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

func (r *rawFS) mark(cancel <-chan struct{}, f reqFlags) func() {
	if f == 0 {
		return func() {}
	}
	r.marks.Store(cancel, f)
	return func() { r.marks.Delete(cancel) }
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
	defer r.mark(cancel, writeFlags(in))()
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	defer r.mark(cancel, writeFlags(in))()
	return r.RawFileSystem.Writev(cancel, in, data)
}

func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer r.mark(cancel, killFlag(in.Mode&fuse.OPEN_KILL_SUIDGID != 0))()
	return r.RawFileSystem.Open(cancel, in, out)
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer r.mark(cancel, killFlag(in.OpenFlags&fuse.OPEN_KILL_SUIDGID != 0))()
	return r.RawFileSystem.Create(cancel, in, name, out)
}

// flags returns what rawFS saw on the request of ctx.
func (r *rawFS) flags(ctx context.Context) reqFlags {
	c, ok := ctx.(*fuse.Context)
	if !ok || r == nil {
		return 0
	}
	f, _ := r.marks.Load(c.Cancel)
	v, _ := f.(reqFlags)
	return v
}

// killRequested reports whether the request of ctx carries a kill flag.
func (r *rawFS) killRequested(ctx context.Context) bool { return r.flags(ctx)&flagKill != 0 }
