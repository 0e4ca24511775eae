// Package bench is `goverlay bench`: it mounts goverlay (the real binary,
// as a subprocess), the kernel's overlayfs and fuse-overlayfs over identical
// scratch layers, runs the same workloads on each and on the bare upper
// directory, and reports min/median/max per target and workload with the
// ratios to the kernel overlay.
//
// Runs interleave the targets: in each round every target is mounted over
// fresh layers, then every workload runs on every target in turn (A B C,
// A B C, ...), so that noise on a shared machine hits all targets alike.
// Nothing is asserted about timings anywhere; this is a measuring tool.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Config is one bench invocation.
type Config struct {
	// Binary is the goverlay executable mounted as a subprocess for the
	// goverlay targets; empty means os.Executable().
	Binary string
	// Baseline is another goverlay executable, mounted with the defaults
	// as the goverlay-baseline and goverlay-baseline-uring targets (only
	// run when named), to compare
	// two builds side by side in one run.
	Baseline string
	// Targets and Workloads name what to run (see Usage); empty means
	// all targets and the default workloads. A workload name also selects
	// every workload it prefixes: "fstime" is all nine fstime phases,
	// "fstime-1024" its three; "default", "dircache" and "all" are
	// groups.
	Targets, Workloads []string
	// Scale sizes the dircache workloads: 1 is their full 100,000 files
	// and entries; 0 means DefaultScale.
	Scale float64
	// Duration is how long each timed phase runs (fstime phases, metadata,
	// stat-deep, path-miss, untar).
	Duration time.Duration
	// Runs is the number of interleaved rounds.
	Runs int
	// Dir is where the scratch tree goes; empty means os.TempDir().
	Dir string
	// Tree is a real tree for the containers workloads instead of the
	// generated one; its parent directory becomes a lower layer.
	Tree string
	// JSON, SVG and PNG, when set, are files to write the report and
	// its chart to.
	JSON, SVG, PNG string
	// Out receives the table at the end (nil: none); Progress the
	// progress bar, shown only when it is a terminal (nil: none).
	Out      io.Writer
	Progress io.Writer

	// hostMounts, when above 0, is how many instances every host
	// workload mounts instead of the N in its name: the tests' tiny
	// size, which no flag sets.
	hostMounts int
}

// Defaults. The issue suggested 2 s per phase; with 7 targets, 14
// workloads and 3 rounds that takes over 10 minutes, and 1 s about 5¼
// on a 2-vCPU machine, so the default is shorter still: about 4 minutes
// for the full run (fstime itself uses 30 s).
const (
	DefaultDuration = 750 * time.Millisecond
	DefaultRuns     = 3
)

// ParseFlags reads the arguments that follow "bench". With -h or --help it
// prints the usage to stdout and returns flag.ErrHelp.
func ParseFlags(args []string) (Config, error) {
	c := Config{Duration: DefaultDuration, Runs: DefaultRuns, Scale: DefaultScale}
	fs := flag.NewFlagSet("goverlay bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	targets := fs.String("targets", "all", "")
	workloads := fs.String("workloads", groupDefault, "")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "")
	fs.Float64Var(&c.Scale, "scale", c.Scale, "")
	fs.IntVar(&c.Runs, "runs", c.Runs, "")
	fs.StringVar(&c.Dir, "dir", "", "")
	fs.StringVar(&c.Tree, "tree", "", "")
	fs.StringVar(&c.JSON, "json", "", "")
	fs.StringVar(&c.SVG, "svg", "", "")
	fs.StringVar(&c.PNG, "png", "", "")
	fs.StringVar(&c.Binary, "binary", "", "")
	rootless := fs.Bool("rootless", false, "")
	fs.StringVar(&c.Baseline, "baseline", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			Usage(os.Stdout)
			return c, err
		}
		return c, fmt.Errorf("bench: %w; see goverlay bench --help", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("bench: unexpected argument %q; see goverlay bench --help", fs.Arg(0))
	}
	var err error
	if c.Targets, err = expandTargets(splitList(*targets)); err != nil {
		return c, err
	}
	if *rootless {
		c.Targets = rootlessTargets(c.Targets)
	}
	if c.Workloads, err = expandWorkloads(splitList(*workloads), c.Scale); err != nil {
		return c, err
	}
	if c.Duration <= 0 {
		return c, fmt.Errorf("bench: --duration must be positive, as in --duration 2s")
	}
	if c.Runs < 1 {
		return c, fmt.Errorf("bench: --runs must be at least 1")
	}
	if !(c.Scale > 0 && c.Scale <= 10) {
		return c, fmt.Errorf("bench: --scale must be above 0 and at most 10, as in --scale 1 for the full 100,000 files")
	}
	return c, nil
}

