package overlay

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Passthrough (Linux 6.9+): the kernel reads and writes an open file's
// backing file itself, without a request to the daemon.
//
// The kernel keeps one backing file per inode, for as long as any
// passthrough open of it lasts, and refuses an open that would mix it
// with a cached open of the inode (ETXTBSY) or give the inode another
// backing file (EBUSY) (fs/fuse/iomode.c fuse_file_io_open()). goverlay
// registers the backing files itself, one per node, at its first
// passthrough open, and closes it at the last (node.backing); go-fuse's
// own registration would count every handle of the node, cached ones
// too, and close the backing file while a passthrough open lasts.
//
// Upper files: writers get passthrough, where it pays (no WRITE request
// per write). Readers get the page cache (FOPEN_KEEP_CACHE), which
// serves repeated reads and execs without a backing file to set up per
// open; a reader joins passthrough only while a passthrough handle is
// open. For the same reason a writer stays cached while a cached handle
// is open.
//
// Lower files (-o sharecache=on, ioShared): a file still in a lower layer
// is opened for reading with FOPEN_PASSTHROUGH on the lower file. The
// kernel then reads and maps the lower file itself and keeps no pages of
// its own: every mount of an image reads and maps the same pages, as the
// kernel overlay does (ovl_read_iter(), ovl_mmap()). The backing file is
// opened anew for each open with that open's flags
// (backing_file_open()): only an open for reading gets it, so nothing can
// write a lower file.
//
// Where the kernel grants no passthrough (rootless), sharecache has no
// effect: FOPEN_DIRECT_IO would keep reads out of the FUSE page cache,
// but each mmap of such a file drops its pages (fuse_file_mmap()), so
// every exec would read the binary anew (docs/BENCHMARKS.md).
//
// The kernel keeps the lower file as the inode's backing file until the
// last such open closes, even across a copy-up, and fails any other open
// meanwhile (fuse_file_io_open()): every open must then be a passthrough
// open on the lower file. Readers are (the data has not changed: a
// metadata copy-up copies it as it is), but a writer's open, or a
// truncate, waits for them, and is refused with ETXTBSY after a second
// (dataChangeStart), as the kernel refuses to write a running binary: a
// writer would otherwise change the file under readers that go on
// reading the lower file, where the kernel overlay's follow the copy-up
// (ovl_real_fdget()), or write the lower file through a shared mapping.
// A reader that opens while a writer's open or truncate is under way is
// cached, as without sharecache.
//
// Privileges (README.md, "NOSEC and privilege removal"): a passthrough
// write never reaches the daemon and runs with the daemon's credentials
// (fs/fuse/passthrough.c), so neither
// the WRITE kill flag nor the backing filesystem clears suid. What does
// reach the daemon, before the write, is the kernel's own attempt to
// remove privileges through file_remove_privs() on the FUSE inode: with
// FUSE_HANDLE_KILLPRIV_V2 it arrives as an empty SETATTR (no attribute
// bits). Setattr takes an empty SETATTR on a regular file as that request
// and strips the file (killPrivsNow).

// ioKind is how the kernel does the I/O of an open file.
type ioKind uint8

const (
	// ioCached: through the FUSE page cache (FOPEN_KEEP_CACHE).
	ioCached ioKind = iota
	// ioPassthrough: on the upper file, by the kernel.
	ioPassthrough
	// ioShared: on the lower file, by the kernel, for reading only.
	ioShared
)

// backed says the kernel uses a backing file for the open.
func (k ioKind) backed() bool { return k == ioPassthrough || k == ioShared }

// openFlags are the FOPEN_* flags of an open of kind k.
func (k ioKind) openFlags() uint32 {
	switch k {
	case ioPassthrough, ioShared:
		return fuse.FOPEN_PASSTHROUGH | fuse.FOPEN_NOFLUSH
	}
	return handleOpenFlags
}

