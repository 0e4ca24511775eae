package overlay

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/goverlay/goverlay/lower"
)

// Behaving as on an older kernel (-o mask=).
//
// Container hosts run long-term kernels (RHEL 9's 5.14, Ubuntu 22.04's
// 5.15, Debian 12's 6.1, Ubuntu 24.04's 6.8), which lack features goverlay
// uses where they are there (kernel.go), each with a fallback. A mask
// names features for goverlay to behave as if the kernel lacked, so that
// the fallbacks run, and the suites with them, on a kernel that has every
// feature:
//
//   - FUSE INIT flags: a masked one goes into go-fuse's
//     DisabledCapabilities, which go-fuse clears from its INIT reply last
//     (fuse/opcode.go doInit(), after its own choices and
//     ExtraCapabilities), so the reply never asks for it and the kernel
//     serves the mount as one without it would; what goverlay reads of
//     the kernel's offer goes through kernelInit, which drops the masked
//     flags too. go-fuse reads INIT itself, with no hook before it
//     decides.
//   - Flags of an OPEN, CREATE, TMPFILE or OPENDIR reply (FOPEN_*) that an
//     older kernel ignores are dropped from the reply (rawFS.opened,
//     rawFS.OpenDir); opcodes it never sends are answered ENOSYS, after
//     which the kernel sends them no more and answers the caller as a
//     kernel without them does (FUSE_TMPFILE: EOPNOTSUPP, fuse_tmpfile()).
//   - Zero-message opens (FUSE_NO_OPEN_SUPPORT, FUSE_NO_OPENDIR_SUPPORT) are
//     the kernel's offer to take an OPEN or OPENDIR answered ENOSYS for
//     "open it yourself"; masked, goverlay serves those requests.
//   - System calls: the layers take them for absent (lower/features.go).
//
// A profile, linux-MAJOR.MINOR, masks every feature below that came after
// that release; the versions are upstream's (a distribution kernel may
// have more backported). The FUSE protocol minor that goverlay reads the
// kernel's INIT as is capped at the release's too (profileMinors).
// goverlay's notifications (FUSE_NOTIFY_INVAL_INODE and
// FUSE_NOTIFY_INVAL_ENTRY, protocol 7.12) are in every kernel it runs on.
//
// Not listed: features goverlay never asks for (FUSE_SECURITY_CTX 5.17,
// FUSE_HAS_INODE_DAX 5.17, FUSE_HAS_EXPIRE_ONLY 6.1, FUSE_CREATE_SUPP_GROUP
// 6.2, FUSE_DIRECT_IO_ALLOW_MMAP 6.6, FUSE_NO_EXPORT_SUPPORT and
// FUSE_HAS_RESEND 6.9, FUSE_REQUEST_TIMEOUT 6.14), and requests it answers
// ENOSYS anyway (FUSE_SYNCFS 5.14, FUSE_STATX 6.6): masking them would
// change nothing the kernel sends.

// featureID names one feature of the table.
type featureID int

const (
	featInitExt featureID = iota
	featPassthrough
	featAllowIdmap
	featUring
	featKillprivV2
	featAtomicOTrunc
	featDontMask
	featReaddirplus
	featReaddirplusAuto
	featWritebackCache
	featPosixACL
	featNoOpen
	featNoOpendir
	featCacheDir
	featNoflush
	featTmpfile
	featOpenTree
	featMountSetattr
	featStatxMntID
	featFchmodat2
	featXattrAt
	numFeatures
)

// feature is one thing of the kernel goverlay uses where it is there.
type feature struct {
	name string
	// since is the Linux release that brought it; {0, 0} for one older
	// than MinKernel, which no profile masks. proto is the FUSE
	// protocol minor that brought it (include/uapi/linux/fuse.h), 0
	// for a system call.
	since [2]int
	proto uint32
	// init are the INIT flags the reply does not ask for; open the
	// FOPEN_* flags dropped from open replies; sys the system calls
	// the layers take for absent.
	init uint64
	open uint32
	sys  lower.Features
	// implies are features that a kernel without this one lacks too,
	// or that goverlay cannot use without it.
	implies []featureID
}

// flags2 are the INIT flags of fuse_init_in's flags2, which only a kernel
// with FUSE_INIT_EXT sends.
const flags2 = uint64(0xFFFFFFFF) << 32

