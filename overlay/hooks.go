package overlay

import "sync/atomic"

// hooks stop a request at a point where a test of a race has another
// request meet it, or make it fail there. They are unset outside tests.
type hooks struct {
	// beforePublish runs when a file's copy-up has chosen its name in
	// the upper layer and is about to build and publish its copy there.
	beforePublish hook
	// beforeDataIn runs when a metacopy file's data copy-in is about to
	// copy the data.
	beforeDataIn hook
	// partedNotify runs before the notification that has the kernel
	// look up again the name of a lower hard link its copy-up parted.
	partedNotify hook
	// lookup runs when a LOOKUP reaches a directory, before the name
	// is looked for (guard_test.go makes it panic).
	lookup hook
}

// hook is one of the hooks, called with the name the request works on.
type hook struct {
	f atomic.Pointer[func(name string)]
}

// set makes f the hook.
func (h *hook) set(f func(name string)) { h.f.Store(&f) }

// run calls the hook, if one is set.
func (h *hook) run(name string) {
	if f := h.f.Load(); f != nil {
		(*f)(name)
	}
}
