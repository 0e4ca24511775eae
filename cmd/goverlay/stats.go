package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/goverlay/goverlay/overlay"
)

// runStats is `goverlay stats [--json] MOUNTPOINT`: the counters of a live
// mount, read from its control socket without touching the mount itself.
func runStats(args []string, stdout, stderr io.Writer) int {
	asJSON := false
	var mnt string
	for _, a := range args {
		switch {
		case a == "--json" || a == "-json":
			asJSON = true
		case a == "-h" || a == "--help":
			fmt.Fprintln(stdout, "usage: goverlay stats [--json] MOUNTPOINT")
			return exitOK
		case mnt == "":
			mnt = a
		default:
			fmt.Fprintf(stderr, "goverlay: stats takes one mountpoint; usage: goverlay stats [--json] MOUNTPOINT\n")
			return exitUsage
		}
	}
	if mnt == "" {
		fmt.Fprintf(stderr, "goverlay: stats needs a mountpoint; usage: goverlay stats [--json] MOUNTPOINT\n")
		return exitUsage
	}
	m, why := goverlayMountAt(mnt)
	if why != "" {
		fmt.Fprintf(stderr, "goverlay: %s\n", why)
		return exitBadLayer
	}
	s, err := overlay.ReadStats(mnt, m.owner())
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: %s\n", whyNoStats(mnt, m.owner(), err))
		return exitBadLayer
	}
	if asJSON {
		e := json.NewEncoder(stdout)
		e.SetIndent("", "  ")
		e.Encode(s)
		return exitOK
	}
	writeStats(stdout, s)
	return exitOK
}

// statsRow is one line of the text output: the JSON name with spaces for
// underscores, the value, and what it counts.
type statsRow struct {
	key, value, desc string
}

// statsRows lays s out for the text output, one row per JSON field, in
// the JSON's order. TestStatsTextMatchesJSON keeps the two in step.
func statsRows(s overlay.Stats) []statsRow {
	n := func(v uint64) string { return strconv.FormatUint(v, 10) }
	onOff := map[bool]string{true: "on", false: "off"}
	layers := []statsRow{{"lowerdir", strings.Join(s.Lower, ":"), "the lower layers, topmost first"}}
	if s.Upper != "" { // omitted from the JSON of a read-only mount
		layers = append(layers, statsRow{"upperdir", s.Upper, ""})
	}
	return append(append([]statsRow{
		{"mountpoint", s.Mountpoint, ""},
		{"pid", strconv.Itoa(s.PID), "the goverlay process serving it"},
	}, layers...), []statsRow{
		{"nosec", onOff[s.NoSec], "whether the kernel skips the security.capability check before each write"},
		{"nosec_reason", s.NoSecReason, ""},
		{"capability_reads", n(s.CapGetxattr), "GETXATTR(security.capability) requests served"},
		{"capability_reads_cached", n(s.CapGetxattrCached), "of them answered from memory, without reading the upper layer"},
		{"privilege_checks", n(s.PrivChecks), "writes, truncates and chowns after which goverlay looked for setuid, setgid and capabilities to remove"},
		{"privilege_checks_skipped", n(s.PrivSkipped), "those it skipped: the file was known to carry none"},
		{"removed_suid", n(s.KilledSuid), "setuid bits removed"},
		{"removed_sgid", n(s.KilledSgid), "setgid bits removed"},
		{"removed_capabilities", n(s.KilledCaps), "security.capability xattrs removed"},
		{"copy_ups", n(s.CopyUps), "files and directories copied from a lower layer to the upper one"},
		{"whiteouts", n(s.Whiteouts), "deletions of lower names recorded in the upper layer"},
		{"copy_ranges", n(s.CopyRanges), "copy_file_range requests served by copying between the layers' files, not through the page cache"},
		{"writeback_cache", onOff[s.Writeback], "whether the kernel caches writes in its page cache and writes them back later (writeback=)"},
		{"passthrough", onOff[s.Passthrough], "whether the kernel registers backing files for this mount (FUSE passthrough, passthrough=)"},
		{"io_reason", s.IOReason, "why writes take the path they take"},
		{"sharecache", onOff[s.ShareCache], "whether files still in a lower layer open with passthrough to the lower file, so that mounts of one image share their pages (sharecache=)"},
		{"noopen", onOff[s.NoOpen], "whether the kernel opens regular files without asking goverlay (noopen=): then opens are not counted below"},
		{"transport", s.Transport, "how requests reach goverlay: io_uring, one queue per CPU (uring=, when the kernel offers it), or /dev/fuse"},
		{"requests_over_io_uring", n(s.RingRequests), "requests answered over io_uring"},
		{"fuse_protocol", s.FuseProtocol, "the FUSE protocol version of the kernel's INIT, as goverlay takes it (a mask= profile caps it at its release's)"},
		{"kernel_features", list(s.KernelFeatures), "the kernel features goverlay uses where they are there (man page: KERNEL FEATURES) that this kernel has and the mask leaves"},
		{"mask", orNone(s.Mask), "the mask= option: features to behave as if the kernel lacked, a diagnostic"},
		{"masked_features", list(s.MaskedFeatures), "the features the mask hides: goverlay neither asks the kernel for them nor uses them, and runs its fallbacks"},
		{"fallbacks", counts(s.Fallbacks), "how often goverlay's fallback for a system call ran, because the kernel lacks the call or the mask hides it"},
		{"opens_passthrough", n(s.OpensPassthrough), "file opens the kernel reads and writes directly (FUSE passthrough)"},
		{"opens_through_goverlay", n(s.OpensCached), "file opens whose reads and writes go through goverlay"},
		{"lookups", n(s.Lookups), "name lookups the kernel asked goverlay for"},
		{"lookups_not_found", n(s.NegativeLookups), "of them for a name that does not exist (the kernel then remembers that)"},
		{"reads_started_at_lookup", n(s.Prefetches), "files whose data a lookup started reading, while files were read one after the other"},
		{"attribute_requests", n(s.Getattrs), "stat requests the kernel could not answer from its cache"},
		{"dirs_searchable_by_all", n(s.FastExecDirs), "directories anyone may search: the kernel keeps their attributes for an hour"},
		{"dirs_search_restricted", n(s.RestrictedDirs), "directories some users may not search: their attributes are checked again after a second"},
		{"names_from_listings", n(s.LayerAnswers), "names a lookup found or ruled out in a lower layer's cached directory listing"},
		{"names_asked_of_layers", n(s.LayerProbes), "names a lookup asked a layer's filesystem for"},
		{"listings_read", n(s.ListingsRead), "lower directories read into the listing cache"},
		{"listing_entries", strconv.Itoa(s.ListingEntries), "entries the listing cache holds now"},
		{"internal_errors", n(s.InternalErrors), "requests answered EIO, and in a shared server work outside a request abandoned, because a consistency check failed or the code panicked (logged with a stack): a bug to report"},
	}...)
}

