package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/goverlay/goverlay/overlay/rundir"
	"golang.org/x/sys/unix"
)

// Stats is what a live mount reports to `goverlay stats`. The JSON names
// are the labels of the text output, with underscores for spaces; keep
// cmd/goverlay/stats.go's descriptions in step.
type Stats struct {
	Mountpoint string `json:"mountpoint"`
	PID        int    `json:"pid"`
	// Lower and Upper are the mount's layers as given, lowers topmost
	// first (Upper is empty for a read-only mount).
	Lower []string `json:"lowerdir"`
	Upper string   `json:"upperdir,omitempty"`

	// NoSec is whether FUSE_HANDLE_KILLPRIV_V2 was negotiated, and why.
	NoSec       bool   `json:"nosec"`
	NoSecReason string `json:"nosec_reason"`

	// CapGetxattr counts GETXATTR(security.capability) requests served;
	// CapGetxattrCached those answered without asking the upper layer.
	CapGetxattr       uint64 `json:"capability_reads"`
	CapGetxattrCached uint64 `json:"capability_reads_cached"`
	// PrivChecks counts kill requests that looked at the file;
	// PrivSkipped those the per-inode NoSec fact answered.
	PrivChecks  uint64 `json:"privilege_checks"`
	PrivSkipped uint64 `json:"privilege_checks_skipped"`
	KilledSuid  uint64 `json:"removed_suid"`
	KilledSgid  uint64 `json:"removed_sgid"`
	KilledCaps  uint64 `json:"removed_capabilities"`

	CopyUps   uint64 `json:"copy_ups"`
	Whiteouts uint64 `json:"whiteouts"`
	// CopyRanges counts copy_file_range requests served by copying
	// between the layers' files (copyrange.go).
	CopyRanges uint64 `json:"copy_ranges"`
	// Writeback says the kernel's writeback cache is on, Passthrough that
	// the kernel registers backing files for this mount, IOReason why
	// (writeback.go).
	Writeback   bool   `json:"writeback_cache"`
	Passthrough bool   `json:"passthrough"`
	IOReason    string `json:"io_reason"`
	// ShareCache says files still in a lower layer open with
	// passthrough to the lower file (-o sharecache=on, passthrough.go):
	// asked for, and the kernel has not refused passthrough.
	ShareCache bool `json:"sharecache"`
	// NoOpen says regular files open without a request (noopen.go).
	NoOpen bool `json:"noopen"`
	// Transport says how requests reach goverlay: io_uring or /dev/fuse,
	// and why (fuseserve/uring.go); RingRequests counts those answered over
	// io_uring.
	Transport    string `json:"transport"`
	RingRequests uint64 `json:"requests_over_io_uring"`
	// FuseProtocol is the FUSE protocol version of the kernel's INIT, as
	// goverlay takes it (capped by a profile's, mask.go); KernelFeatures
	// the features of mask.go's table that the kernel has and the mask
	// leaves; Mask the -o mask= value, MaskedFeatures what it hides,
	// implied features included; Fallbacks how often each system call's
	// fallback ran, for the kernel's lack or the mask's.
	FuseProtocol   string            `json:"fuse_protocol"`
	KernelFeatures []string          `json:"kernel_features"`
	Mask           string            `json:"mask"`
	MaskedFeatures []string          `json:"masked_features"`
	Fallbacks      map[string]uint64 `json:"fallbacks"`
	// OpensPassthrough and OpensCached count file opens by the I/O mode
	// the kernel got: passthrough only where the reply carried a
	// registered backing file.
	OpensPassthrough uint64 `json:"opens_passthrough"`
	OpensCached      uint64 `json:"opens_through_goverlay"`

	// Lookups counts LOOKUPs that reached the daemon, NegativeLookups
	// those that found nothing (the kernel then caches the miss);
	// Getattrs counts attribute refreshes served.
	Lookups         uint64 `json:"lookups"`
	NegativeLookups uint64 `json:"lookups_not_found"`
	// Prefetches counts files whose data a LOOKUP started reading
	// during a read walk (prefetch.go).
	Prefetches uint64 `json:"reads_started_at_lookup"`
	Getattrs   uint64 `json:"attribute_requests"`
	// FastExecDirs and RestrictedDirs count directories instantiated by
	// their fast-exec bit: searchable by everyone (attributes trusted
	// for an hour) or not (for a second; overlay/fastexec.go).
	FastExecDirs   uint64 `json:"dirs_searchable_by_all"`
	RestrictedDirs uint64 `json:"dirs_search_restricted"`
	// LayerAnswers counts the names lookups settled in a read-only layer
	// from its cached directory listings, without a system call (absent,
	// or whited out); LayerProbes those they asked a layer for (fstatat),
	// the upper included; ListingsRead the directories read into
	// listings, and ListingEntries what the cached ones hold now (this
	// mount's caches).
	LayerAnswers   uint64 `json:"names_from_listings"`
	LayerProbes    uint64 `json:"names_asked_of_layers"`
	ListingsRead   uint64 `json:"listings_read"`
	ListingEntries int    `json:"listing_entries"`

	// InternalErrors counts requests whose handler failed a consistency
	// check of goverlay's or go-fuse's (a panic): each was answered EIO
	// and logged with its stack. With Options.Recover it counts too the
	// work outside a request abandoned so (guard.go). Anything but 0 is
	// a bug to report.
	InternalErrors uint64 `json:"internal_errors"`
}

