package fuseserve

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE over io_uring (Linux 6.14+, fs/fuse/dev_uring.c).
//
// The kernel offers FUSE_OVER_IO_URING in INIT while the fuse module's
// enable_uring parameter is Y. A daemon that takes it registers, for every
// possible CPU, a queue of entries: a header buffer and a payload buffer
// each, given to the kernel with an IORING_OP_URING_CMD. From then on the
// kernel puts a request in an entry of the queue of the CPU its caller runs
// on, and completes that entry's command; the daemon answers in the same
// buffers and, with one io_uring_enter, commits the answer and waits for
// the entry's next request (FUSE_IO_URING_CMD_COMMIT_AND_FETCH).
//
// goverlay serves each queue from threads pinned to the queue's CPU, so a
// request is answered on the CPU that asked: no wakeup crosses CPUs, which
// on a virtual machine is most of a request's cost (docs/BENCHMARKS.md,
// "Two CPUs, one round trip"). A thread answers its requests one after the
// other, as libfuse's io_uring threads do; the queue's other thread takes
// the requests that come while one is busy (threadsPerCPU).
//
// Still on /dev/fuse, served by go-fuse's readers: INIT, FORGET and
// BATCH_FORGET, INTERRUPT, and what goverlay tells the kernel
// (notifications). An INTERRUPT therefore cannot reach a request being
// answered over a ring; goverlay's requests do not wait on their caller.
//
// go-fuse serves /dev/fuse itself and answers a request given as bytes
// with ProtocolServer.HandleRequest, which is what the queues use, after
// feeding it the INIT the kernel sent so that it decodes requests as the
// negotiated protocol says. The queues register with the mount's
// /dev/fuse descriptor, which goverlay opened or received (mount.go).

// io_uring ABI (include/uapi/linux/io_uring.h).
const (
	ioringSetupSQE128       = 1 << 10
	ioringSetupSingleIssuer = 1 << 12
	ioringSetupDeferTaskrun = 1 << 13
	ioringFeatSingleMmap    = 1 << 0
	ioringOffSQRing         = 0
	ioringOffCQRing         = 0x8000000
	ioringOffSQEs           = 0x10000000
	ioringEnterGetevents    = 1 << 0
	ioringOpUringCmd        = 46
	sqe128Size              = 128
	cqeSize                 = 16
)

// FUSE's io_uring ABI (include/uapi/linux/fuse.h).
const (
	fuseUringCmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	fuseUringCmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	// struct fuse_uring_req_header: in_out[128] holds the request's
	// fuse_in_header and the answer's fuse_out_header, op_in[128] the
	// request's first argument (its fuse_*_in), then struct
	// fuse_uring_ent_in_out.
	uringOpIn       = 128
	uringCommitID   = 256 + 8  // ent_in_out.commit_id
	uringPayloadSz  = 256 + 16 // ent_in_out.payload_sz
	uringHeaderSize = 288

	inHeaderSize  = 40 // struct fuse_in_header
	outHeaderSize = 16 // struct fuse_out_header
	opInit        = 26 // FUSE_INIT
)

// threadsPerCPU threads serve each CPU's queue, each with its own ring and
// ringDepth entries. A thread answers its requests one after the other, so
// a request that takes long (the copy-up of a large file, an fsync, a
// request waiting on such a copy-up) would hold up every request from its
// CPU behind it; with more threads, the kernel puts the next request in
// another thread's entry (the queue hands out any available entry,
// fuse_uring_queue_fuse_req()), and on the same CPU. Up to three slow
// requests from one CPU at once leave it a thread. The spare threads cost
// nothing while no request is slow: the kernel hands out the entry made
// available last (fuse_uring_ent_avail() puts it at the head of the
// list), so the same thread keeps serving and the others sleep. Four
// threads of one entry each measured level with two on the creates,
// copies and untar of the bench's containers group (docs/BENCHMARKS.md).
const (
	threadsPerCPU = 4
	ringDepth     = 1
)

// maxWrite is the largest WRITE the kernel may send (go-fuse's default,
// set explicitly because a ring's payload buffers are sized by it).
const maxWrite = 128 << 10

var le = binary.LittleEndian