// features are the table; each comment says what goes where the feature
// is masked.
var features = [numFeatures]feature{
	// FUSE_INIT_EXT: no INIT flag above bit 31, so none of the next
	// three.
	featInitExt: {name: "init_ext", since: [2]int{5, 17}, proto: 36,
		init: fuse.CAP_INIT_EXT | flags2, implies: []featureID{featPassthrough, featAllowIdmap, featUring}},
	// FUSE_PASSTHROUGH: the writeback cache instead (writeback.go).
	featPassthrough: {name: "passthrough", since: [2]int{6, 9}, proto: 40, init: fuse.CAP_PASSTHROUGH},
	// FUSE_ALLOW_IDMAP: the mount cannot be id-mapped.
	featAllowIdmap: {name: "allow_idmap", since: [2]int{6, 12}, proto: 41, init: fuse.CAP_ALLOW_IDMAP},
	// FUSE_OVER_IO_URING: requests come through /dev/fuse (uring.go).
	featUring: {name: "uring", since: [2]int{6, 14}, proto: 42, init: fuse.CAP_OVER_IO_URING},
	// FUSE_HANDLE_KILLPRIV_V2: NOSEC off, the kernel removes privileges
	// itself (New, nosec.go). In every kernel goverlay runs on.
	featKillprivV2: {name: "killpriv_v2", since: [2]int{5, 11}, proto: 33, init: fuse.CAP_HANDLE_KILLPRIV_V2},
	// FUSE_ATOMIC_O_TRUNC (protocol 7.9 or older): an open(O_TRUNC)
	// sends a SETATTR.
	featAtomicOTrunc: {name: "atomic_o_trunc", init: fuse.CAP_ATOMIC_O_TRUNC},
	// FUSE_DONT_MASK: the kernel applies the umask before a create,
	// whatever a default ACL says (create.go).
	featDontMask: {name: "dont_mask", proto: 12, init: fuse.CAP_DONT_MASK},
	// FUSE_DO_READDIRPLUS: listings are READDIRs, then a LOOKUP per
	// name.
	featReaddirplus: {name: "readdirplus", proto: 21,
		init: fuse.CAP_READDIRPLUS | fuse.CAP_READDIRPLUS_AUTO, implies: []featureID{featReaddirplusAuto}},
	// FUSE_READDIRPLUS_AUTO: every batch of a listing is a READDIRPLUS.
	featReaddirplusAuto: {name: "readdirplus_auto", proto: 21, init: fuse.CAP_READDIRPLUS_AUTO},
	// FUSE_WRITEBACK_CACHE: every write(2) is a WRITE request.
	featWritebackCache: {name: "writeback_cache", proto: 23, init: fuse.CAP_WRITEBACK_CACHE},
	// FUSE_POSIX_ACL: the kernel checks modes only.
	featPosixACL: {name: "posix_acl", proto: 26, init: fuse.CAP_POSIX_ACL},
	// FUSE_NO_OPEN_SUPPORT: every open(2) of a regular file is an OPEN
	// request, as with noopen=0 (decideIO).
	featNoOpen: {name: "no_open", proto: 23},
	// FUSE_NO_OPENDIR_SUPPORT (Linux 5.1): every opendir(3) is an
	// OPENDIR request (rawFS.OpenDir).
	featNoOpendir: {name: "no_opendir", proto: 29},
	// FOPEN_CACHE_DIR (Linux 4.20): the kernel keeps no listing, and
	// reads each anew; the kernel's own opens of directories set it
	// (fuse_file_open()), so without it they are requests.
	featCacheDir: {name: "cache_dir", proto: 28, open: fuse.FOPEN_CACHE_DIR, implies: []featureID{featNoOpendir}},
	// FOPEN_NOFLUSH: a close(2) sends FLUSH, until one is answered
	// ENOSYS (handle.Flush).
	featNoflush: {name: "noflush", since: [2]int{5, 16}, proto: 35, open: fuse.FOPEN_NOFLUSH},
	// FUSE_TMPFILE: open(O_TMPFILE) fails with EOPNOTSUPP
	// (rawFS.Tmpfile).
	featTmpfile: {name: "tmpfile", since: [2]int{6, 0}, proto: 37},
	// open_tree(2): layers are opened in place (lower/mounts.go).
	featOpenTree: {name: "open_tree", since: [2]int{5, 2}, sys: lower.OpenTree, implies: []featureID{featMountSetattr}},
	// mount_setattr(2): the clone of a layer's mount is not made
	// private (lower/mounts.go).
	featMountSetattr: {name: "mount_setattr", since: [2]int{5, 12}, sys: lower.MountSetattr},
	// statx(2) STATX_MNT_ID: no layer is taken for id-mapped
	// (lower/idmapped.go).
	featStatxMntID: {name: "statx_mnt_id", since: [2]int{5, 8}, sys: lower.StatxMntID},
	// fchmodat2(2): a chmod goes through /proc/self/fd (upper/attr.go).
	featFchmodat2: {name: "fchmodat2", since: [2]int{6, 6}, sys: lower.Fchmodat2},
	// getxattrat(2), listxattrat(2), setxattrat(2), removexattrat(2):
	// xattrs go through /proc/self/fd (lower/xattr.go).
	featXattrAt: {name: "xattrat", since: [2]int{6, 13}, sys: lower.XattrAt},
}