// transport says how requests reach the mount (fuseserve), "" before it
// is mounted.
func (f *FS) transport() string {
	switch {
	case f.srv == nil:
		return ""
	case f.opts.NoUring:
		return "/dev/fuse (uring=0)"
	case f.opts.Mask.has(featUring):
		return "/dev/fuse (" + f.opts.Mask.because(featUring) + ")"
	}
	return f.srv.Transport()
}

// Stats reads the counters.
func (f *FS) Stats() Stats {
	p := &f.privs
	s := Stats{
		NoSec:             f.nosec,
		NoSecReason:       f.nosecWhy,
		CapGetxattr:       p.CapGetxattr.Load(),
		CapGetxattrCached: p.CapGetxattrCached.Load(),
		PrivChecks:        p.Checks.Load(),
		PrivSkipped:       p.Skipped.Load(),
		KilledSuid:        p.KilledSuid.Load(),
		KilledSgid:        p.KilledSgid.Load(),
		KilledCaps:        p.KilledCaps.Load(),
		Writeback:         f.io.writeback,
		Passthrough:       f.passthrough.Load(),
		IOReason:          f.io.why,
		ShareCache:        f.io.share && f.passthrough.Load(),
		NoOpen:            f.io.noOpen,
		Transport:         f.transport(),
		RingRequests:      f.srv.RingRequests(),
		CopyUps:           f.stats.copyUps.Load(),
		Whiteouts:         f.stats.whiteouts.Load(),
		CopyRanges:        f.stats.copyRanges.Load(),
		OpensPassthrough:  f.stats.opensPassthrough.Load(),
		OpensCached:       f.stats.opensCached.Load(),
		Lookups:           f.stats.lookups.Load(),
		NegativeLookups:   f.stats.negativeLookups.Load(),
		Prefetches:        f.stats.prefetches.Load(),
		Getattrs:          f.stats.getattrs.Load(),
		FastExecDirs:      f.stats.fastExecDirs.Load(),
		RestrictedDirs:    f.stats.restrictedDirs.Load(),
		ListingEntries:    f.caches.CachedListingEntries(),
		InternalErrors:    f.guard.panics.Load(),
	}
	s.FuseProtocol = f.protocolReport()
	s.KernelFeatures = f.featureReport()
	s.Mask, s.MaskedFeatures = f.opts.Mask.String(), f.opts.Mask.Names()
	s.Fallbacks = f.fallbackReport()
	for _, l := range f.layers {
		s.LayerAnswers += l.Counters.Answered.Load()
		s.LayerProbes += l.Counters.Asked.Load()
		s.ListingsRead += l.Counters.ListingsRead.Load()
	}
	return s
}

// The control socket.
//
// A live mount answers `goverlay stats` on a unix socket (unix(7)) named
// after its mountpoint, in a directory only root or the daemon's user may
// write (rundir.Dir): no other user can take the name first, or answer in
// the daemon's place. The daemon answers a peer whose SO_PEERCRED says
// uid 0 or its own uid, and closes others' connections unanswered. The
// client (ReadStats) takes an answer only from a peer of uid 0 or the
// mount's owner, whose JSON names that peer's pid and the mountpoint
// asked for.

