package lower

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Dirent is one record of a getdents64(2) buffer, struct linux_dirent64
// (Linux: include/linux/dirent.h).
type Dirent struct {
	Ino uint64
	// Off is d_off: the position to seek to for the entry after this one.
	Off int64
	// Type is d_type, a DT_* constant.
	Type uint8
	// Name is d_name without its NUL padding. It points into the buffer.
	Name []byte
}

// direntNameOff is where d_name starts in a record.
const direntNameOff = int(unsafe.Offsetof(unix.Dirent{}.Name))

// ParseDirents calls fn for each record of buf, what getdents64(2)
// returned, "." and ".." included. It stops at the first record that does
// not fit in what is left of buf (cut short, or a d_reclen below the
// header or past the end) and says so in its error; the records before it
// have been passed to fn. It never reads outside buf.
func ParseDirents(buf []byte, fn func(Dirent)) error {
	for len(buf) > 0 {
		if len(buf) < direntNameOff {
			return fmt.Errorf("getdents64: truncated record: %d bytes left", len(buf))
		}
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		if reclen < direntNameOff || reclen > len(buf) {
			return fmt.Errorf("getdents64: bad d_reclen %d with %d bytes left", reclen, len(buf))
		}
		rec := buf[:reclen]
		buf = buf[reclen:]
		name := rec[direntNameOff:]
		for i, b := range name {
			if b == 0 {
				name = name[:i]
				break
			}
		}
		fn(Dirent{
			Ino:  binary.NativeEndian.Uint64(rec[0:8]),
			Off:  int64(binary.NativeEndian.Uint64(rec[8:16])),
			Type: rec[18],
			Name: name,
		})
	}
	return nil
}

// IsDots reports whether name is "." or "..".
func IsDots(name []byte) bool {
	return len(name) == 1 && name[0] == '.' || len(name) == 2 && name[0] == '.' && name[1] == '.'
}
