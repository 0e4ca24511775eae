package fuseserve

import (
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Serving /dev/fuse inline.
//
// go-fuse's readers (fuse.Server.Serve) keep a second reader waiting: the
// reader that gets a request starts another goroutine to read the next
// one whenever none other is reading (fuseFD.readRequest), then serves
// its request and reads again. On a mount that answers one caller after
// the other, as a walk or a commit does, two threads then take turns in
// read(2), and every request crosses from one to the other; with two
// mounts busy at once that cost half the daemon's time
// (docs/BENCHMARKS.md, "podman build, step by step").
//
// inlineServer reads and serves with one goroutine, as libfuse's
// single-threaded loop does, and gives the reading to a new goroutine
// only when a request keeps the reader:
//
//   - at once, for the requests that wait for the disk or for other
//     requests (handsOff): FSYNC, an LSEEK that has the kernel write
//     pages back, a blocking lock, a copy of a range;
//   - otherwise when the watchdog (watch) finds the reader serving the
//     same request at two of its ticks, stallTick apart: a large
//     copy-up, an open that waits for the RELEASE of a closed file.
//
// So a slow request holds the others back for a tick or two, where a
// single-threaded daemon holds them for its whole length, and a request
// that waits for another one gets it read. The reader it replaced ends
// once it has answered its request.
//
// The requests are answered by go-fuse's ProtocolServer, fed the INIT
// go-fuse's server answered (newProtocolServer), as the io_uring queues
// are. go-fuse's server stays for INIT and the notifications; its own
// loop (Serve) runs only once the inline readers have ended, when it
// reads ENODEV at once and ends the mount as go-fuse does (OnUnmount).
type inlineServer struct {
	fd  int
	ps  *fuse.ProtocolServer
	log *log.Logger
	// debug logs answers the kernel refused (an interrupted request's).
	debug bool
	// inSize and outSize size each reader's buffers.
	inSize, outSize int
	bufs            sync.Pool
	// current is the reader that reads: the others end once they have
	// answered their request.
	current atomic.Pointer[inlineReader]
	readers sync.WaitGroup
	// mu guards ended and the change of current.
	mu sync.Mutex
	// ended is set once a reader saw the connection end; done is then
	// closed.
	ended bool
	done  chan struct{}
	// parked is set while the watchdog sleeps; the reader wakes it
	// (wake) when it begins a request.
	parked atomic.Bool
	wake   chan struct{}
	// handoffs counts the readers started after the first.
	handoffs atomic.Uint64
	// tick is stallTick, shorter or longer in tests.
	tick time.Duration
}

// inlineReader is one reading goroutine's state: state is the number of
// requests it has begun, times two, plus one while it serves one.
type inlineReader struct {
	state atomic.Uint64
}

// inlineBufs are a reader's buffers: a request, and its answer.
type inlineBufs struct{ in, out []byte }

// stallTick is the watchdog's period: a request served longer than two
// ticks has the reading handed to a new goroutine. Each tick wakes a
// thread, while requests come: on a loop of execs, which sends a request
// every 2.5–4 ms, 5 ms ticks were 40% of the daemon's CPU, and 1 ms ticks
// doubled it. A request that waits for another one says so
// (Server.WillWait) and hands off at once; the watchdog is for the slow
// ones nobody foresaw (a large copy-up), which hold the mount's other
// requests back for 20–40 ms.
const stallTick = 20 * time.Millisecond

// watchIdleTicks is how many ticks without a request the watchdog waits
// before it sleeps until the next one.
const watchIdleTicks = 5

// Opcodes of requests that hand the reading off before they are served
// (include/uapi/linux/fuse.h).
const (
	opFsync         = 20 // FUSE_FSYNC
	opFsyncdir      = 30 // FUSE_FSYNCDIR
	opSetlkw        = 33 // FUSE_SETLKW
	opLseek         = 46 // FUSE_LSEEK
	opCopyFileRange = 47 // FUSE_COPY_FILE_RANGE
)

// handsOff reports whether a request of opcode op is served with the
// reading given to a new goroutine first: it waits for the disk (FSYNC,
// FSYNCDIR, COPY_FILE_RANGE) or for other requests: an LSEEK has the
// kernel write the file's cached pages back, in WRITEs, before it is
// answered (overlay's seekFlush), and a SETLKW waits for the lock's
// holder.
func handsOff(op uint32) bool {
	switch op {
	case opFsync, opFsyncdir, opSetlkw, opLseek, opCopyFileRange:
		return true
	}
	return false
}

// newInlineServer serves the mount's descriptor fd with ps; maxWrite sizes
// the buffers.
func newInlineServer(fd int, ps *fuse.ProtocolServer, maxWrite int, logger *log.Logger, debug bool) *inlineServer {
	s := &inlineServer{
		fd: fd, ps: ps, log: logger, debug: debug,
		// A request: its header and structs, and a WRITE's data or
		// a SETXATTR's value (64 KiB at most, XATTR_SIZE_MAX). An
		// answer: its header and structs, and a READ's data, a
		// directory listing, or an attribute's value.
		inSize:  max(maxWrite, 64<<10) + 8192,
		outSize: max(maxWrite, 64<<10) + 4096,
		done:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		tick:    stallTick,
	}
	s.bufs.New = func() any {
		return &inlineBufs{in: make([]byte, s.inSize), out: make([]byte, s.outSize)}
	}
	return s
}

// start starts the first reader and the watchdog.
func (s *inlineServer) start() {
	r := &inlineReader{}
	s.current.Store(r)
	s.readers.Add(1)
	go s.read(r)
	go s.watch()
}

// wait returns once every reader has ended: the connection ended.
func (s *inlineServer) wait() { s.readers.Wait() }

// handoff starts a new reader in place of r, unless one was already, or
// the connection has ended. The new reader is counted before r may see
// that it is no longer current and end, so that the count of readers
// reaches zero only once the connection has ended (wait).
func (s *inlineServer) handoff(r *inlineReader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || s.current.Load() != r {
		return
	}
	nr := &inlineReader{}
	s.readers.Add(1)
	s.current.Store(nr)
	s.handoffs.Add(1)
	go s.read(nr)
}

// read is a reader: it reads a request, serves it and reads the next,
// for as long as it is the current reader.
func (s *inlineServer) read(r *inlineReader) {
	defer s.readers.Done()
	b := s.bufs.Get().(*inlineBufs)
	defer s.bufs.Put(b)
	for s.current.Load() == r {
		n, err := unix.Read(s.fd, b.in)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue
		case errors.Is(err, unix.ENOENT):
			// The request was interrupted and taken back while
			// it was being read (fuse_dev_do_read()).
			continue
		default:
			// ENODEV: the connection ended (unmounted, aborted).
			// Any other error ends the inline readers too; go-fuse's
			// loop then reads the mount (serve.go).
			if !errors.Is(err, unix.ENODEV) {
				s.log.Printf("reading /dev/fuse: %v", err)
			}
			s.end()
			return
		}
		if n < inHeaderSize {
			s.log.Printf("reading /dev/fuse: a request of %d bytes", n)
			continue
		}
		st := r.state.Add(1)
		if s.parked.Load() && s.parked.CompareAndSwap(true, false) {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
		if handsOff(le.Uint32(b.in[4:])) {
			s.handoff(r)
		}
		s.answer(b, n)
		r.state.Store(st + 1)
	}
}

// answer serves the request of n bytes in b.in and writes the answer.
func (s *inlineServer) answer(b *inlineBufs, n int) {
	in := b.in[:n]
	size, st := s.ps.HandleRequest([][]byte{in}, [][]byte{b.out})
	if size == 0 {
		if st.Ok() {
			return // no answer: FORGET, INTERRUPT
		}
		// go-fuse could not take the request: answer its error.
		le.PutUint32(b.out[0:], outHeaderSize)
		le.PutUint32(b.out[4:], uint32(-int32(st)))
		le.PutUint64(b.out[8:], le.Uint64(in[8:]))
		size = outHeaderSize
	}
	if _, err := unix.Write(s.fd, b.out[:size]); err != nil {
		// ENOENT: the kernel no longer waits for the answer (the
		// request was interrupted, or the mount is going).
		if s.debug || !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
			s.log.Printf("answering opcode %d: %v", le.Uint32(in[4:]), err)
		}
	}
}