// Usage prints the help text.
func Usage(w io.Writer) {
	fmt.Fprintf(w, `Usage: goverlay bench [OPTIONS]

Mounts each target over identical scratch layers (a lower with some files,
an empty upper and work) and runs the workloads on it. Targets are
interleaved, round after round, so noise hits them alike; the table gives
min/median/max per target and workload and the median relative to the
kernel overlay.

Options:
  --targets LIST     comma-separated targets, or "all" (default all)
  --workloads LIST   comma-separated workloads, prefixes of them or groups
                     (default "default"); "fstime" is its 9 phases,
                     "fstime-1024" that configuration's write, read and
                     copy; groups: "default" (the ones marked [default]
                     below), "dircache" (those marked [dircache]: the
                     directory-cache workloads, only run when asked for),
                     "containers" (those marked [containers]: walks,
                     reads, exec, creates, cp, rm and untar of a tree
                     that looks like a distribution image, and the walk
                     of a layer's commit, only run when asked for),
                     "host" (those marked [host]: N mounts of a target
                     over one shared image, the page cache their reads
                     and execs take, their daemons' memory and the time
                     per mount; only run when asked for, the N=100 ones
                     only with --scale 1 or more or by name), "build"
                     (those marked [build]: podman build --no-cache on a
                     private podman store with the target as its
                     overlay, the whole build and each RUN step; only
                     run when asked for; needs podman), "all" (every
                     group)
  --duration D       how long each timed phase runs (default %v)
  --runs N           interleaved rounds (default %d)
  --scale S          size of the dircache workloads relative to their
                     full 100,000 files or entries (default %g: %s);
                     --scale 1 is the full size, and takes longer than
                     the whole default run; the containers tree has
                     250,000 entries at --scale 1 (%s at the default)
  --dir DIR          where the scratch tree goes (default %s); all layers
                     live on that filesystem
  --tree DIR         a real tree (such as a copy of /usr) for the
                     containers workloads instead of the generated one;
                     its parent directory becomes a lower layer, and
                     nothing in it is written
  --json FILE        write the whole report, every sample, as JSON
  --svg FILE         write a chart of every target's speed relative to the
                     kernel overlay (median and spread, log scale)
  --png FILE         the same chart as PNG
  --binary PATH      goverlay binary to mount (default this program)
  --rootless         run each target that has a rootless form (the *-rootless
                     targets) that way: mounted, and its workloads run, by
                     an unprivileged user (goverlaybench, created if
                     missing) in a user and mount namespace of its own,
                     over the user's own copy of the layers (and of
                     --tree); needs root to set that up, and makes
                     /dev/fuse 0666
  --baseline PATH    another goverlay binary, mounted with the defaults as
                     the goverlay-baseline target, and over io_uring as
                     goverlay-baseline-uring (give them in --targets):
                     two builds side by side in one run

Targets:
`, DefaultDuration, DefaultRuns, DefaultScale, fmtNum(dcFullBig*DefaultScale), fmtInt(ctEntriesAt(DefaultScale)), os.TempDir())
	for _, t := range allTargets {
		fmt.Fprintf(w, "  %-34s %s\n", t.name, t.desc)
	}
	fmt.Fprintf(w, "\nWorkloads:\n")
	for _, wl := range allWorkloads {
		fmt.Fprintf(w, "  %-34s [%s] %s (%s)\n", wl.name, wl.group, wl.desc, wl.unit)
	}
	fmt.Fprintf(w, `
The dircache workloads but mem-* also report the FUSE requests that reached the
daemon per 1000 ops: counted on the fuse:fuse_request_send tracepoint
(perf_event_open, root) on every FUSE target, and from the daemon's own
counters (goverlay stats: lookups, lookups_not_found,
attribute_requests) on the
goverlay targets. With them selected, every target's layers get three more
lowers (the dircache trees) below the shared one. mem-per-inode and
mem-idle read the FUSE daemon's VmRSS (goverlay's from its pidfile,
fuse-overlayfs's found in /proc); they show "-" on native and kernel,
which have none, and lower is better. The host workloads run on the
kernel, fuse-overlayfs and goverlay targets, not on native or rootless
ones; host-pss sums the N daemons' Pss, so it too shows "-" on kernel.
The build workloads run on every overlay target: kernel and kernel-* as
podman's own overlay driver, the others as its mount_program (the goverlay
binary under test for the goverlay ones), a target's -o options as the
store's mountopt; a rootless target builds as the rootless user. Each
built image is checked, and a build whose image differs fails. For every
MiB, ms and s workload lower is better.

A target that cannot run here (not root, not installed, mount fails) is
reported as skipped with the reason. Ctrl-C unmounts everything and removes
the scratch tree.
`)
}

