package main

import (
	"errors"
	"fmt"
	"strings"
)

// Exit codes are part of goverlay's interface: scripts, containers/storage
// and the test harness tell a typo from a broken layer from a host without
// FUSE by them. fuse-overlayfs exits 1 for every failure; we keep 1 for the
// command line and spell out the rest, so "exit status 1" still means "your
// arguments are wrong" to anyone used to fuse-overlayfs.
//
//	code  constant      meaning
//	0     exitOK        mounted (in the background: the mount is live), or
//	                    served until a clean unmount, SIGINT, SIGTERM or SIGHUP
//	1     exitUsage     bad flags or option string, or a required option is
//	                    missing; nothing was looked at or mounted
//	2     exitBadLayer  a layer or the mountpoint is missing, of the wrong
//	                    type, nested, overlapping, duplicated, not writable
//	                    or in use by another mount
//	3     exitFuse      /dev/fuse is missing or cannot be opened, or the
//	                    kernel is older than Linux 5.11 (overlay.MinKernel)
//	4     exitMount     the layers could not be opened or the kernel (or
//	                    fusermount3) refused the mount
//	5     exitDaemon    the background process could not be started or died
//	                    before the mount was live, or --pidfile / --log could
//	                    not be written
const (
	exitOK       = 0
	exitUsage    = 1
	exitBadLayer = 2
	exitFuse     = 3
	exitMount    = 4
	exitDaemon   = 5
)

// exitCodes is the table above in a form --help can print, so the help text
// and the constants cannot drift apart.
var exitCodes = []struct {
	Code int
	Desc string
}{
	{exitOK, "mounted (in the background: the mount is live), or served until a clean unmount or SIGINT/SIGTERM/SIGHUP"},
	{exitUsage, "bad flags or option string, or a required option missing; nothing was mounted"},
	{exitBadLayer, "a layer or the mountpoint is missing, not a directory, nested, overlapping, duplicated, not writable or in use by another mount"},
	{exitFuse, "/dev/fuse is missing or cannot be opened, or the kernel is older than Linux 5.11"},
	{exitMount, "the layers could not be opened or the mount was refused"},
	{exitDaemon, "the background process failed to start or died before the mount was live, or --pidfile/--log could not be written"},
}

// exitError carries the exit code together with the one-line message the
// user sees. The message names the problem and the fix; main prefixes it
// with "goverlay: ".
type exitError struct {
	code int
	msg  string
	err  error // the underlying cause, for errors.Is/As; may be nil
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) Unwrap() error { return e.err }

// failf builds an exitError. A %w verb in format is honoured, so the cause
// stays reachable with errors.Is.
func failf(code int, format string, a ...any) error {
	for i, v := range a {
		if e, ok := v.(error); ok {
			a[i] = oneLineError{e}
		}
	}
	err := fmt.Errorf(format, a...)
	return &exitError{code: code, msg: oneLine(err.Error()), err: errors.Unwrap(err)}
}

// exitCodeOf maps an error to the process exit code. Errors that are not
// exitErrors come from mounting, the last step, hence exitMount.
func exitCodeOf(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitMount
}

// oneLineError shows a cause on one line and without trailing blanks (go-fuse's
// "fusermount exited with code 256\n") while keeping it reachable by
// errors.Is.
type oneLineError struct{ err error }

func (e oneLineError) Error() string { return oneLine(e.err.Error()) }
func (e oneLineError) Unwrap() error { return e.err }

// oneLine folds a message onto one line: causes from go-fuse or fusermount3
// may carry newlines, and callers such as containers/storage show our
// stderr as a single line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
