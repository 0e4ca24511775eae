package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hbollon/go-edlib"

	"github.com/goverlay/goverlay/overlay"
)

// optStatus says what goverlay does with a -o option.
type optStatus int

const (
	// optSupported options are implemented by goverlay itself.
	optSupported optStatus = iota
	// optKernel options are mount flags handed to the kernel.
	optKernel
	// optIgnored options are accepted and have no effect by design.
	optIgnored
	// optNotYet options are fuse-overlayfs or kernel overlayfs features
	// goverlay does not implement yet: accepted with a warning, so that
	// callers written for fuse-overlayfs (podman, buildah) keep working.
	optNotYet
)

func (s optStatus) String() string {
	switch s {
	case optSupported:
		return "supported"
	case optKernel:
		return "kernel flag"
	case optIgnored:
		return "ignored"
	default:
		return "not implemented yet"
	}
}

// optionInfo describes one -o key. Arg is the value's placeholder; an
// empty Arg on a supported or kernel option means the option is a flag and
// must not carry a value, a non-empty one means it needs a value. Ignored and
// not-yet options take whatever they are given.
type optionInfo struct {
	Key    string
	Arg    string
	Status optStatus
	Desc   string
}

// optionTable is the single list of every -o key goverlay knows. The parser,
// --help and --options-markdown (for the README) all read it; a test checks
// that the parser handles each entry as its Status says.
var optionTable = []optionInfo{
	{"lowerdir", "DIR[:DIR...]", optSupported, `read-only layers, topmost first; "\:" escapes a colon inside a path`},
	{"upperdir", "DIR", optSupported, "writable layer; needs workdir"},
	{"workdir", "DIR", optSupported, "scratch directory on the upperdir's filesystem; needs upperdir"},
	{"userxattr", "", optSupported, `keep overlay metadata in "user.overlay.*" instead of "trusted.overlay.*" xattrs`},
	{"ro", "", optSupported, "mount read-only, even with an upperdir; wins over rw"},
	{"fsname", "NAME", optSupported, `source shown in /proc/mounts (default: the SOURCE argument, else "goverlay")`},
	{"allow_other", "", optSupported, "let other users use the mount; always on when run as root"},
	{"default_permissions", "", optSupported, "accepted; the kernel always checks permissions against the layers' modes"},
	{"debug", "", optSupported, "log every FUSE request, like -d but without implying -f"},
	{"fsync", "1|0", optSupported, "fsync=0: do not fsync a copy-up before publishing it (fuse-overlayfs); faster, not crash-safe"},
	{"volatile", "", optSupported, "same as fsync=0 (kernel overlayfs; podman passes it for --volatile containers)"},
	{"nosec", "inherit|on|off", optSupported, "let the kernel skip the security.capability check on writes: inherit (default) when the upper filesystem is local, on, or off"},
	{"noopen", "1|0", optSupported, "1 (default): the kernel opens regular files without asking goverlay (FUSE no_open): no OPEN and RELEASE per open(2), so reads from the page cache and execs of cached files never reach goverlay; a lower file is copied up at its first change rather than when opened for writing; no passthrough. 0: every open is a request, as in fuse-overlayfs; passthrough needs it"},
	{"passthrough", "on|off", optSupported, "with noopen=0: on (default) lets the kernel read and write files of the upper layer directly (FUSE passthrough; Linux 6.9+, root); off sends reads and writes through the page cache and goverlay. passthrough=on implies noopen=0"},
	{"sharecache", "on|off", optSupported, "on: files still in a lower layer open with FUSE passthrough to the lower file (Linux 6.9+, root), so reads, mmap and exec use the lower file's pages: mounts of one image share one copy in memory, as with the kernel overlay. Every open(2) is then a request (OPEN and RELEASE). Implies noopen=0; needs passthrough=on and writeback=0; no effect where the kernel grants no passthrough (rootless). Default off"},
	{"daemon", "own|shared", optSupported, "own (default): each mount has a process of its own. shared: one process serves every mount of the user (per user and mount namespace), started by the first such mount and gone with the last; a mount then costs the command's Go start, not a second one for its daemon, and little memory (man page: SHARED DAEMON). No effect with -f or -d"},
	{"writeback", "0|1", optSupported, "the kernel's writeback cache: write(2) fills the page cache and the kernel writes it to goverlay later, in large requests (fuse-overlayfs). Default: on, except with noopen=0 where passthrough is granted; 1 uses it instead of passthrough, 0 never (every write(2) is then a request)"},
	{"uring", "1|0", optSupported, "1 (default): where the kernel offers FUSE over io_uring (Linux 6.14+, when /sys/module/fuse/parameters/enable_uring is Y), serve requests through one io_uring queue per CPU, each answered by a thread on that CPU; the kernel's offer is the switch, as it is off by default. 0: serve every request through /dev/fuse"},
	{"noacl", "", optSupported, "do not enforce POSIX ACLs, nor give new objects their directory's default ACL; the umask always applies (fuse-overlayfs)"},
	{"static_nlink", "", optSupported, "report a link count of 1 for every directory (fuse-overlayfs); merged directories always report 1, like the kernel overlay's"},
	{"uidmapping", "ID:HOSTID:LEN[:...]", optSupported, "owners ID..ID+LEN-1 on disk are shown as HOSTID..; new files and chown map back; unmapped ids show as the overflow uid (fuse-overlayfs; containers/storage passes it); the ids named in POSIX ACLs are mapped the same way (fuse-overlayfs leaves them); a lower layer on an id-mapped mount is not shifted twice (man page: ID-MAPPED LAYERS)"},
	{"gidmapping", "ID:HOSTID:LEN[:...]", optSupported, "the same for groups"},
	{"squash_to_root", "", optSupported, "show every file as owned by 0:0; chown succeeds and changes nothing (fuse-overlayfs)"},
	{"squash_to_uid", "UID", optSupported, "show every file as owned by UID; wins over squash_to_root (fuse-overlayfs)"},
	{"squash_to_gid", "GID", optSupported, "show every file's group as GID; wins over squash_to_root (fuse-overlayfs)"},
	{"xattr_permissions", "0|1|2", optSupported, `keep owners and modes in an xattr instead of for real: 0 (default) for real, 1 in "security.fuseoverlayfs.override_stat", 2 in "user.containers.override_stat" (containers/storage passes it with force_mask; fuse-overlayfs)`},
	{"metacopy", "on|off", optSupported, "on: chown, chmod, utimes, xattr changes, link and rename of a lower regular file copy up its metadata only, in the kernel overlay's format (an empty overlay.metacopy xattr, overlay.origin, and an overlay.redirect where it moves); its data is read from the lower file until the first write, open for writing or truncate copies it in. Needs redirect_dir=on, which it turns on; refused with userxattr, as the kernel refuses it. off (default): metacopy files found on disk are refused with EPERM, as the kernel refuses them"},
	{"mask", "PROFILE|FEATURE[+...]", optSupported, `a diagnostic: behave as if the kernel lacked the named features, so that goverlay's fallbacks for them run on a kernel that has them; a profile, linux-MAJOR.MINOR (linux-5.14, linux-5.15, linux-6.1, linux-6.8, any from 5.11), names every feature that came after that release; features and profiles are joined with "+" (man page: KERNEL FEATURES)`},
	{"redirect_dir", "on|off|follow|nofollow", optSupported, "on (default): a directory with lower instances is renamed in place with an overlay.redirect xattr, written as the kernel writes it with redirect_dir=on (its old name when it stays in its parent, else its path in the merged view; over 256 bytes, the kernel's redirect_max, EXDEV); off, follow, nofollow: such renames fail with EXDEV (mv falls back to copying). Redirects on disk are always followed, layer by layer through any number of layers; a malformed one fails the lookup of its directory with EINVAL or EACCES, as on the kernel, and is logged"},

	{"rw", "", optKernel, "default; dropped"},
	{"nosuid", "", optKernel, "ignore set-user/group-ID bits; wins over suid"},
	{"suid", "", optKernel, "honour set-user/group-ID bits; the default when run as root, as in fuse-overlayfs"},
	{"nodev", "", optKernel, "no device files (FUSE's default); wins over dev"},
	{"dev", "", optKernel, "allow device files"},
	{"noexec", "", optKernel, "forbid execution; wins over exec"},
	{"exec", "", optKernel, "default; dropped"},
	{"sync", "", optKernel, "synchronous I/O; wins over async"},
	{"async", "", optKernel, "default; dropped"},
	{"dirsync", "", optKernel, "synchronous directory changes"},
	{"lazytime", "", optKernel, "update timestamps lazily; the last of lazytime/nolazytime wins"},
	{"nolazytime", "", optKernel, "default; dropped"},
	{"noatime", "", optKernel, "reads never change an access time, in any layer; the last of noatime, atime, relatime, norelatime, strictatime and nostrictatime wins (man page: ACCESS TIMES)"},
	{"relatime", "", optKernel, "default: a read updates an upper file's access time when that is not after its mtime or ctime, or is a day old; dropped"},
	{"norelatime", "", optKernel, "default (relatime; as on Linux, only strictatime turns it off); dropped"},
	{"atime", "", optKernel, "default (relatime); dropped"},
	{"strictatime", "", optKernel, "every read that reaches goverlay updates an upper file's access time"},
	{"nostrictatime", "", optKernel, "default (relatime); dropped"},
	{"nodiratime", "", optKernel, "listing a directory never changes its access time; the last of nodiratime/diratime wins"},
	{"diratime", "", optKernel, "default; dropped"},

	{"subtype", "NAME", optIgnored, "the type is always fuse.goverlay"},

	{"threaded", "0|1", optNotYet, "threading mode (fuse-overlayfs)"},
	{"timeout", "SECONDS", optNotYet, "kernel cache timeout for names and attributes (fuse-overlayfs)"},
	{"fast_ino", "0|1", optNotYet, "cheaper inode numbering (fuse-overlayfs)"},
	{"noxattrs", "0|1|2", optNotYet, "disable extended attributes (fuse-overlayfs)"},
	{"plugins", "PATH[:PATH...]", optNotYet, "layer-format plugins (fuse-overlayfs)"},
	{"context", `"LABEL"`, optNotYet, "SELinux context for every file (containers/storage passes it)"},
	{"xino", "on|off|auto", optNotYet, "inode-number scheme (kernel overlayfs)"},
	{"index", "on|off", optNotYet, "hard-link index (kernel overlayfs)"},
	{"nfs_export", "on|off", optNotYet, "NFS export support (kernel overlayfs)"},
}