// uringFailure, set by tests, fails every mount's ring setup after INIT,
// as a go-fuse that cannot decode the kernel's INIT would.
var uringFailure atomic.Pointer[error]

// uringServer serves a mount's requests over io_uring.
type uringServer struct {
	log     *log.Logger
	opts    fuse.MountOptions
	payload int
	queues  []*ringQueue
	done    sync.WaitGroup
	// served counts the requests answered over the rings.
	served atomic.Uint64
	// why says why requests do not go over the rings, or how they do.
	why atomic.Pointer[string]
	// stopOnce ends the queues that never started.
	stopOnce sync.Once
	// closing tells the queues' threads to end although the kernel has
	// not ended their entries (wait).
	closing atomic.Bool
	// dev is the mount's /dev/fuse descriptor, which the queues
	// register with; the Server closes it once they have ended.
	dev int
}

// ringEndGrace is how long wait lets the kernel end the rings' entries
// before it ends the queues' threads itself.
const ringEndGrace = 2 * time.Second

// ringQueue is one thread serving a CPU's queue: its ring and its entries.
type ringQueue struct {
	s     *uringServer
	qid   int
	start chan ringStart
	ring  *ioRing
	ents  []ringEntry
	mem   [][]byte // mappings to unmap at the end
	// tid is the queue's thread, for wait to interrupt; ended is set
	// once the thread is done with it.
	tid   atomic.Int32
	ended atomic.Bool
}

// ringStart is what a queue needs to register: the /dev/fuse descriptor
// and the protocol server. A queue answers on registered.
type ringStart struct {
	fd         int
	ps         *fuse.ProtocolServer
	registered chan error
}

// ringEntry is one entry's buffers, in memory the Go heap does not own.
type ringEntry struct {
	hdr     []byte // struct fuse_uring_req_header
	payload []byte
	iov     *[2]unix.Iovec
	in      [3][]byte
	out     [2][]byte
}

func (s *uringServer) setWhy(why string) { s.why.Store(&why) }

// Why says whether requests go over the rings, and why not.
func (s *uringServer) Why() string {
	if p := s.why.Load(); p != nil {
		return *p
	}
	return "/dev/fuse"
}

// Served is how many requests were answered over the rings.
func (s *uringServer) Served() uint64 {
	if s == nil {
		return 0
	}
	return s.served.Load()
}

// uringOffered reports whether the kernel offers FUSE over io_uring to new
// mounts (the fuse module's enable_uring parameter).
func uringOffered() bool {
	b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring")
	return err == nil && strings.TrimSpace(string(b)) == "Y"
}

// startUring prepares the queue of every possible CPU: threadsPerCPU
// threads pinned to the CPU, each with its ring and buffers. It returns once all are
// ready, or the first error (and no queue then).
func startUring(logger *log.Logger, opts fuse.MountOptions) (*uringServer, error) {
	ncpu, err := possibleCPUs()
	if err != nil {
		return nil, err
	}
	page := os.Getpagesize()
	s := &uringServer{
		log:  logger,
		opts: opts,
		// The kernel refuses a payload buffer smaller than
		// max(FUSE_MIN_READ_BUFFER, max_write, max_pages pages)
		// (fuse_uring_create_ring_ent()).
		payload: max(8192, (opts.MaxWrite+page-1)/page*page),
	}
	s.opts.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
	ready := make(chan error, ncpu*threadsPerCPU)
	for qid := range ncpu {
		for range threadsPerCPU {
			q := &ringQueue{s: s, qid: qid, start: make(chan ringStart, 1)}
			s.queues = append(s.queues, q)
			s.done.Add(1)
			go q.run(ready)
		}
	}
	var first error
	for range ncpu * threadsPerCPU {
		if err := <-ready; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		s.stop()
		s.done.Wait()
		return nil, first
	}
	return s, nil
}

// stop ends the queues that have not registered (a mount that failed, or
// a kernel that did not take io_uring). Queues that registered end at the
// unmount, when the kernel completes their entries with ENOTCONN.
func (s *uringServer) stop() {
	s.stopOnce.Do(func() {
		for _, q := range s.queues {
			close(q.start)
		}
	})
}