// profileMinors are the FUSE protocol minors of the releases that raised
// it since MinKernel (FUSE_KERNEL_MINOR_VERSION of each release's
// include/uapi/linux/fuse.h).
var profileMinors = []struct {
	release [2]int
	minor   uint32
}{
	{[2]int{5, 11}, 33}, {[2]int{5, 14}, 34}, {[2]int{5, 16}, 35}, {[2]int{5, 17}, 36},
	{[2]int{6, 0}, 37}, {[2]int{6, 1}, 38}, {[2]int{6, 6}, 39}, {[2]int{6, 9}, 40},
	{[2]int{6, 12}, 41}, {[2]int{6, 14}, 42},
}

// namedProfiles are the profiles of the kernels container hosts run,
// named in errors and the man page; any linux-MAJOR.MINOR from MinKernel
// on is a profile.
var namedProfiles = []struct{ name, host string }{
	{"linux-5.11", "the oldest goverlay runs on"},
	{"linux-5.14", "RHEL 9"},
	{"linux-5.15", "Ubuntu 22.04"},
	{"linux-6.1", "Debian 12"},
	{"linux-6.8", "Ubuntu 24.04"},
}

// Mask is a set of kernel features goverlay behaves as if the kernel
// lacked (-o mask=). The zero Mask masks nothing.
type Mask struct {
	given string // as given, for goverlay stats
	set   uint32 // featureIDs, implied ones included
	// minor caps the FUSE protocol minor read from the kernel's INIT;
	// 0 leaves it.
	minor uint32
}

// ParseMask reads the value of -o mask=: profiles (linux-MAJOR.MINOR) and
// feature names, separated by "+".
func ParseMask(s string) (Mask, error) {
	m := Mask{given: s}
	for _, name := range strings.Split(s, "+") {
		if err := m.add(name); err != nil {
			return Mask{}, err
		}
	}
	return m, nil
}

// add masks the profile or feature called name.
func (m *Mask) add(name string) error {
	if v, ok := strings.CutPrefix(name, "linux-"); ok {
		maj, min, ok := kernelVersion(v)
		if !ok || v != strconv.Itoa(maj)+"."+strconv.Itoa(min) {
			return fmt.Errorf("%q is not a profile: write linux-MAJOR.MINOR, as linux-5.15; %s", name, knownMasks())
		}
		if olderThan(maj, min, MinKernel) {
			return fmt.Errorf("%s is older than Linux %d.%d, the oldest goverlay runs on; %s", name, MinKernel[0], MinKernel[1], knownMasks())
		}
		for id, f := range features {
			if f.since != [2]int{} && olderThan(maj, min, f.since) {
				m.mask(featureID(id))
			}
		}
		if p := profileMinor(maj, min); p != 0 && (m.minor == 0 || p < m.minor) {
			m.minor = p
		}
		return nil
	}
	for id, f := range features {
		if f.name == name {
			m.mask(featureID(id))
			return nil
		}
	}
	if name == "" {
		return fmt.Errorf("an empty name (two \"+\" in a row, or one at an end); %s", knownMasks())
	}
	return fmt.Errorf("unknown name %q; %s", name, knownMasks())
}

// profileMinor is the FUSE protocol minor of release maj.min, or 0 for a
// release after every one profileMinors knows.
func profileMinor(maj, min int) uint32 {
	var minor uint32
	for i, p := range profileMinors {
		if olderThan(maj, min, p.release) {
			break
		}
		minor = p.minor
		if i == len(profileMinors)-1 && (maj != p.release[0] || min != p.release[1]) {
			return 0
		}
	}
	return minor
}

// mask adds id and what it implies.
func (m *Mask) mask(id featureID) {
	if m.set&(1<<id) != 0 {
		return
	}
	m.set |= 1 << id
	for _, i := range features[id].implies {
		m.mask(i)
	}
}

// knownMasks lists the names mask= takes, for an error.
func knownMasks() string {
	var p []string
	for _, n := range namedProfiles {
		p = append(p, n.name+" ("+n.host+")")
	}
	return "known: the profiles " + strings.Join(p, ", ") +
		" or any linux-MAJOR.MINOR from " + fmt.Sprintf("%d.%d", MinKernel[0], MinKernel[1]) +
		", and the features " + strings.Join(FeatureNames(), ", ") + `, separated by "+"`
}

// FeatureNames lists the features mask= takes, in the table's order.
func FeatureNames() []string {
	var n []string
	for _, f := range features {
		n = append(n, f.name)
	}
	return n
}

