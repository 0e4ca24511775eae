package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/overlay"
)

// withCwd pins the directory relative paths resolve against.
func withCwd(t *testing.T, dir string) {
	t.Helper()
	old := getwd
	getwd = func() (string, error) { return dir, nil }
	t.Cleanup(func() { getwd = old })
}

func mustParse(t *testing.T, args ...string) *config {
	t.Helper()
	cfg, err := parseArgs(args)
	if err != nil {
		t.Fatalf("parseArgs(%q): %v", args, err)
	}
	return cfg
}

func TestParseArgs(t *testing.T) {
	withCwd(t, "/cwd")
	tests := []struct {
		name string
		args []string
		want func(c *config) string // "" when c is as expected
	}{
		{"fuse-overlayfs form", []string{"-o", "lowerdir=/a:/b,upperdir=/u,workdir=/w", "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a", "/b"}, c.Upper, "/u", c.Work, "/w", c.Mountpoint, "/m", c.FsName, "goverlay")
		}},
		{"mount helper form", []string{"src", "/m", "-o", "rw,nosuid,nodev,lowerdir=/a"}, func(c *config) string {
			return diff(c.Lower, []string{"/a"}, c.Source, "src", c.Mountpoint, "/m", c.FsName, "src",
				c.KernelOptions, []string{"nosuid", "nodev"})
		}},
		{"fsname beats source", []string{"src", "/m", "-o", "lowerdir=/a,fsname=mine"}, func(c *config) string {
			return diff(c.FsName, "mine")
		}},
		{"mask of a profile and a feature", []string{"-o", "lowerdir=/a,mask=linux-6.8+fchmodat2", "/m"}, func(c *config) string {
			return diff(c.Mask.String(), "linux-6.8+fchmodat2", c.Mask.Names(), []string{"passthrough", "allow_idmap", "uring", "fchmodat2", "xattrat"})
		}},
		{"-o accumulates, attached form", []string{"-olowerdir=/a", "-o", "upperdir=/u", "-oworkdir=/w", "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a"}, c.Upper, "/u", c.Work, "/w")
		}},
		{"podman's empty option", []string{"-o", "lowerdir=/a,upperdir=/u,workdir=/w,,volatile", "/m"}, func(c *config) string {
			return diff(len(c.Warnings), 0, c.NoFsync, true, c.Upper, "/u", c.Work, "/w")
		}},
		{"metacopy=on", []string{"-o", "lowerdir=/a,metacopy=on", "/m"}, func(c *config) string {
			return diff(c.Metacopy, true, c.RedirectDirOff, false, len(c.Warnings), 0)
		}},
		{"metacopy=on with redirect_dir=on", []string{"-o", "lowerdir=/a,redirect_dir=on,metacopy=on", "/m"}, func(c *config) string {
			return diff(c.Metacopy, true, c.RedirectDirOff, false)
		}},
		{"metacopy=off", []string{"-o", "lowerdir=/a,metacopy=on,metacopy=off,redirect_dir=off", "/m"}, func(c *config) string {
			return diff(c.Metacopy, false, c.RedirectDirOff, true)
		}},
		{"fsync", []string{"-o", "lowerdir=/a,fsync=0", "/m"}, func(c *config) string {
			return diff(c.NoFsync, true)
		}},
		{"fsync=1 after fsync=0", []string{"-o", "lowerdir=/a,fsync=0,fsync=1", "/m"}, func(c *config) string {
			return diff(c.NoFsync, false)
		}},
		{"nosec and passthrough", []string{"-o", "lowerdir=/a,nosec=off,passthrough=off", "/m"}, func(c *config) string {
			return diff(c.NoSec, overlay.NoSecOff, c.NoPassthrough, true)
		}},
		{"nosec defaults to inherit", []string{"-o", "lowerdir=/a", "/m"}, func(c *config) string {
			return diff(c.NoSec, overlay.NoSecInherit, c.NoPassthrough, false, c.NoFsync, false)
		}},
		{"leading and trailing commas", []string{"-o", ",lowerdir=/a,", "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a"}, len(c.Warnings), 0)
		}},
		{"escaped colon", []string{"-o", `lowerdir=/a\:b:/c`, "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a:b", "/c"})
		}},
		{"escaped comma", []string{"-o", `lowerdir=/a\,b,upperdir=/u\,v,workdir=/w`, "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a,b"}, c.Upper, "/u,v")
		}},
		{"escaped backslash", []string{"-o", `lowerdir=/a\\:/b`, "/m"}, func(c *config) string {
			return diff(c.Lower, []string{`/a\`, "/b"})
		}},
		{"quoted context with commas and colons", []string{"-o", `lowerdir=/a,context="system_u:object_r:container_file_t:s0:c1,c2",upperdir=/u,workdir=/w`, "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a"}, c.Upper, "/u", c.Warnings, []string{`option "context" is not implemented yet, ignored`})
		}},
		{"quoted lowerdir keeps its colon", []string{"-o", `lowerdir="/a:b":/c`, "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/a:b", "/c"})
		}},
		{"relative paths", []string{"-o", "lowerdir=l1:../l2,upperdir=./u,workdir=w", "m", "--pidfile", "p", "--log=x/log"}, func(c *config) string {
			return diff(c.Lower, []string{"/cwd/l1", "/l2"}, c.Upper, "/cwd/u", c.Work, "/cwd/w",
				c.Mountpoint, "/cwd/m", c.PidFile, "/cwd/p", c.LogFile, "/cwd/x/log")
		}},
		{"paths are cleaned", []string{"-o", "lowerdir=/a//b/", "/m/"}, func(c *config) string {
			return diff(c.Lower, []string{"/a/b"}, c.Mountpoint, "/m")
		}},
		{"last value wins", []string{"-o", "lowerdir=/a,lowerdir=/b", "-o", "lowerdir=/c", "/m"}, func(c *config) string {
			return diff(c.Lower, []string{"/c"}, c.Warnings, []string{`option "lowerdir" given more than once; the last one wins`})
		}},
		{"unknown option warned once", []string{"-o", "lowerdir=/a,bogus,bogus=1", "/m"}, func(c *config) string {
			return diff(c.Warnings, []string{`unknown option "bogus" ignored`})
		}},
		{"not implemented warned once each", []string{"-o", "lowerdir=/a,fast_ino=1,threaded=1,fast_ino=0", "/m"}, func(c *config) string {
			return diff(c.Warnings, []string{`option "fast_ino" is not implemented yet, ignored`, `option "threaded" is not implemented yet, ignored`})
		}},
		{"xattr_permissions", []string{"-o", "lowerdir=/a,xattr_permissions=2", "/m"}, func(c *config) string {
			return diff(c.XattrPermissions, 2, len(c.Warnings), 0)
		}},
		{"xattr_permissions last wins", []string{"-o", "lowerdir=/a,xattr_permissions=2,xattr_permissions=0", "/m"}, func(c *config) string {
			return diff(c.XattrPermissions, 0, c.Warnings, []string{`option "xattr_permissions" given more than once; the last one wins`})
		}},
		{"id mappings", []string{"-o", "lowerdir=/a,uidmapping=0:100000:65536:65536:1:1,gidmapping=0:200000:10", "/m"}, func(c *config) string {
			return diff(len(c.Owners.UIDs), 2, c.Owners.UIDs[1].Disk, uint32(65536), c.Owners.UIDs[1].Shown, uint32(1), c.Owners.GIDs[0].Shown, uint32(200000))
		}},
		{"squash_to_uid wins over squash_to_root", []string{"-o", "lowerdir=/a,squash_to_root,squash_to_uid=7", "/m"}, func(c *config) string {
			return diff(*c.Owners.SquashUID, uint32(7), *c.Owners.SquashGID, uint32(0))
		}},
		{"ignored options are silent", []string{"-o", "lowerdir=/a,subtype=x,default_permissions", "/m"}, func(c *config) string {
			return diff(len(c.Warnings), 0)
		}},
		{"defaults dropped", []string{"-o", "lowerdir=/a,rw,exec,async,atime,diratime,relatime", "/m"}, func(c *config) string {
			return diff(len(c.KernelOptions), 0, c.ReadOnly, false)
		}},
		{"restrictive flags win whatever the order", []string{"-o", "lowerdir=/a,ro,nosuid,nodev,noexec,sync,rw,suid,dev,exec,async", "/m"}, func(c *config) string {
			return diff(c.KernelOptions, []string{"ro", "nosuid", "nodev", "noexec", "sync"}, c.ReadOnly, true, len(c.Warnings), 5)
		}},
		{"suid and dev are kept", []string{"-o", "lowerdir=/a,suid,dev,dirsync,lazytime", "/m"}, func(c *config) string {
			return diff(c.KernelOptions, []string{"suid", "dev", "dirsync", "lazytime"})
		}},
		{"last atime flag wins", []string{"-o", "lowerdir=/a,atime,noatime,diratime,nodiratime", "/m"}, func(c *config) string {
			return diff(c.KernelOptions, []string{"noatime", "nodiratime"})
		}},
		{"last atime flag wins, default", []string{"-o", "lowerdir=/a,noatime,relatime,nodiratime,diratime", "/m"}, func(c *config) string {
			return diff(len(c.KernelOptions), 0)
		}},
		{"implemented flags", []string{"-o", "lowerdir=/a,userxattr,allow_other,debug", "/m"}, func(c *config) string {
			return diff(c.UserXattr, true, c.AllowOther, true, c.Debug, true)
		}},
		{"flags anywhere", []string{"/m", "-f", "--debug", "-s", "-o", "lowerdir=/a", "--pidfile=/p"}, func(c *config) string {
			return diff(c.Foreground, true, c.Debug, true, c.PidFile, "/p", c.Mountpoint, "/m")
		}},
		{"double dash", []string{"-o", "lowerdir=/a", "--", "-m"}, func(c *config) string {
			return diff(c.Mountpoint, "/cwd/-m")
		}},
		{"help ignores the rest", []string{"-o", "lowerdir=", "--help", "a", "b", "c"}, func(c *config) string {
			return diff(c.Help, true)
		}},
		{"version", []string{"-V"}, func(c *config) string { return diff(c.Version, true) }},
		{"options markdown", []string{"--options-markdown"}, func(c *config) string { return diff(c.OptionsMarkdown, true) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.args...)
			if d := tc.want(c); d != "" {
				t.Errorf("parseArgs(%q): %s\nconfig: %+v", tc.args, d, c)
			}
		})
	}
}

// diff compares got/want pairs and describes the first mismatch.
func diff(pairs ...any) string {
	for i := 0; i+1 < len(pairs); i += 2 {
		got, want := pairs[i], pairs[i+1]
		if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
			if gs, ok := got.([]string); ok && len(gs) == 0 {
				if ws, ok := want.([]string); ok && len(ws) == 0 {
					continue
				}
			}
			return fmt.Sprintf("pair %d: got %#v, want %#v", i/2, got, want)
		}
	}
	return ""
}

// TestAtimeOptions: the access-time options of mount(8) are accepted
// without a warning; of each family the last one wins, and what is not
// the default goes to the kernel (and so to the daemon's policy,
// overlay/atime.go).
func TestAtimeOptions(t *testing.T) {
	for _, tc := range []struct {
		opts string
		want []string
	}{
		{"noatime", []string{"noatime"}},
		{"atime", nil},
		{"relatime", nil},
		{"norelatime", nil},
		{"strictatime", []string{"strictatime"}},
		{"nostrictatime", nil},
		{"lazytime", []string{"lazytime"}},
		{"nolazytime", nil},
		{"nodiratime", []string{"nodiratime"}},
		{"diratime", nil},
		{"noatime,strictatime", []string{"strictatime"}},
		{"strictatime,noatime", []string{"noatime"}},
		{"strictatime,relatime", nil},
		{"noatime,nostrictatime", nil},
		{"strictatime,nodiratime,lazytime,nolazytime", []string{"strictatime", "nodiratime"}},
		{"lazytime,noatime,diratime", []string{"lazytime", "noatime"}},
	} {
		args := []string{"-o", "lowerdir=/a," + tc.opts, "/m"}
		c := mustParse(t, args...)
		if d := diff(c.Warnings, []string(nil), c.KernelOptions, tc.want); d != "" {
			t.Errorf("parseArgs(%q): %s", args, d)
		}
	}
}

func TestParseArgsErrors(t *testing.T) {
	withCwd(t, "/cwd")
	tests := []struct {
		args []string
		want string // the exact message
	}{
		{nil, "no mountpoint given; usage: " + usageLine},
		{[]string{"-o", "lowerdir=/a", "s", "m", "x"}, `too many arguments ["s" "m" "x"]; give at most SOURCE and MOUNTPOINT`},
		{[]string{"-x", "/m"}, `unknown flag "-x"; see goverlay --help`},
		{[]string{"--frobnicate", "/m"}, `unknown flag "--frobnicate"; see goverlay --help`},
		{[]string{"/m", "-o"}, "-o needs an option string, as in -o lowerdir=/lower"},
		{[]string{"/m", "--pidfile"}, "--pidfile needs a file name, as in --pidfile /run/goverlay.pid"},
		{[]string{"/m", "--pidfile="}, "--pidfile needs a file name, as in --pidfile=/run/goverlay.pid"},
		{[]string{"/m", "--log"}, "--log needs a file name, as in --log /tmp/goverlay.log"},
		{[]string{""}, "the mountpoint is an empty string; give a directory"},
		{[]string{"-o", "lowerdir=", "/m"}, `option "lowerdir" needs a value, as in lowerdir=DIR[:DIR...]`},
		{[]string{"-o", "lowerdir", "/m"}, `option "lowerdir" needs a value, as in lowerdir=DIR[:DIR...]`},
		{[]string{"-o", "lowerdir=/a,upperdir", "/m"}, `option "upperdir" needs a value, as in upperdir=DIR`},
		{[]string{"-o", "lowerdir=/a,fsname=", "/m"}, `option "fsname" needs a value, as in fsname=NAME`},
		{[]string{"-o", "lowerdir=a::b", "/m"}, `lowerdir "a::b" has an empty layer between colons; data-only layers ("::") are not supported, remove the extra colon`},
		{[]string{"-o", "lowerdir=/a::/b::/c", "/m"}, `lowerdir "/a::/b::/c" has an empty layer between colons; data-only layers ("::") are not supported, remove the extra colon`},
		{[]string{"-o", "lowerdir=/a:", "/m"}, `lowerdir "/a:" starts or ends with a colon; remove the stray colon`},
		{[]string{"-o", "lowerdir=:/a", "/m"}, `lowerdir ":/a" starts or ends with a colon; remove the stray colon`},
		{[]string{"-o", `lowerdir=/a,context="system_u:object_r`, "/m"}, `unterminated quote in option string "lowerdir=/a,context=\"system_u:object_r"; close the quote`},
		{[]string{"-o", "=x", "/m"}, `option "=x" has no name; write KEY or KEY=VALUE`},
		{[]string{"-o", "lowerdir=/a,nosuid=1", "/m"}, `option "nosuid" takes no value (got "nosuid=1"); write just nosuid`},
		{[]string{"-o", "lowerdir=/a,userxattr=on", "/m"}, `option "userxattr" takes no value (got "userxattr=on"); write just userxattr`},
		{[]string{"-o", "lowerdir=/a,fsync=yes", "/m"}, `option "fsync" is 1 or 0, not "yes"; write fsync=1 or fsync=0`},
		{[]string{"-o", "lowerdir=/a,passthrough=1", "/m"}, `option "passthrough" is on or off, not "1"; write passthrough=on or passthrough=off`},
		{[]string{"-o", "lowerdir=/a,fsync", "/m"}, `option "fsync" needs a value, as in fsync=1|0`},
		{[]string{"-o", "lowerdir=/a,nosec=maybe", "/m"}, `option "nosec" is inherit, on or off, not "maybe"; write nosec=inherit, nosec=on or nosec=off`},
		{[]string{"-o", "lowerdir=/a,nosec", "/m"}, `option "nosec" needs a value, as in nosec=inherit|on|off`},
		{[]string{"-o", "lowerdir=/a,xattr_permissions=3", "/m"}, `option "xattr_permissions" is 0, 1 or 2, not "3"; write xattr_permissions=2 for user.containers.override_stat`},
		{[]string{"-o", "lowerdir=/a,xattr_permissions=x", "/m"}, `option "xattr_permissions" is 0, 1 or 2, not "x"; write xattr_permissions=2 for user.containers.override_stat`},
		{[]string{"-o", "lowerdir=/a,xattr_permissions=-1", "/m"}, `option "xattr_permissions" is 0, 1 or 2, not "-1"; write xattr_permissions=2 for user.containers.override_stat`},
		{[]string{"-o", "lowerdir=/a,xattr_permissions", "/m"}, `option "xattr_permissions" needs a value, as in xattr_permissions=0|1|2`},
		{[]string{"-o", "lowerdir=/a,metacopy=yes", "/m"}, `option "metacopy" is on or off, not "yes"; write metacopy=on or metacopy=off`},
		{[]string{"-o", "lowerdir=/a,metacopy=on,redirect_dir=follow", "/m"}, `option "metacopy=on" needs redirect_dir=on, not redirect_dir=follow; drop one of them`},
		{[]string{"-o", "lowerdir=/a,redirect_dir=off", "-o", "metacopy=on", "/m"}, `option "metacopy=on" needs redirect_dir=on, not redirect_dir=off; drop one of them`},
		{[]string{"-o", "lowerdir=/a,userxattr,metacopy=on", "/m"}, `option "metacopy=on" cannot be used with userxattr (the kernel overlay refuses it too: unprivileged users could forge metacopy files); drop one of them`},
		{[]string{"-o", "lowerdir=/a,mask=passthrough,tmpfile", "/m"}, `unknown option "tmpfile"; the names of mask= are joined with "+", not ",": write mask=A+tmpfile`},
		{[]string{"-o", "lowerdir=/a,mask=tmpfile,passthrough", "/m"}, `option "passthrough" needs a value, as in passthrough=on|off; the names of mask= are joined with "+", not ",": write mask=A+passthrough`},
		{[]string{"-o", "lowerdir=/a,mask=linux-5.15,linux-6.1", "/m"}, `unknown option "linux-6.1"; the names of mask= are joined with "+", not ",": write mask=A+linux-6.1`},
	}
	for _, tc := range tests {
		cfg, err := parseArgs(tc.args)
		if err == nil {
			t.Errorf("parseArgs(%q) = %+v, want error %q", tc.args, cfg, tc.want)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("parseArgs(%q) error\n got %q\nwant %q", tc.args, err, tc.want)
		}
		if code := exitCodeOf(err); code != exitUsage {
			t.Errorf("parseArgs(%q): exit code %d, want %d", tc.args, code, exitUsage)
		}
	}
}

func TestRelativePathWithoutCwd(t *testing.T) {
	old := getwd
	getwd = func() (string, error) { return "", errors.New("gone") }
	defer func() { getwd = old }()
	if _, err := parseArgs([]string{"-o", "lowerdir=/a", "m"}); err == nil || exitCodeOf(err) != exitUsage {
		t.Fatalf("got %v, want a usage error", err)
	}
	// Absolute paths do not need the working directory.
	mustParse(t, "-o", "lowerdir=/a", "/m")
}

// TestOptionTable checks that the parser treats every entry of optionTable
// as its Status says, so the table (and the help and README made from it)
// cannot drift from what the code does.
func TestOptionTable(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range optionTable {
		if seen[o.Key] {
			t.Errorf("option %q is listed twice", o.Key)
		}
		seen[o.Key] = true
		if o.Desc == "" {
			t.Errorf("option %q has no description", o.Key)
		}
		opt := o.Key
		if o.Arg != "" {
			opt += "=" + sampleValue(o)
		}
		args := []string{"-o", "lowerdir=/l", "-o", opt, "/m"}
		if o.Key == "lowerdir" {
			args = []string{"-o", opt, "/m"}
		}
		c, err := parseArgs(args)
		if err != nil {
			t.Errorf("option %q: %v", o.Key, err)
			continue
		}
		switch o.Status {
		case optNotYet:
			if want := []string{fmt.Sprintf("option %q is not implemented yet, ignored", o.Key)}; !slices.Equal(c.Warnings, want) {
				t.Errorf("option %q: warnings %q, want %q", o.Key, c.Warnings, want)
			}
		default:
			if len(c.Warnings) != 0 {
				t.Errorf("option %q (%v): unexpected warnings %q", o.Key, o.Status, c.Warnings)
			}
		}
		if o.Status == optKernel && !strings.Contains(o.Desc, "dropped") && !slices.Contains(c.KernelOptions, o.Key) {
			t.Errorf("kernel flag %q is not passed on: %q", o.Key, c.KernelOptions)
		}
		if o.Status == optKernel && strings.Contains(o.Desc, "dropped") && slices.Contains(c.KernelOptions, o.Key) {
			t.Errorf("kernel flag %q is said to be dropped but is passed on", o.Key)
		}
		// Supported and kernel flags refuse a value; not-yet options
		// take one or none.
		if o.Arg == "" {
			_, err := parseArgs([]string{"-o", "lowerdir=/l," + o.Key + "=1", "/m"})
			if (err == nil) != (o.Status == optNotYet || o.Status == optIgnored) {
				t.Errorf("option %q=1: err = %v", o.Key, err)
			}
		}
	}
}

func TestBackground(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"/m"}, true},
		{[]string{"-f", "/m"}, false},
		{[]string{"-d", "/m"}, false},
		{[]string{"-o", "debug", "/m"}, true},
		{[]string{"--debug", "/m"}, false},
		{[]string{"-d", "--log", "/l", "/m"}, true},
		{[]string{"-f", "--log", "/l", "/m"}, false},
	} {
		c := mustParse(t, append([]string{"-o", "lowerdir=/a"}, tc.args...)...)
		if got := c.background(); got != tc.want {
			t.Errorf("%q: background() = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestOverlayOptions(t *testing.T) {
	c := mustParse(t, "-o", "lowerdir=/a,upperdir=/u,workdir=/w,userxattr,noexec", "src", "/m")
	root := overlayOptions(c, 0, nil)
	if !root.AllowOther || !slices.Equal(root.KernelOptions, []string{"noexec", "suid"}) {
		t.Errorf("as root: allow_other=%v kernel=%q, want true [noexec suid]", root.AllowOther, root.KernelOptions)
	}
	if !slices.Equal(root.Lower, []string{"/a"}) || root.Upper != "/u" || root.Work != "/w" || !root.UserXattr || root.FsName != "src" {
		t.Errorf("as root: %+v", root)
	}
	user := overlayOptions(c, 1000, nil)
	if user.AllowOther || !slices.Equal(user.KernelOptions, []string{"noexec"}) {
		t.Errorf("as user: allow_other=%v kernel=%q, want false [noexec]", user.AllowOther, user.KernelOptions)
	}
	c = mustParse(t, "-o", "lowerdir=/a,nosuid,allow_other", "/m")
	if o := overlayOptions(c, 0, nil); !slices.Equal(o.KernelOptions, []string{"nosuid"}) {
		t.Errorf("nosuid as root: kernel=%q", o.KernelOptions)
	}
	if o := overlayOptions(c, 1000, nil); !o.AllowOther {
		t.Errorf("allow_other as user is not passed on")
	}
	// overlayOptions must not alias the config's slice.
	c = mustParse(t, "-o", "lowerdir=/a,noexec", "/m")
	_ = overlayOptions(c, 0, nil)
	if !slices.Equal(c.KernelOptions, []string{"noexec"}) {
		t.Errorf("config changed: %q", c.KernelOptions)
	}
}

func TestSplitHelpers(t *testing.T) {
	items, err := splitOptions(`a=1,b="x,y:z\",c\,d,e\`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`a=1`, `b=x\,y\:z\\`, `c\,d`, `e\\`}
	if !slices.Equal(items, want) {
		t.Errorf("splitOptions = %q, want %q", items, want)
	}
	if got := unescape(`x\,y\:z\\`); got != `x,y:z\` {
		t.Errorf("unescape = %q", got)
	}
	if got := splitUnescaped(`a\:b:c:`, ':'); !slices.Equal(got, []string{`a\:b`, "c", ""}) {
		t.Errorf("splitUnescaped = %q", got)
	}
	if k, v, ok := cutUnescaped(`a\=b=c=d`, '='); k != `a\=b` || v != "c=d" || !ok {
		t.Errorf("cutUnescaped = %q %q %v", k, v, ok)
	}
}

// sampleValue is a valid value for an option: the first alternative of
// "a|b|c", else a path.
func sampleValue(o optionInfo) string {
	if o.Key == "mask" {
		return "linux-5.15"
	}
	if first, _, found := strings.Cut(o.Arg, "|"); found {
		return first
	}
	switch o.Arg {
	case "UID", "GID":
		return "1000"
	case "ID:HOSTID:LEN[:...]":
		return "0:100000:65536"
	}
	return "/x"
}

// TestOptionTypos: a key one or two edits from a goverlay key is refused
// with the key it probably meant (a misspelt upperdir would otherwise
// make a read-only mount); the options other programs pass, some of them
// as close to a goverlay key, are still ignored with a warning.
func TestOptionTypos(t *testing.T) {
	for _, c := range []struct{ opts, want string }{
		{"lowerdir=/a,uppperdir=/u,workdir=/w", "upperdir"},
		{"lowerdir=/a,upperdir=/u,wrkdir=/w", "workdir"},
		{"lowerdr=/a", "lowerdir"},
		{"lowerdir=/a,UpperDir=/u,workdir=/w", "upperdir"},
		{"lowerdir=/a,user_xattr", "userxattr"},
		{"lowerdir=/a,nosce=on", "nosec"},
		{"lowerdir=/a,passtrough=off", "passthrough"},
		{"lowerdir=/a,squash_to_uidd=0", "squash_to_uid"},
		{"lowerdir=/a,redirectdir=off", "redirect_dir"},
		{"lowerdir=/a,xatr_permissions=2", "xattr_permissions"},
		{"lowerdir=/a,noexce", "noexec"},
		{"lowerdir=/a,rx", "ro"},
	} {
		_, err := parseArgs([]string{"-o", c.opts, "/m"})
		want := fmt.Sprintf("did you mean %s?", c.want)
		if err == nil || exitCodeOf(err) != exitUsage || !strings.Contains(err.Error(), want) {
			t.Errorf("-o %s: %v (exit %d); want exit %d and %q", c.opts, err, exitCodeOf(err), exitUsage, want)
		}
	}
	for _, extra := range []string{
		"uid=1000", "gid=1000", "uuid=on", "nofail", "_netdev", "noauto", "users", "defaults",
		"x-systemd.automount", "verity=on", "max_read=131072", "allow_root", "nonempty",
		"bogus_option_xyz", "fscontext=system_u:object_r:foo_t:s0", "lowerdir+=/b",
	} {
		c, err := parseArgs([]string{"-o", "lowerdir=/a," + extra, "/m"})
		if err != nil {
			t.Errorf("-o lowerdir=/a,%s: %v; want it ignored with a warning", extra, err)
			continue
		}
		if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "ignored") {
			t.Errorf("-o lowerdir=/a,%s: warnings %q, want one saying it is ignored", extra, c.Warnings)
		}
	}
	// No known key is a typo of another.
	for _, o := range optionTable {
		if near := typoOf(o.Key); near != "" {
			t.Errorf("typoOf(%q) = %q for a known key", o.Key, near)
		}
	}
}
