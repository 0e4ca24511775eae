package lower

import (
	"encoding/binary"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fuzzDirent encodes one struct linux_dirent64 the way getdents64(2)
// does: 8-byte aligned, the name NUL-terminated.
func fuzzDirent(ino uint64, typ uint8, name string) []byte {
	const nameOff = int(unsafe.Offsetof(unix.Dirent{}.Name))
	reclen := (nameOff + len(name) + 1 + 7) &^ 7
	b := make([]byte, reclen)
	binary.NativeEndian.PutUint64(b[0:8], ino)
	binary.NativeEndian.PutUint64(b[8:16], uint64(len(b)))
	binary.NativeEndian.PutUint16(b[16:18], uint16(reclen))
	b[18] = typ
	copy(b[nameOff:], name)
	return b
}

// FuzzParseDirents: parseDirents never panics on arbitrary bytes (a
// buffer cut short, a d_reclen of 0, below the header or past the end),
// returns only names without NUL other than "." and "..", and decodes a
// well-formed buffer made from the input exactly, and a prefix of it when
// the buffer is cut anywhere.
//
//	go test -run '^$' -fuzz FuzzParseDirents -fuzztime 30s ./lower/
func FuzzParseDirents(f *testing.F) {
	f.Add([]byte{}, uint16(0))
	f.Add(fuzzDirent(1, unix.DT_REG, "foo"), uint16(5))
	f.Add(append(fuzzDirent(1, unix.DT_DIR, "."), fuzzDirent(2, unix.DT_DIR, "..")...), uint16(30))
	f.Add(append(fuzzDirent(7, unix.DT_LNK, "a-longer-name"), make([]byte, 19)...), uint16(0xffff))
	f.Add([]byte("a/b/c/.wh.x/../name\nwith\nnewlines/\xff\xfe"), uint16(40))
	l := &Layer{Index: 3}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		out := parseDirents(data, l, nil)
		const nameOff = int(unsafe.Offsetof(unix.Dirent{}.Name))
		if len(out) > len(data)/nameOff {
			t.Fatalf("%d entries out of %d bytes", len(out), len(data))
		}
		for _, e := range out {
			if strings.IndexByte(e.Name, 0) >= 0 || e.Name == "." || e.Name == ".." || e.Layer != l {
				t.Fatalf("bad entry %+v", e)
			}
			switch e.Mode {
			case 0, unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK, unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
			default:
				t.Fatalf("entry %q: mode %#o is not a file type", e.Name, e.Mode)
			}
		}

		// The input as names, encoded well-formed, must decode exactly.
		var names []string
		var buf []byte
		for i, n := range strings.Split(strings.ReplaceAll(string(data), "\x00", ""), "/") {
			if n == "" || n == "." || n == ".." || len(n) > 255 {
				continue
			}
			names = append(names, n)
			buf = append(buf, fuzzDirent(uint64(i+1), unix.DT_REG, n)...)
		}
		got := parseDirents(buf, l, nil)
		if len(got) != len(names) {
			t.Fatalf("well-formed buffer of %d names decoded to %d entries", len(names), len(got))
		}
		for i, e := range got {
			if e.Name != names[i] || e.Mode != unix.S_IFREG {
				t.Fatalf("entry %d = %q (mode %#o), want %q", i, e.Name, e.Mode, names[i])
			}
		}
		// Cut anywhere: a prefix of the names, never a garbled one.
		if len(buf) > 0 {
			c := int(cut) % (len(buf) + 1)
			for i, e := range parseDirents(buf[:c], l, nil) {
				if i >= len(names) || e.Name != names[i] {
					t.Fatalf("buffer cut at %d of %d: entry %d = %q, not a prefix of %q", c, len(buf), i, e.Name, names)
				}
			}
		}
	})
}