// has reports whether m masks feature id.
func (m Mask) has(id featureID) bool { return m.set&(1<<id) != 0 }

// Masks reports whether m masks the feature called name.
func (m Mask) Masks(name string) bool {
	for id, f := range features {
		if f.name == name {
			return m.has(featureID(id))
		}
	}
	return false
}

// Empty reports whether m masks nothing.
func (m Mask) Empty() bool { return m.set == 0 && m.minor == 0 }

// String is the mask as given.
func (m Mask) String() string { return m.given }

// Names lists the masked features, implied ones included, in the table's
// order.
func (m Mask) Names() []string {
	var n []string
	for id, f := range features {
		if m.has(featureID(id)) {
			n = append(n, f.name)
		}
	}
	return n
}

// initFlags are the INIT flags m keeps out of the reply.
func (m Mask) initFlags() uint64 {
	var fl uint64
	for id, f := range features {
		if m.has(featureID(id)) {
			fl |= f.init
		}
	}
	return fl
}

// openFlags are the FOPEN_* flags m drops from open replies.
func (m Mask) openFlags() uint32 {
	var fl uint32
	for id, f := range features {
		if m.has(featureID(id)) {
			fl |= f.open
		}
	}
	return fl
}

// syscalls are the system calls m has the layers take for absent.
func (m Mask) syscalls() lower.Features {
	var s lower.Features
	for id, f := range features {
		if m.has(featureID(id)) {
			s |= f.sys
		}
	}
	return s
}

// because is the reason a decision gives for feature id being masked.
func (m Mask) because(id featureID) string {
	return features[id].name + " masked by mask=" + m.given
}

// kernelInit is the kernel's INIT as goverlay takes it: without the flags
// the mask hides, and at most the protocol minor of its profile.
func (f *FS) kernelInit(srv *fuse.Server) *fuse.InitIn {
	k := srv.KernelSettings()
	if k == nil {
		return nil
	}
	fl := k.Flags64() &^ f.opts.Mask.initFlags()
	k.Flags, k.Flags2 = uint32(fl), uint32(fl>>32)
	if m := f.opts.Mask.minor; m != 0 && k.Minor > m {
		k.Minor = m
	}
	return k
}

// featureReport lists the features the kernel has and the mask leaves,
// for goverlay stats: an INIT flag where the kernel's INIT offered it,
// a reply flag or an opcode where its protocol minor has it, a system
// call where the kernel's release has it and no layer found it missing.
func (f *FS) featureReport() []string {
	k := f.initIn.Load()
	maj, min, _ := runningKernel()
	var have []string
	for id, ft := range features {
		if f.opts.Mask.has(featureID(id)) {
			continue
		}
		var ok bool
		switch {
		case ft.init != 0:
			offer := ft.init
			if id == int(featInitExt) {
				offer = fuse.CAP_INIT_EXT
			}
			ok = k != nil && k.Flags64()&offer != 0
		case ft.sys != 0:
			ok = !olderThan(maj, min, ft.since) && f.fallbacks(ft.sys) == 0
		case featureID(id) == featNoOpen:
			ok = k != nil && k.Flags64()&fuse.CAP_NO_OPEN_SUPPORT != 0
		case featureID(id) == featNoOpendir:
			ok = k != nil && k.Flags64()&fuse.CAP_NO_OPENDIR_SUPPORT != 0
		default:
			ok = k != nil && k.Minor >= ft.proto
		}
		if ok {
			have = append(have, ft.name)
		}
	}
	return have
}

// fallbacks sums the fallbacks the layers ran for s.
func (f *FS) fallbacks(s lower.Features) uint64 {
	var n uint64
	for _, l := range f.layers {
		n += l.Counters.Fallbacks.Of(s)
	}
	return n
}

// fallbackReport maps each system call whose fallback ran to how often,
// for goverlay stats.
func (f *FS) fallbackReport() map[string]uint64 {
	out := map[string]uint64{}
	for _, name := range lower.AllFeatures.Names() {
		if n := f.fallbacks(lower.FeatureNamed(name)); n > 0 {
			out[name] = n
		}
	}
	return out
}

// protocolReport is the FUSE protocol version of the kernel's INIT as
// goverlay takes it, and the kernel's own where a profile capped it.
func (f *FS) protocolReport() string {
	k := f.initIn.Load()
	if k == nil {
		return ""
	}
	v := fmt.Sprintf("%d.%d", k.Major, k.Minor)
	if own := f.kernelMinor.Load(); own != k.Minor {
		v += fmt.Sprintf(" (the kernel's %d.%d, as %s)", k.Major, own, f.opts.Mask.given)
	}
	return v
}