// wait waits for the queues' threads to end. The kernel ends the rings'
// entries when the connection ends, which is at the unmount unless the
// mount lives on elsewhere (bound into another mount namespace, or into
// one of its own layers): then only the daemon's exit ends it, and wait
// must not keep the daemon from exiting. After ringEndGrace it has each
// thread's io_uring_enter interrupted (SIGURG, which the Go runtime
// ignores but for preemption) until the thread sees closing and ends;
// closing a ring cancels its entries' commands.
func (s *uringServer) wait() {
	if s == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		s.done.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(ringEndGrace):
	}
	s.closing.Store(true)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	pid := unix.Getpid()
	for {
		for _, q := range s.queues {
			if tid := q.tid.Load(); tid != 0 && !q.ended.Load() {
				unix.Tgkill(pid, int(tid), unix.SIGURG)
			}
		}
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

// serve registers the queues with the kernel, once go-fuse has answered
// INIT (handler.Init): the kernel refuses registrations before that, and
// once INIT took io_uring it holds every request until each queue has
// registered (fuse_uring_ready()).
func (s *uringServer) serve(srv *fuse.Server, fs fuse.RawFileSystem) {
	k := srv.KernelSettings()
	if k == nil || k.Flags64()&fuse.CAP_OVER_IO_URING == 0 {
		s.setWhy("/dev/fuse (the kernel did not offer io_uring)")
		s.stop()
		return
	}
	ps, err := s.protocolServer(fs, k)
	if p := uringFailure.Load(); p != nil && err == nil {
		err = *p
	}
	var results []chan error
	for _, q := range s.queues {
		st := ringStart{fd: s.dev, ps: ps, registered: make(chan error, 1)}
		if err != nil {
			// Register nothing: the queues tell the kernel so
			// (refuse), which then serves /dev/fuse alone.
			st.ps = nil
		}
		q.start <- st
		results = append(results, st.registered)
	}
	s.stop()
	var failed error
	for _, r := range results {
		if e := <-r; e != nil && failed == nil {
			failed = e
		}
	}
	switch {
	case err != nil:
		failed = err
	case failed == nil:
		s.setWhy(fmt.Sprintf("io_uring (%d queues, one per CPU, %d threads each)", len(s.queues)/threadsPerCPU, threadsPerCPU))
		return
	}
	s.setWhy("/dev/fuse (io_uring refused: " + failed.Error() + ")")
	s.log.Printf("io_uring: %v; serving /dev/fuse", failed)
}

// protocolServer is the go-fuse protocol server the queues answer with,
// given the INIT the kernel sent, as go-fuse's server got it.
func (s *uringServer) protocolServer(fs fuse.RawFileSystem, k *fuse.InitIn) (*fuse.ProtocolServer, error) {
	ps, flags, err := newProtocolServer(fs, &s.opts, k)
	if err != nil {
		return nil, err
	}
	if flags&fuse.CAP_OVER_IO_URING == 0 {
		return nil, errors.New("go-fuse did not negotiate io_uring")
	}
	return ps, nil
}

// run is a queue's thread.
func (q *ringQueue) run(ready chan<- error) {
	defer q.s.done.Done()
	// The kernel hands a queue's requests to the thread that submitted
	// its commands (io_uring_cmd_complete_in_task()), and the ring takes
	// submissions from that thread alone (IORING_SETUP_SINGLE_ISSUER).
	// Never unlocked: the thread is pinned, so it ends with the
	// goroutine rather than go back to the scheduler.
	runtime.LockOSThread()
	q.tid.Store(int32(unix.Gettid()))
	defer q.ended.Store(true)
	var cpu unix.CPUSet
	cpu.Set(q.qid)
	// A possible CPU that is not online, or not in the daemon's cpuset,
	// refuses the pin: the queue's thread then runs where it may, and
	// its requests cross CPUs as through /dev/fuse.
	_ = unix.SchedSetaffinity(0, &cpu)
	err := q.setup()
	ready <- err
	if err != nil {
		q.release()
		return
	}
	st, ok := <-q.start
	if !ok {
		q.release()
		return
	}
	if st.ps == nil {
		st.registered <- q.refuse(st.fd)
		q.release()
		return
	}
	if err := q.register(st.fd); err != nil {
		st.registered <- err
		q.release()
		return
	}
	st.registered <- nil
	q.loop(st.fd, st.ps)
	q.release()
}

// setup makes the queue's ring and its entries' buffers.
func (q *ringQueue) setup() error {
	r, err := newIoRing(2*ringDepth, ioringSetupSQE128|ioringSetupSingleIssuer|ioringSetupDeferTaskrun)
	if errors.Is(err, unix.EINVAL) {
		// Linux before 6.1 lacks DEFER_TASKRUN; it lacks FUSE over
		// io_uring too, but say that through the INIT offer.
		r, err = newIoRing(2*ringDepth, ioringSetupSQE128)
	}
	if err != nil {
		return err
	}
	r.closing = &q.s.closing
	q.ring = r
	// Headers and their iovecs in one mapping, 512 bytes an entry; the
	// payloads in another, touched only as requests fill them.
	hdrs, err := unix.Mmap(-1, 0, ringDepth*512, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("io_uring buffers: %w", err)
	}
	q.mem = append(q.mem, hdrs)
	payloads, err := unix.Mmap(-1, 0, ringDepth*q.s.payload, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("io_uring buffers: %w", err)
	}
	q.mem = append(q.mem, payloads)
	q.ents = make([]ringEntry, ringDepth)
	for i := range q.ents {
		e := &q.ents[i]
		e.hdr = hdrs[i*512 : i*512+uringHeaderSize]
		e.payload = payloads[i*q.s.payload : (i+1)*q.s.payload]
		e.iov = (*[2]unix.Iovec)(unsafe.Pointer(&hdrs[i*512+320]))
		e.iov[0].Base = &e.hdr[0]
		e.iov[0].SetLen(uringHeaderSize)
		e.iov[1].Base = &e.payload[0]
		e.iov[1].SetLen(len(e.payload))
	}
	return nil
}

// release closes the ring and unmaps the buffers.
func (q *ringQueue) release() {
	if q.ring != nil {
		q.ring.close()
		q.ring = nil
	}
	for _, m := range q.mem {
		unix.Munmap(m)
	}
	q.mem, q.ents = nil, nil
}

// cmd fills an SQE with a FUSE io_uring command for entry i.
func (q *ringQueue) cmd(fd int, op uint32, i int, commitID uint64) []byte {
	sqe := q.ring.sqe()
	sqe[0] = ioringOpUringCmd
	le.PutUint32(sqe[4:], uint32(fd))
	le.PutUint32(sqe[8:], op)         // cmd_op
	le.PutUint64(sqe[32:], uint64(i)) // user_data
	// struct fuse_uring_cmd_req, in sqe->cmd: flags, commit_id, qid.
	le.PutUint64(sqe[56:], commitID)
	le.PutUint16(sqe[64:], uint16(q.qid))
	return sqe
}

// register gives the kernel the queue's entries.
func (q *ringQueue) register(fd int) error {
	for i := range q.ents {
		sqe := q.cmd(fd, fuseUringCmdRegister, i, 0)
		le.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(q.ents[i].iov)))) // addr: iovec[2]
		le.PutUint32(sqe[24:], 2)                                              // len
	}
	if err := q.ring.submit(0); err != nil {
		// Entries the kernel took would wait for the others: have it
		// drop io_uring altogether.
		q.refuse(fd)
		return fmt.Errorf("queue %d: %w", q.qid, err)
	}
	// A refused registration completes at once; an accepted one only
	// when a request arrives.
	var err error
	q.ring.reap(func(_ uint64, res int32) {
		if res < 0 && err == nil {
			err = fmt.Errorf("queue %d: registration: %w", q.qid, unix.Errno(-res))
		}
	})
	return err
}

