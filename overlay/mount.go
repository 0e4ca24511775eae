package overlay

import (
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/fuseserve"
	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/privs"
	"github.com/goverlay/goverlay/upper"
)

// Options configure one overlay mount. Paths are absolute and have been
// validated by the caller (cmd/goverlay): they exist, are directories and do
// not nest in one another or in the mountpoint.
type Options struct {
	// Lower are the read-only layers, topmost first.
	Lower []string
	// Upper and Work are the writable layer and its scratch directory, on
	// one filesystem. Both empty makes a read-only mount.
	Upper, Work string

	// UserXattr selects the "user.overlay." xattr namespace for what the
	// overlay writes (Linux: -o userxattr).
	UserXattr bool
	// NoFsync skips the fsync of a copy-up before it is published
	// (-o fsync=0, volatile).
	NoFsync bool
	// NoSec is the -o nosec= setting.
	NoSec NoSecMode
	// OpenRequests makes every open(2) of a regular file a request
	// (-o noopen=0), which passthrough needs; without it the kernel
	// opens files by itself (noopen.go).
	OpenRequests bool
	// Passthrough lets the kernel read and write upper files directly
	// (Linux 6.9+, root; only with OpenRequests); see passthrough.go.
	Passthrough bool
	// ShareCache opens files still in a lower layer with passthrough to
	// the lower file, so that every mount of a layer maps and reads the
	// same pages (-o sharecache=on; only with OpenRequests and
	// Passthrough; passthrough.go).
	ShareCache bool
	// Writeback is the -o writeback= setting: the kernel's writeback
	// cache, by default where passthrough is not granted (writeback.go).
	Writeback WritebackMode
	// NoACL turns off POSIX ACL enforcement (-o noacl).
	NoACL bool
	// StaticNlink reports a link count of 1 for every directory, which
	// saves counting subdirectories (-o static_nlink, fuse-overlayfs).
	StaticNlink bool
	// Owners maps or squashes file owners (uidmapping=, gidmapping=,
	// squash_to_uid=, squash_to_gid=, squash_to_root); the zero value
	// shows them as they are on disk.
	Owners Owners
	// XattrPermissions keeps the upper layer's owners and modes in an
	// xattr (-o xattr_permissions, xperm.go): 0 for real, 1 in
	// security.fuseoverlayfs.override_stat, 2 in
	// user.containers.override_stat.
	XattrPermissions int
	// RedirectDirOff refuses to move directories that have lower
	// instances (EXDEV), as the kernel with redirect_dir=off; by default
	// they move with a redirect (-o redirect_dir=on).
	RedirectDirOff bool
	// NoUring serves every request over /dev/fuse even where the kernel
	// offers FUSE over io_uring (-o uring=0; fuseserve/uring.go).
	NoUring bool
	// Metacopy copies up the metadata of a lower regular file alone
	// where the data is not changed (-o metacopy=on; metacopy.go), and
	// follows metacopy files found on disk to their data; without it
	// those are refused, as the kernel refuses them with metacopy=off.
	Metacopy bool
	// Mask names kernel features to behave as if the kernel lacked
	// (-o mask=, mask.go), so that their fallbacks run.
	Mask Mask
	// FDBudget is how many fds the mount's caches may keep open: the
	// layers' directory fds take up to a quarter of it (at least 64, at
	// most 65,536; lower.NewCachesBudget), the files opened without a
	// request an eighth (at least 16, at most 1,024; noopen.go
	// ringSize). 0 sizes them from what the process may open
	// (RLIMIT_NOFILE) instead, which suits a process serving one mount;
	// a process serving several gives each its share, or together they
	// may run it out of fds (EMFILE). Not counted: the files
	// applications hold open through the mount (with OpenRequests, one
	// fd of the daemon's each, for as long as they do), and the mount's
	// own few (the layers' roots, /dev/fuse).
	FDBudget int

	// FsName is the mount's source as /proc/mounts shows it.
	FsName string
	// AllowOther lets users other than the mounter in; it is only
	// useful together with DefaultPermissions, which makes the kernel
	// check modes and ACLs the way it does on a local filesystem.
	AllowOther bool
	// KernelOptions are mount flags passed through to the kernel as they
	// are: nosuid, nodev, noexec, noatime, ... Those of the atime family
	// (noatime, strictatime, nodiratime; relatime is the default) are
	// the daemon's to apply too (atime.go).
	KernelOptions []string

	// Debug logs every FUSE request.
	Debug bool
	// Verbose logs what was decided at mount time (NOSEC on or off, and
	// why), which goverlay stats reports anyway; cmd/goverlay sets it
	// with -d or --log, so that a plain mount prints nothing.
	Verbose bool
	// Logger receives warnings and decisions; nil means the standard
	// logger.
	Logger *log.Logger

	// Recover keeps a panic of the mount's from ending the process, for
	// a process that serves several mounts (guard.go). A panic while
	// serving a request is answered EIO with or without it: go-fuse
	// recovers it. With Recover, a panic in the mount's work outside a
	// request (the goroutines it starts, its INIT and unmount
	// callbacks, the runtime cleanups of its nodes) abandons that work
	// instead of ending the process; without it, such a panic ends the
	// process, as it always did. A panic recovered either way is logged
	// on Logger with its value and stack, once, and counted
	// (Stats.InternalErrors), and the mount goes on serving, but for
	// what needs a lock the panicking code held.
	Recover bool
	// Shared says the process serves other mounts too (goverlay -o
	// daemon=shared): the transport leaves GOMAXPROCS alone
	// (fuseserve.Options.Shared). Such a process also wants Recover and
	// an FDBudget.
	Shared bool
}

