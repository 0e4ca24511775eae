package testutil

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Dirent is one linux_dirent64 as getdents64(2) returns it.
type Dirent struct {
	Ino  uint64
	Off  int64 // d_off: the position to seek to for the entry after this one
	Type uint8
	Name string
}

// Getdents makes one getdents64(2) call on fd with a buffer of size bytes
// and decodes what it returned; an empty slice means end of directory.
func Getdents(fd, size int) ([]Dirent, error) {
	buf := make([]byte, size)
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return ParseDirents(buf[:n])
	}
}

// ParseDirents decodes a getdents64 buffer:
// struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }.
func ParseDirents(b []byte) ([]Dirent, error) {
	var out []Dirent
	for len(b) > 0 {
		if len(b) < 19 {
			return out, fmt.Errorf("truncated dirent: %d bytes left", len(b))
		}
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < 19 || reclen > len(b) {
			return out, fmt.Errorf("bad d_reclen %d with %d bytes left", reclen, len(b))
		}
		name := b[19:reclen]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		out = append(out, Dirent{
			Ino:  binary.NativeEndian.Uint64(b[0:8]),
			Off:  int64(binary.NativeEndian.Uint64(b[8:16])),
			Type: b[18],
			Name: string(name),
		})
		b = b[reclen:]
	}
	return out, nil
}

// ReadAllDirents reads fd from its current position to the end with
// buffers of size bytes.
func ReadAllDirents(fd, size int) ([]Dirent, error) {
	var all []Dirent
	for {
		ds, err := Getdents(fd, size)
		if err != nil {
			return all, err
		}
		if len(ds) == 0 {
			return all, nil
		}
		all = append(all, ds...)
	}
}

// readNames lists a directory fd without "." and "..".
func readNames(fd int) ([]string, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, err
	}
	ds, err := ReadAllDirents(fd, 64<<10)
	var names []string
	for _, d := range ds {
		if d.Name != "." && d.Name != ".." {
			names = append(names, d.Name)
		}
	}
	return names, err
}
