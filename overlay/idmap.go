package overlay

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/goverlay/goverlay/lower"
	"github.com/goverlay/goverlay/upper"
)

// IDMap maps a range of owner ids between the layers and the mount, as
// fuse-overlayfs's uidmapping=/gidmapping= do (containers/storage passes
// ContainerID:HostID:Size triplets): an id Disk+i on disk is shown as
// Shown+i through the mount, and the other way round for the owner of a new
// file or a chown.
type IDMap struct {
	Disk, Shown, Len uint32
}

// ParseIDMaps reads "DISK:SHOWN:LEN[:DISK:SHOWN:LEN...]". containers/storage
// puts a colon before every triplet, the first one too
// (":0:100000:65536"), which fuse-overlayfs accepts, and so do we.
func ParseIDMaps(s string) ([]IDMap, error) {
	s = strings.TrimPrefix(s, ":")
	f := strings.Split(s, ":")
	if len(f)%3 != 0 || s == "" {
		return nil, fmt.Errorf("%q: want ID:HOSTID:LEN triplets separated by colons", s)
	}
	var out []IDMap
	for i := 0; i < len(f); i += 3 {
		var v [3]uint32
		for j := range v {
			n, err := strconv.ParseUint(f[i+j], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%q: %q is not an id", s, f[i+j])
			}
			v[j] = uint32(n)
		}
		if v[2] == 0 || uint64(v[0])+uint64(v[2]) > 1<<32 || uint64(v[1])+uint64(v[2]) > 1<<32 {
			return nil, fmt.Errorf("%q: the range %d:%d:%d is empty or too long", s, v[0], v[1], v[2])
		}
		out = append(out, IDMap{Disk: v[0], Shown: v[1], Len: v[2]})
	}
	return out, nil
}

// Owners is how owners are shown and stored: id maps, or squashing every
// owner to one id.
type Owners struct {
	UIDs, GIDs []IDMap
	// SquashUID and SquashGID, when set, are shown as the owner of every
	// file; chown through the mount still changes the file on disk, and
	// its errors are ignored (fuse-overlayfs's squash_to_uid/gid/root).
	SquashUID, SquashGID *uint32
}

// overflowID is what the kernel shows for an id without a mapping.
var overflowUID, overflowGID = readOverflow("uid"), readOverflow("gid")

func readOverflow(kind string) uint32 {
	b, err := os.ReadFile("/proc/sys/kernel/overflow" + kind)
	if err != nil {
		return 65534
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 65534
	}
	return uint32(n)
}

func mapID(maps []IDMap, id uint32, toShown bool, overflow uint32) uint32 {
	if v, ok := mapIDOK(maps, id, toShown); ok {
		return v
	}
	return overflow
}

// mapIDOK maps id and reports whether a map covers it (no maps: every id,
// as it is).
func mapIDOK(maps []IDMap, id uint32, toShown bool) (uint32, bool) {
	if len(maps) == 0 {
		return id, true
	}
	if id == lower.NoID {
		// An owner an id-mapped layer could not show
		// (setupIDMappedLayers): no map covers it.
		return 0, false
	}
	for _, m := range maps {
		from, to := m.Disk, m.Shown
		if !toShown {
			from, to = to, from
		}
		if id >= from && id-from < m.Len {
			return to + (id - from), true
		}
	}
	return 0, false
}

// shown turns on-disk owners into what the mount shows.
func (o *Owners) shown(uid, gid uint32) (uint32, uint32) {
	uid = mapID(o.UIDs, uid, true, overflowUID)
	gid = mapID(o.GIDs, gid, true, overflowGID)
	if o.SquashUID != nil {
		uid = *o.SquashUID
	}
	if o.SquashGID != nil {
		gid = *o.SquashGID
	}
	return uid, gid
}

// onDisk turns owners as the mount's callers give them into on-disk ones.
func (o *Owners) onDisk(uid, gid uint32) (uint32, uint32) {
	return mapID(o.UIDs, uid, false, overflowUID), mapID(o.GIDs, gid, false, overflowGID)
}

// mapsIDs reports whether ids are mapped (uidmapping=, gidmapping=).
func (o *Owners) mapsIDs() bool { return len(o.UIDs) > 0 || len(o.GIDs) > 0 }

// aclShown maps the ids of an ACL xattr read from a layer to what the
// mount shows, as stat's owners are: an id no map covers shows as the
// overflow id. ACL entries are not squashed (squash_to_uid, squash_to_gid),
// as fuse-overlayfs does not squash them either.
func (o *Owners) aclShown(v []byte) ([]byte, error) {
	return upper.MapACL(v,
		func(id uint32) (uint32, bool) { return mapID(o.UIDs, id, true, overflowUID), true },
		func(id uint32) (uint32, bool) { return mapID(o.GIDs, id, true, overflowGID), true })
}

// aclOnDisk maps the ids of an ACL xattr set through the mount to on-disk
// ones; an id no map covers is EINVAL (aclShown would not show it back).
func (o *Owners) aclOnDisk(v []byte) ([]byte, error) {
	return upper.MapACL(v,
		func(id uint32) (uint32, bool) { return mapIDOK(o.UIDs, id, false) },
		func(id uint32) (uint32, bool) { return mapIDOK(o.GIDs, id, false) })
}

// isACLXattr reports whether attr holds a POSIX ACL.
func isACLXattr(attr string) bool {
	return attr == upper.ACLAccessXattr || attr == upper.ACLDefaultXattr
}

// squashed reports whether chown errors are ignored.
func (o *Owners) squashed() bool { return o.SquashUID != nil || o.SquashGID != nil }

// setupIDMappedLayers applies the rule for layers on id-mapped mounts
// (lower/idmapped.go) when the mount maps owners: such a lower layer
// already shows the shifted ids, so it is read back into its on-disk ids
// and mapped once, with the others. The upper layer keeps the mapping: what
// the mount's callers create is stored in on-disk ids, which is what
// containers/storage expects of a container's layer with or without
// id-mapped lowers (it commits the upper as it is on disk). An id-mapped
// upper would have every write shifted twice: refused.
func (f *FS) setupIDMappedLayers() error {
	o := &f.opts.Owners
	if !o.mapsIDs() {
		return nil
	}
	back := func(maps []IDMap) func(uint32) (uint32, bool) {
		return func(id uint32) (uint32, bool) { return mapIDOK(maps, id, false) }
	}
	noID := func(maps []IDMap) func(uint32) (uint32, bool) {
		return func(id uint32) (uint32, bool) {
			if v, ok := mapIDOK(maps, id, false); ok {
				return v, true
			}
			return lower.NoID, true
		}
	}
	un := &lower.Unshift{
		UID: back(o.UIDs),
		GID: back(o.GIDs),
		ACL: func(v []byte) ([]byte, error) { return upper.MapACL(v, noID(o.UIDs), noID(o.GIDs)) },
	}
	for _, l := range f.layers {
		switch {
		case !l.IDMapped:
		case l.Upper:
			return fmt.Errorf("upperdir %q is on an id-mapped mount: with uidmapping=/gidmapping= its owners would be shifted twice; give the upper layer without the id-mapped mount, or leave out uidmapping=/gidmapping=", l.Path)
		default:
			l.Unshift = un
			f.log.Printf("lowerdir %s is on an id-mapped mount: its owners are already shifted, and are not shifted again by uidmapping=/gidmapping=", l.Path)
		}
	}
	return nil
}