// FS is an overlay ready to be mounted.
type FS struct {
	opts   Options
	layers []*lower.Layer // topmost first; layers[0] is the upper when there is one
	upper  *upper.Layer   // nil on a read-only mount
	ino    *inoMap
	log    *log.Logger
	stats  stats
	raw    *rawFS
	// guard logs and counts the mount's panics (guard.go).
	guard *guard
	// statWalk is when, in Unix nanoseconds, READDIRPLUS stops giving
	// the attributes of every entry (listattrs.go).
	statWalk atomic.Int64
	// readWalk is when, in Unix nanoseconds, a LOOKUP of a file stops
	// starting the read of its data; lastLookup is the file the kernel
	// looked up last (prefetch.go).
	readWalk   atomic.Int64
	lastLookup atomic.Pointer[node]

	// nosec says FUSE_HANDLE_KILLPRIV_V2 is negotiated: the kernel trusts
	// S_NOSEC and goverlay removes privileges itself (nosecWhy says why).
	nosec    bool
	nosecWhy string
	privs    privs.Counters
	// io is the write data path: passthrough, writeback cache or
	// neither (writeback.go), settled by New and Mount; passthrough and
	// writeback are io's for the request handlers, which may run before
	// Mount has settled what the kernel grants.
	io                     ioMode
	passthrough, writeback atomic.Bool
	// refusedOnce logs the first backing file the kernel refused for a
	// reason of the file's own (passthroughRefused).
	refusedOnce sync.Once
	// kernelACLs says FUSE_POSIX_ACL is negotiated: the kernel then
	// drops a file's attributes itself after it sets or removes an ACL
	// (fuse_set_acl()).
	kernelACLs atomic.Bool
	// atime is when reads update the upper layer's access times
	// (atime.go).
	atime lower.Atime
	// initIn is the kernel's INIT as goverlay takes it (kernelInit),
	// once mounted; kernelMinor the protocol minor the kernel sent.
	initIn      atomic.Pointer[fuse.InitIn]
	kernelMinor atomic.Uint32

	// overrides is set when a layer keeps owners in an xattr (xperm.go).
	overrides bool

	// caches are the layers' directory fds, listings and probes
	// (lower.Caches, which says when each entry goes).
	caches *lower.Caches

	// statsSock is the control socket (statsock.go), nil without one.
	statsSock *statsServer
	// root is the mount's root directory, once mounted.
	root *node
	// srv serves the mount's requests (fuseserve), once mounted.
	srv *fuseserve.Server
	// served is srv for the request handlers, which may run before
	// Mount has set srv (willWait).
	served atomic.Pointer[fuseserve.Server]
	// upperFiles maps upper files to their nodes (links.go).
	upperFiles upperFiles
	// fds bounds the open files nodes keep for requests on files
	// opened without a request (noopen.go).
	fds fdRing
	// keptIDs maps the upper instance of a directory this mount moved
	// with a redirect to the identity the kernel knows it by
	// (keepIdentity). An entry goes when its directory is removed
	// (remove) or replaced by a rename (Rename); moving the directory
	// again replaces it (the upper
	// instance keeps its inode). So it holds at most one entry per
	// directory this mount moved that still exists.
	keptIDs sync.Map // devIno → fs.StableAttr
	// redirectWarned is when a malformed redirect was last logged
	// (warnRedirect), in Unix nanoseconds.
	redirectWarned atomic.Int64
	// metacopyWarned is the same for metacopy files (warnMetacopy).
	metacopyWarned atomic.Int64
	// hooks are the tests' (hooks.go).
	hooks hooks
}

