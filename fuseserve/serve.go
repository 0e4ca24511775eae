package fuseserve

import (
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Options configure how a mount's requests reach its filesystem.
type Options struct {
	// Uring serves requests over io_uring where the kernel offers it
	// (uring.go); without it every request goes through /dev/fuse.
	Uring bool
	// Logger receives what the transport decided and what went wrong;
	// nil means mo.Logger, or the standard logger.
	Logger *log.Logger
	// Shared: the process serves many mounts. GOMAXPROCS is left as it
	// is (addSpareProcs): go-fuse sizes each server's readers by it
	// when it starts (fuse.NewServer: between 2 and 16), and each idle
	// reader is a thread blocked in read(2), with its stacks; spare Ps
	// for a mount's readers help little once a hundred mounts' readers
	// share the process.
	Shared bool
	// fusermount mounts through fusermount3 even where goverlay may
	// mount itself (tests).
	fusermount bool
	// stallTick, when not 0, replaces the inline readers' watchdog
	// period (tests).
	stallTick time.Duration
}

// Server is a mounted filesystem: go-fuse's server, which answers INIT
// and sends the notifications; the inline readers serving /dev/fuse, or
// the io_uring queues when the kernel took them (go-fuse's readers then
// serve what still comes through /dev/fuse). The embedded server's
// methods (Wait, KernelSettings, the notifications) are go-fuse's;
// Unmount is the Server's own (mount.go).
type Server struct {
	*fuse.Server
	uring *uringServer
	// inline serves /dev/fuse when the rings do not (inline.go).
	inline *inlineServer
	// why says why requests do not go over io_uring, when the rings
	// were not started.
	why string
	// dev is the mount's /dev/fuse descriptor, which go-fuse's server
	// and the inline readers use through a duplicate of go-fuse's own;
	// it is kept for the rings, -1 once closed.
	dev int
	// mountpoint is where the mount is, direct whether goverlay may
	// mount and unmount it itself (mayMount).
	mountpoint string
	direct     bool
	log        *log.Logger
	debug      bool
	// mu serialises Unmount; unmounted is set once the mount is gone by
	// Unmount.
	mu        sync.Mutex
	unmounted bool
	// closeDev closes dev once (Close).
	closeDev sync.Once
}

// handler is the filesystem as go-fuse's readers and the rings call it:
// the requests a busy mount receives often yield first (yield.go), and
// INIT has the rings register.
type handler struct {
	fuse.RawFileSystem
	uring *uringServer
}

// Init is called by go-fuse once it has answered INIT, before it reads
// the next request.
func (h *handler) Init(srv *fuse.Server) {
	h.RawFileSystem.Init(srv)
	if h.uring != nil {
		h.uring.serve(srv, h)
	}
}

// Mount mounts fs on mountpoint with the options mo and starts serving
// it. It returns once the kernel has accepted the mount and go-fuse has
// answered INIT. mo.MaxWrite, when 0, becomes maxWrite, which sizes the
// rings' payload buffers; mo.DirectMount and DirectMountStrict are not
// looked at: goverlay mounts with mount(2) wherever it may (mount.go).
// On an error nothing is left mounted.
func Mount(fs fuse.RawFileSystem, mountpoint string, mo *fuse.MountOptions, o Options) (*Server, error) {
	m := *mo
	if m.Logger == nil {
		m.Logger = log.Default()
	}
	logger := o.Logger
	if logger == nil {
		logger = m.Logger
	}
	if m.MaxWrite <= 0 {
		m.MaxWrite = maxWrite
	}
	// The kernel caps a request at max_pages_limit pages, and go-fuse
	// its buffers with it (fuse.MountOptions.MaxWrite).
	m.MaxWrite = min(m.MaxWrite, kernelMaxWrite())
	if m.Name == "" {
		// As go-fuse names it: the mount's type is fuse.NAME.
		m.Name = strings.ReplaceAll(fs.String()[:min(len(fs.String()), 20)], ",", ";")
	}
	mnt, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, err
	}
	s := &Server{dev: -1, mountpoint: mnt, direct: mayMount() && !o.fusermount, log: logger, debug: m.Debug}
	h := &handler{RawFileSystem: fs}
	switch {
	case !o.Uring:
		s.why = "/dev/fuse"
	case !uringOffered():
		s.why = "/dev/fuse (the kernel does not offer io_uring: enable_uring is not Y)"
	default:
		// The queues are ready before INIT offers io_uring: once
		// the kernel takes it, it serves nothing until they register.
		u, err := startUring(logger, m)
		if err != nil {
			logger.Printf("io_uring: %v; serving /dev/fuse", err)
			s.why = "/dev/fuse (" + err.Error() + ")"
		} else {
			s.uring, h.uring = u, u
			m.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
		}
	}
	fail := func(err error) (*Server, error) {
		if s.uring != nil {
			s.uring.stop()
		}
		s.Close()
		return nil, err
	}
	if s.dev, err = mountDevice(mnt, &m, s.direct); err != nil {
		return fail(err)
	}
	if s.uring != nil {
		s.uring.dev = s.dev
	}
	// go-fuse reads and answers on a duplicate (fd 3 or above: it takes
	// no /dev/fd/0) and closes it when it is done serving.
	gofd, err := unix.FcntlInt(uintptr(s.dev), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		detach(mnt, s.direct)
		return fail(os.NewSyscallError("fcntl", err))
	}
	m.DirectMount, m.DirectMountStrict = false, false
	srv, err := fuse.NewServer(h, "/dev/fd/"+strconv.Itoa(gofd), &m)
	if err != nil {
		detach(mnt, s.direct)
		return fail(err)
	}
	s.Server = srv
	if s.uring == nil {
		s.Close()
	}
	if !o.Shared {
		spareProcs.Do(addSpareProcs)
	}
	s.serve(h, &m, gofd, o, logger)
	if err := stopPolls(mnt); err != nil {
		s.Unmount()
		s.Close()
		return nil, err
	}
	return s, nil
}

