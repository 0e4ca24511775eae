package overlay

import (
	"sync"

	"github.com/goverlay/goverlay/lower"
)

// inoMap turns a (st_dev, st_ino) pair of a layer into the st_ino the mount
// reports, unique across layers and stable for the life of the mount.
//
// When every layer is on one filesystem the real inode number is already
// unique and is reported as it is, like the kernel overlay does for
// same-fs layers. Otherwise each filesystem gets an index in the top
// xinoBits bits (Linux: xino, fs/overlayfs/inode.c ovl_map_ino()); an inode
// number too large for that falls back to a number from a table, marked by
// an index no filesystem has.
type inoMap struct {
	fsIndex map[uint64]uint64 // st_dev → index; the first filesystem is 0

	mu    sync.Mutex
	table map[devIno]uint64
}

type devIno struct{ dev, ino uint64 }

const (
	xinoBits  = 8
	xinoShift = 64 - xinoBits
	xinoMask  = 1<<xinoShift - 1
	// overflowIndex marks numbers handed out from the table.
	overflowIndex = 1<<xinoBits - 1
)

func newInoMap(layers []*lower.Layer) *inoMap {
	m := &inoMap{fsIndex: make(map[uint64]uint64), table: make(map[devIno]uint64)}
	for _, l := range layers {
		if _, ok := m.fsIndex[l.Dev]; !ok && len(m.fsIndex) < overflowIndex {
			m.fsIndex[l.Dev] = uint64(len(m.fsIndex))
		}
	}
	return m
}

// ino maps one layer inode to the mount's inode number.
func (m *inoMap) ino(dev, ino uint64) uint64 {
	idx, ok := m.fsIndex[dev]
	if len(m.fsIndex) == 1 && ok {
		return ino
	}
	if ok && ino <= xinoMask {
		return idx<<xinoShift | ino
	}
	// A filesystem we did not see at mount (a mount point inside a
	// layer), or a number that needs all 64 bits.
	m.mu.Lock()
	defer m.mu.Unlock()
	k := devIno{dev, ino}
	if v, ok := m.table[k]; ok {
		return v
	}
	v := uint64(overflowIndex)<<xinoShift | uint64(len(m.table)+1)
	m.table[k] = v
	return v
}