// ErrInUse is New's error when the upperdir or workdir belongs to another
// live mount (upper.ErrInUse).
var ErrInUse = upper.ErrInUse

// New opens the layers described by o. Nothing is mounted yet.
func New(o Options) (*FS, error) {
	if len(o.Lower) == 0 {
		return nil, fmt.Errorf("no lower layer")
	}
	if (o.Upper == "") != (o.Work == "") {
		return nil, fmt.Errorf("upperdir and workdir go together")
	}
	if o.FDBudget < 0 {
		return nil, fmt.Errorf("fd budget %d: want 0 (from RLIMIT_NOFILE) or more", o.FDBudget)
	}
	f := &FS{opts: o, log: o.Logger, caches: lower.NewCachesBudget(o.FDBudget), atime: atimeOf(o.KernelOptions)}
	f.fds.budget = o.FDBudget
	if f.log == nil {
		f.log = log.New(os.Stderr, "goverlay: ", 0)
	}
	f.guard = &guard{recover: o.Recover, log: f.log}
	wfd := -1
	if o.Upper != "" {
		// The upper layer and its workdir, through one clone of their
		// mount (lower/mounts.go).
		l, fd, err := lower.OpenUpperMasked(o.Upper, o.Work, f.atime, o.Mask.syscalls())
		if err != nil {
			return nil, err
		}
		l.Caches = f.caches // one set for the mount's layers
		f.layers, wfd = append(f.layers, l), fd
	}
	for _, p := range o.Lower {
		l, err := lower.OpenLayerMasked(p, len(f.layers), false, o.Mask.syscalls())
		if err != nil {
			if wfd >= 0 {
				unix.Close(wfd)
			}
			f.Close()
			return nil, err
		}
		l.Caches = f.caches // one set for the mount's layers
		f.layers = append(f.layers, l)
	}
	if err := f.setupIDMappedLayers(); err != nil {
		f.Close()
		return nil, err
	}
	if o.Upper != "" {
		prefix := lower.TrustedPrefix
		if o.UserXattr {
			prefix = lower.UserPrefix
		}
		u, err := upper.OpenAt(f.layers[0], wfd, o.Work, upper.Options{XattrPrefix: prefix, NoFsync: o.NoFsync})
		if err != nil {
			f.Close()
			return nil, err
		}
		f.upper = u
		if u.Whiteouts != upper.KernelWhiteouts {
			f.log.Printf("upper %s refuses char 0/0 whiteouts: deletions are written as .wh. files", o.Upper)
		}
		if f.opts.Metacopy {
			if err := u.ProbeMetacopy(); err != nil {
				// As the kernel falls back (ovl_make_workdir()).
				f.log.Printf("upper %s cannot hold the metacopy xattr (%v): falling back to metacopy=off", o.Upper, err)
				f.opts.Metacopy = false
			}
		}
	}
	for _, l := range f.layers {
		l.Metacopy = f.opts.Metacopy
		if !l.Cloned() && o.Debug {
			f.log.Printf("layer %s is used in place (no private clone of its mount: open_tree(2) needs CAP_SYS_ADMIN): mounts inside it are not entered (EXDEV)", l.Path)
		}
	}
	if err := f.setupOverrides(); err != nil {
		f.Close()
		return nil, err
	}
	f.ino = newInoMap(f.layers)
	f.layers[0].Root().Do(func(fd int) error {
		f.nosec, f.nosecWhy = decideNoSec(o.NoSec, fd, f.ReadOnly())
		return nil
	})
	if f.nosec && f.layers[0].Override != lower.OverrideNone {
		// Set-id bits live in the xattr, where goverlay's privilege
		// removal (privs.Strip) does not look; the kernel removes
		// them itself, through SETATTR, when NOSEC is off.
		f.nosec, f.nosecWhy = false, "xattr_permissions keeps modes in an xattr; the kernel removes privileges through SETATTR"
	}
	if f.nosec && o.Mask.has(featKillprivV2) {
		// As on a kernel before 5.11: NOSEC rests on the kill flags
		// of FUSE_HANDLE_KILLPRIV_V2, without which the kernel removes
		// privileges itself, through SETATTR and REMOVEXATTR.
		f.nosec, f.nosecWhy = false, o.Mask.because(featKillprivV2)+": the kernel removes privileges through SETATTR and REMOVEXATTR"
	}
	f.io = decideIO(o, f.ReadOnly())
	f.passthrough.Store(f.io.passthrough)
	f.writeback.Store(f.io.writeback)
	return f, nil
}

