package overlay

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// rawFS finds what it saw on a request (kill flags, umask) from the context go-fuse hands the node and file methods: it
// relies on go-fuse details that are not its API. The two tests below pin
// them, so that a go-fuse upgrade that changes them fails here rather than
// silently losing the umask and the privilege removal.

// rawProbe is a directory whose methods record what rawFS tells them.
type rawProbe struct {
	fs.Inode
	r  *rawFS
	mu sync.Mutex
	// seen, by operation, is what r.seen reported; ctxOK is false when a
	// method got a context other than a *fuse.Context with the request's
	// cancel channel.
	seen   map[string]reqMark
	ctxOK  map[string]bool
	cancel <-chan struct{} // the channel the test passes for this request
}

func (p *rawProbe) record(ctx context.Context, op string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := ctx.(*fuse.Context)
	p.ctxOK[op] = ok && c.Cancel == p.cancel
	p.seen[op] = p.r.seen(ctx)
}

func (p *rawProbe) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p.record(ctx, "mkdir")
	return p.NewInode(ctx, &fs.Inode{}, fs.StableAttr{Mode: unix.S_IFDIR}), 0
}

func (p *rawProbe) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p.record(ctx, "create")
	return p.NewInode(ctx, &fs.Inode{}, fs.StableAttr{Mode: unix.S_IFREG}), &rawProbeFile{p}, 0, 0
}

type rawProbeFile struct{ p *rawProbe }

func (f *rawProbeFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.p.record(ctx, "write")
	return uint32(len(data)), 0
}

func (f *rawProbeFile) Release(ctx context.Context) syscall.Errno {
	f.p.record(ctx, "release")
	return 0
}

// TestRawFSContext: go-fuse's node bridge hands each node and file method a
// *fuse.Context whose Cancel is the channel the RawFileSystem method got,
// which is how rawFS matches the two.
func TestRawFSContext(t *testing.T) {
	p := &rawProbe{seen: map[string]reqMark{}, ctxOK: map[string]bool{}}
	p.r = &rawFS{RawFileSystem: fs.NewNodeFS(p, &fs.Options{})}
	next := func() chan struct{} {
		c := make(chan struct{})
		p.mu.Lock()
		p.cancel = c
		p.mu.Unlock()
		return c
	}
	var eo fuse.EntryOut
	if st := p.r.Mkdir(next(), &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, Mode: 0o777, Umask: 0o027}, "d", &eo); !st.Ok() {
		t.Fatalf("mkdir: %v", st)
	}
	var co fuse.CreateOut
	in := &fuse.CreateIn{InHeader: fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, Flags: uint32(os.O_RDWR), Mode: 0o666, Umask: 0o002, OpenFlags: fuse.OPEN_KILL_SUIDGID}
	if st := p.r.Create(next(), in, "f", &co); !st.Ok() {
		t.Fatalf("create: %v", st)
	}
	wr := &fuse.WriteIn{InHeader: fuse.InHeader{NodeId: co.NodeId, Unique: 7}, Fh: co.Fh, WriteFlags: fuse.WRITE_KILL_SUIDGID | fuse.WRITE_CACHE}
	if _, st := p.r.Write(next(), wr, []byte("x")); !st.Ok() {
		t.Fatalf("write: %v", st)
	}
	p.r.Release(next(), &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: co.NodeId}, Fh: co.Fh})

	want := map[string]reqMark{
		"mkdir":   {umask: 0o027},
		"create":  {flags: flagKill, umask: 0o002},
		"write":   {flags: flagKill | flagCacheWrite, unique: 7, nodeID: co.NodeId},
		"release": {},
	}
	for op, w := range want {
		if !p.ctxOK[op] {
			t.Errorf("%s: the method's context is not a *fuse.Context carrying the request's cancel channel", op)
		}
		if p.seen[op] != w {
			t.Errorf("%s: rawFS saw %+v on the request, want %+v", op, p.seen[op], w)
		}
	}
	if n := syncMapLen(&p.r.marks) + syncMapLen(&p.r.opens); n != 0 {
		t.Errorf("%d request marks left after the requests", n)
	}
}

func syncMapLen(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// cancelProbe is a root with files whose Open waits until two opens are
// in flight at once, and records their cancel channels.
type cancelProbe struct {
	fs.Inode
	mu      sync.Mutex
	cancels []<-chan struct{}
	both    chan struct{}
}

func (r *cancelProbe) OnAdd(ctx context.Context) {
	for _, name := range []string{"a", "b"} {
		r.AddChild(name, r.NewPersistentInode(ctx, &cancelProbeFile{r: r}, fs.StableAttr{Mode: unix.S_IFREG}), false)
	}
}

type cancelProbeFile struct {
	fs.Inode
	r *cancelProbe
}

func (f *cancelProbeFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = unix.S_IFREG | 0o644
	return 0
}

func (f *cancelProbeFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	c, _ := ctx.(*fuse.Context)
	if c == nil {
		return nil, 0, syscall.EIO
	}
	f.r.mu.Lock()
	f.r.cancels = append(f.r.cancels, c.Cancel)
	if len(f.r.cancels) == 2 {
		close(f.r.both)
	}
	f.r.mu.Unlock()
	select {
	case <-f.r.both:
	case <-time.After(30 * time.Second):
		// Not a timing assertion: a go-fuse that serves one request at
		// a time would never let the second in, and the test would hang.
		return nil, 0, syscall.EIO
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

// TestRawFSCancelPerRequest: go-fuse gives each request in flight a
// cancel channel of its own, so two concurrent requests never share a
// mark.
func TestRawFSCancelPerRequest(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	root := &cancelProbe{both: make(chan struct{})}
	mnt := t.TempDir()
	srv, err := fs.Mount(mnt, root, &fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		srv.Wait()
	})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(mnt + "/" + name)
			if err == nil {
				f.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("open: %v (were the two opens served at once?)", err)
		}
	}
	root.mu.Lock()
	defer root.mu.Unlock()
	if len(root.cancels) != 2 || root.cancels[0] == nil || root.cancels[0] == root.cancels[1] {
		t.Errorf("two requests in flight had cancel channels %v, want two distinct ones", root.cancels)
	}
}
