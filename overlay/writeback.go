package overlay

// The write data path: which of the kernel's three ways of writing a FUSE
// file a mount uses.
//
//   - Passthrough (passthrough.go): the kernel writes the upper file itself.
//     Granted only to a daemon with CAP_SYS_ADMIN in the initial user
//     namespace (fuse_backing_open()), so never rootless.
//   - The writeback cache (FUSE_WRITEBACK_CACHE): write(2) fills the FUSE
//     inode's page cache and returns; the kernel writes dirty pages back
//     later in large WRITE requests flagged FUSE_WRITE_CACHE, and at every
//     close(2) (fuse_flush() writes the inode back even with
//     FOPEN_NOFLUSH) and fsync(2). The kernel excludes it from passthrough
//     (process_init_reply()).
//   - Write-through: every write(2) is a WRITE request.
//
// With writeback, what the daemon must do differently:
//
//   - Size and times: the kernel keeps i_size, mtime and ctime of a regular
//     file itself and ignores those of attribute replies
//     (fuse_get_cache_mask()); it sends mtime in a SETATTR once the data is
//     written back (fuse_flush_times()), which Setattr applies like any
//     other. Nothing here may cache a size or mtime of its own.
//   - Privileges: written-back pages come from the flusher, with no kill
//     flag and the daemon's credentials. With FUSE_HANDLE_KILLPRIV_V2 the
//     kernel writes through, with FUSE_WRITE_KILL_SUIDGID, instead of
//     caching when the writer lacks CAP_FSETID and the file is set-id
//     (fuse_cache_write_iter()), and before that its file_remove_privs()
//     sends the empty SETATTR that Setattr takes as the request to strip
//     (killPrivsNow), and REMOVEXATTR for a capability; so privileges are
//     removed for the writer before any page is cached. A page of a shared
//     mapping with a capability is stored through a mapping (mmapWrite),
//     which the kernel overlay does not strip either.
//   - Reads: the kernel reads the rest of a partly written page through any
//     handle, write-only ones included: upper files are always opened
//     read-write (backingFlags). O_APPEND is the kernel's: it computes the
//     offset from its own i_size.
//   - Crash safety: a write(2) that returned lives in the kernel's page
//     cache of the FUSE mount, not yet in the upper layer's, until it is
//     written back (at the latest at close(2) or fsync(2)); if the daemon
//     dies first, those pages are lost, where with write-through or
//     passthrough they were already the upper filesystem's. fsync(2) is
//     unchanged: the kernel writes the pages back and then sends FSYNC,
//     which syncs the upper file. fsync=0 only skips goverlay's own syncs
//     of copy-ups.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay/rundir"
)

// WritebackMode is the -o writeback= setting.
type WritebackMode int

const (
	// WritebackAuto uses the writeback cache where passthrough is not
	// used (noopen=1, rootless, passthrough=off, kernels without it).
	WritebackAuto WritebackMode = iota
	// WritebackOn uses it always (no passthrough then).
	WritebackOn
	// WritebackOff never uses it.
	WritebackOff
)

func (m WritebackMode) String() string { return [...]string{"auto", "1", "0"}[m] }

// ioMode is what a mount asks the kernel for.
type ioMode struct {
	// noOpen: regular files open without a request (noopen.go).
	noOpen                 bool
	passthrough, writeback bool
	// share: lower files open with passthrough to the lower file
	// (-o sharecache=on, passthrough.go).
	share bool
	why   string
}

// decideIO settles the write data path of a mount from its options and
// what the kernel will grant this process. What the mask hides (mask.go)
// is off whatever the options say, and the reason says so.
func decideIO(o Options, readOnly bool) ioMode {
	wbOff, ptOff := "writeback=0", "passthrough=off"
	if o.Mask.has(featNoOpen) {
		// The kernel would take an OPEN answered ENOSYS for a
		// failed open (fuse_file_open() before FUSE_NO_OPEN_SUPPORT).
		o.OpenRequests = true
	}
	if o.Mask.has(featWritebackCache) {
		o.Writeback, wbOff = WritebackOff, o.Mask.because(featWritebackCache)
	}
	if o.Mask.has(featPassthrough) {
		o.Passthrough, ptOff = false, o.Mask.because(featPassthrough)
	}
	m := decideIOAs(o, readOnly, wbOff, ptOff)
	if o.ShareCache {
		m = decideShare(o, m, readOnly)
	}
	if o.Mask.has(featNoOpen) && !readOnly {
		m.why = o.Mask.because(featNoOpen) + ": every open is a request; " + m.why
	}
	return m
}

// decideIOAs is decideIO with the words that say why the writeback cache
// and passthrough are off.
func decideIOAs(o Options, readOnly bool, wbOff, ptOff string) ioMode {
	switch {
	case readOnly:
		// Nothing is written, and passthrough serves only upper
		// files.
		return ioMode{noOpen: !o.OpenRequests, why: "read-only mount"}
	case !o.OpenRequests && o.Writeback == WritebackOff:
		return ioMode{noOpen: true, why: "noopen=1 (no passthrough: it is set up at an OPEN), " + wbOff}
	case !o.OpenRequests:
		return ioMode{noOpen: true, writeback: true, why: "noopen=1: no passthrough, which is set up at an OPEN"}
	case o.Writeback == WritebackOn:
		return ioMode{writeback: true, why: "writeback=1"}
	case o.Writeback == WritebackOff && !o.Passthrough:
		return ioMode{why: wbOff + ", " + ptOff}
	case o.Writeback == WritebackOff:
		if ok, why := passthroughGrantable(); !ok {
			return ioMode{why: wbOff + "; passthrough will not be granted: " + why}
		}
		return ioMode{passthrough: true, why: wbOff}
	case !o.Passthrough:
		return ioMode{writeback: true, why: ptOff}
	}
	if ok, why := passthroughGrantable(); !ok {
		return ioMode{writeback: true, why: "passthrough will not be granted: " + why}
	}
	return ioMode{passthrough: true, why: "the default where the kernel grants it"}
}