// openMode decides the I/O mode of a new handle of n on fd (in the upper
// layer when upper, open for writing when write), registers fd as n's
// backing file when the handle is the first to need one, and counts the
// handle; it returns the mode and the backing file's ID. The kernel
// refusing the backing file turns passthrough off for the mount, and the
// handle is cached.
func (n *node) openMode(fd int, upper, write bool) (ioKind, int32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.rareMadeLocked()
	kind := ioCached
	switch {
	case r.backingLower:
		// Only readers come here (dataChangeStart); the kernel fails
		// any other open.
		if !write {
			kind = ioShared
		}
	case !n.ofs.passthrough.Load():
	case !upper:
		if n.ofs.io.share && !write && r.openCached == 0 && r.changing == 0 {
			kind = ioShared
		}
	case write:
		if r.openCached == 0 {
			kind = ioPassthrough
		}
	default:
		if r.openPassthrough > 0 {
			kind = ioPassthrough
		}
	}
	if kind.backed() && r.openPassthrough == 0 {
		id, err := n.ofs.raw.registerBacking(fd)
		if err != nil {
			n.ofs.passthroughRefused(err)
			kind = ioCached
		} else {
			r.backing, r.backingLower = id, kind == ioShared
		}
	}
	if kind.backed() {
		r.openPassthrough++
	} else {
		r.openCached++
	}
	if !kind.backed() {
		return kind, 0
	}
	return kind, r.backing
}

// closed uncounts a released handle, and closes the node's backing file
// after its last passthrough handle.
func (n *node) closed(kind ioKind) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.rareMadeLocked()
	if kind.backed() {
		r.openPassthrough--
		if r.openPassthrough == 0 {
			n.ofs.raw.unregisterBacking(r.backing)
			r.backing, r.backingLower = 0, false
			if r.released != nil {
				close(r.released)
				r.released = nil
			}
		}
		// Its writes changed the file without the daemon.
		r.atimeFresh.Store(0)
	} else {
		r.openCached--
	}
	n.dropTempLocked()
}

// dataChangeStart is called before an open for writing or a truncate
// of n changes its data, on a mount with sharecache=on: while lower files
// of n are open with passthrough to the lower file, it waits up to
// releaseGrace for them to close, then refuses the change with ETXTBSY;
// otherwise it keeps readers from opening so until done is called.
//
// The wait is for the RELEASE requests of files already closed: the
// kernel sends them in the background (fuse_file_put()), and they may
// reach the daemon after a later OPEN, as in `cat f; echo x >> f`.
func (n *node) dataChangeStart() (done func(), err error) {
	if !n.ofs.io.share {
		return func() {}, nil
	}
	var timeout <-chan time.Time
	for {
		n.mu.Lock()
		r := n.rareMadeLocked()
		if !r.backingLower {
			r.changing++
			n.mu.Unlock()
			return func() {
				n.mu.Lock()
				r.changing--
				n.mu.Unlock()
			}, nil
		}
		if r.released == nil {
			r.released = make(chan struct{})
		}
		released := r.released
		n.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(releaseGrace)
			defer t.Stop()
			timeout = t.C
			// The RELEASE may be the next request.
			n.ofs.willWait()
		}
		// Not the request's interruption: the kernel interrupts it
		// for any signal, one the caller restarts the call for
		// included, and waits for the reply anyway (only a fatal
		// signal ends the wait; request_wait_answer()).
		select {
		case <-released:
		case <-timeout:
			return nil, syscall.ETXTBSY
		}
	}
}

// releaseGrace is how long dataChangeStart waits for the lower files of a
// node to close.
const releaseGrace = time.Second

// passthroughRefused records that the kernel refused a backing file; the
// open is cached. EPERM refuses every file alike (fuse_backing_open(): not
// granted at INIT, or no CAP_SYS_ADMIN) and turns passthrough off for the
// mount; others are the file's own (ELOOP: its filesystem is stacked as
// deep as the mount may stack, e.g. a lower layer on an overlay), logged
// once.
func (f *FS) passthroughRefused(err error) {
	if errors.Is(err, syscall.EPERM) {
		if f.passthrough.Swap(false) {
			f.log.Printf("the kernel refused a passthrough backing file (%v): files open cached from now on", err)
		}
		return
	}
	f.refusedOnce.Do(func() {
		f.log.Printf("the kernel refused a passthrough backing file (%v): such files open cached", err)
	})
}

// registerBacking registers fd with the kernel as a backing file
// (FUSE_DEV_IOC_BACKING_OPEN) and returns its ID.
func (r *rawFS) registerBacking(fd int) (int32, error) {
	srv := r.server.Load()
	if srv == nil {
		return 0, fmt.Errorf("not mounted")
	}
	id, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	if errno != 0 {
		return 0, errno
	}
	return id, nil
}

// unregisterBacking closes the backing file ID
// (FUSE_DEV_IOC_BACKING_CLOSE). The kernel keeps the file for the opens
// that use it; a failure leaves only an ID unused until unmount.
func (r *rawFS) unregisterBacking(id int32) {
	if srv := r.server.Load(); srv != nil && id != 0 {
		srv.UnregisterBackingFd(id)
	}
}
