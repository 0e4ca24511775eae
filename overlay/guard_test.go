package overlay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// panickyFS is a filesystem whose LOOKUP of "boom", FORGET of a single
// lookup, Init and OnUnmount panic; its other LOOKUPs and FORGETs work.
type panickyFS struct {
	fuse.RawFileSystem
	forgotten atomic.Uint64
}

func (p *panickyFS) Lookup(cancel <-chan struct{}, in *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if name == "boom" {
		panic("lookup of " + name)
	}
	out.NodeId = 2
	return fuse.OK
}

func (p *panickyFS) Forget(nodeid, nlookup uint64) {
	if nlookup == 1 {
		panic("forget of a single lookup")
	}
	p.forgotten.Add(nlookup)
}

func (p *panickyFS) Init(*fuse.Server) { panic("init") }

func (p *panickyFS) OnUnmount() { panic("unmount") }

// fuseRequest is a request as the kernel writes it: fuse_in_header, then
// the arguments.
func fuseRequest(opcode uint32, unique, node uint64, args []byte) []byte {
	b := make([]byte, 40, 40+len(args))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)+len(args)))
	binary.LittleEndian.PutUint32(b[4:], opcode)
	binary.LittleEndian.PutUint64(b[8:], unique)
	binary.LittleEndian.PutUint64(b[16:], node)
	return append(b, args...)
}

// TestRequestPanicAnsweredEIO: a request whose handler panics is answered
// EIO, the panic logged once with its value and stack on the mount's
// logger and counted, and the next requests are served; a FORGET, which
// gets no answer, likewise. The requests go through go-fuse's dispatch
// (ProtocolServer, as the io_uring queues answer; the /dev/fuse readers
// share its handleRequest) to the mount's rawFS, with the PanicHandler
// Mount gives go-fuse: what a process serving several mounts relies on,
// with or without Options.Recover.
func TestRequestPanicAnsweredEIO(t *testing.T) {
	for _, rec := range []bool{false, true} {
		t.Run(fmt.Sprintf("Recover=%v", rec), func(t *testing.T) {
			var buf syncBuffer
			g := &guard{recover: rec, log: log.New(&buf, "", 0)}
			fake := &panickyFS{RawFileSystem: fuse.NewDefaultRawFileSystem()}
			ps := fuse.NewProtocolServer(&rawFS{RawFileSystem: fake, guard: g},
				&fuse.MountOptions{PanicHandler: g.panicked, Logger: log.New(&buf, "", 0)})
			lookup := func(unique uint64, name string) (errno int32, node uint64) {
				t.Helper()
				out := make([]byte, 4096)
				n, st := ps.HandleRequest([][]byte{fuseRequest(1, unique, 1, []byte(name+"\x00"))}, [][]byte{out})
				if !st.Ok() || n < 16 {
					t.Fatalf("LOOKUP %s: %d bytes, %v", name, n, st)
				}
				if u := binary.LittleEndian.Uint64(out[8:]); u != unique {
					t.Fatalf("LOOKUP %s answered as request %d, want %d", name, u, unique)
				}
				errno = int32(binary.LittleEndian.Uint32(out[4:]))
				if errno == 0 {
					node = binary.LittleEndian.Uint64(out[16:])
				}
				return errno, node
			}
			forget := func(unique, nlookup uint64) {
				t.Helper()
				n, st := ps.HandleRequest([][]byte{fuseRequest(2, unique, 2, binary.LittleEndian.AppendUint64(nil, nlookup))}, [][]byte{make([]byte, 4096)})
				if !st.Ok() || n != 0 {
					t.Fatalf("FORGET: %d bytes, %v; want no answer", n, st)
				}
			}

			if errno, _ := lookup(10, "boom"); errno != -int32(syscall.EIO) {
				t.Errorf("LOOKUP boom answered %d, want -EIO", errno)
			}
			logged := buf.String()
			if strings.Count(logged, "internal error") != 1 || !strings.Contains(logged, "lookup of boom") ||
				!strings.Contains(logged, "(*panickyFS).Lookup") || !strings.Contains(logged, "goroutine ") {
				t.Errorf("the panic was not logged once with its value and stack:\n%s", logged)
			}
			if n := g.panics.Load(); n != 1 {
				t.Errorf("%d panics counted, want 1", n)
			}
			if errno, node := lookup(11, "fine"); errno != 0 || node != 2 {
				t.Errorf("LOOKUP fine after the panic: errno %d, node %d; want 0 and 2", errno, node)
			}

			forget(12, 1)
			if n := g.panics.Load(); n != 2 {
				t.Errorf("%d panics counted after FORGET's, want 2", n)
			}
			if logged := buf.String(); strings.Count(logged, "internal error") != 2 || !strings.Contains(logged, "forget of a single lookup") {
				t.Errorf("FORGET's panic was not logged once:\n%s", logged)
			}
			forget(13, 3)
			if n := fake.forgotten.Load(); n != 3 {
				t.Errorf("the FORGET after the panic forgot %d lookups, want 3", n)
			}
			if errno, node := lookup(14, "fine"); errno != 0 || node != 2 {
				t.Errorf("LOOKUP fine after FORGET's panic: errno %d, node %d; want 0 and 2", errno, node)
			}
		})
	}
}