// serve starts serving the mount. With io_uring, go-fuse's readers serve
// what still comes through /dev/fuse; without, the inline readers serve
// it all (inline.go), and go-fuse's loop runs once they have ended, to end
// the mount as go-fuse does. A go-fuse that does not take the kernel's
// INIT a second time leaves /dev/fuse to go-fuse's readers. The inline
// readers read gofd, go-fuse's descriptor, which go-fuse closes only at
// the end of its loop.
func (s *Server) serve(h *handler, m *fuse.MountOptions, gofd int, o Options, logger *log.Logger) {
	srv := s.Server
	if s.uring != nil {
		go srv.Serve()
		return
	}
	ps, _, err := newProtocolServer(h, m, srv.KernelSettings())
	if err != nil {
		logger.Printf("%v; go-fuse's readers serve /dev/fuse", err)
		go srv.Serve()
		return
	}
	s.inline = newInlineServer(gofd, ps, m.MaxWrite, logger, m.Debug)
	if o.stallTick != 0 {
		s.inline.tick = o.stallTick
	}
	s.inline.start()
	go func() {
		s.inline.wait()
		srv.Serve()
	}()
}

// WillWait is called by a request's handler before it waits for
// another request (the RELEASE of a file it needs closed) or for a
// notification the kernel may hold up behind one: another reader then
// reads /dev/fuse at once, rather than after the watchdog's ticks
// (inline.go). Over io_uring the queues' other threads read.
func (s *Server) WillWait() {
	if s.inline != nil {
		s.inline.handoff(s.inline.current.Load())
	}
}

// Transport says how requests reach the filesystem: over io_uring, or
// through /dev/fuse and why.
func (s *Server) Transport() string {
	if s.uring != nil {
		return s.uring.Why()
	}
	return s.why
}

// RingRequests is how many requests were answered over io_uring.
func (s *Server) RingRequests() uint64 {
	if s == nil {
		return 0
	}
	return s.uring.Served()
}

// Close waits, once the mount is gone, for the rings' threads to end
// (uringServer.wait), and closes the mount's descriptor.
func (s *Server) Close() {
	if s == nil {
		return
	}
	s.uring.wait()
	s.closeDev.Do(func() {
		if s.dev >= 0 {
			unix.Close(s.dev)
			s.dev = -1
		}
	})
}

// kernelMaxWrite is the largest request the kernel sends: max_pages_limit
// pages (/proc/sys/fs/fuse/max_pages_limit, 256 by default).
func kernelMaxWrite() int {
	limit := 256
	if b, err := os.ReadFile("/proc/sys/fs/fuse/max_pages_limit"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			limit = n
		}
	}
	return limit * os.Getpagesize()
}

// spareProcs raises GOMAXPROCS once per process, after the first server
// has sized its readers by it (addSpareProcs).
var spareProcs sync.Once