// optionByKey indexes optionTable.
var optionByKey = func() map[string]*optionInfo {
	m := make(map[string]*optionInfo, len(optionTable))
	for i := range optionTable {
		m[optionTable[i].Key] = &optionTable[i]
	}
	return m
}()

// foreignOptions are options that mount(8), libfuse, the kernel overlay
// and containers/storage hand a mount program, which goverlay ignores with
// a warning like any unknown option. They are listed so that the typo check
// does not take one for a misspelt goverlay key (uid or uuid for suid,
// nofail for noacl). ext4's user_xattr is not among them: on an overlay it
// can only be a misspelt userxattr.
var foreignOptions = map[string]bool{
	// libfuse and fuse(8)
	"uid": true, "gid": true, "umask": true, "user_id": true, "group_id": true, "rootmode": true,
	"blksize": true, "max_read": true, "max_write": true, "max_readahead": true,
	"allow_root": true, "auto_unmount": true, "nonempty": true, "kernel_cache": true,
	"auto_cache": true, "noauto_cache": true, "direct_io": true, "entry_timeout": true,
	"negative_timeout": true, "attr_timeout": true, "ac_attr_timeout": true, "use_ino": true,
	"readdir_ino": true, "hard_remove": true, "intr": true, "intr_signal": true,
	"async_read": true, "sync_read": true, "atomic_o_trunc": true, "big_writes": true,
	"no_remote_lock": true, "clone_fd": true, "modules": true, "setuid": true, "drop_privileges": true,
	// kernel overlayfs
	"uuid": true, "verity": true, "datadir+": true, "lowerdir+": true,
	// mount(8) and fstab(5)
	"defaults": true, "auto": true, "noauto": true, "nofail": true, "_netdev": true,
	"user": true, "nouser": true, "users": true, "owner": true, "group": true,
	"mand": true, "nomand": true,
	"iversion": true, "noiversion": true, "silent": true, "loud": true,
	// SELinux, besides context
	"fscontext": true, "defcontext": true, "rootcontext": true, "seclabel": true,
}