// statsIOTimeout bounds each step of a conversation on the socket.
const statsIOTimeout = 5 * time.Second

// statsName is the socket's name in its directory: a hash of the resolved
// mountpoint, which fits sun_path whatever the path's length.
func statsName(mountpoint string) string {
	sum := sha256.Sum256([]byte(mountpoint))
	return hex.EncodeToString(sum[:16]) + ".sock"
}

// resolveMountpoint makes mountpoint absolute and resolves its symlinks,
// as far as it can: a FUSE mount refuses other users than its owner
// (without allow_other), root included, so for them only the directory
// it is in is resolved.
func resolveMountpoint(mountpoint string) string {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return mountpoint
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	if r, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(r, filepath.Base(abs))
	}
	return abs
}

// statsServer is a mount's socket.
type statsServer struct {
	l     *net.UnixListener
	dirfd int
	name  string
	// dev and ino identify the socket's file: a later daemon of the
	// same mountpoint may have put its own in its place (close).
	dev, ino uint64
}

// serveStats answers each connection of root or of this process's user
// with the counters as JSON. mountpoint is resolved (resolveMountpoint).
// It never waits: a stale socket of the same name, of a daemon dead or
// still exiting, is replaced.
func (f *FS) serveStats(mountpoint string, pid int) (*statsServer, error) {
	uid := os.Geteuid()
	dir := rundir.Own(uid)
	dirfd, err := rundir.Open(dir, uid, true)
	if err != nil {
		return nil, fmt.Errorf("no stats socket (goverlay stats will not answer for %s): %w", mountpoint, err)
	}
	s := &statsServer{dirfd: dirfd, name: statsName(mountpoint)}
	if err := s.listen(pid); err != nil {
		unix.Close(dirfd)
		return nil, fmt.Errorf("no stats socket (goverlay stats will not answer for %s): %s: %w", mountpoint, filepath.Join(dir.Path, s.name), err)
	}
	go func() {
		for {
			c, err := s.l.AcceptUnix()
			if err != nil {
				return
			}
			f.answerStats(c, uid, mountpoint, pid)
		}
	}()
	return s, nil
}

// answerStats answers one connection to the stats socket, and closes it.
// With Options.Recover a panic abandons this answer alone: the socket goes
// on answering.
func (f *FS) answerStats(c *net.UnixConn, uid int, mountpoint string, pid int) {
	defer f.guard.recovered("an answer on the stats socket")
	defer c.Close()
	if cred, err := PeerCred(c); err != nil || (cred.Uid != 0 && int(cred.Uid) != uid) {
		if f.opts.Debug {
			f.log.Printf("stats socket: closed a connection of %v without an answer (%v): only root and uid %d are answered", cred, err, uid)
		}
		return
	}
	st := f.Stats()
	st.Mountpoint, st.PID = mountpoint, pid
	st.Lower, st.Upper = f.opts.Lower, f.opts.Upper
	c.SetWriteDeadline(time.Now().Add(statsIOTimeout))
	json.NewEncoder(c).Encode(st)
}

// listen binds the socket under a name of its own and renames it over
// s.name (rename(2) replaces a stale socket in one step, and two daemons
// of one mountpoint never meet EADDRINUSE).
func (s *statsServer) listen(pid int) error {
	tmp := s.name + "." + strconv.Itoa(pid)
	// A daemon that died here, whose pid this one has now.
	unix.Unlinkat(s.dirfd, tmp, 0)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: rundir.Path(s.dirfd, tmp), Net: "unix"})
	if err != nil {
		return err
	}
	// close removes the file, if it is still this one.
	l.SetUnlinkOnClose(false)
	var st unix.Stat_t
	err = unix.Fchmodat(s.dirfd, tmp, 0o600, 0)
	if err == nil {
		err = unix.Fstatat(s.dirfd, tmp, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err == nil {
		err = unix.Renameat(s.dirfd, tmp, s.dirfd, s.name)
	}
	if err != nil {
		l.Close()
		unix.Unlinkat(s.dirfd, tmp, 0)
		return err
	}
	s.l, s.dev, s.ino = l, st.Dev, st.Ino
	return nil
}

// close stops answering and removes the socket's file, unless a later
// daemon of the same mountpoint replaced it.
func (s *statsServer) close() {
	s.l.Close()
	var st unix.Stat_t
	if unix.Fstatat(s.dirfd, s.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Dev == s.dev && st.Ino == s.ino {
		unix.Unlinkat(s.dirfd, s.name, 0)
	}
	unix.Close(s.dirfd)
}

// PeerCred is the SO_PEERCRED of c's peer: who connected, or who listens.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	cerr := rc.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return nil, cerr
	}
	return cred, err
}