// TestRecoverOutsideRequests: with Options.Recover, a panic of the work a
// mount does outside a request (a goroutine it starts, the Init and
// OnUnmount go-fuse calls outside its dispatch, a runtime cleanup of a
// node) is logged once with its value and stack and counted, and the same
// work runs again afterwards; without Recover the panic goes on, unlogged
// and uncounted, as before.
func TestRecoverOutsideRequests(t *testing.T) {
	var buf syncBuffer
	g := &guard{recover: true, log: log.New(&buf, "", 0)}
	var wg sync.WaitGroup
	var ran atomic.Int32
	work := func(fail bool) func() {
		return func() {
			if fail {
				panic("background work failed")
			}
			ran.Add(1)
		}
	}
	for _, fail := range []bool{true, false} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.guarded("the test's work", work(fail))()
		}()
		wg.Wait()
	}
	logged := buf.String()
	if strings.Count(logged, "internal error") != 1 || !strings.Contains(logged, "the test's work abandoned: background work failed") ||
		!strings.Contains(logged, "TestRecoverOutsideRequests") {
		t.Errorf("the goroutine's panic was not logged once with its value and stack:\n%s", logged)
	}
	if n := g.panics.Load(); n != 1 {
		t.Errorf("%d panics counted, want 1", n)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the work after the panic ran %d times, want 1", n)
	}

	r := &rawFS{RawFileSystem: &panickyFS{RawFileSystem: fuse.NewDefaultRawFileSystem()}, guard: g}
	r.Init(nil)
	r.OnUnmount()
	if n := g.panics.Load(); n != 3 {
		t.Errorf("%d panics counted after Init's and OnUnmount's, want 3", n)
	}
	for _, want := range []string{"INIT's setup abandoned: init", "the unmount's cleanup abandoned: unmount"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, buf.String())
		}
	}

	// Without Recover: the panic reaches whoever called the work, as
	// it would end the goroutine and the process.
	var quiet syncBuffer
	off := &guard{log: log.New(&quiet, "", 0)}
	for what, call := range map[string]func(){
		"goroutine": off.guarded("the test's work", work(true)),
		"Init":      func() { (&rawFS{RawFileSystem: &panickyFS{}, guard: off}).Init(nil) },
		"OnUnmount": func() { (&rawFS{RawFileSystem: &panickyFS{}, guard: off}).OnUnmount() },
	} {
		func() {
			defer func() {
				if v := recover(); v == nil {
					t.Errorf("%s: without Recover, the panic was stopped", what)
				}
			}()
			call()
		}()
	}
	if n := off.panics.Load(); n != 0 || quiet.String() != "" {
		t.Errorf("without Recover: %d panics counted, logged %q; want none", n, quiet.String())
	}
}