// typoOf returns the goverlay key that key most likely misspells, or ""
// when key is not close to any: at most one edit (insertion, deletion,
// substitution or swap of neighbours, Damerau-Levenshtein) from a key of
// up to four letters, two from a longer one, ignoring case. Options that
// other programs pass (foreignOptions, x-* userspace options) are never
// typos.
func typoOf(key string) string {
	lk := strings.ToLower(key)
	if optionByKey[key] != nil || foreignOptions[lk] || strings.HasPrefix(lk, "x-") || strings.ContainsAny(lk, ".:") {
		return ""
	}
	best, bestDist := "", 3
	for _, o := range optionTable {
		limit := 2
		if len(o.Key) <= 4 {
			limit = 1
		}
		d := edlib.DamerauLevenshteinDistance(lk, o.Key)
		if lk == o.Key {
			d = 1 // the key in other letter case
		}
		if d <= limit && d < bestDist {
			best, bestDist = o.Key, d
		}
	}
	return best
}

// optState accumulates the -o strings of one command line: several -o
// flags add up, and a key given twice keeps its last value.
type optState struct {
	cfg    *config
	given  map[string]bool // value options seen, to warn about repeats
	flags  []string        // kernel flags in the order given
	warned map[string]bool // keys already warned about
}

func newOptState(cfg *config) *optState {
	return &optState{cfg: cfg, given: map[string]bool{}, warned: map[string]bool{}}
}

