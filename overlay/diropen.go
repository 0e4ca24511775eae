package overlay

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Directories open without a request (no OPENDIR, no RELEASEDIR).
//
// The first OPENDIR is answered ENOSYS. The kernel then opens every
// directory of the mount by itself, with FOPEN_KEEP_CACHE|FOPEN_CACHE_DIR
// (fs/fuse/file.c fuse_file_open(), fc->no_opendir): exactly the flags
// dirHandle's own opens had. A warm walk (find, ls -R, a stat walk) then
// reaches the daemon not at all, where it cost two requests per
// directory: the listing is in the directory's page cache, the
// attributes and entries in the dentry cache.
//
// What does reach the daemon are the requests that need a listing the
// kernel has not cached (READDIR, READDIRPLUS) and FSYNCDIR, all with
// file handle 0. rawFS serves them through a dirStream: a dirHandle
// opened through go-fuse's bridge for that directory, kept between
// requests so that the offsets of one pass through a directory stay
// those of one listing (dirHandle reads the listing at the first READDIR
// and again at offset 0, as before). A pass that reaches the end of the
// listing gives its stream back; streams left behind by a reader that
// stopped early are closed oldest first beyond maxDirStreams.
//
// A stream holds a file handle the kernel does not know of, so it must
// not outlive the kernel's reference to its directory: go-fuse drops a
// node at its last FORGET whatever handles are open, and reuses its ID.
// A FORGET of a directory closes its idle streams before go-fuse sees it
// (a stream in use cannot meet one: the kernel holds the directory for
// the READDIR in flight).
//
// The kernel checks permissions itself (default_permissions), so the
// open needs nothing from the daemon.
//
// Except with strictatime (atime.go): a listing the kernel serves from
// its cache would update no atime, so each OPENDIR is answered, without
// FOPEN_CACHE_DIR, and every listing reaches the daemon, which reads the
// upper directory for it. The mount pays an OPENDIR, a RELEASEDIR and
// the READDIRs of every listing for that.

// maxDirStreams bounds the open dirStreams of a mount.
const maxDirStreams = 64

// dirStream is one pass through a directory, between requests.
type dirStream struct {
	node uint64 // the directory's node ID
	fh   uint64 // its dirHandle, opened through the bridge
	next uint64 // the offset the next READDIR of this pass asks for
	used uint64 // when it was last used (dirStreams.clock)
}

// dirStreams holds the streams not in use by a request.
type dirStreams struct {
	mu    sync.Mutex
	idle  []*dirStream
	clock uint64

	// opendirs counts OPENDIR requests (the kernel sends one), opened
	// the streams opened.
	opendirs, opened atomic.Uint64
}

// OpenDir: see "Directories open without a request" above. Where the mask
// hides FUSE_NO_OPENDIR_SUPPORT (mask.go), as on a kernel before 5.1 that
// would fail the opendir(3) of an OPENDIR answered ENOSYS, the open is
// served through the bridge, and its handle serves the READDIRs. So it is
// with strictatime (listEvery), without FOPEN_CACHE_DIR: every listing
// must reach goverlay to update the upper directory's atime (atime.go).
func (r *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.dirs.opendirs.Add(1)
	if !r.listEvery && !r.mask.opendir {
		return fuse.ENOSYS
	}
	st := r.RawFileSystem.OpenDir(cancel, in, out)
	if st.Ok() {
		out.OpenFlags &^= r.mask.open
		if r.listEvery {
			out.OpenFlags &^= fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
		}
	}
	return st
}

func (r *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.readDir(cancel, in, out, r.RawFileSystem.ReadDir)
}

func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.readDir(cancel, in, out, r.RawFileSystem.ReadDirPlus)
}

// Forget: see "A stream holds a file handle" above.
func (r *rawFS) Forget(nodeid, nlookup uint64) {
	r.closeStreamsOf(nodeid)
	r.RawFileSystem.Forget(nodeid, nlookup)
}

