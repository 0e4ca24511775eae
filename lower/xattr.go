package lower

import (
	"errors"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Getxattr reads attribute attr of entry name in d, or of d itself when name
// is "". A symlink entry's own attributes are read, never its target's.
func (d *Dir) Getxattr(name, attr string) ([]byte, error) {
	v, err := d.readXattrs(name, xattrCalls{
		fd:   func(fd int, buf []byte) (int, error) { return unix.Fgetxattr(fd, attr, buf) },
		at:   func(fd int, buf []byte) (int, error) { return getxattrat(fd, name, attr, buf) },
		path: func(p string, buf []byte) (int, error) { return unix.Getxattr(p, attr, buf) },
		link: func(p string, buf []byte) (int, error) { return unix.Lgetxattr(p, attr, buf) },
	})
	if err != nil {
		return nil, err
	}
	return d.Layer.unshiftXattr(attr, v)
}

// Listxattr lists the attribute names of entry name in d, or of d itself
// when name is "", the way Getxattr reads them.
func (d *Dir) Listxattr(name string) ([]string, error) {
	raw, err := d.readXattrs(name, xattrCalls{
		fd:   unix.Flistxattr,
		at:   func(fd int, buf []byte) (int, error) { return listxattrat(fd, name, buf) },
		path: unix.Listxattr,
		link: unix.Llistxattr,
	})
	return splitNames(raw), err
}

// xattrCalls are the four forms of one xattr read (a get of one attribute,
// or the list), each filling buf or, given none, reporting the size.
type xattrCalls struct {
	fd   func(fd int, buf []byte) (int, error)    // d itself, through its fd
	at   func(dirfd int, buf []byte) (int, error) // an entry, *xattrat(2)
	path func(p string, buf []byte) (int, error)  // following the path
	link func(p string, buf []byte) (int, error)  // not following it
}

// readXattrs runs an xattr read of entry name in d, or of d itself for "".
// d's own attributes are read through its fd, an entry's with the *xattrat
// calls relative to it (Linux 6.13+), and only where those cannot serve
// through /proc/self/fd/N[/NAME], which costs a path walk through procfs on
// every call: a lookup reads a directory's opaque and redirect marks, and
// the kernel asks security.capability of each new file.
func (d *Dir) readXattrs(name string, c xattrCalls) (v []byte, err error) {
	viaProc := func(call func(p string, buf []byte) (int, error)) ([]byte, error) {
		err = d.DoPath(name, func(p string) error {
			v, err = readXattr(func(buf []byte) (int, error) { return call(p, buf) })
			return err
		})
		return v, err
	}
	if name == "" {
		err = d.Do(func(fd int) error {
			v, err = readXattr(func(buf []byte) (int, error) { return c.fd(fd, buf) })
			return err
		})
		if !errors.Is(err, unix.EBADF) {
			return v, err
		}
		// An O_PATH fd (a directory we may search but not read):
		// /proc/self/fd/N is a magic link, followed to the directory.
		return viaProc(c.path)
	}
	if d.xattrAtAvailable() {
		err = d.Do(func(fd int) error {
			v, err = readXattr(func(buf []byte) (int, error) { return c.at(fd, buf) })
			return err
		})
		if !errors.Is(err, unix.ENOSYS) {
			return v, err
		}
		d.Layer.Caches.noXattrAt.Store(true)
	}
	d.Layer.Counters.Fallbacks.ran(XattrAt)
	return viaProc(c.link)
}

// xattrAtAvailable reports whether the *xattrat calls may serve: neither
// masked (features.go) nor found missing.
func (d *Dir) xattrAtAvailable() bool {
	return !d.Layer.Masked.Has(XattrAt) && !d.Layer.Caches.noXattrAt.Load()
}

// readXattr calls get with a buffer big enough for the value: a first try
// with a small one, then the size the kernel reports, as often as the value
// grows in between (ERANGE).
func readXattr(get func(buf []byte) (int, error)) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := get(buf)
		if err == nil {
			return buf[:n], nil
		}
		if !errors.Is(err, unix.ERANGE) {
			return nil, err
		}
		if n, err = get(nil); err != nil {
			return nil, err
		}
		buf = make([]byte, n+1)
	}
}

