package overlay

import (
	"errors"
	"io/fs"
	"syscall"
)

// errno is the one place where an error becomes the errno a request is
// answered with; every error that leaves the daemon goes through it.
//
//   - An error that is, or wraps, an errno (a failed system call, with or
//     without context added by fmt.Errorf's %w, *os.PathError,
//     *xattr.Error) is answered with that errno.
//   - The io/fs sentinels (fs.ErrNotExist, ...) get the errno they stand
//     for.
//   - Anything else is a fault of goverlay or of a layer's content that no
//     errno describes (a malformed override xattr, say): it is logged
//     through the mount's own logger and answered EIO, as the kernel
//     answers what it cannot make sense of on disk. go-fuse's own
//     conversion would answer ENOTSUP, which tells the caller to stop
//     trying, and log to the process's standard logger: in a process that
//     serves several mounts, nobody could tell which mount's layers hold
//     the fault.
func (f *FS) errno(err error) syscall.Errno {
	e, known := errnoOf(err)
	if !known {
		f.log.Printf("answered EIO: %v", err)
	}
	return e
}

// errnoOf is the errno err stands for, and false for an error that
// carries none (answered EIO).
func errnoOf(err error) (syscall.Errno, bool) {
	if err == nil {
		return 0, true
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e, true
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT, true
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST, true
	case errors.Is(err, fs.ErrPermission):
		return syscall.EPERM, true
	case errors.Is(err, fs.ErrInvalid):
		return syscall.EINVAL, true
	case errors.Is(err, fs.ErrClosed):
		return syscall.EBADF, true
	}
	return syscall.EIO, false
}