func dedupe(list []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// expandTargets checks names and expands "all"; the order is the canonical
// one, which is also the interleaving order.
func expandTargets(names []string) ([]string, error) {
	if len(names) == 0 {
		names = []string{"all"}
	}
	want := map[string]bool{}
	for _, n := range names {
		if n == "all" {
			// The rootless targets are asked for by name or with
			// --rootless, the kernel profiles' by name.
			for _, t := range allTargets {
				want[t.name] = want[t.name] || (!t.rootless && !t.baseline && !t.named)
			}
			continue
		}
		if findTarget(n) == nil {
			return nil, fmt.Errorf("bench: unknown target %q; known: all, %s", n, strings.Join(targetNames(), ", "))
		}
		want[n] = true
	}
	var out []string
	for _, t := range allTargets {
		if want[t.name] {
			out = append(out, t.name)
		}
	}
	return out, nil
}

// expandWorkloads checks names, expands groups ("default", "dircache",
// "all", ...) and prefixes, and puts the result in canonical order
// (fstime's read follows its write, as in fstime). No names is the
// default group. A group leaves out its fullScale workloads below
// --scale 1 (scale); a name or prefix selects them.
func expandWorkloads(names []string, scale float64) ([]string, error) {
	if len(names) == 0 {
		names = []string{groupDefault}
	}
	want := map[string]bool{}
	for _, n := range names {
		found := false
		for _, w := range allWorkloads {
			group := n == "all" || w.group == n
			if group || w.name == n || strings.HasPrefix(w.name, n+"-") {
				found = true
				want[w.name] = want[w.name] || !group || !w.fullScale || scale >= 1
			}
		}
		if !found {
			return nil, fmt.Errorf("bench: unknown workload %q; known: all, %s, fstime, fstime-256, fstime-1024, fstime-4096, %s",
				n, strings.Join(workloadGroups, ", "), strings.Join(workloadNames(), ", "))
		}
	}
	var out []string
	for _, w := range allWorkloads {
		if want[w.name] {
			out = append(out, w.name)
		}
	}
	return out, nil
}

// Run runs the benchmark. It writes the table to c.Out and the JSON and SVG
// files if asked. SIGINT and SIGTERM (and ctx) stop it cleanly: the rounds
// end, everything mounted is unmounted and the scratch tree removed; the
// partial table is still written, the files are not, and the error is the
// context's.
func Run(ctx context.Context, c Config) (rep *Report, err error) {
	if c.Duration <= 0 {
		c.Duration = DefaultDuration
	}
	if c.Runs < 1 {
		c.Runs = DefaultRuns
	}
	if c.Scale <= 0 {
		c.Scale = DefaultScale
	}
	if c.Dir == "" {
		c.Dir = os.TempDir()
	}
	if c.Binary == "" {
		c.Binary = defaultBinary()
	}
	if c.Binary != "" {
		if abs, err := filepath.Abs(c.Binary); err == nil {
			c.Binary = abs
		}
	}
	if c.Baseline != "" {
		if abs, err := filepath.Abs(c.Baseline); err == nil {
			c.Baseline = abs
		}
	}
	// Unknown targets are reported as skipped; unknown workloads are an
	// error, there is nothing sensible to skip.
	if len(c.Targets) == 0 {
		c.Targets, _ = expandTargets(nil)
	}
	c.Targets = dedupe(c.Targets)
	if c.Workloads, err = expandWorkloads(c.Workloads, c.Scale); err != nil {
		return nil, err
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	var cl cleanups
	defer func() {
		if cerr := cl.run(); cerr != nil && err == nil {
			err = cerr
		}
		if rep != nil && c.Out != nil {
			rep.WriteTable(c.Out)
		}
	}()

	b, err := newBencher(ctx, c, &cl)
	if err != nil {
		return nil, err
	}
	rep = b.rep
	b.loop()
	rep.Finished = time.Now()
	if ctx.Err() != nil {
		rep.Interrupted = true
		return rep, fmt.Errorf("bench interrupted: %w", ctx.Err())
	}
	rep.finish()
	if c.JSON != "" {
		if err := writeFile(c.JSON, rep.WriteJSON); err != nil {
			return rep, fmt.Errorf("bench: write %s: %w", c.JSON, err)
		}
	}
	for _, ch := range []struct {
		path  string
		asPNG bool
	}{{c.SVG, false}, {c.PNG, true}} {
		if ch.path == "" {
			continue
		}
		if err := rep.writeChart(ch.path, ch.asPNG); err != nil {
			return rep, fmt.Errorf("bench: write %s: %w", ch.path, err)
		}
	}
	return rep, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cleanups is a stack of undo steps, run last-in first-out whatever
// happens.
type cleanups struct {
	fns []func() error
}

func (c *cleanups) push(f func() error) { c.fns = append(c.fns, f) }

func (c *cleanups) run() error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		if err := c.fns[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.fns = nil
	return errors.Join(errs...)
}

// defaultBinary is the goverlay binary the goverlay targets run when
// --binary names none: the one beside this program (make builds both into
// one directory, and `goverlay bench` names itself), else the one in
// PATH, else "" (the goverlay targets are then skipped, saying so).
func defaultBinary() string {
	if self, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(self), "goverlay")
		if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return beside
		}
	}
	if p, err := exec.LookPath("goverlay"); err == nil {
		return p
	}
	return ""
}
