package lower

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

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

	root *Dir
}

// OpenLayer opens the root of a layer. The directory fd it keeps is the
// anchor of every later access to the layer.
func OpenLayer(path string, index int, upper bool) (*Layer, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open layer %q: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat layer %q: %w", path, err)
	}
	l := &Layer{Index: index, Path: path, Dev: st.Dev, Upper: upper}
	l.root = &Dir{Layer: l, fd: fd}
	return l, nil
}

// Root returns the layer's root directory. It stays open until Close.
func (l *Layer) Root() *Dir { return l.root }

// Close releases the layer's root fd.
func (l *Layer) Close() error { return l.root.Close() }

// Dir is an open directory inside one layer.
type Dir struct {
	Layer *Layer

	mu sync.Mutex
	fd int // -1 once closed
}

// NewDir wraps an fd of a directory in layer l; the Dir owns the fd.
func NewDir(l *Layer, fd int) *Dir { return &Dir{Layer: l, fd: fd} }

// FD returns the directory's fd for *at syscalls. The caller keeps the Dir
// open (its owner, a node the kernel still references) while using it.
func (d *Dir) FD() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fd
}

// Close closes the fd once; further calls do nothing.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// Stat is fstatat(d, name, AT_SYMLINK_NOFOLLOW).
func (d *Dir) Stat(name string, st *unix.Stat_t) error {
	return unix.Fstatat(d.FD(), name, st, unix.AT_SYMLINK_NOFOLLOW)
}

// StatSelf is fstat of the directory itself.
func (d *Dir) StatSelf(st *unix.Stat_t) error {
	return unix.Fstat(d.FD(), st)
}

// OpenDir opens the subdirectory name without following a symlink.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	fd, err := unix.Openat(d.FD(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) {
		// A directory we may search but not read (rootless, mode
		// 0311): O_PATH still anchors *at calls.
		fd, err = unix.Openat(d.FD(), name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, err
	}
	return &Dir{Layer: d.Layer, fd: fd}, nil
}

// Open opens the non-directory name in d with flags, never following a
// symlink.
func (d *Dir) Open(name string, flags int) (int, error) {
	return unix.Openat(d.FD(), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// Readlink reads the symlink name in d.
func (d *Dir) Readlink(name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(d.FD(), name, buf)
		if err != nil {
			return nil, err
		}
		if n < len(buf) {
			return buf[:n], nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// ProcPath names entry name of d through /proc/self/fd, for the l*xattr
// calls that have no *at form before Linux 6.13. The path has exactly one
// component after the fd, and the l* calls do not follow it.
func (d *Dir) ProcPath(name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(d.FD())
	if name != "" {
		p += "/" + name
	}
	return p
}
