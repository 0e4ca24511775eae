package lower

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// TestParseDirentsExported: every record with its d_off and d_type, "."
// and ".." included; an error, after the good records, for a bad one.
func TestParseDirentsExported(t *testing.T) {
	foo := dirent(42, unix.DT_REG, "foo", 0)
	binary.NativeEndian.PutUint64(foo[8:16], 77)
	good := append(append(dirent(1, unix.DT_DIR, ".", 0), dirent(2, unix.DT_DIR, "..", 0)...), foo...)
	var got []Dirent
	if err := ParseDirents(good, func(d Dirent) { got = append(got, d) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0].Name) != "." || string(got[1].Name) != ".." || !IsDots(got[1].Name) {
		t.Fatalf("got %+v", got)
	}
	if f := got[2]; string(f.Name) != "foo" || f.Ino != 42 || f.Type != unix.DT_REG || f.Off != 77 || IsDots(f.Name) {
		t.Errorf("foo = %+v", f)
	}
	for name, bad := range map[string][]byte{
		"header cut":       make([]byte, 10),
		"reclen zero":      withReclen(dirent(9, unix.DT_REG, "bar", 0), 0),
		"reclen past end":  dirent(9, unix.DT_REG, "bar", 4096)[:24],
		"record cut short": dirent(9, unix.DT_REG, "cut-off-name", 0)[:22],
	} {
		n := 0
		err := ParseDirents(append(dirent(42, unix.DT_REG, "foo", 0), bad...), func(Dirent) { n++ })
		if err == nil || n != 1 {
			t.Errorf("%s: %d records and error %v, want 1 and an error", name, n, err)
		}
	}
}
