package testutil

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
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

// ParseDirents decodes a getdents64 buffer (lower.ParseDirents), and fails
// on a record it cannot decode.
func ParseDirents(b []byte) ([]Dirent, error) {
	var out []Dirent
	err := lower.ParseDirents(b, func(d lower.Dirent) {
		out = append(out, Dirent{Ino: d.Ino, Off: d.Off, Type: d.Type, Name: string(d.Name)})
	})
	return out, err
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
