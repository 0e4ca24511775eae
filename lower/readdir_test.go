package lower

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// byName indexes a listing, failing on a name listed twice.
func byName(t *testing.T, ents []DirEntry) map[string]DirEntry {
	t.Helper()
	m := make(map[string]DirEntry, len(ents))
	for _, e := range ents {
		if _, dup := m[e.Name]; dup {
			t.Errorf("%q listed twice", e.Name)
		}
		m[e.Name] = e
	}
	return m
}

func TestReadDirMerged(t *testing.T) {
	s := newStack(t, 3)
	// Layer 0.
	s.file(t, 0, "a", "0")
	s.dir(t, 0, "b")
	s.whiteout(t, 0, "kw")
	s.file(t, 0, ".wh.x", "")
	s.file(t, 0, "y", "0")
	s.file(t, 0, ".wh.y", "") // hides y below, not this y
	s.mknod(t, 0, "null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	s.whiteout(t, 0, "kwonly")
	// Layer 1.
	s.file(t, 1, "a", "1")
	s.file(t, 1, "kw", "1")
	s.file(t, 1, "x", "1")
	s.file(t, 1, "y", "1")
	s.file(t, 1, "m", "1")
	s.file(t, 1, ".wh.n", "")
	s.file(t, 1, "p", "1")
	s.file(t, 1, ".wh.p", "")
	s.dir(t, 1, "b")
	// Layer 2.
	s.file(t, 2, "a", "2")
	s.file(t, 2, "b", "2")
	s.file(t, 2, "m", "2")
	s.file(t, 2, "n", "2")
	s.file(t, 2, "p", "2")
	s.file(t, 2, "y", "2")
	s.mknod(t, 2, "q", unix.S_IFIFO|0o644, 0)
	s.symlink(t, 2, "z", "/")
	s.file(t, 2, OpaqueMarker, "")

	ents, err := s.chain().ReadDir()
	if err != nil {
		t.Fatal(err)
	}
	got := byName(t, ents)
	want := map[string]struct {
		layer int
		mode  uint32
	}{
		"a":    {0, unix.S_IFREG},
		"b":    {0, unix.S_IFDIR},
		"y":    {0, unix.S_IFREG},
		"null": {0, unix.S_IFCHR},
		"m":    {1, unix.S_IFREG},
		"p":    {1, unix.S_IFREG},
		"q":    {2, unix.S_IFIFO},
		"z":    {2, unix.S_IFLNK},
	}
	for name, w := range want {
		e, ok := got[name]
		if !ok {
			t.Errorf("%q not listed", name)
			continue
		}
		if e.Layer != s.layers[w.layer] {
			t.Errorf("%q from layer %d, want %d", name, e.Layer.Index, w.layer)
		}
		if e.Mode != w.mode {
			t.Errorf("%q mode %#o, want %#o", name, e.Mode, w.mode)
		}
		if st := lstat(t, s.path(w.layer, name)); e.Ino != st.Ino {
			t.Errorf("%q ino %d, want %d (layer %d's)", name, e.Ino, st.Ino, w.layer)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%q listed, should not be", name)
		}
	}
	for _, e := range ents {
		if e.Mode == 0 {
			t.Errorf("%q has no type (DT_UNKNOWN leaked)", e.Name)
		}
		if e.Name == "." || e.Name == ".." {
			t.Errorf("%q listed", e.Name)
		}
	}
	// Sorted by name, whatever layer each comes from.
	for i := 1; i < len(ents); i++ {
		if ents[i].Name <= ents[i-1].Name {
			t.Errorf("%q after %q: not sorted", ents[i].Name, ents[i-1].Name)
		}
	}
}

func TestReadDirXattrWhiteouts(t *testing.T) {
	s := newStack(t, 2)
	s.dir(t, 0, "x")
	s.dir(t, 1, "x")
	s.setxattr(t, 0, "x", TrustedPrefix+"opaque", "x")
	s.file(t, 0, "x/gone", "")
	s.setxattr(t, 0, "x/gone", TrustedPrefix+"whiteout", "y")
	s.file(t, 0, "x/empty", "")
	s.file(t, 1, "x/gone", "1")
	s.file(t, 1, "x/kept", "1")
	e := mustLookup(t, s, s.chain(), "x")
	ents, err := e.Chain.ReadDir()
	if err != nil {
		t.Fatal(err)
	}
	got := byName(t, ents)
	if _, ok := got["gone"]; ok {
		t.Errorf("xattr whiteout listed, or the name below it")
	}
	if g, ok := got["empty"]; !ok || g.Layer.Index != 0 || g.Mode != unix.S_IFREG {
		t.Errorf("empty = %+v, want a layer-0 regular file", g)
	}
	if g, ok := got["kept"]; !ok || g.Layer.Index != 1 {
		t.Errorf("kept = %+v, want layer 1", g)
	}
}

func TestReadDirLarge(t *testing.T) {
	s := newStack(t, 2)
	const n = 10000
	dir := s.path(1, "")
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	for i := 0; i < n; i++ {
		fd, err := unix.Openat(dfd, fmt.Sprintf("file-with-a-longish-name-%05d", i), unix.O_CREAT|unix.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
	}
	// Every 100th name whited out in the top layer, half of them each way.
	hidden := 0
	for i := 0; i < n; i += 100 {
		name := fmt.Sprintf("file-with-a-longish-name-%05d", i)
		if i%200 == 0 {
			s.whiteout(t, 0, name)
		} else {
			s.file(t, 0, ".wh."+name, "")
		}
		hidden++
	}
	ents, err := s.chain().ReadDir()
	if err != nil {
		t.Fatal(err)
	}
	got := byName(t, ents)
	if len(got) != n-hidden {
		t.Fatalf("%d names, want %d", len(got), n-hidden)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("file-with-a-longish-name-%05d", i)
		e, ok := got[name]
		if ok == (i%100 == 0) {
			t.Fatalf("%s listed = %v", name, ok)
		}
		if ok && (e.Layer.Index != 1 || e.Mode != unix.S_IFREG) {
			t.Fatalf("%s: layer %d mode %#o", name, e.Layer.Index, e.Mode)
		}
	}

	raw, err := s.layers[1].Root().ReadDirRaw()
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != n {
		t.Errorf("ReadDirRaw: %d entries, want %d", len(raw), n)
	}
}

func TestReadDirOddNames(t *testing.T) {
	names := []string{
		"new\nline",
		"\n",
		"trailing\n",
		strings.Repeat("x", 255),
		strings.Repeat("\n", 255),
		strings.Repeat("é", 127) + "z", // 255 bytes, multi-byte UTF-8
		"\xff\xfe invalid utf-8",
		" leading space",
		"tab\there",
		"-",
		"...",
		".wh", // not a whiteout prefix
	}
	s := newStack(t, 2)
	for i, name := range names {
		if len(name) > 255 {
			t.Fatalf("test name %d is %d bytes", i, len(name))
		}
		s.file(t, i%2, name, "")
	}
	ents, err := s.chain().ReadDir()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name)
	}
	sort.Strings(got)
	want := append([]string(nil), names...)
	sort.Strings(want)
	if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
		t.Errorf("names:\n got %q\nwant %q", got, want)
	}
	// And each name works for Lookup as listed.
	for _, e := range ents {
		if _, err := s.chain().Lookup(e.Name, s.layers); err != nil {
			t.Errorf("Lookup(%q) of a listed name: %v", e.Name, err)
		}
	}
}

