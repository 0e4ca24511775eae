package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
)

// version is set at build time by the Makefile, from git describe:
//
//	go build -ldflags "-X main.version=1.2.3" ./cmd/goverlay
//
// Left empty, goverlayVersion falls back on the module build information.
var version = ""

// goverlayVersion says what was built: the version given at link time;
// else the module version the go command recorded ("go install ...@v1.2.3",
// or the pseudo-version v0.0.0-TIME-REVISION it derives from git in a
// checkout); else the VCS revision (with "-dirty" for uncommitted changes);
// else a note that the build carries no version.
func goverlayVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (built without module information)"
	}
	return versionFromBuildInfo(bi)
}

func versionFromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	rev := settings["vcs.revision"]
	if rev == "" {
		return "unknown (built without VCS information; build with make)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	v := "devel-" + rev
	if settings["vcs.modified"] == "true" {
		v += "-dirty"
	}
	if t := settings["vcs.time"]; t != "" {
		v += " (" + t + ")"
	}
	return v
}

const goFuseModule = "github.com/hanwen/go-fuse/v2"

// goFuseVersion reads the go-fuse version from the build information, so
// that bug reports say which FUSE library served the mount.
func goFuseVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == goFuseModule {
			if d.Replace != nil {
				return d.Replace.Version + " (replaced)"
			}
			return d.Version
		}
	}
	return "unknown"
}

// printVersion mirrors fuse-overlayfs -V: our version, then the FUSE
// library's.
func printVersion(w io.Writer) {
	fmt.Fprintf(w, "goverlay %s\n", goverlayVersion())
	fmt.Fprintf(w, "go-fuse %s\n", goFuseVersion())
	fmt.Fprintf(w, "%s\n", runtime.Version())
}

const helpHeader = `usage: ` + usageLine + `
       goverlay SOURCE MOUNTPOINT -o OPTS     (mount helper: mount -t fuse.goverlay)
       goverlay stats [--json] MOUNTPOINT     (counters of a live mount)
       goverlay bench [FLAGS]                 (compare with the kernel overlay and fuse-overlayfs; bench --help)

goverlay mounts a union of directories, like kernel overlayfs and
fuse-overlayfs: the lower layers are read-only, changes go to upperdir.
By default it returns once the mount is live and keeps serving in the
background; "umount MOUNTPOINT" or "fusermount3 -u MOUNTPOINT" ends it.

Flags:
  -o OPTS           mount options, comma separated; may be repeated, -oOPTS works too
  -f                stay in the foreground; errors and logs go to stderr
  -d, --debug       log every FUSE request; implies -f unless --log is given
  -s                accepted for compatibility (libfuse's single-threaded mode); no effect
  --pidfile FILE    write the serving process's PID to FILE once the mount is live;
                    removed when it exits
  --log FILE        append warnings and, with -d, the request log to FILE
                    (a background process has no stderr)
  -h, --help        show this help
  -V, --version     show the versions of goverlay and go-fuse
  --options-markdown  print the option table below as Markdown (for the README)

Option syntax: KEY or KEY=VALUE, separated by commas. Empty options (",,")
are skipped. A backslash escapes the next character ("\," is a comma inside
a value, "\:" a colon inside a lowerdir path); double quotes protect a whole
value (context="a:b,c"). Relative paths are taken from the working
directory. A key given twice keeps its last value. Unknown keys are ignored
with a warning, as fuse-overlayfs does, except a key one or two letters away
from a known one ("uppperdir"): that is refused as a typo.
`

// printHelp prints the usage, every option of optionTable with its status,
// and the exit codes.
func printHelp(w io.Writer) {
	io.WriteString(w, helpHeader)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	groups := []struct {
		status optStatus
		title  string
	}{
		{optSupported, "Options"},
		{optKernel, "Mount flags (passed to the kernel)"},
		{optIgnored, "Accepted and ignored"},
		{optNotYet, "Not implemented yet (accepted with a warning)"},
	}
	for _, g := range groups {
		fmt.Fprintf(tw, "\n%s:\n", g.title)
		for _, o := range optionTable {
			if o.Status == g.status {
				fmt.Fprintf(tw, "  %s\t%s\n", optionSyntax(o), o.Desc)
			}
		}
	}
	fmt.Fprintf(tw, "\nExit codes:\n")
	for _, e := range exitCodes {
		fmt.Fprintf(tw, "  %d\t%s\n", e.Code, e.Desc)
	}
	tw.Flush()
}

func optionSyntax(o optionInfo) string {
	if o.Arg == "" {
		return o.Key
	}
	return o.Key + "=" + o.Arg
}

// printOptionsMarkdown prints optionTable as a Markdown table, so that the
// README's table is generated from the same list as the parser and --help.
func printOptionsMarkdown(w io.Writer) {
	fmt.Fprintln(w, "| Option | Status | Description |")
	fmt.Fprintln(w, "|---|---|---|")
	cell := strings.NewReplacer("|", `\|`)
	for _, o := range optionTable {
		fmt.Fprintf(w, "| `%s` | %s | %s |\n", cell.Replace(optionSyntax(o)), o.Status, cell.Replace(o.Desc))
	}
}
