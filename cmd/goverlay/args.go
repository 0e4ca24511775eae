package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goverlay/goverlay/overlay"
)

// config is what the command line asks for, before anything on disk has
// been looked at. Paths are absolute and clean.
type config struct {
	Lower       []string // read-only layers, topmost first
	Upper, Work string   // both empty for a read-only overlay
	Mountpoint  string
	Source      string // SOURCE of the mount-helper form, "" if absent
	FsName      string // shown in /proc/mounts

	UserXattr        bool
	NoFsync          bool // fsync=0 or volatile
	NoSec            overlay.NoSecMode
	NoPassthrough    bool // passthrough=off
	passthroughOn    bool // passthrough=on, given
	OpenRequests     bool // noopen=0, or implied by passthrough=on or sharecache=on
	ShareCache       bool // sharecache=on
	noOpenGiven      bool // noopen= given
	Writeback        overlay.WritebackMode
	NoACL            bool
	NoUring          bool
	Mask             overlay.Mask   // mask=
	RedirectDirOff   bool           // redirect_dir=off|follow|nofollow
	redirectGiven    string         // the value of redirect_dir=, if given
	Metacopy         bool           // metacopy=on
	XattrPermissions int            // xattr_permissions=0|1|2
	Owners           overlay.Owners // uid/gid mapping and squashing
	squashRoot       bool
	StaticNlink      bool
	AllowOther       bool     // asked for explicitly; root gets it anyway
	ReadOnly         bool     // "ro" among KernelOptions
	KernelOptions    []string // resolved mount flags, see resolveFlags

	Shared     bool // daemon=shared: mount through the user's mount server
	Foreground bool
	Debug      bool
	dashD      bool // -d or --debug: debug and, as in libfuse, foreground
	PidFile    string
	LogFile    string

	Help, Version, OptionsMarkdown bool

	// Warnings are printed by the caller, once, without failing.
	Warnings []string
}

// background reports whether to return once the mount is live and keep
// serving from a detached process. -d alone implies -f, as in libfuse and
// fuse-overlayfs, because debug output needs somewhere to go; with --log it
// goes to the log file and the process can detach. "-o debug" does not
// imply -f (libfuse's does not either), so a caller that adds it still gets
// a program that returns.
func (c *config) background() bool {
	return !c.Foreground && (!c.dashD || c.LogFile != "")
}

// getwd is os.Getwd; tests replace it to pin relative-path resolution.
var getwd = os.Getwd

const usageLine = "goverlay [-f] [-d] -o lowerdir=DIR[:DIR...][,upperdir=DIR,workdir=DIR][,OPTS] [SOURCE] MOUNTPOINT"

// parseArgs reads a command line (without the program name). It accepts
// fuse-overlayfs' form, "goverlay [-f] [-d] -o OPTS MOUNTPOINT", and the
// mount-helper form "goverlay SOURCE MOUNTPOINT -o OPTS" that mount.fuse3
// uses for "mount -t fuse.goverlay". Flags and operands may come in any
// order and -o may be repeated. It only reads the working directory (to
// make relative paths absolute); it never panics.
func parseArgs(args []string) (*config, error) {
	return parseArgsAt(args, getwd)
}