// refuse makes the kernel give up io_uring for the mount: a registration
// with an invalid queue number fails, and a failed registration turns the
// mount back to /dev/fuse (fuse_uring_cmd()).
func (q *ringQueue) refuse(fd int) error {
	sqe := q.cmd(fd, fuseUringCmdRegister, 0, 0)
	le.PutUint16(sqe[64:], 0xffff)
	le.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(q.ents[0].iov))))
	le.PutUint32(sqe[24:], 2)
	if err := q.ring.submit(1); err != nil {
		return err
	}
	q.ring.reap(func(uint64, int32) {})
	return nil
}

// loop answers the queue's requests until the kernel ends its entries.
func (q *ringQueue) loop(fd int, ps *fuse.ProtocolServer) {
	live := len(q.ents)
	for live > 0 {
		if err := q.ring.submit(1); err != nil {
			if errors.Is(err, errRingClosing) {
				return
			}
			// The entries stay with the kernel; the mount's requests
			// from this CPU wait until it is unmounted.
			q.s.log.Printf("io_uring queue %d: %v", q.qid, err)
			return
		}
		q.ring.reap(func(i uint64, res int32) {
			if res < 0 {
				live--
				if res != -int32(unix.ENOTCONN) && res != -int32(unix.ECANCELED) {
					q.s.log.Printf("io_uring queue %d: entry ended: %v", q.qid, unix.Errno(-res))
				}
				return
			}
			commitID := q.answer(&q.ents[i], ps)
			q.cmd(fd, fuseUringCmdCommitAndFetch, int(i), commitID)
		})
	}
}