// dirent encodes one struct linux_dirent64 record.
func dirent(ino uint64, typ uint8, name string, reclen int) []byte {
	const nameOff = int(unsafe.Offsetof(unix.Dirent{}.Name))
	if reclen == 0 {
		reclen = (nameOff + len(name) + 1 + 7) &^ 7
	}
	b := make([]byte, max(reclen, nameOff+len(name)+1))
	binary.NativeEndian.PutUint64(b[0:8], ino)
	binary.NativeEndian.PutUint64(b[8:16], 0)
	binary.NativeEndian.PutUint16(b[16:18], uint16(reclen))
	b[18] = typ
	copy(b[nameOff:], name)
	return b[:max(reclen, 0)]
}

func TestParseDirents(t *testing.T) {
	l := &Layer{Index: 7}
	good := append(append(append(dirent(1, unix.DT_DIR, ".", 0), dirent(2, unix.DT_DIR, "..", 0)...),
		dirent(42, unix.DT_REG, "foo", 0)...), dirent(43, unix.DT_LNK, "a-longer-name", 0)...)

	t.Run("well formed", func(t *testing.T) {
		out := parseDirents(good, l, nil)
		if len(out) != 2 {
			t.Fatalf("got %+v, want foo and a-longer-name", out)
		}
		if out[0].Name != "foo" || out[0].Ino != 42 || out[0].Mode != unix.S_IFREG || out[0].Layer != l {
			t.Errorf("first = %+v", out[0])
		}
		if out[1].Name != "a-longer-name" || out[1].Ino != 43 || out[1].Mode != unix.S_IFLNK {
			t.Errorf("second = %+v", out[1])
		}
	})
	t.Run("appends to out", func(t *testing.T) {
		prev := []DirEntry{{Name: "before"}}
		out := parseDirents(good, l, prev)
		if len(out) != 3 || out[0].Name != "before" {
			t.Errorf("got %+v", out)
		}
	})
	t.Run("dt types", func(t *testing.T) {
		for _, tc := range []struct {
			dt   uint8
			mode uint32
		}{
			{unix.DT_REG, unix.S_IFREG}, {unix.DT_DIR, unix.S_IFDIR}, {unix.DT_LNK, unix.S_IFLNK},
			{unix.DT_CHR, unix.S_IFCHR}, {unix.DT_BLK, unix.S_IFBLK}, {unix.DT_FIFO, unix.S_IFIFO},
			{unix.DT_SOCK, unix.S_IFSOCK}, {unix.DT_UNKNOWN, 0}, {unix.DT_WHT, 0}, {200, 0},
		} {
			out := parseDirents(dirent(5, tc.dt, "n", 0), l, nil)
			if len(out) != 1 || out[0].Mode != tc.mode {
				t.Errorf("d_type %d: got %+v, want mode %#o", tc.dt, out, tc.mode)
			}
		}
	})
	truncated := []struct {
		name string
		buf  []byte
		want []string
	}{
		{"record longer than the buffer", append(dirent(42, unix.DT_REG, "foo", 0), dirent(9, unix.DT_REG, "cut-off-name", 0)[:22]...), []string{"foo"}},
		{"reclen beyond the buffer", append(dirent(42, unix.DT_REG, "foo", 0), dirent(9, unix.DT_REG, "bar", 4096)[:24]...), []string{"foo"}},
		{"header cut", append(dirent(42, unix.DT_REG, "foo", 0), make([]byte, 10)...), []string{"foo"}},
		{"reclen zero", append(dirent(42, unix.DT_REG, "foo", 0), withReclen(dirent(9, unix.DT_REG, "bar", 0), 0)...), []string{"foo"}},
		{"reclen below the header", append(dirent(42, unix.DT_REG, "foo", 0), withReclen(dirent(9, unix.DT_REG, "bar", 0), 8)...), []string{"foo"}},
		{"empty", nil, nil},
		{"one byte", []byte{1}, nil},
	}
	for _, tc := range truncated {
		t.Run(tc.name, func(t *testing.T) {
			var out []DirEntry
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panic: %v", r)
					}
				}()
				out = parseDirents(tc.buf, l, nil)
			}()
			var got []string
			for _, e := range out {
				got = append(got, e.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("names %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("name without terminator", func(t *testing.T) {
		const nameOff = int(unsafe.Offsetof(unix.Dirent{}.Name))
		b := dirent(3, unix.DT_REG, "abcde", nameOff+5) // no NUL inside the record
		out := parseDirents(b, l, nil)
		if len(out) != 1 || out[0].Name != "abcde" {
			t.Errorf("got %+v", out)
		}
	})
}

// withReclen overwrites a record's d_reclen.
func withReclen(b []byte, reclen uint16) []byte {
	binary.NativeEndian.PutUint16(b[16:18], reclen)
	return b
}
