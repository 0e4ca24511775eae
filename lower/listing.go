package lower

import (
	"container/list"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// listing is what one directory of a read-only layer holds, read with one
// pass over it and classified once: the names, which of them are whiteouts,
// and which names its ".wh.NAME" entries hide in the layers below. Lower
// layers do not change while mounted (the kernel overlay calls changing them
// undefined: Documentation/filesystems/overlayfs.rst, "Changes to underlying
// filesystems"), so a listing never needs reading again; it is a cache all
// the same, dropped when memory is short (listingCache) and read again when
// next needed.
//
// It answers the questions a lookup asks of each layer without a system
// call: is NAME here, is it a whiteout, is it hidden by ".wh.NAME". A name
// that is in no layer's listing is a miss that costs nothing.
type listing struct {
	ents   []listEntry // in on-disk order
	byName []uint32    // indexes into ents, sorted by name
	hidden []string    // sorted: the NAMEs of ".wh.NAME" entries

	used atomic.Bool // looked at since the cache last passed over it
	elem *list.Element
}

type listEntry struct {
	name     string
	ino      uint64
	mode     uint32 // file type bits only
	whiteout bool   // char 0/0, or an xattr whiteout in an "x" directory
}

// find returns the entry called name.
func (l *listing) find(name string) (*listEntry, bool) {
	i := sort.Search(len(l.byName), func(i int) bool { return l.ents[l.byName[i]].name >= name })
	if i < len(l.byName) && l.ents[l.byName[i]].name == name {
		return &l.ents[l.byName[i]], true
	}
	return nil, false
}

// hides reports whether a ".wh.NAME" entry hides name in the layers below.
func (l *listing) hides(name string) bool {
	i := sort.SearchStrings(l.hidden, name)
	return i < len(l.hidden) && l.hidden[i] == name
}

// size is what the listing counts against the cache's budget.
func (l *listing) size() int { return len(l.ents) + len(l.hidden) }

// readListing reads and classifies d. xw says whether the directory may hold
// xattr whiteouts (it is marked overlay.opaque="x"); accessed, whether the
// read is a listing through the mount (readDirRaw).
func readListing(d *Dir, xw, accessed bool) (*listing, error) {
	raw, err := d.readDirRaw(accessed)
	if err != nil {
		return nil, err
	}
	l := &listing{ents: make([]listEntry, 0, len(raw))}
	for _, de := range raw {
		if IsWhiteoutName(de.Name) {
			if de.Name != OpaqueMarker {
				l.hidden = append(l.hidden, de.Name[len(WhiteoutPrefix):])
			}
			continue
		}
		e := listEntry{name: de.Name, ino: de.Ino, mode: de.Mode}
		if de.Mode == 0 || de.Mode == unix.S_IFCHR || (xw && de.Mode == unix.S_IFREG) {
			// The type alone cannot tell a whiteout.
			var st unix.Stat_t
			if err := d.Stat(de.Name, &st); err != nil {
				continue // gone, or unreadable: as if absent
			}
			e.mode = st.Mode & unix.S_IFMT
			e.whiteout = IsWhiteout(&st) || (xw && e.mode == unix.S_IFREG && st.Size == 0 && d.isXattrWhiteout(de.Name))
		}
		if e.mode == unix.S_IFREG && !e.whiteout && d.Layer.Override != OverrideNone {
			// A device, FIFO or socket kept as a plain file
			// (containers/storage with force_mask): readdir's type
			// must be the one stat shows (Override.Apply). Only
			// layers that keep overrides pay the getxattr.
			if o, ok := d.ReadOverride(de.Name); ok {
				e.mode = o.Type(e.mode)
			}
		}
		l.ents = append(l.ents, e)
	}
	l.byName = make([]uint32, len(l.ents))
	for i := range l.byName {
		l.byName[i] = uint32(i)
	}
	sort.Slice(l.byName, func(i, j int) bool { return l.ents[l.byName[i]].name < l.ents[l.byName[j]].name })
	sort.Strings(l.hidden)
	return l, nil
}

// listing returns d's listing, reading it if it is not cached. It returns
// nil for a directory of the upper layer, which changes, when the directory
// cannot be read, and when its listing is too big to cache (a lookup then
// asks the layer name by name).
func (m Member) listing() *listing {
	d := m.Dir
	if d.Layer.Upper || d.lsNoCache.Load() {
		return nil
	}
	if l := d.ls.Load(); l != nil {
		l.used.Store(true)
		return l
	}
	d.lsMu.Lock()
	defer d.lsMu.Unlock()
	if l := d.ls.Load(); l != nil {
		return l
	}
	l, err := readListing(d, m.XWhiteouts, false)
	if err != nil {
		// Searchable but not readable (rootless, mode 0311), say: ask
		// the layer name by name, without trying again each time.
		d.lsNoCache.Store(true)
		return nil
	}
	d.Layer.Counters.ListingsRead.Add(1)
	if !d.Layer.Caches.listings.add(d, l) {
		// Too big for the budget: use it for what it was read for,
		// but ask the layer name by name from now on rather than read
		// it again for each lookup.
		d.lsNoCache.Store(true)
	}
	return l
}

// lcache bounds the memory listings take (Caches.listings): beyond the
// budget (in entries), listings not used since the cache last passed over
// them are dropped (the clock algorithm: one bit per listing, no lock on a
// hit).
type lcache struct {
	mu    sync.Mutex
	lru   list.List // of *Dir; new ones at the front
	total int
	max   int
}

// SetListingBudget sets how many entries cached listings may hold in all
// (tests); 0 caches none.
func (cs *Caches) SetListingBudget(n int) {
	c := cs.listings
	c.mu.Lock()
	c.max = max(n, 0)
	c.trimLocked()
	c.mu.Unlock()
}

// CachedListingEntries reports how many entries the cached listings hold.
func (cs *Caches) CachedListingEntries() int {
	c := cs.listings
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// add caches l as d's listing, unless d is closed or l is bigger than the
// budget.
func (c *lcache) add(d *Dir, l *listing) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.lsDead || l.size() > c.max {
		return false
	}
	l.elem = c.lru.PushFront(d)
	d.ls.Store(l)
	c.total += l.size()
	c.trimLocked()
	return true
}

// drop forgets d's listing for good (Dir.Close), or until d is next
// used (Dir.Forget).
func (c *lcache) drop(d *Dir, dead bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d.lsDead = d.lsDead || dead
	if l := d.ls.Load(); l != nil {
		c.lru.Remove(l.elem)
		c.total -= l.size()
		d.ls.Store(nil)
	}
}

// Preconditions: c.mu is held.
func (c *lcache) trimLocked() {
	for tries := 2 * c.lru.Len(); c.total > c.max && tries > 0; tries-- {
		e := c.lru.Back()
		d := e.Value.(*Dir)
		l := d.ls.Load()
		if l.used.Swap(false) {
			c.lru.MoveToFront(e) // a second chance
			continue
		}
		c.lru.Remove(e)
		c.total -= l.size()
		d.ls.Store(nil)
	}
	for c.total > c.max && c.lru.Len() > 0 {
		// Lookups kept marking listings used while it passed: drop
		// the oldest.
		e := c.lru.Back()
		d := e.Value.(*Dir)
		c.lru.Remove(e)
		c.total -= d.ls.Load().size()
		d.ls.Store(nil)
	}
}