// answer serves the request in e and writes the answer into e's buffers;
// it returns the commit ID the answer goes back with.
func (q *ringQueue) answer(e *ringEntry, ps *fuse.ProtocolServer) uint64 {
	h := e.hdr
	commitID := le.Uint64(h[uringCommitID:])
	unique := le.Uint64(h[8:])
	payload := int(le.Uint32(h[uringPayloadSz:]))
	// The request, as /dev/fuse would give it: header, first argument,
	// the rest. The header's length counts all three.
	arg0 := int(le.Uint32(h[0:])) - inHeaderSize - payload
	n, st := 0, fuse.EIO
	if arg0 >= 0 && arg0 <= 128 && payload <= len(e.payload) {
		in := append(e.in[:0], h[:inHeaderSize])
		if arg0 > 0 {
			in = append(in, h[uringOpIn:uringOpIn+arg0])
		}
		if payload > 0 {
			in = append(in, e.payload[:payload])
		}
		// The answer: its header where the request's was, its
		// structs and data in the payload buffer. go-fuse reads the
		// request before it writes the answer, and the handlers take
		// names as strings, so the two may share the buffers.
		e.out = [2][]byte{h[:outHeaderSize], e.payload}
		n, st = ps.HandleRequest(in, e.out[:])
	}
	q.s.served.Add(1)
	if !st.Ok() || n < outHeaderSize {
		if st.Ok() {
			// An answer go-fuse suppressed (FORGET, INTERRUPT),
			// which the kernel never sends over a ring.
			st = fuse.EIO
		}
		le.PutUint32(h[0:], outHeaderSize)
		le.PutUint32(h[4:], uint32(-int32(st)))
		le.PutUint64(h[8:], unique)
		n = outHeaderSize
	}
	le.PutUint32(h[uringPayloadSz:], uint32(n-outHeaderSize))
	return commitID
}

// possibleCPUs is how many queues the kernel wants: one per possible CPU
// (fuse_uring_create(): nr_cpu_ids), online or not.
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	return parseCPUList(string(b))
}

// parseCPUList is one more than the highest CPU in a list like "0-3,8".
func parseCPUList(list string) (int, error) {
	n := -1
	for _, r := range strings.Split(strings.TrimSpace(list), ",") {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			hi = lo
		}
		v, err := strconv.Atoi(hi)
		if _, lerr := strconv.Atoi(lo); err != nil || lerr != nil || v < 0 {
			return 0, fmt.Errorf("CPU list %q", list)
		}
		n = max(n, v)
	}
	return n + 1, nil
}

// ioRing is an io_uring with 128-byte SQEs, used by one thread.
type ioRing struct {
	fd                     int
	sqRing, cqRing, sqeMem []byte
	sqHead, sqTail, sqMask *uint32
	sqArray                unsafe.Pointer
	cqHead, cqTail, cqMask *uint32
	cqes                   unsafe.Pointer
	tail                   uint32 // SQEs prepared, published at submit
	single                 bool   // one mapping for both rings
	// closing, when set, makes an interrupted submit end with
	// errRingClosing (uringServer.wait).
	closing *atomic.Bool
}

// errRingClosing is submit's error when the server ends its queues.
var errRingClosing = errors.New("io_uring queue ends")

