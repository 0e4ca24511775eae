package upper

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// TestCopyUpMetacopy: a metacopy copy-up carries the metadata, no data (a
// hole of the file's size), and the kernel's marks: an empty
// overlay.metacopy and overlay.origin, the lower file's handle in struct
// ovl_fb form.
func TestCopyUpMetacopy(t *testing.T) {
	e := newEnv(t)
	content := string(bytes.Repeat([]byte("metacopy data "), 10000))
	regularSource(t, e, "f", content)
	src := e.source(t, "f")
	src.Meta = true
	if err := e.l.CopyUp(src, e.up.Root(), "f", true, 77); err != nil {
		t.Fatal(err)
	}
	p := e.upper("f")
	checkMetacopyMeta(t, p)
	st := lstat(t, p)
	if st.Size != int64(len(content)) || st.Blocks*512 >= int64(len(content)) {
		t.Errorf("size %d blocks %d: want a hole of %d bytes", st.Size, st.Blocks, len(content))
	}
	xattrIs(t, p, lower.TrustedPrefix+lower.MetacopyXattr, "")
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, e.lower("f"), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte{0, 0xfb, byte(21 + h.Size()), 0, byte(h.Type())}, make([]byte, 16)...)
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 {
		want[3] = 1
	}
	xattrIs(t, p, lower.TrustedPrefix+"origin", string(append(want, h.Bytes()...)))
	e.wantWorkEmpty(t)

	// The data copied in: the same file, with its data and its
	// capability and suid, and no metacopy mark.
	ino := st.Ino
	data, err := lower.NewDataFile(e.lo.Root(), "f")
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	noXattr(t, p, lower.TrustedPrefix+InoXattr)
	if err := e.l.CopyDataIn(e.up.Root(), "f", data, DataInOptions{Data: true, Ino: 77}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, p); got != content {
		t.Errorf("content: %d bytes, want the %d-byte source", len(got), len(content))
	}
	if st := lstat(t, p); st.Ino != ino || st.Mode != unix.S_IFREG|04755 {
		t.Errorf("ino %d mode %#o, want the same file %d with mode 04755", st.Ino, st.Mode, ino)
	}
	xattrIs(t, p, "security.capability", string(capV2))
	noXattr(t, p, lower.TrustedPrefix+lower.MetacopyXattr)
	noXattr(t, p, lower.TrustedPrefix+"origin")
	xattrIs(t, p, lower.TrustedPrefix+InoXattr, "77")
}

// checkMetacopyMeta is checkRegularMeta but for the overlay's own xattrs,
// which a metacopy file has.
func checkMetacopyMeta(t *testing.T, p string) {
	t.Helper()
	st := lstat(t, p)
	if st.Mode != unix.S_IFREG|04755 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("mode %#o owner %d:%d, want 04755 1234:5678", st.Mode, st.Uid, st.Gid)
	}
	wantTimes(t, st)
	xattrIs(t, p, "user.keep", "kept value")
	xattrIs(t, p, "security.capability", string(capV2))
	noXattr(t, p, lower.UserPrefix+"redirect")
}

// TestCopyDataInWithoutData: for an open with O_TRUNC the data is not
// copied, only the mark removed (Linux: ovl_copy_up_one() copies a size of
// 0 then).
func TestCopyDataInWithoutData(t *testing.T) {
	e := newEnv(t)
	data := metacopyUp(t, e, string(bytes.Repeat([]byte("data to be truncated "), 10000)))
	if err := e.l.CopyDataIn(e.up.Root(), "f", data, DataInOptions{}); err != nil {
		t.Fatal(err)
	}
	noXattr(t, e.upper("f"), lower.TrustedPrefix+lower.MetacopyXattr)
	if st := lstat(t, e.upper("f")); st.Blocks*512 >= st.Size {
		t.Errorf("data copied: %d blocks", st.Blocks)
	}
}

// TestCopyDataInKeepMtime: with KeepMtime the data copied in leaves the
// file's mtime as it was; without, the copy sets it.
func TestCopyDataInKeepMtime(t *testing.T) {
	for _, keep := range []bool{true, false} {
		e := newEnv(t)
		data := metacopyUp(t, e, string(bytes.Repeat([]byte("data kept "), 10000)))
		set := unix.Timespec{Sec: 1_000_000_000, Nsec: 123}
		if err := unix.UtimesNano(e.upper("f"), []unix.Timespec{set, set}); err != nil {
			t.Fatal(err)
		}
		if err := e.l.CopyDataIn(e.up.Root(), "f", data, DataInOptions{Data: true, KeepMtime: keep}); err != nil {
			t.Fatal(err)
		}
		if got := lstat(t, e.upper("f")).Mtim; (got == set) != keep {
			t.Errorf("KeepMtime %v: mtime %d.%09d after the copy, set before: %d.%09d", keep, got.Sec, got.Nsec, set.Sec, set.Nsec)
		}
	}
}

// metacopyUp makes lower file f with content, copies its metadata alone
// up, and returns its data file (closed when the test ends).
func metacopyUp(t *testing.T, e *env, content string) *lower.DataFile {
	t.Helper()
	regularSource(t, e, "f", content)
	src := e.source(t, "f")
	src.Meta = true
	if err := e.l.CopyUp(src, e.up.Root(), "f", true, 0); err != nil {
		t.Fatal(err)
	}
	data, err := lower.NewDataFile(e.lo.Root(), "f")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { data.Close() })
	return data
}