// decideShare settles -o sharecache=on, which needs every open to be a
// request and the kernel to grant passthrough, without the writeback
// cache (fuse_backing_open(), process_init_reply()); where it cannot be
// had, the mount is as m, and the reason says why (passthrough.go).
func decideShare(o Options, m ioMode, readOnly bool) ioMode {
	var why string
	switch {
	case !o.OpenRequests:
		why = "noopen=1"
	case !o.Passthrough:
		why = "passthrough is off"
	case o.Writeback == WritebackOn:
		why = "writeback=1"
	default:
		var ok bool
		if ok, why = passthroughGrantable(); ok {
			m.passthrough, m.writeback, m.share = true, false, true
			if readOnly {
				m.why = "read-only mount"
			}
			m.why += ", sharecache=on: lower files open with passthrough"
			return m
		}
	}
	m.why += "; sharecache=on has no effect: " + why
	return m
}

// passthroughGrantable reports whether the kernel would register backing
// files for this process: Linux 6.9 or later, and CAP_SYS_ADMIN in the
// initial user namespace (fuse_backing_open()). A kernel built without
// CONFIG_FUSE_PASSTHROUGH still refuses; the mount then reports that no
// open got passthrough (Stats.OpensPassthrough).
func passthroughGrantable() (bool, string) {
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		if maj, min, ok := kernelVersion(unix.ByteSliceToString(u.Release[:])); ok && olderThan(maj, min, [2]int{6, 9}) {
			return false, fmt.Sprintf("Linux %d.%d has no FUSE passthrough (6.9+)", maj, min)
		}
	}
	if !rundir.InInitialUserNS() {
		return false, "not in the initial user namespace"
	}
	if !hasCapSysAdmin() {
		return false, "no CAP_SYS_ADMIN"
	}
	return true, ""
}

// hasCapSysAdmin reads CAP_SYS_ADMIN from the effective set.
func hasCapSysAdmin() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("CapEff:")); ok {
			caps, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_ADMIN) != 0
		}
	}
	return false
}

// granted settles, once mounted, what the kernel granted: the writeback
// cache is on when its INIT offered it too; passthrough when it registers
// a backing file, which a probe on a temporary file of the workdir tries
// (the kernel refuses without CAP_SYS_ADMIN in the initial user namespace,
// or without CONFIG_FUSE_PASSTHROUGH). Opens then do not ask in vain.
func (f *FS) granted(srv *fuse.Server) {
	if k := f.kernelInit(srv); k != nil && !f.opts.NoACL && k.Flags64()&fuse.CAP_POSIX_ACL != 0 {
		f.kernelACLs.Store(true)
	}
	if f.io.passthrough {
		if err := probePassthrough(srv, f.opts.Work); err != nil && !errors.Is(err, errNoProbe) {
			f.io.passthrough = false
			f.passthrough.Store(false)
			f.io.why += "; but the kernel refused a backing file (" + err.Error() + "): writes go through goverlay; writeback=1 would cache them"
		}
	}
	if !f.io.writeback {
		return
	}
	if k := f.kernelInit(srv); k == nil || k.Flags64()&fuse.CAP_WRITEBACK_CACHE == 0 {
		f.io.writeback = false
		f.io.why += "; the kernel did not offer the writeback cache"
		f.writeback.Store(false)
	}
}

// keepMtime runs op, a change of fd's data the kernel asked for, and with
// the writeback cache puts the upper file's mtime back as it was: the
// kernel keeps a regular file's mtime itself and never takes it from an
// attribute reply (fuse_get_cache_mask()), so a time the upper filesystem
// gave the file would show only after a remount. The kernel sends its own
// in a SETATTR (fuse_flush_times()), possibly before the WRITE of the
// pages it wrote (the daemon serves requests in parallel); timesMu keeps
// that SETATTR from falling between the fstat and the futimens here.
func (n *node) keepMtime(fd int, op func() error) error {
	if !n.ofs.writeback.Load() {
		return op()
	}
	return n.keepMtimeStat(fd, func(*unix.Stat_t) error { return op() })
}

// keepMtimeStat is keepMtime for an op that needs fd's stat from before
// it, which it is given (with or without the writeback cache).
func (n *node) keepMtimeStat(fd int, op func(st *unix.Stat_t) error) error {
	var st unix.Stat_t
	if !n.ofs.writeback.Load() {
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		return op(&st)
	}
	defer n.timesLock()()
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	err := op(&st)
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, st.Mtim}
	if terr := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err == nil && terr != nil {
		err = terr
	}
	return err
}

// errNoProbe: the workdir cannot make a temporary file to probe with.
var errNoProbe = errors.New("no temporary file to probe with")

// probePassthrough registers a temporary file of dir as a backing file and
// unregisters it.
func probePassthrough(srv *fuse.Server, dir string) error {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		// Without one, opens still ask, and the stats say what
		// they got.
		return errNoProbe
	}
	defer unix.Close(fd)
	id, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	if errno != 0 {
		return errno
	}
	srv.UnregisterBackingFd(id)
	return nil
}

// ioSummary is the mount's write data path, for the log.
func (f *FS) ioSummary() string {
	switch {
	case f.io.writeback:
		return "writes: writeback cache (" + f.io.why + ")"
	case f.io.passthrough:
		return "writes: passthrough, granted by the kernel (" + f.io.why + ")"
	}
	return "writes: through goverlay (" + f.io.why + ")"
}