// closeStreamsOf closes the idle streams of directory node.
func (r *rawFS) closeStreamsOf(node uint64) {
	d := &r.dirs
	d.mu.Lock()
	var gone []*dirStream
	d.idle = slices.DeleteFunc(d.idle, func(s *dirStream) bool {
		if s.node == node {
			gone = append(gone, s)
			return true
		}
		return false
	})
	d.mu.Unlock()
	for _, s := range gone {
		r.closeStream(s)
	}
}

// readDir serves one READDIR(PLUS) from the stream of the pass it
// continues, or from a new one.
func (r *rawFS) readDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList,
	read func(<-chan struct{}, *fuse.ReadIn, *fuse.DirEntryList) fuse.Status) fuse.Status {
	if in.Fh != 0 {
		return read(cancel, in, out)
	}
	s, st := r.takeStream(cancel, in.InHeader, in.Offset)
	if !st.Ok() {
		return st
	}
	req := *in
	req.Fh = s.fh
	st = read(cancel, &req, out)
	if !st.Ok() || out.Offset == in.Offset {
		// An error, or the end of the listing: this pass is over.
		r.closeStream(s)
		return st
	}
	s.next = out.Offset
	r.putStream(s)
	return st
}

func (r *rawFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if in.Fh != 0 {
		return r.RawFileSystem.FsyncDir(cancel, in)
	}
	s, st := r.openStream(cancel, in.InHeader)
	if !st.Ok() {
		return st
	}
	defer r.closeStream(s)
	req := *in
	req.Fh = s.fh
	return r.RawFileSystem.FsyncDir(cancel, &req)
}

// takeStream returns the idle stream of directory h.NodeId whose pass
// asks for offset next, or a new stream; either way the caller owns it
// until putStream or closeStream.
func (r *rawFS) takeStream(cancel <-chan struct{}, h fuse.InHeader, next uint64) (*dirStream, fuse.Status) {
	d := &r.dirs
	if next != 0 {
		d.mu.Lock()
		for i, s := range d.idle {
			if s.node == h.NodeId && s.next == next {
				d.idle = append(d.idle[:i], d.idle[i+1:]...)
				d.mu.Unlock()
				return s, fuse.OK
			}
		}
		d.mu.Unlock()
	}
	return r.openStream(cancel, h)
}

// openStream opens a dirHandle of directory h.NodeId through the bridge.
func (r *rawFS) openStream(cancel <-chan struct{}, h fuse.InHeader) (*dirStream, fuse.Status) {
	in := fuse.OpenIn{InHeader: h, Flags: unix.O_RDONLY | unix.O_DIRECTORY}
	var out fuse.OpenOut
	if st := r.RawFileSystem.OpenDir(cancel, &in, &out); !st.Ok() {
		return nil, st
	}
	r.dirs.opened.Add(1)
	return &dirStream{node: h.NodeId, fh: out.Fh}, fuse.OK
}

// putStream makes s idle, closing the least recently used idle stream
// beyond maxDirStreams.
//
// The evicted stream is closed before d.mu is let go. Its directory is
// not held by a request of ours, so the kernel may have forgotten it: a
// FORGET that found no idle stream of it under d.mu must find it closed
// by then too, or the close would reach go-fuse after the node is gone
// (a panic on the unknown node, answered EIO to this READDIR) or after
// its ID went to another node (whose open files it would unlink).
func (r *rawFS) putStream(s *dirStream) {
	d := &r.dirs
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clock++
	s.used = d.clock
	d.idle = append(d.idle, s)
	if len(d.idle) > maxDirStreams {
		oldest := 0
		for i, o := range d.idle {
			if o.used < d.idle[oldest].used {
				oldest = i
			}
		}
		evict := d.idle[oldest]
		d.idle = append(d.idle[:oldest], d.idle[oldest+1:]...)
		r.closeStream(evict)
	}
}

// closeStream releases s's dirHandle.
func (r *rawFS) closeStream(s *dirStream) {
	r.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: s.node}, Fh: s.fh})
}