func (st *optState) warnOnce(key, format string, a ...any) {
	if st.warned[key] {
		return
	}
	st.warned[key] = true
	st.cfg.Warnings = append(st.cfg.Warnings, fmt.Sprintf(format, a...))
}

// parse applies one -o string.
func (st *optState) parse(s string) error {
	items, err := splitOptions(s)
	if err != nil {
		return err
	}
	for _, item := range items {
		if item == "" {
			// podman builds "...,workdir=W,,volatile" when an optional
			// piece is empty; the kernel and fuse-overlayfs skip it.
			continue
		}
		if err := st.apply(item); err != nil {
			return err
		}
	}
	return nil
}

// apply handles one option in escaped form (see splitOptions).
func (st *optState) apply(item string) error {
	rawKey, raw, hasValue := cutUnescaped(item, '=')
	key := unescape(rawKey)
	if key == "" {
		return failf(exitUsage, "option %q has no name; write KEY or KEY=VALUE", unescape(item))
	}
	info := optionByKey[key]
	if info == nil && maskName(key) {
		// mask=passthrough,tmpfile would otherwise mask passthrough
		// alone and ignore "tmpfile" with a warning.
		return failf(exitUsage, "unknown option %q; the names of mask= are joined with \"+\", not \",\": write mask=A+%s", key, key)
	}
	if info == nil {
		if near := typoOf(key); near != "" {
			return failf(exitUsage, "unknown option %q; did you mean %s? fix the option string", key, near)
		}
		// fuse-overlayfs ignores unknown options too ("unknown argument
		// ignored"), which lets callers pass kernel-overlayfs options.
		st.warnOnce(key, "unknown option %q ignored", key)
		return nil
	}
	switch info.Status {
	case optNotYet:
		st.warnOnce(key, "option %q is not implemented yet, ignored", key)
		return nil
	case optIgnored:
		return nil
	}
	if info.Arg == "" && hasValue {
		return failf(exitUsage, "option %q takes no value (got %q); write just %s", key, unescape(item), key)
	}
	if info.Arg != "" && (!hasValue || raw == "") {
		if !hasValue && maskName(key) {
			return failf(exitUsage, "option %q needs a value, as in %s=%s; the names of mask= are joined with \"+\", not \",\": write mask=A+%s", key, key, info.Arg, key)
		}
		return failf(exitUsage, "option %q needs a value, as in %s=%s", key, key, info.Arg)
	}
	if info.Arg != "" {
		if st.given[key] {
			st.warnOnce(key+"=", "option %q given more than once; the last one wins", key)
		}
		st.given[key] = true
	}
	return st.set(key, raw)
}