// Close releases the layers. It is called after the mount is gone.
func (f *FS) Close() {
	// The kernel ended the rings' entries at the unmount, unless the
	// mount lives on elsewhere (fuseserve.Server.Close).
	f.srv.Close()
	if f.upper != nil {
		// Files opened without a request are removed from the
		// workdir at their FORGET, which the kernel does not send
		// for the inodes it still holds at an unmount (noopen.go).
		if err := f.upper.Clean(); err != nil {
			f.log.Printf("cannot empty the workdir at unmount: %v", err)
		}
		f.upper.Close()
	}
	for _, l := range f.layers {
		l.Close()
	}
	// The stats socket goes last: a mount of the same layers on the
	// same mountpoint waits for it to stop answering, in a process
	// that serves other mounts and so does not exit (goverlay's
	// checkSameMount), and must then find the layers released.
	if f.statsSock != nil {
		f.statsSock.close()
	}
}

// willWait tells the transport that the request being served is about
// to wait for another request (fuseserve.Server.WillWait).
func (f *FS) willWait() {
	if srv := f.served.Load(); srv != nil {
		srv.WillWait()
	}
}

// ReadOnly reports whether the mount has no upper layer.
func (f *FS) ReadOnly() bool { return f.upper == nil }

// Server is a mounted overlay: its Unmount takes the mount down, its Wait
// returns once the mount is gone.
type Server = fuseserve.Server

// FusermountError is Mount's error when fusermount3 refused to mount.
type FusermountError = fuseserve.FusermountError