// ErrStatsDenied is ReadStats's error for a caller neither root nor the
// mount's owner.
var ErrStatsDenied = errors.New("only root and the mount's owner may read its statistics")

// StatsRefusedError is ReadStats's error when what answered on the socket
// is not the daemon serving the mount.
type StatsRefusedError struct {
	Socket string
	Why    string
}

func (e *StatsRefusedError) Error() string {
	return "refused the answer on " + e.Socket + ": " + e.Why
}

// ResolveMountpoint is mountpoint as ReadStats and the daemon name it:
// absolute, its symlinks resolved.
func ResolveMountpoint(mountpoint string) string { return resolveMountpoint(mountpoint) }

// ReadStats asks the daemon serving mountpoint for its counters. owner is
// the mount's owner (the user_id of its FUSE connection): its daemon runs
// as root or as owner.
func ReadStats(mountpoint string, owner int) (Stats, error) {
	mnt := resolveMountpoint(mountpoint)
	if me := os.Geteuid(); me != 0 && me != owner {
		return Stats{}, fmt.Errorf("%w: it is uid %d's, and this is uid %d", ErrStatsDenied, owner, me)
	}
	// The first of the most telling errors: a refusal, then any but a
	// missing socket.
	var told error
	rank := func(err error) int {
		var r *StatsRefusedError
		switch {
		case errors.As(err, &r):
			return 2
		case errors.Is(err, unix.ENOENT):
			return 0
		}
		return 1
	}
	for _, d := range rundir.Of(owner) {
		s, err := readStatsIn(d, owner, mnt)
		if err == nil {
			return s, nil
		}
		if told == nil || rank(err) > rank(told) {
			told = err
		}
	}
	return Stats{}, told
}

// readStatsIn reads the counters from the socket of mnt in d, a
// directory of owner's.
func readStatsIn(d rundir.Dir, owner int, mnt string) (Stats, error) {
	var s Stats
	dirfd, err := rundir.Open(d, owner, false)
	if err != nil {
		return s, err
	}
	defer unix.Close(dirfd)
	name := statsName(mnt)
	shown := filepath.Join(d.Path, name)
	c, err := net.DialTimeout("unix", rundir.Path(dirfd, name), statsIOTimeout)
	if err != nil {
		// The errno alone: the address is the /proc/self/fd path.
		var errno unix.Errno
		if errors.As(err, &errno) {
			err = errno
		}
		return s, &os.PathError{Op: "connect", Path: shown, Err: err}
	}
	defer c.Close()
	cred, err := PeerCred(c.(*net.UnixConn))
	if err != nil {
		return s, fmt.Errorf("%s: SO_PEERCRED: %w", shown, err)
	}
	if cred.Uid != 0 && int(cred.Uid) != owner {
		return s, &StatsRefusedError{shown, fmt.Sprintf("the process answering (pid %d) runs as uid %d, neither root nor the mount's owner (uid %d)", cred.Pid, cred.Uid, owner)}
	}
	c.SetReadDeadline(time.Now().Add(statsIOTimeout))
	if err := json.NewDecoder(io.LimitReader(c, 1<<20)).Decode(&s); err != nil {
		return s, fmt.Errorf("read %s: %w", shown, err)
	}
	switch {
	case s.PID != int(cred.Pid):
		return Stats{}, &StatsRefusedError{shown, fmt.Sprintf("the answer names pid %d, but pid %d sent it", s.PID, cred.Pid)}
	case s.Mountpoint != mnt:
		return Stats{}, &StatsRefusedError{shown, fmt.Sprintf("the answer is for mountpoint %q, not %q", s.Mountpoint, mnt)}
	}
	return s, nil
}