// set stores a known, well-formed option.
func (st *optState) set(key, raw string) error {
	c := st.cfg
	switch key {
	case "lowerdir":
		dirs, err := splitLowerdir(raw)
		if err != nil {
			return err
		}
		c.Lower = dirs
	case "upperdir":
		c.Upper = unescape(raw)
	case "workdir":
		c.Work = unescape(raw)
	case "fsname":
		c.FsName = unescape(raw)
	case "userxattr":
		c.UserXattr = true
	case "allow_other":
		c.AllowOther = true
	case "debug":
		c.Debug = true
	case "fsync":
		on, err := switchValue(key, raw, "1", "0")
		c.NoFsync = !on
		if err != nil {
			return err
		}
	case "volatile":
		c.NoFsync = true
	case "nosec":
		mode, err := overlay.ParseNoSec(unescape(raw))
		if err != nil {
			return failf(exitUsage, "option \"nosec\" is inherit, on or off, not %q; write nosec=inherit, nosec=on or nosec=off", unescape(raw))
		}
		c.NoSec = mode
	case "passthrough":
		on, err := switchValue(key, raw, "on", "off")
		c.NoPassthrough = !on
		if err != nil {
			return err
		}
		c.passthroughOn = on
	case "sharecache":
		on, err := switchValue(key, raw, "on", "off")
		if err != nil {
			return err
		}
		c.ShareCache = on
	case "daemon":
		shared, err := switchValue(key, raw, "shared", "own")
		if err != nil {
			return err
		}
		c.Shared = shared
	case "noopen":
		on, err := switchValue(key, raw, "1", "0")
		if err != nil {
			return err
		}
		c.noOpenGiven, c.OpenRequests = true, !on
	case "writeback":
		switch v := unescape(raw); v {
		case "0", "1":
			c.Writeback = map[string]overlay.WritebackMode{"0": overlay.WritebackOff, "1": overlay.WritebackOn}[v]
		default:
			return failf(exitUsage, "option \"writeback\" is 0 or 1, not %q; write writeback=0 or writeback=1", v)
		}
	case "uring":
		on, err := switchValue(key, raw, "1", "0")
		if err != nil {
			return err
		}
		c.NoUring = !on
	case "mask":
		m, err := overlay.ParseMask(unescape(raw))
		if err != nil {
			return failf(exitUsage, "option \"mask\": %v", err)
		}
		c.Mask = m
	case "noacl":
		c.NoACL = true
	case "static_nlink":
		c.StaticNlink = true
	case "uidmapping", "gidmapping":
		m, err := overlay.ParseIDMaps(unescape(raw))
		if err != nil {
			return failf(exitUsage, "option %q: %v", key, err)
		}
		if key == "uidmapping" {
			c.Owners.UIDs = m
		} else {
			c.Owners.GIDs = m
		}
	case "squash_to_root":
		c.squashRoot = true
	case "squash_to_uid", "squash_to_gid":
		n, err := strconv.ParseUint(unescape(raw), 10, 32)
		if err != nil {
			return failf(exitUsage, "option %q takes a numeric id, not %q", key, unescape(raw))
		}
		id := uint32(n)
		if key == "squash_to_uid" {
			c.Owners.SquashUID = &id
		} else {
			c.Owners.SquashGID = &id
		}
	case "xattr_permissions":
		v := unescape(raw)
		n, err := strconv.Atoi(v)
		if err != nil || !overlay.ValidXattrPermissions(n) {
			return failf(exitUsage, "option \"xattr_permissions\" is 0, 1 or 2, not %q; write xattr_permissions=2 for user.containers.override_stat", v)
		}
		c.XattrPermissions = n
	case "redirect_dir":
		switch v := unescape(raw); v {
		case "on", "off", "follow", "nofollow":
			c.RedirectDirOff = v != "on"
			c.redirectGiven = v
		default:
			return failf(exitUsage, "option \"redirect_dir\" is on, off, follow or nofollow, not %q; write redirect_dir=on or redirect_dir=off", v)
		}
	case "metacopy":
		on, err := switchValue(key, raw, "on", "off")
		c.Metacopy = on
		if err != nil {
			return err
		}
	case "default_permissions":
		// Always on: overlay.FS lets the kernel check permissions.
	default: // kernel flags, "ro" among them
		st.flags = append(st.flags, key)
	}
	return nil
}