// end stops the handoffs and the watchdog once the connection has ended.
func (s *inlineServer) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		close(s.done)
	}
}

// watch is the watchdog: every tick it looks at the current reader, and
// hands the reading off when the reader serves the request it served at
// the last tick. After watchIdleTicks ticks without a request it sleeps
// until the reader begins the next.
func (s *inlineServer) watch() {
	t := time.NewTicker(s.tick)
	defer t.Stop()
	var (
		last   *inlineReader
		lastSt uint64
		idle   int
	)
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		r := s.current.Load()
		st := r.state.Load()
		switch {
		case r == last && st == lastSt && st&1 == 1:
			s.handoff(r)
		case r == last && st == lastSt:
			idle++
		default:
			idle = 0
		}
		last, lastSt = r, st
		if idle < watchIdleTicks {
			continue
		}
		// Sleep, unless the reader began a request meanwhile: it
		// looks at parked after it marks the request begun, this
		// looks at the reader after it sets parked.
		idle = 0
		t.Stop()
		s.parked.Store(true)
		if s.current.Load().state.Load() == lastSt && s.current.Load() == last {
			select {
			case <-s.done:
				return
			case <-s.wake:
			}
		} else if s.parked.CompareAndSwap(true, false) {
			// Not asleep: nobody will send on wake.
		} else {
			<-s.wake
		}
		last = nil
		t.Reset(s.tick)
	}
}

// newProtocolServer is a go-fuse protocol server for fs, fed the INIT k
// the kernel sent, as go-fuse's server got it, so that it decodes requests
// as the negotiated protocol says; opts must be the options go-fuse's
// server was made with. It returns the flags the answer negotiated.
func newProtocolServer(fs fuse.RawFileSystem, opts *fuse.MountOptions, k *fuse.InitIn) (*fuse.ProtocolServer, uint64, error) {
	ps := fuse.NewProtocolServer(fs, opts)
	init := *k
	init.Length = uint32(unsafe.Sizeof(init))
	init.Opcode = opInit
	in := unsafe.Slice((*byte)(unsafe.Pointer(&init)), unsafe.Sizeof(init))
	out := make([]byte, 256)
	n, st := ps.HandleRequest([][]byte{in}, [][]byte{out})
	if !st.Ok() || n < outHeaderSize+36 || int32(le.Uint32(out[4:])) != 0 {
		return nil, 0, fmt.Errorf("go-fuse did not take the kernel's INIT (%v)", st)
	}
	// fuse_init_out: flags at 12, flags2 at 32.
	flags := uint64(le.Uint32(out[outHeaderSize+12:])) | uint64(le.Uint32(out[outHeaderSize+32:]))<<32
	return ps, flags, nil
}