// parseArgsAt is parseArgs with relative paths resolved against the
// directory wd returns: the shared mount server's is not its client's.
func parseArgsAt(args []string, wd func() (string, error)) (*config, error) {
	cfg := &config{}
	var optStrings, operands []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			operands = append(operands, args[i+1:]...)
			i = len(args)
		case a == "-o":
			if i+1 >= len(args) {
				return nil, failf(exitUsage, "-o needs an option string, as in -o lowerdir=/lower")
			}
			i++
			optStrings = append(optStrings, args[i])
		case strings.HasPrefix(a, "-o"):
			optStrings = append(optStrings, a[2:])
		case a == "-f":
			cfg.Foreground = true
		case a == "-d" || a == "--debug":
			cfg.Debug, cfg.dashD = true, true
		case a == "-s":
			// libfuse's single-threaded mode; accepted for drop-in
			// compatibility, go-fuse always serves concurrently.
		case a == "-h" || a == "--help":
			cfg.Help = true
		case a == "-V" || a == "--version":
			cfg.Version = true
		case a == "--options-markdown":
			cfg.OptionsMarkdown = true
		case a == "--pidfile" || strings.HasPrefix(a, "--pidfile="):
			v, skip, err := flagValue(args, i, "--pidfile")
			if err != nil {
				return nil, err
			}
			cfg.PidFile, i = v, i+skip
		case a == "--log" || strings.HasPrefix(a, "--log="):
			v, skip, err := flagValue(args, i, "--log")
			if err != nil {
				return nil, err
			}
			cfg.LogFile, i = v, i+skip
		case len(a) > 1 && a[0] == '-':
			return nil, failf(exitUsage, "unknown flag %q; see goverlay --help", a)
		default:
			operands = append(operands, a)
		}
	}
	if cfg.Help || cfg.Version || cfg.OptionsMarkdown {
		return cfg, nil
	}

	switch len(operands) {
	case 0:
		return nil, failf(exitUsage, "no mountpoint given; usage: %s", usageLine)
	case 1:
		cfg.Mountpoint = operands[0]
	case 2:
		// mount.fuse3 passes SOURCE first; like fuse-overlayfs, the
		// last operand is the mountpoint.
		cfg.Source, cfg.Mountpoint = operands[0], operands[1]
	default:
		return nil, failf(exitUsage, "too many arguments %q; give at most SOURCE and MOUNTPOINT", operands)
	}
	if cfg.Mountpoint == "" {
		return nil, failf(exitUsage, "the mountpoint is an empty string; give a directory")
	}

	st := newOptState(cfg)
	for _, s := range optStrings {
		if err := st.parse(s); err != nil {
			return nil, err
		}
	}
	if err := st.finish(); err != nil {
		return nil, err
	}

	if cfg.FsName == "" {
		cfg.FsName = cfg.Source
	}
	if cfg.FsName == "" {
		cfg.FsName = "goverlay"
	}
	if err := cfg.absolutize(wd); err != nil {
		return nil, err
	}
	return cfg, nil
}

// flagValue returns the value of a long flag given as "--name=V" or as
// "--name V", and how many extra arguments it used.
func flagValue(args []string, i int, name string) (string, int, error) {
	example := "/run/goverlay.pid"
	if name == "--log" {
		example = "/tmp/goverlay.log"
	}
	if v, ok := strings.CutPrefix(args[i], name+"="); ok {
		if v == "" {
			return "", 0, failf(exitUsage, "%s needs a file name, as in %s=%s", name, name, example)
		}
		return v, 0, nil
	}
	if i+1 >= len(args) || args[i+1] == "" {
		return "", 0, failf(exitUsage, "%s needs a file name, as in %s %s", name, name, example)
	}
	return args[i+1], 1, nil
}

// absolutize makes every path absolute against the working directory.
// containers/storage runs its mount program with cmd.Dir set to the
// storage root, so a relative path there means relative to that directory;
// the daemon later changes to "/", so the paths must not depend on the
// working directory any more.
func (c *config) absolutize(getwd func() (string, error)) error {
	var cwd string
	abs := func(p *string) error {
		if *p == "" {
			return nil
		}
		if filepath.IsAbs(*p) {
			*p = filepath.Clean(*p)
			return nil
		}
		if cwd == "" {
			wd, err := getwd()
			if err != nil {
				return failf(exitUsage, "cannot resolve relative path %s: %w; give an absolute path", *p, err)
			}
			cwd = wd
		}
		*p = filepath.Join(cwd, *p)
		return nil
	}
	for i := range c.Lower {
		if err := abs(&c.Lower[i]); err != nil {
			return err
		}
	}
	for _, p := range []*string{&c.Upper, &c.Work, &c.Mountpoint, &c.PidFile, &c.LogFile} {
		if err := abs(p); err != nil {
			return err
		}
	}
	return nil
}

// String renders the configuration for the debug log.
func (c *config) String() string {
	return fmt.Sprintf("lower=%q upper=%q work=%q mountpoint=%q fsname=%q userxattr=%v nofsync=%v nosec=%v nopassthrough=%v openrequests=%v writeback=%v noacl=%v nouring=%v kernel=%q",
		c.Lower, c.Upper, c.Work, c.Mountpoint, c.FsName, c.UserXattr, c.NoFsync, c.NoSec, c.NoPassthrough, c.OpenRequests, c.Writeback, c.NoACL, c.NoUring, c.KernelOptions)
}