// maskName reports whether key is a name mask= takes (a profile or a
// feature), given as an option of its own.
func maskName(key string) bool {
	_, err := overlay.ParseMask(key)
	return err == nil
}

// switchValue reads the value of an option that turns something on or off,
// spelled on and off (1 and 0, say, as optionTable lists them).
func switchValue(key, raw, on, off string) (bool, error) {
	switch v := unescape(raw); v {
	case on:
		return true, nil
	case off:
		return false, nil
	default:
		return false, failf(exitUsage, "option %q is %s or %s, not %q; write %s=%s or %s=%s", key, on, off, v, key, on, key, off)
	}
}

// finish resolves the kernel flags once every -o string is in, and
// refuses options that exclude each other.
func (st *optState) finish() error {
	c := st.cfg
	if c.Metacopy {
		// Linux: fs/overlayfs/params.c ovl_fs_params_verify(): metacopy
		// needs redirects to find a moved file's data, and turns
		// redirect_dir on unless it was set to something else; it
		// trusts the upper layer's xattrs, which user.* ones cannot be.
		if c.redirectGiven != "" && c.redirectGiven != "on" {
			return failf(exitUsage, "option \"metacopy=on\" needs redirect_dir=on, not redirect_dir=%s; drop one of them", c.redirectGiven)
		}
		if c.UserXattr {
			return failf(exitUsage, "option \"metacopy=on\" cannot be used with userxattr (the kernel overlay refuses it too: unprivileged users could forge metacopy files); drop one of them")
		}
		c.RedirectDirOff = false
	}
	c.KernelOptions = st.resolveFlags()
	if c.squashRoot {
		// squash_to_uid/gid win over squash_to_root (fuse-overlayfs).
		var zero uint32
		if c.Owners.SquashUID == nil {
			c.Owners.SquashUID = &zero
		}
		if c.Owners.SquashGID == nil {
			c.Owners.SquashGID = &zero
		}
	}
	c.ReadOnly = slices.Contains(c.KernelOptions, "ro")
	return nil
}

