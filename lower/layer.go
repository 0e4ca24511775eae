package lower

import (
	"container/list"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Layer is one directory tree of the stack.
type Layer struct {
	// Index is the layer's place in the stack, 0 being the topmost
	// (the upper layer when there is one).
	Index int
	// Path is the layer's directory as given on the command line.
	Path string
	// Dev is the st_dev of the layer's root.
	Dev uint64
	// Upper is set for the writable layer.
	Upper bool
	// Counters counts what lookups asked of the layer.
	Counters Counters
	// Caches are the caches the layer's directories use, shared by the
	// layers of a mount. OpenLayer gives the layer caches of its own;
	// set before the layer is used.
	Caches *Caches
	// Override says where the layer keeps owners and modes (override.go):
	// found by DetectOverride for a lower layer, chosen by the mount's
	// xattr_permissions for the upper one. Set before the layer is used.
	Override OverrideMode
	// IDMapped says the layer was opened through an id-mapped mount
	// (idmapped.go); Unshift, when set, reads its owners back into
	// on-disk ids. Set before the layer is used.
	IDMapped bool
	Unshift  *Unshift
	// Metacopy: the mount follows metacopy files to their data
	// (metacopy=on, metacopy.go); without it, a lookup that meets one
	// fails as the kernel's does. Set before the layer is used.
	Metacopy bool
	// Masked are the system calls the layer takes for absent
	// (features.go), given when it is opened.
	Masked Features

	root *Dir
	// cloned: opened through a private clone of its mount (mounts.go).
	cloned bool
	// atime is when reads of the layer update access times (atime.go).
	atime Atime
}

// Counters counts, for one layer, how lookups got their answers.
type Counters struct {
	// Answered counts names a lookup settled from the layer's cached
	// listings without a system call: absent, a whiteout, or hidden by a
	// ".wh.NAME" entry.
	Answered atomic.Uint64
	// Asked counts names a lookup asked the layer for (fstatat).
	Asked atomic.Uint64
	// ListingsRead counts directories of the layer read into a listing.
	ListingsRead atomic.Uint64
	// Fallbacks counts the fallbacks run on the layer for system calls
	// the kernel lacks or the mask hides (features.go).
	Fallbacks Fallbacks
}

// OpenLayer opens the root of a layer. The directory fd it keeps is the
// anchor of every later access to the layer.
//
// An upper layer is opened in place: a clone of its own would not share
// a mount with its workdir (OpenUpper opens both). A lower layer's reads
// never change access times (atime.go).
func OpenLayer(path string, index int, upper bool) (*Layer, error) {
	return OpenLayerMasked(path, index, upper, 0)
}

// OpenLayerMasked is OpenLayer taking the system calls of masked for
// absent (features.go).
func OpenLayerMasked(path string, index int, upper bool, masked Features) (*Layer, error) {
	fd, cloned, why, err := openRoot(path, !upper, masked)
	if err != nil {
		return nil, fmt.Errorf("open layer %q: %w", path, err)
	}
	l, err := newLayer(path, index, upper, fd, cloned, masked, why)
	if err == nil && !upper {
		l.atime = Atime{Mode: Noatime}
	}
	return l, err
}

// newLayer makes the layer whose root is fd, which it owns; lacked is
// the feature whose fallback opened it, if any.
func newLayer(path string, index int, upper bool, fd int, cloned bool, masked, lacked Features) (*Layer, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat layer %q: %w", path, err)
	}
	l := &Layer{Index: index, Path: path, Dev: st.Dev, Upper: upper, cloned: cloned, Masked: masked}
	l.Counters.Fallbacks.ran(lacked)
	// Told now, while the path's mount is attached: the caller may
	// detach it as soon as the mount is up (containers/storage does),
	// and fd keeps the layer reachable. A mount that cannot be told
	// counts as not id-mapped.
	var err error
	l.IDMapped, err = onIDMappedMount(path, masked)
	if errors.Is(err, unix.ENOSYS) {
		l.Counters.Fallbacks.ran(StatxMntID)
	}
	l.root = &Dir{Layer: l, fd: fd}
	l.Caches = NewCaches()
	return l, nil
}

// Root returns the layer's root directory. It stays open until Close.
func (l *Layer) Root() *Dir { return l.root }

// Close releases the layer's root fd.
func (l *Layer) Close() error { return l.root.Close() }

