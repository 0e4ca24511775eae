package upper

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// POSIX ACLs of new objects. On a local filesystem, and on the kernel
// overlay, an object created in a directory with a default ACL gets that
// ACL, narrowed by the mode asked for, as its access ACL, and a directory
// gets it as its own default ACL too; the umask does not apply then (Linux:
// posix_acl_create()). goverlay builds new objects in the workdir, where no
// such inheritance happens, so it computes the result here and writes it
// before the object gets its name.
//
// The xattrs hold the kernel's binary format (include/uapi/linux/
// posix_acl_xattr.h): a little-endian u32 version, 2, then one {u16 tag,
// u16 perm, u32 id} per entry. Inheritance copies the on-disk ids as they
// are (the default ACL and the new object's ACL are both on disk);
// uidmapping= and gidmapping= rewrite them only on their way through the
// mount (MapACL).

const (
	// ACLAccessXattr holds an object's access ACL.
	ACLAccessXattr = "system.posix_acl_access"
	// ACLDefaultXattr holds a directory's default ACL.
	ACLDefaultXattr = "system.posix_acl_default"
)

const aclVersion = 2

// ACL entry tags.
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// parseACL decodes an ACL xattr. Malformed ACLs are EIO, as the kernel
// reports one it finds on disk.
func parseACL(b []byte) ([]aclEntry, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("ACL of %d bytes: %w", len(b), unix.EIO)
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		return nil, fmt.Errorf("ACL version %d: %w", v, unix.EIO)
	}
	es := make([]aclEntry, 0, (len(b)-4)/8)
	for p := b[4:]; len(p) > 0; p = p[8:] {
		es = append(es, aclEntry{
			tag:  binary.LittleEndian.Uint16(p),
			perm: binary.LittleEndian.Uint16(p[2:]),
			id:   binary.LittleEndian.Uint32(p[4:]),
		})
	}
	return es, nil
}

// formatACL encodes es as an ACL xattr.
func formatACL(es []aclEntry) []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+8*len(es)), aclVersion)
	for _, e := range es {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// Inherited is what a new object gets from its directory.
type Inherited struct {
	// Mode is the object's mode: type, special bits and permissions.
	Mode uint32
	// Access is the access ACL xattr to store; nil when the mode says
	// it all (only the owner, group and other entries).
	Access []byte
	// Default is the default ACL xattr of a new directory; nil
	// otherwise.
	Default []byte
}

// Inherit computes the mode and ACLs of a new object of mode mode (type
// and permission bits, as asked for, before the umask), made by a caller
// with umask umask in a directory whose default ACL xattr is def (nil:
// none). Without a default ACL the umask applies; with one the ACL takes
// its place (Linux: posix_acl_create(), posix_acl_create_masq()). A symlink
// gets neither.
func Inherit(def []byte, mode, umask uint32) (Inherited, error) {
	if mode&unix.S_IFMT == unix.S_IFLNK {
		return Inherited{Mode: mode}, nil
	}
	var es []aclEntry
	if def != nil {
		var err error
		if es, err = parseACL(def); err != nil {
			return Inherited{}, fmt.Errorf("default ACL: %w", err)
		}
	}
	if len(es) == 0 {
		// The kernel reads an empty ACL as none.
		return Inherited{Mode: mode &^ (umask & 0o777)}, nil
	}
	in := Inherited{Mode: mode}
	if mode&unix.S_IFMT == unix.S_IFDIR {
		in.Default = formatACL(es)
	}
	access := append([]aclEntry(nil), es...)
	equiv, err := createMasq(access, &in.Mode)
	if err != nil {
		return Inherited{}, fmt.Errorf("default ACL: %w", err)
	}
	if !equiv {
		in.Access = formatACL(access)
	}
	return in, nil
}

var errACLNoGroup = errors.New("no group or mask entry")

// createMasq narrows the entries es, a copy of a default ACL, to the
// permission bits of *mode and *mode to what es grants: the owner and
// other entries are ANDed with the mode's owner and other bits, the mask
// entry, or without one the group entry, with its group bits. It reports
// whether es is equivalent to a mode (no named user or group, no mask)
// (Linux: posix_acl_create_masq()).
func createMasq(es []aclEntry, mode *uint32) (equiv bool, err error) {
	m := *mode
	equiv = true
	var group, mask *aclEntry
	for i := range es {
		e := &es[i]
		switch e.tag {
		case aclUserObj:
			e.perm &= uint16(m>>6)&7 | ^uint16(7)
			m &= uint32(e.perm)<<6 | ^uint32(0o700)
		case aclUser, aclGroup:
			equiv = false
		case aclGroupObj:
			group = e
		case aclOther:
			e.perm &= uint16(m)&7 | ^uint16(7)
			m &= uint32(e.perm) | ^uint32(0o007)
		case aclMask:
			mask = e
			equiv = false
		default:
			return false, fmt.Errorf("ACL tag %#x: %w", e.tag, unix.EIO)
		}
	}
	if mask == nil {
		mask = group
	}
	if mask == nil {
		return false, fmt.Errorf("%w: %w", errACLNoGroup, unix.EIO)
	}
	mask.perm &= uint16(m>>3)&7 | ^uint16(7)
	m &= uint32(mask.perm)<<3 | ^uint32(0o070)
	*mode = m
	return equiv, nil
}

// MapACL rewrites the ids of the named-user and named-group entries of the
// ACL xattr b with user and group, which report false for an id they
// cannot map; such an ACL is EINVAL, as the kernel refuses an ACL naming
// an id outside the user namespace it is set in. The owner, group, mask
// and other entries carry no id.
func MapACL(b []byte, user, group func(uint32) (uint32, bool)) ([]byte, error) {
	es, err := parseACL(b)
	if err != nil {
		return nil, err
	}
	for i := range es {
		e := &es[i]
		var ok bool
		switch e.tag {
		case aclUser:
			e.id, ok = user(e.id)
		case aclGroup:
			e.id, ok = group(e.id)
		default:
			continue
		}
		if !ok {
			return nil, fmt.Errorf("ACL entry for an id with no mapping: %w", unix.EINVAL)
		}
	}
	return formatACL(es), nil
}
