package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/goverlay/goverlay/lower"
)

// Stats is what a live mount reports to `goverlay stats`.
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
	CapGetxattr       uint64 `json:"getxattr_security_capability"`
	CapGetxattrCached uint64 `json:"getxattr_security_capability_cached"`
	// PrivChecks counts kill requests that looked at the file;
	// PrivSkipped those the per-inode NoSec fact answered.
	PrivChecks  uint64 `json:"priv_checks"`
	PrivSkipped uint64 `json:"priv_checks_skipped"`
	KilledSuid  uint64 `json:"killed_suid"`
	KilledSgid  uint64 `json:"killed_sgid"`
	KilledCaps  uint64 `json:"killed_caps"`

	CopyUps   uint64 `json:"copy_ups"`
	Whiteouts uint64 `json:"whiteouts"`
	// OpensPassthrough and OpensCached count file opens by the I/O mode
	// they were offered.
	OpensPassthrough uint64 `json:"opens_passthrough"`
	OpensCached      uint64 `json:"opens_cached"`

	// Lookups counts LOOKUPs that reached the daemon, NegativeLookups
	// those that found nothing (the kernel then caches the miss);
	// Getattrs counts attribute refreshes served.
	Lookups         uint64 `json:"lookups"`
	NegativeLookups uint64 `json:"negative_lookups"`
	Getattrs        uint64 `json:"getattrs"`
	// FastExecDirs and RestrictedDirs count directories instantiated by
	// their fast-exec bit.
	FastExecDirs   uint64 `json:"fast_exec_dirs"`
	RestrictedDirs uint64 `json:"restricted_dirs"`
	// LayerAnswers counts the names lookups settled in a read-only layer
	// from its cached directory listings, without a system call (absent,
	// or whited out); LayerProbes those they asked a layer for (fstatat),
	// the upper included; ListingsRead the directories read into
	// listings, and ListingEntries what the cached ones hold now (of all
	// the mounts in this process).
	LayerAnswers   uint64 `json:"layer_answers_cached"`
	LayerProbes    uint64 `json:"layer_probes"`
	ListingsRead   uint64 `json:"listings_read"`
	ListingEntries int    `json:"listing_entries"`
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
		CopyUps:           f.stats.copyUps.Load(),
		Whiteouts:         f.stats.whiteouts.Load(),
		OpensPassthrough:  f.stats.opensPassthrough.Load(),
		OpensCached:       f.stats.opensCached.Load(),
		Lookups:           f.stats.lookups.Load(),
		NegativeLookups:   f.stats.negativeLookups.Load(),
		Getattrs:          f.stats.getattrs.Load(),
		FastExecDirs:      f.stats.fastExecDirs.Load(),
		RestrictedDirs:    f.stats.restrictedDirs.Load(),
		ListingEntries:    lower.CachedListingEntries(),
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

// serveStats answers each connection with the counters as JSON.
func (f *FS) serveStats(mountpoint string, pid int) (net.Listener, error) {
	l, err := net.Listen("unix", statsAddr(mountpoint))
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