// ioUringParams is struct io_uring_params.
type ioUringParams struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  struct {
		Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
		UserAddr                                                        uint64
	}
	CqOff struct {
		Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
		UserAddr                                                        uint64
	}
}

func newIoRing(entries, flags uint32) (*ioRing, error) {
	var p ioUringParams
	p.Flags = flags
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", e)
	}
	r := &ioRing{fd: int(fd), single: p.Features&ioringFeatSingleMmap != 0}
	sqSize := int(p.SqOff.Array + p.SqEntries*4)
	cqSize := int(p.CqOff.Cqes + p.CqEntries*cqeSize)
	if r.single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	mmap := func(off int64, size int) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = unix.Mmap(r.fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		return b
	}
	r.sqRing = mmap(ioringOffSQRing, sqSize)
	r.cqRing = r.sqRing
	if !r.single {
		r.cqRing = mmap(ioringOffCQRing, cqSize)
	}
	r.sqeMem = mmap(ioringOffSQEs, int(p.SqEntries*sqe128Size))
	if err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	at := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead, r.sqTail, r.sqMask = at(r.sqRing, p.SqOff.Head), at(r.sqRing, p.SqOff.Tail), at(r.sqRing, p.SqOff.RingMask)
	r.sqArray = unsafe.Pointer(&r.sqRing[p.SqOff.Array])
	r.cqHead, r.cqTail, r.cqMask = at(r.cqRing, p.CqOff.Head), at(r.cqRing, p.CqOff.Tail), at(r.cqRing, p.CqOff.RingMask)
	r.cqes = unsafe.Pointer(&r.cqRing[p.CqOff.Cqes])
	r.tail = atomic.LoadUint32(r.sqTail)
	return r, nil
}

func (r *ioRing) close() {
	if r.cqRing != nil && !r.single {
		unix.Munmap(r.cqRing)
	}
	for _, m := range [][]byte{r.sqeMem, r.sqRing} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	unix.Close(r.fd)
}

// sqe returns the next submission slot, zeroed. The ring holds twice the
// entries of a queue, and a queue prepares at most one command per entry
// between two submits, so it never runs out.
func (r *ioRing) sqe() []byte {
	idx := r.tail & *r.sqMask
	*(*uint32)(unsafe.Add(r.sqArray, 4*idx)) = idx
	r.tail++
	s := r.sqeMem[idx*sqe128Size : (idx+1)*sqe128Size]
	clear(s)
	return s
}

// submit hands the prepared SQEs to the kernel and, with wait, waits for a
// completion.
func (r *ioRing) submit(wait uint32) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	for {
		toSubmit := r.tail - atomic.LoadUint32(r.sqHead)
		flags := uintptr(0)
		if wait > 0 {
			flags = ioringEnterGetevents
		}
		// Syscall, not RawSyscall: the thread may wait here for
		// long, and the Go runtime must know it is in the kernel.
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(wait), flags, 0, 0)
		switch e {
		case 0:
			if atomic.LoadUint32(r.sqHead) != r.tail {
				continue
			}
			return nil
		case unix.EINTR, unix.EAGAIN, unix.EBUSY:
			if e == unix.EINTR && r.closing != nil && r.closing.Load() {
				return errRingClosing
			}
			// A signal (the Go runtime's preemption), or the kernel
			// asking to reap first: submit the rest and wait again.
			if wait == 0 && atomic.LoadUint32(r.sqHead) == r.tail {
				return nil
			}
			if wait > 0 && r.ready() {
				return nil
			}
			continue
		default:
			return fmt.Errorf("io_uring_enter: %w", e)
		}
	}
}

// ready reports whether completions wait, with every SQE submitted.
func (r *ioRing) ready() bool {
	return atomic.LoadUint32(r.sqHead) == r.tail && atomic.LoadUint32(r.cqHead) != atomic.LoadUint32(r.cqTail)
}

// reap calls fn for every completion waiting, with its user_data and res.
func (r *ioRing) reap(fn func(userData uint64, res int32)) {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	mask := *r.cqMask
	for ; head != tail; head++ {
		c := unsafe.Add(r.cqes, cqeSize*(head&mask))
		fn(*(*uint64)(c), *(*int32)(unsafe.Add(c, 8)))
	}
	atomic.StoreUint32(r.cqHead, head)
}
