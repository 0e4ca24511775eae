package lower

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Owners of a layer on an id-mapped mount.
//
// A directory reached through an id-mapped mount (mount_setattr(2) with
// MOUNT_ATTR_IDMAP) shows its owners, and the ids its POSIX ACLs name,
// shifted by the mount's idmap: stat, getxattr and the copy-up all see the
// shifted ids. containers/storage 1.40 to 1.45 (podman 4.1 to 4.4) hands a
// mount program its lower layers that way *and* passes the same shift as
// uidmapping=/gidmapping=; a mount that mapped those layers again would
// shift them twice. A layer whose Unshift is set is read back into the
// ids it has on disk, so that it looks like any other layer to the rest
// of the mount, which maps it once (docs/goverlay.1.md, ID-MAPPED
// LAYERS).

// Unshift turns the ids an id-mapped mount shows back into the layer's
// on-disk ids.
type Unshift struct {
	// UID and GID report false for an id the mapping does not cover:
	// the mount showed the overflow id for an on-disk id its idmap has
	// no mapping for, and the on-disk id is lost.
	UID, GID func(uint32) (uint32, bool)
	// ACL rewrites the named entries of a POSIX ACL xattr value; ids it
	// cannot map become NoID.
	ACL func([]byte) ([]byte, error)
}

// NoID stands for an owner an id-mapped mount could not show: (uid_t)-1,
// which no file has (the kernel's INVALID_UID), and which chown(2) takes
// for "unchanged". The mount shows it as the overflow id; a copy-up of an
// object owned by it fails with EOVERFLOW, as the kernel's does
// (notify_change() with an invalid vfsuid).
const NoID = ^uint32(0)

// UnshiftStat puts the layer's on-disk owners into st, a stat of one of
// its objects taken through its id-mapped mount. Dir.Stat and
// Dir.StatSelf do it; callers that fstat a file of the layer themselves
// call it.
func (l *Layer) UnshiftStat(st *unix.Stat_t) {
	u := l.Unshift
	if u == nil {
		return
	}
	var ok bool
	if st.Uid, ok = u.UID(st.Uid); !ok {
		st.Uid = NoID
	}
	if st.Gid, ok = u.GID(st.Gid); !ok {
		st.Gid = NoID
	}
}

// unshiftXattr rewrites the value of a POSIX ACL read through the
// layer's id-mapped mount; other attributes carry no ids the mount maps.
func (l *Layer) unshiftXattr(attr string, v []byte) ([]byte, error) {
	if u := l.Unshift; u != nil && (attr == "system.posix_acl_access" || attr == "system.posix_acl_default") {
		return u.ACL(v)
	}
	return v, nil
}

// onIDMappedMount reports whether the directory at path lies on an
// id-mapped mount. It asks by path, not by the layer's fd, so that it
// tells the mount the path is on whatever way the layer's root is opened
// (a detached clone of it is in no mount table). statmount(2) (Linux 6.8)
// gives the mount's attributes by its unique id (STATX_MNT_ID_UNIQUE),
// MOUNT_ATTR_IDMAP among them. Before that, the kernel lists "idmapped"
// among the mount's own options in /proc/self/mountinfo
// (fs/proc_namespace.c, show_mnt_opts), found there by the mount id
// statx(2) gives: a read of the whole table, which grows with every
// mount on the host. Without STATX_MNT_ID (masked, or before Linux 5.8,
// which has no id-mapped mounts either) it says false and ENOSYS.
func onIDMappedMount(path string, masked Features) (bool, error) {
	var stx unix.Statx_t
	if masked.Has(StatxMntID) {
		return false, lackedErr{StatxMntID}
	}
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID_UNIQUE, &stx); err == nil && stx.Mask&unix.STATX_MNT_ID_UNIQUE != 0 {
		if idmapped, err := statmountIDMapped(stx.Mnt_id); err == nil {
			return idmapped, nil
		}
	}
	return idMappedByMountinfo(path)
}

// idMappedByMountinfo is onIDMappedMount through /proc/self/mountinfo.
func idMappedByMountinfo(path string) (bool, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil {
		return false, fmt.Errorf("statx: %w", err)
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		// The kernel ignores a mask bit it does not know.
		return false, fmt.Errorf("statx: no mount id (Linux 5.8+): %w", lackedErr{StatxMntID})
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	return mountHasOption(data, stx.Mnt_id, "idmapped")
}

// statmount(2)'s ABI (include/uapi/linux/mount.h).
const (
	statmountMntBasic = 0x2 // STATMOUNT_MNT_BASIC
	mntIDReqSizeVer0  = 24  // MNT_ID_REQ_SIZE_VER0
	statmountMaskOff  = 8   // struct statmount: mask
	statmountAttrOff  = 64  // struct statmount: mnt_attr
)

// statmountIDMapped reports whether the mount of unique id id is
// id-mapped, from its MOUNT_ATTR_* flags.
func statmountIDMapped(id uint64) (bool, error) {
	// struct mnt_id_req: size, spare, mnt_id, param.
	req := struct {
		size, spare  uint32
		mntID, param uint64
	}{size: mntIDReqSizeVer0, mntID: id, param: statmountMntBasic}
	var buf [1024]byte
	_, _, e := unix.Syscall6(unix.SYS_STATMOUNT, uintptr(unsafe.Pointer(&req)), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	if e != 0 {
		return false, fmt.Errorf("statmount: %w", e)
	}
	if binary.NativeEndian.Uint64(buf[statmountMaskOff:])&statmountMntBasic == 0 {
		return false, errors.New("statmount: no mount attributes")
	}
	return binary.NativeEndian.Uint64(buf[statmountAttrOff:])&unix.MOUNT_ATTR_IDMAP != 0, nil
}

// mountHasOption reports whether mount id's own options (the sixth field
// of its /proc/self/mountinfo line) include opt.
func mountHasOption(mountinfo []byte, id uint64, opt string) (bool, error) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(nil, 1<<20)
	want := strconv.FormatUint(id, 10)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[0] != want {
			continue
		}
		for _, o := range strings.Split(f[5], ",") {
			if o == opt {
				return true, nil
			}
		}
		return false, nil
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	// A detached mount (open_tree(OPEN_TREE_CLONE), or one unmounted
	// with MNT_DETACH) is in no mount table.
	return false, fmt.Errorf("mount %d is not in /proc/self/mountinfo", id)
}
