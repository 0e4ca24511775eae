package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/pkg/xattr"
)

// TestErrnoPolicy pins the one error policy: an errno, however wrapped, is
// answered as it is; the io/fs sentinels get theirs; anything else is
// logged through the mount's logger and answered EIO (not go-fuse's
// ENOTSUP).
func TestErrnoPolicy(t *testing.T) {
	var buf bytes.Buffer
	f := &FS{log: log.New(&buf, "", 0)}

	unknown := errors.New("override \"x\": want UID:GID:MODE[:TYPE]")
	for _, c := range []struct {
		err    error
		want   syscall.Errno
		logged bool
	}{
		{nil, 0, false},
		{syscall.ENOENT, syscall.ENOENT, false},
		{fmt.Errorf("copy up %q: %w", "f", syscall.EXDEV), syscall.EXDEV, false},
		{&os.PathError{Op: "open", Path: "p", Err: syscall.EACCES}, syscall.EACCES, false},
		{&xattr.Error{Op: "xattr.get", Path: "p", Name: "user.x", Err: syscall.ENODATA}, syscall.ENODATA, false},
		{fmt.Errorf("ACL: %w", fmt.Errorf("tag: %w", syscall.EIO)), syscall.EIO, false},
		{fs.ErrNotExist, syscall.ENOENT, false},
		{fmt.Errorf("x: %w", fs.ErrExist), syscall.EEXIST, false},
		{fs.ErrPermission, syscall.EPERM, false},
		{fs.ErrInvalid, syscall.EINVAL, false},
		{fs.ErrClosed, syscall.EBADF, false},
		{unknown, syscall.EIO, true},
		{fmt.Errorf("stat: %w", unknown), syscall.EIO, true},
	} {
		buf.Reset()
		if got := f.errno(c.err); got != c.want {
			t.Errorf("errno(%v) = %v, want %v", c.err, got, c.want)
		}
		if logged := buf.Len() > 0; logged != c.logged {
			t.Errorf("errno(%v) logged %q, want logged=%v", c.err, buf.String(), c.logged)
		}
		if c.logged && !strings.Contains(buf.String(), c.err.Error()) {
			t.Errorf("errno(%v) logged %q, without the error", c.err, buf.String())
		}
	}
}

// TestErrnoLogsToItsMount: in a process that serves several mounts, an
// error without an errno is logged by the mount whose request met it, on
// that mount's logger alone, whichever was made last.
func TestErrnoLogsToItsMount(t *testing.T) {
	var bufs [2]bytes.Buffer
	var fss [2]*FS
	for i := range fss {
		f, err := New(Options{Lower: []string{t.TempDir()}, Logger: log.New(&bufs[i], "", 0)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.Close)
		fss[i] = f
	}
	if e := fss[0].errno(errors.New("no errno here")); e != syscall.EIO {
		t.Errorf("errno = %v, want EIO", e)
	}
	if !strings.Contains(bufs[0].String(), "no errno here") {
		t.Errorf("the first mount's logger got %q, want the unknown error", bufs[0].String())
	}
	if bufs[1].Len() != 0 {
		t.Errorf("the second mount's logger got %q, want nothing", bufs[1].String())
	}
}
