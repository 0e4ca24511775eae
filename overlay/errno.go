package overlay

import (
	"errors"
	"io/fs"
	"log"
	"sync/atomic"
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
//     through the mount's logger and answered EIO, as the kernel answers
//     what it cannot make sense of on disk. go-fuse's own conversion would
//     answer ENOTSUP, which tells the caller to stop trying, and log to the
//     process's standard logger.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EPERM
	case errors.Is(err, fs.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, fs.ErrClosed):
		return syscall.EBADF
	}
	if l := errLog.Load(); l != nil {
		l.Printf("answered EIO: %v", err)
	} else {
		log.Printf("goverlay: answered EIO: %v", err)
	}
	return syscall.EIO
}

// errLog is the logger errno reports unknown errors to: that of the mount
// this process serves (Mount sets it, Close clears it). goverlay serves
// one mount per process; in a process with several (tests), the one
// mounted last gets them.
var errLog atomic.Pointer[log.Logger]