// Mount mounts the overlay on mountpoint and starts serving it. It returns
// once the kernel has accepted the mount.
func (f *FS) Mount(mountpoint string) (*Server, error) {
	// The control socket is named after the mountpoint's path, resolved
	// before the mount is on it.
	resolved := resolveMountpoint(mountpoint)
	root := f.newRoot()
	f.root = root
	opts := f.fsOptions()
	f.raw = &rawFS{RawFileSystem: fs.NewNodeFS(root, opts), stats: &f.stats, guard: f.guard, noOpen: f.io.noOpen,
		listEvery: f.atime.Mode == lower.Strictatime && !f.atime.NoDirs,
		mask:      maskedReplies(f.opts.Mask)}
	uring := !f.opts.NoUring && !f.opts.Mask.has(featUring)
	srv, err := fuseserve.Mount(f.raw, mountpoint, &opts.MountOptions, fuseserve.Options{Uring: uring, Logger: f.log, Shared: f.opts.Shared})
	if err != nil {
		return nil, err
	}
	f.srv = srv
	f.served.Store(srv)
	f.initIn.Store(f.kernelInit(srv.Server))
	f.kernelMinor.Store(srv.KernelSettings().Minor)
	f.granted(srv.Server)
	f.teachNoOpen(mountpoint)
	// One notice per mount, with -d or --log: the two decisions that
	// shape every write (goverlay stats shows them always).
	if f.opts.Verbose || f.opts.Debug {
		f.log.Printf("NOSEC %s: %s; %s", map[bool]string{true: "on", false: "off"}[f.nosec], f.nosecWhy, f.ioSummary())
	}
	if f.statsSock, err = f.serveStats(resolved, os.Getpid()); err != nil {
		// The mount works without it; `goverlay stats` will say so.
		f.log.Printf("%v", err)
	}
	return srv, nil
}

