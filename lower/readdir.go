package lower

import (
	"encoding/binary"
	"unsafe"

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
// are not included. Names come in layer order, and in each layer's on-disk
// order.
func (c Chain) ReadDir() ([]DirEntry, error) {
	var out []DirEntry
	seen := make(map[string]struct{})
	for _, m := range c {
		ents, err := m.ReadDirRaw()
		if err != nil {
			return nil, err
		}
		var hidden []string
		for _, de := range ents {
			if IsWhiteoutName(de.Name) {
				if de.Name != OpaqueMarker {
					hidden = append(hidden, de.Name[len(WhiteoutPrefix):])
				}
				continue
			}
			if _, ok := seen[de.Name]; ok {
				continue
			}
			if de.Mode == 0 || de.Mode == unix.S_IFCHR || (m.XWhiteouts && de.Mode == unix.S_IFREG) {
				// The type alone cannot tell a whiteout.
				var st unix.Stat_t
				if err := m.Stat(de.Name, &st); err != nil {
					continue // gone, or unreadable: not listed
				}
				de.Mode = st.Mode & unix.S_IFMT
				if IsWhiteout(&st) || (m.XWhiteouts && de.Mode == unix.S_IFREG && st.Size == 0 && m.isXattrWhiteout(de.Name)) {
					seen[de.Name] = struct{}{}
					continue
				}
			}
			seen[de.Name] = struct{}{}
			out = append(out, de)
		}
		// ".wh.NAME" hides NAME in the layers below, not beside it.
		for _, h := range hidden {
			seen[h] = struct{}{}
		}
	}
	return out, nil
}

// ReadDirRaw reads the entries of the directory d as they are on disk,
// whiteouts included, "." and ".." left out.
func (d *Dir) ReadDirRaw() ([]DirEntry, error) {
	var fd int
	err := d.Do(func(dfd int) error {
		var err error
		fd, err = unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []DirEntry
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
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

// parseDirents decodes struct linux_dirent64 records.
func parseDirents(buf []byte, l *Layer, out []DirEntry) []DirEntry {
	const nameOff = int(unsafe.Offsetof(unix.Dirent{}.Name))
	for len(buf) >= nameOff {
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		if reclen < nameOff || reclen > len(buf) {
			break
		}
		rec := buf[:reclen]
		buf = buf[reclen:]
		name := rec[nameOff:]
		for i, b := range name {
			if b == 0 {
				name = name[:i]
				break
			}
		}
		if string(name) == "." || string(name) == ".." {
			continue
		}
		out = append(out, DirEntry{
			Name:  string(name),
			Ino:   binary.NativeEndian.Uint64(rec[0:8]),
			Mode:  dtToMode(rec[18]),
			Layer: l,
		})
	}
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
