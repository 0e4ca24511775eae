package fuseserve

import (
	"log"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options configure how a mount's requests reach its filesystem.
type Options struct {
	// Uring serves requests over io_uring where the kernel offers it
	// (uring.go); without it every request goes through /dev/fuse.
	Uring bool
	// Logger receives what the transport decided and what went wrong;
	// nil means the standard logger.
	Logger *log.Logger
}

// Server is a mounted filesystem: go-fuse's server reading /dev/fuse, and
// the io_uring queues when the kernel took them. The embedded server's
// methods (Wait, KernelSettings, the notifications) are go-fuse's.
type Server struct {
	*fuse.Server
	uring *uringServer
	// why says why requests do not go over io_uring, when the rings
	// were not started.
	why string
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
// it. It returns once the kernel has accepted the mount
// (fuse.Server.WaitMount). mo.MaxWrite, when 0, becomes maxWrite, which
// sizes the rings' payload buffers.
func Mount(fs fuse.RawFileSystem, mountpoint string, mo *fuse.MountOptions, o Options) (*Server, error) {
	logger := o.Logger
	if logger == nil {
		logger = log.Default()
	}
	if mo.MaxWrite == 0 {
		mo.MaxWrite = maxWrite
	}
	s := &Server{}
	h := &handler{RawFileSystem: fs}
	switch {
	case !o.Uring:
		s.why = "/dev/fuse"
	case !uringOffered():
		s.why = "/dev/fuse (the kernel does not offer io_uring: enable_uring is not Y)"
	default:
		// The queues are ready before INIT offers io_uring: once
		// the kernel takes it, it serves nothing until they register.
		u, err := startUring(logger, *mo)
		if err != nil {
			logger.Printf("io_uring: %v; serving /dev/fuse", err)
			s.why = "/dev/fuse (" + err.Error() + ")"
		} else {
			s.uring, h.uring = u, u
			mo.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
		}
	}
	srv, err := fuse.NewServer(h, mountpoint, mo)
	if err != nil {
		if s.uring != nil {
			s.uring.stop()
			s.uring.wait()
		}
		return nil, err
	}
	s.Server = srv
	spareProcs.Do(addSpareProcs)
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		s.Close()
		return nil, err
	}
	return s, nil
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
// (uringServer.wait).
func (s *Server) Close() {
	if s != nil {
		s.uring.wait()
	}
}

// spareProcs raises GOMAXPROCS once per process, after the first server
// has sized its readers by it (addSpareProcs).
var spareProcs sync.Once