// list is names as a row's value.
func list(names []string) string { return orNone(strings.Join(names, " ")) }

// orNone is v, or "none" for "".
func orNone(v string) string {
	if v == "" {
		return "none"
	}
	return v
}

// counts is a name-to-count map as a row's value, in the names' order.
func counts(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+" "+strconv.FormatUint(m[k], 10))
	}
	return orNone(strings.Join(parts, ", "))
}

// writeStats prints s as text.
func writeStats(w io.Writer, s overlay.Stats) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, r := range statsRows(s) {
		// Two cells, so that every row's value starts in one column;
		// the description follows the value.
		line := strings.ReplaceAll(r.key, "_", " ") + "\t" + r.value
		if r.desc != "" {
			line += "   (" + r.desc + ")"
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

// goverlayMountAt returns the goverlay mount on mnt, or says in words why
// there is none: mnt does not exist, is not a mount point, or is another
// filesystem.
func goverlayMountAt(mnt string) (mountEntry, string) {
	_, serr := os.Stat(mnt)
	switch {
	case os.IsNotExist(serr):
		return mountEntry{}, fmt.Sprintf("%s does not exist; give the mountpoint of a goverlay mount", show(mnt))
	case serr != nil && !os.IsPermission(serr):
		// A dead FUSE mount (ENOTCONN) lands here. A live one
		// refuses users other than its owner without allow_other,
		// root included: the mount table says what it is.
		return mountEntry{}, fmt.Sprintf("cannot look at %s (%v); is it a goverlay mount whose daemon died? unmount it with umount -l %s", show(mnt), oneLineError{serr}, shellQuote(mnt))
	}
	m, mounted := topMountAt(overlay.ResolveMountpoint(mnt))
	switch {
	case !mounted:
		return m, fmt.Sprintf("%s is not a mount point; give the directory a goverlay mount is mounted on (see findmnt -t fuse.goverlay)", show(mnt))
	case m.fsType != "fuse.goverlay":
		return m, fmt.Sprintf("%s is not a goverlay mount (its filesystem is %s); see findmnt -t fuse.goverlay for goverlay mounts", show(mnt), m.fsType)
	}
	return m, ""
}

// whyNoStats says, in words, why the counters of mnt, a goverlay mount of
// owner's, could not be read: the caller may not read them, what answered
// is not the mount's daemon, or the daemon did not answer.
func whyNoStats(mnt string, owner int, err error) string {
	var refused *overlay.StatsRefusedError
	switch {
	case errors.Is(err, overlay.ErrStatsDenied):
		return fmt.Sprintf("cannot read the statistics of %s: only root and the mount's owner (uid %d) may; run goverlay stats as one of them", show(mnt), owner)
	case errors.As(err, &refused):
		return fmt.Sprintf("not showing the statistics of %s: what answered on its control socket %s is not the goverlay daemon serving it: %s", show(mnt), refused.Socket, refused.Why)
	}
	return fmt.Sprintf("the goverlay daemon serving %s does not answer (%v); it may run in another mount namespace, have no control socket (its log says why), or be too old to report statistics", show(mnt), oneLineError{err})
}

// topMountAt returns the mount whose mount point is path (the topmost
// one, when several are stacked), from /proc/self/mountinfo (proc(5)).
func topMountAt(path string) (m mountEntry, mounted bool) {
	mounts, _ := readMountinfo("/proc/self/mountinfo")
	return topMountIn(mounts, path)
}

// topMountIn is topMountAt in the mount table mounts.
func topMountIn(mounts []mountEntry, path string) (m mountEntry, mounted bool) {
	for _, e := range mounts {
		if e.mountpoint == path {
			m, mounted = e, true
		}
	}
	return m, mounted
}
