package lower

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// DirEntry is one name of a merged directory listing.
type DirEntry struct {
	Name string
	// Mode holds the file type bits (S_IFMT) only.
	Mode uint32
	// Ino is the inode number in the layer the name comes from.
	Ino uint64
	// Layer is the topmost layer that holds the name.
	Layer *Layer
}

// ReadDir lists the merged directory c: each name once, from its topmost
// layer; whiteouts, whited-out names and the AUFS ".wh." entries are left
// out (Linux: fs/overlayfs/readdir.c ovl_dir_read_merged()). "." and ".."
// are not included. Names come sorted (bytewise).
//
// The read-only layers' listings are cached (listing.go); the upper
// layer's directory is read each time. The layers are merged name by name
// in sorted order, with no map: for each name, the topmost layer that holds
// it gives it, unless that is a whiteout or a layer above hides it with a
// ".wh.NAME" entry (which hides NAME in the layers below, not beside it).
//
// It changes no access time: it is the mount's own read (an emptiness
// check). A listing read through the mount is ReadDirAccess.
func (c Chain) ReadDir() ([]DirEntry, error) { return c.readDir(false) }

// ReadDirAccess is ReadDir for a listing read through the mount: the read
// of the upper instance updates its atime as the layer's policy says
// (atime.go), as the kernel overlay's readdir updates the overlay
// directory's (iterate_dir(), ovl_update_time()).
func (c Chain) ReadDirAccess() ([]DirEntry, error) { return c.readDir(true) }

func (c Chain) readDir(accessed bool) ([]DirEntry, error) {
	lists := make([]*listing, len(c))
	total := 0
	for i, m := range c {
		ls := m.listing()
		if ls == nil {
			// The upper layer, or a directory we could not cache:
			// read it now.
			var err error
			if ls, err = readListing(m.Dir, m.XWhiteouts, accessed); err != nil {
				return nil, err
			}
		}
		lists[i] = ls
		total += len(ls.ents)
	}
	out := make([]DirEntry, 0, total)
	pos := make([]int, len(c))  // next entry of each layer, in byName order
	hpos := make([]int, len(c)) // next hidden name of each layer
	for {
		var name string
		found := false
		for i, ls := range lists {
			if pos[i] < len(ls.byName) {
				if n := ls.ents[ls.byName[pos[i]]].name; !found || n < name {
					name, found = n, true
				}
			}
		}
		if !found {
			return out, nil
		}
		decided := false
		for i, ls := range lists {
			if pos[i] < len(ls.byName) && ls.ents[ls.byName[pos[i]]].name == name {
				e := &ls.ents[ls.byName[pos[i]]]
				pos[i]++
				if !decided && !e.whiteout {
					out = append(out, DirEntry{Name: e.name, Mode: e.mode, Ino: e.ino, Layer: c[i].Layer})
				}
				decided = true
				continue
			}
			for hpos[i] < len(ls.hidden) && ls.hidden[hpos[i]] < name {
				hpos[i]++
			}
			if hpos[i] < len(ls.hidden) && ls.hidden[hpos[i]] == name {
				decided = true
			}
		}
	}
}

// direntBufs holds ReadDirRaw's getdents buffers: a cold walk reads a
// directory per lookup of a new directory, and a 32 KiB buffer each was
// more than half of what the daemon allocated in it.
var direntBufs = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

// ReadDirRaw reads the entries of the directory d as they are on disk,
// whiteouts included, "." and ".." left out. It changes no access time.
func (d *Dir) ReadDirRaw() ([]DirEntry, error) { return d.readDirRaw(false) }

// readDirRaw is ReadDirRaw; accessed makes the read a listing through the
// mount, which updates d's atime as the layer's policy says (atime.go).
func (d *Dir) readDirRaw(accessed bool) ([]DirEntry, error) {
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	if !accessed {
		flags |= unix.O_NOATIME
	}
	flags |= d.Layer.noatimeFlag(true)
	var fd int
	err := d.Do(func(dfd int) error {
		var err error
		fd, err = openatNoatime(dfd, ".", flags, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []DirEntry
	bp := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(bp)
	buf := *bp
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		out = parseDirents(buf[:n], d.Layer, out)
	}
}

// parseDirents appends the entries of a getdents64 buffer but "." and
// "..", up to the first record that cannot be decoded (ParseDirents).
func parseDirents(buf []byte, l *Layer, out []DirEntry) []DirEntry {
	ParseDirents(buf, func(d Dirent) {
		if !IsDots(d.Name) {
			out = append(out, DirEntry{Name: string(d.Name), Ino: d.Ino, Mode: dtToMode(d.Type), Layer: l})
		}
	})
	return out
}

func dtToMode(t uint8) uint32 {
	switch t {
	case unix.DT_REG:
		return unix.S_IFREG
	case unix.DT_DIR:
		return unix.S_IFDIR
	case unix.DT_LNK:
		return unix.S_IFLNK
	case unix.DT_CHR:
		return unix.S_IFCHR
	case unix.DT_BLK:
		return unix.S_IFBLK
	case unix.DT_FIFO:
		return unix.S_IFIFO
	case unix.DT_SOCK:
		return unix.S_IFSOCK
	}
	return 0
}