// TestRecoverOneMountOfTwo: two mounts served by one process, as a shared
// server serves them. A LOOKUP of the first panics: it is answered EIO,
// logged on the first mount's logger alone and counted in its stats alone;
// the second mount goes on serving meanwhile, and the first answers its
// next requests, the same name's included.
func TestRecoverOneMountOfTwo(t *testing.T) {
	var logs [2]syncBuffer
	var mnts [2]string
	var fss [2]*FS
	for i := range fss {
		lo := t.TempDir()
		write(t, lo+"/other", fmt.Sprintf("other %d", i))
		mnts[i], fss[i] = mountFS(t, Options{Lower: []string{lo}, Upper: t.TempDir(), Work: t.TempDir(),
			Recover: true, Logger: log.New(&logs[i], "", 0)})
	}
	// A name the mount has not looked up yet (Mount has the kernel
	// look up and open a file of the mount's: teachNoOpen).
	var once atomic.Bool
	fss[0].hooks.lookup.set(func(name string) {
		if name == "boom" && once.CompareAndSwap(false, true) {
			panic("a lookup of boom that failed a check")
		}
	})
	var st unix.Stat_t
	if err := unix.Lstat(mnts[0]+"/boom", &st); !errors.Is(err, syscall.EIO) {
		t.Fatalf("lstat boom on the first mount: %v, want EIO", err)
	}
	if err := unix.Lstat(mnts[1]+"/boom", &st); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lstat boom on the second mount: %v, want ENOENT", err)
	}
	for i := range mnts {
		if got, want := readFile(t, mnts[i]+"/other"), fmt.Sprintf("other %d", i); got != want {
			t.Errorf("mount %d, other: %q, want %q", i, got, want)
		}
	}
	if err := unix.Lstat(mnts[0]+"/boom", &st); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lstat boom on the first mount after its panic: %v, want ENOENT", err)
	}
	if err := os.WriteFile(mnts[0]+"/boom", []byte("made"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, mnts[0]+"/boom"); got != "made" {
		t.Errorf("boom on the first mount: %q, want %q", got, "made")
	}
	if n := fss[0].Stats().InternalErrors; n != 1 {
		t.Errorf("the first mount counts %d internal errors, want 1", n)
	}
	if n := fss[1].Stats().InternalErrors; n != 0 {
		t.Errorf("the second mount counts %d internal errors, want 0", n)
	}
	if l := logs[0].String(); strings.Count(l, "internal error") != 1 ||
		!strings.Contains(l, "request answered EIO: a lookup of boom that failed a check") || !strings.Contains(l, "(*node).Lookup") {
		t.Errorf("the first mount's log:\n%s\nwant the panic once, with its stack", l)
	}
	if l := logs[1].String(); strings.Contains(l, "internal error") {
		t.Errorf("the second mount logged the first's panic:\n%s", l)
	}
	// The panic was the test's: mountFS fails a test whose daemon
	// panicked otherwise.
	fss[0].guard.panics.Store(0)
}

// TestRecoverMountGoroutine: with Recover, a panic in a goroutine a mount
// starts (here the one that notifies the kernel once a copy-up parted a
// lower hard link, node.part) is logged and counted, and the mount goes on
// serving, the copied-up file and the other link included.
func TestRecoverMountGoroutine(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/a", "data")
	if err := os.Link(lo+"/a", lo+"/b"); err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	mnt, f := mountFS(t, Options{Lower: []string{lo}, Upper: t.TempDir(), Work: t.TempDir(),
		Recover: true, Logger: log.New(&logged, "", 0)})
	f.hooks.partedNotify.set(func(string) { panic("the notification failed a check") })
	if err := os.WriteFile(mnt+"/a", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The goroutine runs after the request that started it; this bounds
	// the wait for it, it asserts no timing.
	for deadline := time.Now().Add(10 * time.Second); f.guard.panics.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.Stats().InternalErrors; n != 1 {
		t.Fatalf("%d internal errors counted, want 1", n)
	}
	if l := logged.String(); strings.Count(l, "internal error") != 1 ||
		!strings.Contains(l, "a parted hard link's notification abandoned: the notification failed a check") || !strings.Contains(l, "(*node).part") {
		t.Errorf("the log:\n%s\nwant the panic once, with its stack", l)
	}
	for name, want := range map[string]string{"a": "new", "b": "data"} {
		if got := readFile(t, mnt+"/"+name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if err := os.WriteFile(mnt+"/c", []byte("c"), 0o644); err != nil {
		t.Errorf("a create after the panic: %v", err)
	}
	f.guard.panics.Store(0) // the test's, as TestRecoverOneMountOfTwo's
}
