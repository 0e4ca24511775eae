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
	kill sync.Map // <-chan struct{} → struct{}
}

func (r *rawFS) mark(cancel <-chan struct{}, on bool) func() {
	if !on {
		return func() {}
	}
	r.kill.Store(cancel, struct{}{})
	return func() { r.kill.Delete(cancel) }
}

// Write and Writev both need the wrapper: the server calls Writev first.
func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	defer r.mark(cancel, in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0)()
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	defer r.mark(cancel, in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0)()
	return r.RawFileSystem.Writev(cancel, in, data)
}

func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer r.mark(cancel, in.Mode&fuse.OPEN_KILL_SUIDGID != 0)()
	return r.RawFileSystem.Open(cancel, in, out)
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer r.mark(cancel, in.OpenFlags&fuse.OPEN_KILL_SUIDGID != 0)()
	return r.RawFileSystem.Create(cancel, in, name, out)
}

// killRequested reports whether the request of ctx carries a kill flag.
func (r *rawFS) killRequested(ctx context.Context) bool {
	c, ok := ctx.(*fuse.Context)
	if !ok || r == nil {
		return false
	}
	_, ok = r.kill.Load(c.Cancel)
	return ok
}
