package overlay

import (
	"log"
	"runtime/debug"
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Fault isolation.
//
// A panic is a bug of goverlay's or of go-fuse's (a consistency check
// that failed). In a process that serves several mounts it must cost the
// mount whose code panicked what that code was doing, and the process
// nothing. A mount's code runs in two ways:
//
//   - Serving a request. go-fuse calls every RawFileSystem method that
//     serves one under a recover of its own (protocolServer.handleRequest,
//     for /dev/fuse and the io_uring queues alike) and answers the request
//     with what MountOptions.PanicHandler returns: guard.panicked, EIO
//     (a FORGET gets no answer). That is so with or without
//     Options.Recover: go-fuse recovers whatever PanicHandler does.
//   - Outside a request: the goroutines the overlay starts (notifications
//     that must not wait for a request in flight, the stats socket), the
//     runtime cleanups of its nodes, and what go-fuse calls outside its
//     dispatch (Init after INIT: fuse.Server.handleInit; OnUnmount once
//     the last request is served: fuse.Server.Serve). A panic there ends
//     the process, as any Go panic does, unless Options.Recover is set;
//     then guard.recovered ends it instead, logged and counted as a
//     request's are.
//
// Neither undoes what the panicking code left half done: a lock it held
// stays held, and the mount's requests that need it wait for ever. The
// process and its other mounts go on.

// guard logs and counts a mount's panics. It is an object of its own, not
// part of the FS, so that a runtime cleanup can hold it: a cleanup that
// held the FS would hold the node tree, and with it the node it is for,
// which would then never be collected (runtime.AddCleanup).
type guard struct {
	// recover is Options.Recover.
	recover bool
	log     *log.Logger
	// panics counts the panics recovered (Stats.InternalErrors).
	panics atomic.Uint64
}

// panicked is go-fuse's PanicHandler: v is what a request's handler
// panicked with, and the request is answered with the status returned.
func (g *guard) panicked(v any) fuse.Status {
	g.report("request answered EIO", v)
	return fuse.EIO
}

// recovered, deferred by work outside a request, ends a panic of that
// work when Options.Recover is set; what says what the work was. Without
// Recover the panic goes on: recover is not called.
func (g *guard) recovered(what string) {
	if !g.recover {
		return
	}
	if v := recover(); v != nil {
		g.report(what+" abandoned", v)
	}
}

// guarded is fn, for work handed to a goroutine of its own (go statement),
// under recovered when Options.Recover is set; without Recover it is fn
// itself.
func (g *guard) guarded(what string, fn func()) func() {
	if !g.recover {
		return fn
	}
	return func() {
		defer g.recovered(what)
		fn()
	}
}

// guardedCleanup is cleanup, a runtime cleanup (runtime.AddCleanup) of
// a discarded node's, under recovered when Options.Recover is set; what
// says what it does. The cleanups run one after the other on the
// runtime's goroutine for them, whose panic ends the process. The
// function holds the guard alone: nothing of the node tree (guard).
func guardedCleanup[T any](g *guard, what string, cleanup func(T)) func(T) {
	if !g.recover {
		return cleanup
	}
	return func(v T) {
		defer g.recovered(what)
		cleanup(v)
	}
}

// report logs a recovered panic, once, with the stack of the goroutine
// that panicked (it is still on that stack: a deferred call runs before
// the stack unwinds), and counts it.
func (g *guard) report(what string, v any) {
	g.panics.Add(1)
	g.log.Printf("internal error, %s: %v\n%s", what, v, debug.Stack())
}
