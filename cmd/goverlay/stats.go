package main

import (
	"encoding/json"
	"fmt"
	"io"
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
	s, err := overlay.ReadStats(mnt)
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: %v; is a goverlay daemon serving it?\n", err)
		return exitBadLayer
	}
	if asJSON {
		e := json.NewEncoder(stdout)
		e.SetIndent("", "  ")
		e.Encode(s)
		return exitOK
	}
	on := map[bool]string{true: "on", false: "off"}
	w := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(w, "mountpoint\t%s (pid %d)\n", s.Mountpoint, s.PID)
	fmt.Fprintf(w, "NOSEC\t%s: %s\n", on[s.NoSec], s.NoSecReason)
	fmt.Fprintf(w, "GETXATTR(security.capability)\t%d served, %d from the cache\n", s.CapGetxattr, s.CapGetxattrCached)
	fmt.Fprintf(w, "privilege checks\t%d executed, %d skipped (file known clean)\n", s.PrivChecks, s.PrivSkipped)
	fmt.Fprintf(w, "privileges removed\tsuid %d, sgid %d, security.capability %d\n", s.KilledSuid, s.KilledSgid, s.KilledCaps)
	fmt.Fprintf(w, "copy-ups\t%d\n", s.CopyUps)
	fmt.Fprintf(w, "whiteouts\t%d\n", s.Whiteouts)
	io := "through goverlay"
	switch {
	case s.Writeback:
		io = "writeback cache"
	case s.Passthrough:
		io = "passthrough, granted by the kernel"
	}
	fmt.Fprintf(w, "writes\t%s (%s)\n", io, s.IOReason)
	fmt.Fprintf(w, "opens\t%d passthrough (granted), %d through the page cache or goverlay\n", s.OpensPassthrough, s.OpensCached)
	fmt.Fprintf(w, "lookups served\t%d, %d of them misses\n", s.Lookups, s.NegativeLookups)
	fmt.Fprintf(w, "names settled in a layer\t%d from cached listings, %d asked of the layer\n", s.LayerAnswers, s.LayerProbes)
	fmt.Fprintf(w, "directory listings\t%d read, %d entries cached\n", s.ListingsRead, s.ListingEntries)
	fmt.Fprintf(w, "attribute refreshes served\t%d\n", s.Getattrs)
	fmt.Fprintf(w, "directories\t%d fast-exec, %d restricted\n", s.FastExecDirs, s.RestrictedDirs)
	w.Flush()
	return exitOK
}