// Dir is a directory inside one layer.
//
// Its fd is opened on demand, with one openat(O_NOFOLLOW) step from its
// parent's, and an unused one may be closed again by the fd cache
// (fdcache.go): a tree of a million directories must not need a million
// fds. Every use goes through Do, which pins the fd for the call. A reopen
// checks that it found the same directory (st_dev, st_ino); the upper
// layer, the only one that changes, tells a Dir that moved (Moved).
//
// A Dir without a parent (a layer's root, the workdir) keeps its fd until
// Close.
type Dir struct {
	Layer *Layer

	mu       sync.Mutex
	parent   *Dir
	name     string
	path     []string // without a parent: the components from the layer root
	dev, ino uint64
	fd       int // -1 while not open
	pins     int
	dead     bool
	lru      *list.Element // in the fd cache while open and reopenable
	used     bool          // used since the fd cache last passed over it
	// forgotten: the directory's node was forgotten (Forget); its fd is
	// closed at each last release instead of cached.
	forgotten bool

	// The directory's listing, in a read-only layer (listing.go).
	ls     atomic.Pointer[listing]
	lsMu   sync.Mutex // held while reading the listing
	lsDead bool       // closed: cache no listing; guarded by the listing cache's mu
	// lsNoCache: the listing was too big to cache; do not read it again
	// for lookups.
	lsNoCache atomic.Bool
}

// NewDir wraps an fd of a directory in layer l; the Dir owns the fd and
// keeps it until Close.
func NewDir(l *Layer, fd int) *Dir { return &Dir{Layer: l, fd: fd} }

// Do calls fn with the directory's fd, which stays open for the call.
func (d *Dir) Do(fn func(fd int) error) error {
	fd, err := d.acquire()
	if err != nil {
		return err
	}
	defer d.release()
	return fn(fd)
}

// Pin pins the directory's fd until release is called, for calls that
// need several directories' fds at once (renameat2, linkat).
func (d *Dir) Pin() (fd int, release func(), err error) {
	fd, err = d.acquire()
	if err != nil {
		return -1, nil, err
	}
	return fd, d.release, nil
}

// acquire pins the fd, opening it if needed.
//
// It takes d's mu, then its parent's when it reopens d (lock order: the
// overlay package documentation).
func (d *Dir) acquire() (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return -1, unix.EBADF
	}
	if d.fd < 0 {
		if err := d.reopenLocked(); err != nil {
			return -1, err
		}
		d.Layer.Caches.fds.add(d)
	}
	d.pins++
	d.used = true
	return d.fd, nil
}

// release unpins the fd; an unpinned fd of a Dir with a parent goes back
// to the cache, which may close it.
func (d *Dir) release() {
	d.mu.Lock()
	d.pins--
	if (d.dead || d.forgotten) && d.pins == 0 && d.fd >= 0 {
		d.closeFDLocked()
	}
	d.mu.Unlock()
}

// reopenLocked opens the directory again from its parent.
//
// Preconditions: d.mu is held; d.fd < 0.
func (d *Dir) reopenLocked() error {
	var fd int
	var err error
	switch {
	case d.parent != nil:
		err = d.parent.Do(func(pfd int) error {
			fd, err = openDirAt(pfd, d.name)
			return err
		})
	case d.path != nil:
		fd, err = d.Layer.walk(d.path)
	default:
		return unix.EBADF
	}
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != d.dev || st.Ino != d.ino {
		unix.Close(fd)
		return unix.ESTALE
	}
	d.fd = fd
	return nil
}

// openDirAt opens directory name in dirfd without following a symlink.
// A mount on the directory (a layer opened in place, mounts.go) is not
// entered: EXDEV.
func openDirAt(dirfd int, name string) (int, error) {
	fd, err := openat2Dir(dirfd, name, unix.O_RDONLY)
	if errors.Is(err, unix.EACCES) {
		// A directory we may search but not read (rootless, mode
		// 0311): O_PATH still anchors *at calls.
		fd, err = openat2Dir(dirfd, name, unix.O_PATH)
	}
	return fd, err
}

// openat2Dir opens directory name in dirfd with flags, neither following
// a symlink nor crossing into a mount.
func openat2Dir(dirfd int, name string, flags int) (int, error) {
	return unix.Openat2(dirfd, name, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_NO_XDEV,
	})
}

// closeIdleLocked closes an unpinned fd for the cache.
//
// Preconditions: d.mu is held.
func (d *Dir) closeIdleLocked() {
	if d.pins == 0 && d.fd >= 0 && d.reopenableLocked() {
		unix.Close(d.fd)
		d.fd = -1
	}
}

// Close closes the fd for good; further calls do nothing, and a Dir closed
// while pinned closes its fd at the last release.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil
	}
	d.dead = true
	if d.lru != nil {
		d.Layer.Caches.fds.remove(d)
	}
	d.Layer.Caches.listings.drop(d, true)
	if d.fd < 0 || d.pins > 0 {
		return nil // the last release closes it
	}
	return d.closeFDLocked()
}