// fsOptions sets every go-fuse option, each with its reason.
func (f *FS) fsOptions() *fs.Options {
	entry, attr, negative := trustTimeout, trustTimeout, trustTimeout
	o := &fs.Options{
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &negative,
		// Modes are the layers' own; 0000 files stay 0000.
		NullPermissions: true,
		Logger:          f.log,
		RootStableAttr:  &fs.StableAttr{Ino: f.rootIno()},
	}
	mo := &o.MountOptions
	mo.FsName = f.opts.FsName
	// /proc/mounts shows fuse.goverlay, which mount(8) maps back to us.
	mo.Name = "goverlay"
	mo.Debug = f.opts.Debug
	mo.AllowOther = f.opts.AllowOther
	mo.Logger = f.log
	// go-fuse recovers a request's panic and answers with what this
	// returns. The daemon goes on serving the other requests, so the
	// panic is logged with its stack and counted (`goverlay stats`:
	// internal errors) rather than lost in an EIO (guard.go).
	mo.PanicHandler = f.guard.panicked
	// The kernel checks permissions against the modes we report, as it
	// does for a local filesystem; we never check them ourselves. With
	// FUSE_POSIX_ACL it enforces ACLs too (the kernel overlay does).
	mo.Options = append(mo.Options, "default_permissions")
	mo.EnableAcl = !f.opts.NoACL
	if mo.EnableAcl {
		// A new object in a directory with a default ACL gets its
		// mode from the ACL, not from the umask: the kernel must send
		// the mode unmasked, with the umask beside it, for us to
		// choose (create.go inherit).
		mo.ExtraCapabilities |= fuse.CAP_DONT_MASK
	}
	// READ replies are pread into the request's buffer and written with
	// the header, not spliced. go-fuse's splice pipes come from os.Pipe,
	// which registers them with the Go runtime's epoll: every splice into
	// or out of a pipe is an edge that wakes the thread parked in
	// epoll_pwait, for nothing, about one wakeup per READ. A cold read of
	// 30,000 files cost 1.6 times the daemon CPU that way
	// (docs/BENCHMARKS.md, "Container workloads: where the time goes").
	mo.DisableSplice = true
	mo.DirectMountFlags = unix.MS_NOSUID | unix.MS_NODEV
	if f.ReadOnly() {
		// No upper layer: the kernel refuses writes with EROFS.
		mo.DirectMountFlags |= unix.MS_RDONLY
		mo.Options = append(mo.Options, "ro")
	}
	for _, k := range f.opts.KernelOptions {
		// mount(2) takes the per-mount flags as bits, not as text
		// (go-fuse translates suid, dev and exec itself).
		if bit, ok := mountFlags[k]; ok {
			mo.DirectMountFlags |= bit
			if os.Geteuid() == 0 || k == "ro" {
				continue
			}
			// fusermount3 takes some of them as text. The daemon
			// applies strictatime and nodiratime itself (atime.go):
			// only /proc/mounts goes without them.
			if k != "noatime" {
				if k != "strictatime" && k != "nodiratime" {
					f.log.Printf("option %s needs root; ignored", k)
				}
				continue
			}
		}
		mo.Options = append(mo.Options, k)
	}
	// READDIRPLUS only where it pays: for the first batch of a listing,
	// and for later batches once the kernel saw the names looked up
	// (ls -l, find). A listing read for its names alone (readdir(3),
	// glob) then costs no lookup per entry in the daemon.
	mo.ExtraCapabilities |= fuse.CAP_READDIRPLUS_AUTO
	if f.nosec {
		// The kernel sets SB_NOSEC on the mount and stops asking for
		// security.capability on every write; we remove privileges
		// when its KILL_SUIDGID flags say so (rawFS, killPrivs).
		mo.ExtraCapabilities |= fuse.CAP_HANDLE_KILLPRIV_V2
	}
	if f.nosec && !f.io.noOpen {
		// O_TRUNC reaches OPEN, so that a truncating open copies a
		// lower file up without its data instead of copying it and
		// truncating. Only with KILLPRIV_V2: then the OPEN carries
		// FUSE_OPEN_KILL_SUIDGID. Without it the kernel clears suid
		// and sgid of a truncating open in the SETATTR that atomic
		// O_TRUNC does away with, and nobody would. Never without
		// OPEN requests (noopen.go): the kernel would take the
		// truncation for done by an OPEN it never sent
		// (fuse_do_setattr() skips the SETATTR of ATTR_OPEN).
		mo.ExtraCapabilities |= fuse.CAP_ATOMIC_O_TRUNC
	}
	if f.io.writeback {
		// write(2) fills the page cache and returns (writeback.go);
		// the kernel then offers no passthrough.
		mo.ExtraCapabilities |= fuse.CAP_WRITEBACK_CACHE
	}
	if !f.io.passthrough {
		mo.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	// Last, as go-fuse applies it last: what the mask hides is never
	// asked for (mask.go).
	mo.DisabledCapabilities |= f.opts.Mask.initFlags()
	return o
}

// mountFlags are the kernel options mount(2) wants as MS_* bits.
var mountFlags = map[string]uintptr{
	"ro":          unix.MS_RDONLY,
	"noatime":     unix.MS_NOATIME,
	"nodiratime":  unix.MS_NODIRATIME,
	"relatime":    unix.MS_RELATIME,
	"strictatime": unix.MS_STRICTATIME,
	"sync":        unix.MS_SYNCHRONOUS,
	"dirsync":     unix.MS_DIRSYNC,
	"lazytime":    unix.MS_LAZYTIME,
}

// How long the kernel may keep names and attributes (the fast-exec policy,
// overlay/fastexec.go). The lower layers are read-only by contract and the
// upper changes only through this mount, whose every change either reaches
// the kernel in the operation's own reply or is notified (NotifyEntry), so
// what the kernel was told stays true: it may keep it as long as it likes.
// Restricted directories (not searchable by everyone, or with an ACL) get
// restrictedTimeout for their attributes, so the kernel's permission check
// on them refreshes now and then.
const (
	trustTimeout      = time.Hour
	restrictedTimeout = time.Second
)