// splitNames splits a listxattr answer (NUL-terminated names).
func splitNames(raw []byte) []string {
	var names []string
	for _, s := range strings.Split(string(raw), "\x00") {
		if s != "" {
			names = append(names, s)
		}
	}
	return names
}

// xattrArgs is struct xattr_args of getxattrat(2) (include/uapi/linux/xattr.h).
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

// getxattrat reads attr of name in the directory dirfd, without following a
// symlink (getxattrat(2), Linux 6.13+). An empty buf asks for the size.
func getxattrat(dirfd int, name, attr string, buf []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	args := xattrArgs{size: uint32(len(buf))}
	if len(buf) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	n, _, errno := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// listxattrat lists the attribute names of name in the directory dirfd,
// without following a symlink (listxattrat(2), Linux 6.13+).
func listxattrat(dirfd int, name string, buf []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	var b unsafe.Pointer
	if len(buf) > 0 {
		b = unsafe.Pointer(&buf[0])
	}
	n, _, errno := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(b), uintptr(len(buf)), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// isOpaque reports how the directory d marks itself: opaque (nothing below
// shows through) or holding xattr whiteouts (opaque value "x"). Both the
// trusted and the user namespace are honoured, and the AUFS marker file.
func (d *Dir) isOpaque() (opaque, xwhiteouts bool) {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		v, err := d.Getxattr("", prefix+"opaque")
		if err != nil {
			continue
		}
		o, x := opaqueValue(v)
		if o {
			return true, false
		}
		xwhiteouts = xwhiteouts || x
	}
	return d.hasEntry(OpaqueMarker), xwhiteouts
}

// isXattrWhiteout reports whether the zero-size regular file name in d is an
// xattr whiteout (Linux 6.7+: overlay.whiteout inside an "x" directory).
func (d *Dir) isXattrWhiteout(name string) bool {
	for _, prefix := range []string{TrustedPrefix, UserPrefix} {
		if _, err := d.Getxattr(name, prefix+"whiteout"); err == nil {
			return true
		}
	}
	return false
}

// SetxattrAt sets attribute attr of entry name (not "") in d, without
// following a symlink, with setxattrat(2) (Linux 6.13+): no path through
// /proc/self/fd to resolve. It reports ok false, having done nothing, on
// a kernel without the call or where the layer masks it (features.go);
// the caller then goes through /proc.
func (d *Dir) SetxattrAt(name, attr string, data []byte, flags int) (ok bool, err error) {
	args := xattrArgs{size: uint32(len(data)), flags: uint32(flags)}
	if len(data) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&data[0])))
	}
	ok, err = d.xattrAt(name, attr, func(fd int, p, a *byte) syscall.Errno {
		_, _, errno := unix.Syscall6(unix.SYS_SETXATTRAT, uintptr(fd), uintptr(unsafe.Pointer(p)),
			unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
		return errno
	})
	runtime.KeepAlive(data)
	return ok, err
}

// RemovexattrAt removes attribute attr of entry name (not "") in d, as
// SetxattrAt sets one (removexattrat(2)).
func (d *Dir) RemovexattrAt(name, attr string) (ok bool, err error) {
	return d.xattrAt(name, attr, func(fd int, p, a *byte) syscall.Errno {
		_, _, errno := unix.Syscall6(unix.SYS_REMOVEXATTRAT, uintptr(fd), uintptr(unsafe.Pointer(p)),
			unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(a)), 0, 0)
		return errno
	})
}

// xattrAt makes call, an *xattrat(2) system call, with d's fd and name and
// attr as C strings, and says ok false when the kernel has no such calls
// (remembered for the layer, as by the reads).
func (d *Dir) xattrAt(name, attr string, call func(fd int, p, a *byte) syscall.Errno) (ok bool, err error) {
	if !d.xattrAtAvailable() {
		d.Layer.Counters.Fallbacks.ran(XattrAt)
		return false, nil
	}
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return true, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return true, err
	}
	err = d.Do(func(fd int) error {
		if errno := call(fd, p, a); errno != 0 {
			return errno
		}
		return nil
	})
	if errors.Is(err, unix.ENOSYS) {
		d.Layer.Caches.noXattrAt.Store(true)
		d.Layer.Counters.Fallbacks.ran(XattrAt)
		return false, nil
	}
	return true, err
}