// Forget lets go of what the directory holds, as Close does, but leaves
// it usable: its fd is closed now (at its last release if pinned) and
// after each later use, and its listing is dropped. It is for the
// directories of a node the kernel forgot: go-fuse may still hand that
// node out again to a lookup that raced with the FORGET, and then it must
// work. A Dir that cannot reopen itself (no parent, no path) is kept open.
func (d *Dir) Forget() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead || !d.reopenableLocked() {
		return
	}
	d.forgotten = true
	d.Layer.Caches.listings.drop(d, false)
	if d.pins > 0 || d.fd < 0 {
		return // the last release closes it
	}
	d.closeFDLocked()
}

// closeFDLocked closes the fd and takes d out of the fd cache.
//
// Preconditions: d.mu is held; d.fd >= 0; d is not pinned.
func (d *Dir) closeFDLocked() error {
	if d.lru != nil {
		d.Layer.Caches.fds.remove(d)
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// reopenableLocked reports whether d can open its fd again after the cache
// closed it.
//
// Preconditions: d.mu is held.
func (d *Dir) reopenableLocked() bool { return d.parent != nil || d.path != nil }

// walked returns the path d reopens itself through, if it was found by
// walking from a layer root (rebase).
func (d *Dir) walked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.path == nil {
		return nil
	}
	return append([]string(nil), d.path...)
}

// rebase makes d reopen itself from the layer root through path instead
// of from its parent, so that the parent need not stay open.
func (d *Dir) rebase(path []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.parent, d.path = nil, path
}

// walk opens the directory at path from the root of l, one O_NOFOLLOW
// step at a time.
func (l *Layer) walk(path []string) (int, error) {
	fd, err := -1, error(nil)
	err = l.root.Do(func(rfd int) error {
		cur := rfd
		for _, c := range path {
			next, err := openDirAt(cur, c)
			if cur != rfd {
				unix.Close(cur)
			}
			if err != nil {
				return err
			}
			cur = next
		}
		if cur == rfd {
			next, err := unix.FcntlInt(uintptr(rfd), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				return err
			}
			cur = next
		}
		fd = cur
		return nil
	})
	return fd, err
}

// Moved records that the directory now is name in parent (a rename in the
// upper layer), so that a reopen finds it.
func (d *Dir) Moved(parent *Dir, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.parent, d.name = parent, name
}

// Stat is fstatat(d, name, AT_SYMLINK_NOFOLLOW).
func (d *Dir) Stat(name string, st *unix.Stat_t) error {
	if err := d.Do(func(fd int) error { return unix.Fstatat(fd, name, st, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
		return err
	}
	d.Layer.UnshiftStat(st)
	return nil
}

// StatSelf is fstat of the directory itself.
func (d *Dir) StatSelf(st *unix.Stat_t) error {
	if err := d.Do(func(fd int) error { return unix.Fstat(fd, st) }); err != nil {
		return err
	}
	d.Layer.UnshiftStat(st)
	return nil
}

// OpenDir opens the subdirectory name without following a symlink.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	var fd int
	err := d.Do(func(pfd int) error {
		var err error
		fd, err = openDirAt(pfd, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	c := &Dir{Layer: d.Layer, parent: d, name: name, dev: st.Dev, ino: st.Ino, fd: fd, used: true}
	c.mu.Lock()
	d.Layer.Caches.fds.add(c)
	c.mu.Unlock()
	return c, nil
}

// Open opens the non-directory name in d with flags, never following a
// symlink. The fd is the caller's. Where the layer's reads must not change
// access times, it is opened O_NOATIME if the daemon may (atime.go).
func (d *Dir) Open(name string, flags int) (int, error) {
	return d.OpenMode(name, flags, 0)
}

// OpenMode is Open with the mode of a file that O_CREAT makes.
func (d *Dir) OpenMode(name string, flags int, mode uint32) (int, error) {
	flags |= d.Layer.noatimeFlag(flags&unix.O_DIRECTORY != 0)
	var fd int
	err := d.Do(func(dfd int) error {
		var err error
		fd, err = openatNoatime(dfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		return err
	})
	return fd, err
}

// Readlink reads the symlink name in d.
func (d *Dir) Readlink(name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		var n int
		err := d.Do(func(fd int) error {
			var err error
			n, err = unix.Readlinkat(fd, name, buf)
			return err
		})
		if err != nil {
			return nil, err
		}
		if n < len(buf) {
			return buf[:n], nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// DoPath calls fn with a path that names entry name of d (d itself for "")
// through /proc/self/fd, for the xattr calls that have no *at form before
// Linux 6.13; the fd stays open for the call. The path has exactly one
// component after the fd, which the l*xattr calls do not follow; for d
// itself the magic link must be followed (the non-l calls).
func (d *Dir) DoPath(name string, fn func(path string) error) error {
	return d.Do(func(fd int) error {
		p := "/proc/self/fd/" + strconv.Itoa(fd)
		if name != "" {
			p += "/" + name
		}
		return fn(p)
	})
}
