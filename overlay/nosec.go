package overlay

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// NoSecMode is the -o nosec= setting.
type NoSecMode int

const (
	// NoSecInherit turns NOSEC on when the upper filesystem keeps
	// security xattrs coherent locally (the kernel overlay inherits
	// SB_NOSEC from its upper the same way: ovl_get_upper()).
	NoSecInherit NoSecMode = iota
	// NoSecOn forces it.
	NoSecOn
	// NoSecOff never turns it on: every write costs the kernel's
	// GETXATTR(security.capability) round trip, as with other FUSE
	// overlays. For comparison runs, and the only safe answer on a
	// network upper.
	NoSecOff
)

// ParseNoSec reads the value of -o nosec=.
func ParseNoSec(s string) (NoSecMode, error) {
	switch s {
	case "", "inherit":
		return NoSecInherit, nil
	case "on":
		return NoSecOn, nil
	case "off":
		return NoSecOff, nil
	}
	return 0, fmt.Errorf("nosec=%s: want inherit, on or off", s)
}

func (m NoSecMode) String() string {
	return [...]string{"inherit", "on", "off"}[m]
}

// Filesystem magic numbers (linux/magic.h) that keep security xattrs
// coherent locally: the kernel sets SB_NOSEC on them (every block
// filesystem through get_tree_bdev(), tmpfs in shmem_fill_super()).
var localFS = map[int64]string{
	0xEF53:     "ext2/3/4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0xF2F52010: "f2fs",
	0x3153464A: "jfs",
	0x52654973: "reiserfs",
	0x4244:     "hfs",
	0x482B:     "hfsplus",
	0x2FC12FC1: "zfs",
	0x5346544E: "ntfs",
	0x7366746E: "ntfs3",
	0xCAFE4A11: "bcachefs",
	0x858458F6: "ramfs",
}

// Filesystems where another client can set suid or a capability behind
// our back.
var remoteFS = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x517B:     "smb",
	0x65735546: "fuse",
	0x01021997: "9p",
	0x00C36400: "ceph",
	0x01161970: "gfs2",
	0x7461636F: "ocfs2",
	0x0BD00BD0: "lustre",
	0x47504653: "gpfs",
	0x794C7630: "overlay",
}

// decideNoSec applies mode to the filesystem of dirfd, the upper layer (or
// the top lower on a read-only mount, whose files nobody writes through the
// mount). It returns the decision and its reason, for the log and `goverlay
// stats`.
func decideNoSec(mode NoSecMode, dirfd int, readOnly bool) (bool, string) {
	var st unix.Statfs_t
	statErr := unix.Fstatfs(dirfd, &st)
	fsName := "unknown"
	local := false
	if statErr == nil {
		if n, ok := localFS[st.Type]; ok {
			fsName, local = n, true
		} else if n, ok := remoteFS[st.Type]; ok {
			fsName = n
		} else {
			fsName = fmt.Sprintf("unknown (f_type %#x)", st.Type)
		}
	}
	switch mode {
	case NoSecOff:
		return false, "nosec=off"
	case NoSecOn:
		if local || readOnly {
			return true, "nosec=on, upper is " + fsName
		}
		return true, "nosec=on forced over an upper on " + fsName + " (not local: another client could set suid or capabilities unseen)"
	}
	switch {
	case readOnly:
		return true, "nosec=inherit, read-only mount (no writes through it)"
	case local:
		return true, "nosec=inherit, upper is " + fsName + " (local)"
	}
	return false, "nosec=inherit, upper is " + fsName + " (not known to be local)"
}
