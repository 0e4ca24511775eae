package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"syscall"
	"time"
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
	// NoOpen says regular files open without a request (noopen.go).
	NoOpen bool `json:"noopen"`
	// Transport says how requests reach goverlay: io_uring or /dev/fuse,
	// and why (uring.go); RingRequests counts those answered over
	// io_uring.
	Transport    string `json:"transport"`
	RingRequests uint64 `json:"requests_over_io_uring"`
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
	// and logged with its stack. Anything but 0 is a bug to report.
	InternalErrors uint64 `json:"internal_errors"`
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
		NoOpen:            f.io.noOpen,
		Transport:         f.transport,
		RingRequests:      f.uring.Served(),
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
		InternalErrors:    f.stats.panics.Load(),
	}
	if f.uring != nil {
		s.Transport = f.uring.Why()
	}
	for _, l := range f.layers {
		s.LayerAnswers += l.Counters.Answered.Load()
		s.LayerProbes += l.Counters.Asked.Load()
		s.ListingsRead += l.Counters.ListingsRead.Load()
	}
	return s
}

// statsAddr is the control socket of the mount at mountpoint: an abstract
// unix socket, so nothing appears in the mount or on disk, and nothing is
// left behind by a daemon that dies.
func statsAddr(mountpoint string) string {
	abs, err := filepath.Abs(mountpoint)
	if err == nil {
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			abs = r
		}
	}
	sum := sha256.Sum256([]byte(abs))
	return "@goverlay-stats-" + hex.EncodeToString(sum[:16])
}

// statsBindWait bounds how long serveStats waits for its address.
const statsBindWait = 2 * time.Second

// serveStats answers each connection with the counters as JSON.
func (f *FS) serveStats(mountpoint string, pid int) (net.Listener, error) {
	// The daemon of a mount just unmounted from the same mountpoint may
	// hold the address for a moment longer, until it exits.
	l, err := net.Listen("unix", statsAddr(mountpoint))
	for end := time.Now().Add(statsBindWait); errors.Is(err, syscall.EADDRINUSE) && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
		l, err = net.Listen("unix", statsAddr(mountpoint))
	}
	if err != nil {
		return nil, fmt.Errorf("stats socket: %w", err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s := f.Stats()
			s.Mountpoint, s.PID = mountpoint, pid
			s.Lower, s.Upper = f.opts.Lower, f.opts.Upper
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			json.NewEncoder(c).Encode(s)
			c.Close()
		}
	}()
	return l, nil
}

// ReadStats asks the daemon serving mountpoint for its counters.
func ReadStats(mountpoint string) (Stats, error) {
	var s Stats
	c, err := net.DialTimeout("unix", statsAddr(mountpoint), 5*time.Second)
	if err != nil {
		return s, fmt.Errorf("no goverlay mount at %s (%w)", mountpoint, err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := json.NewDecoder(c).Decode(&s); err != nil {
		return s, fmt.Errorf("read stats of %s: %w", mountpoint, err)
	}
	return s, nil
}