// resolveFlags turns the flags as given into what the kernel gets. Flags
// that only restate a default are dropped. Of an opposite pair that limits
// what the mount allows, the restrictive one wins whatever the order, so a
// caller appending "suid" cannot undo another's "nosuid". The atime family
// only tunes behaviour, so there the last one wins: of noatime, atime,
// relatime, norelatime, strictatime and nostrictatime, of nodiratime and
// diratime, of lazytime and nolazytime. The daemon applies the atime
// flags itself (overlay/atime.go); the kernel gets them for /proc/mounts.
// "suid" and "dev" are not defaults on FUSE (the kernel mount defaults to
// nosuid,nodev, as libfuse and go-fuse do), so they are passed on.
func (st *optState) resolveFlags() []string {
	has := map[string]bool{}
	for _, f := range st.flags {
		has[f] = true
	}
	last := func(names ...string) string {
		for i := len(st.flags) - 1; i >= 0; i-- {
			if slices.Contains(names, st.flags[i]) {
				return st.flags[i]
			}
		}
		return ""
	}
	var out []string
	restrictive := func(strict, loose string, keepLoose bool) {
		switch {
		case has[strict] && has[loose]:
			st.warnOnce(strict+"/"+loose, "options %q and %q both given; %q wins", strict, loose, strict)
			out = append(out, strict)
		case has[strict]:
			out = append(out, strict)
		case has[loose] && keepLoose:
			out = append(out, loose)
		}
	}
	restrictive("ro", "rw", false)
	restrictive("nosuid", "suid", true)
	restrictive("nodev", "dev", true)
	restrictive("noexec", "exec", false)
	restrictive("sync", "async", false)
	if has["dirsync"] {
		out = append(out, "dirsync")
	}
	if last("lazytime", "nolazytime") == "lazytime" {
		out = append(out, "lazytime")
	}
	switch f := last("noatime", "atime", "relatime", "norelatime", "strictatime", "nostrictatime"); f {
	case "noatime", "strictatime":
		out = append(out, f)
	}
	if last("nodiratime", "diratime") == "nodiratime" {
		out = append(out, "nodiratime")
	}
	return out
}

// splitOptions splits an option string on commas into options in escaped
// form: a backslash escape is kept as it is (so that lowerdir can still
// tell "\:" from ":"), and a double-quoted stretch loses its quotes and has
// its special characters escaped instead, so quoting and escaping mean the
// same thing from here on. containers/storage quotes SELinux labels
// (context="system_u:object_r:container_file_t:s0:c1,c2"), whose commas
// must not split. A lone backslash at the very end stands for itself.
func splitOptions(s string) ([]string, error) {
	var items []string
	var cur strings.Builder
	inQuote := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inQuote && c == '"':
			inQuote = false
		case inQuote:
			if strings.IndexByte(`\,:="`, c) >= 0 {
				cur.WriteByte('\\')
			}
			cur.WriteByte(c)
		case c == '"':
			inQuote = true
		case c == '\\' && i+1 < len(s):
			cur.WriteByte(c)
			cur.WriteByte(s[i+1])
			i++
		case c == '\\':
			cur.WriteString(`\\`)
		case c == ',':
			items = append(items, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	if inQuote {
		return nil, failf(exitUsage, "unterminated quote in option string %q; close the quote", s)
	}
	return append(items, cur.String()), nil
}

// cutUnescaped is strings.Cut for escaped text: it splits at the first sep
// that is not preceded by an escaping backslash.
func cutUnescaped(s string, sep byte) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case sep:
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// splitUnescaped splits escaped text at every unescaped sep.
func splitUnescaped(s string, sep byte) []string {
	var parts []string
	for {
		before, after, found := cutUnescaped(s, sep)
		parts = append(parts, before)
		if !found {
			return parts
		}
		s = after
	}
}

// unescape turns escaped text into the literal value: "\x" becomes "x".
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// splitLowerdir splits lowerdir's escaped value into its layers. Kernel
// overlayfs reads "::" as the start of data-only layers; goverlay has no
// such layers, and an empty path is a typo anyway, so both are errors
// rather than silently dropped layers.
func splitLowerdir(raw string) ([]string, error) {
	parts := splitUnescaped(raw, ':')
	dirs := make([]string, 0, len(parts))
	for i, p := range parts {
		if p != "" {
			dirs = append(dirs, unescape(p))
			continue
		}
		if i > 0 && i < len(parts)-1 {
			return nil, failf(exitUsage, "lowerdir %q has an empty layer between colons; data-only layers (\"::\") are not supported, remove the extra colon", raw)
		}
		return nil, failf(exitUsage, "lowerdir %q starts or ends with a colon; remove the stray colon", raw)
	}
	return dirs, nil
}
