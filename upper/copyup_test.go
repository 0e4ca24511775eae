package upper

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// capV2 is a valid VFS_CAP_REVISION_2 security.capability value.
var capV2 = []byte{0, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

var (
	atime = unix.Timespec{Sec: 1_000_000_000, Nsec: 123_456_789}
	mtime = unix.Timespec{Sec: 1_100_000_000, Nsec: 987_654_321}
)

// setTimes gives p (not followed) the test's atime and mtime.
func setTimes(t *testing.T, p string) {
	t.Helper()
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

func wantTimes(t *testing.T, st unix.Stat_t) {
	t.Helper()
	if st.Atim != atime || st.Mtim != mtime {
		t.Errorf("atime %v mtime %v, want %v %v", st.Atim, st.Mtim, atime, mtime)
	}
}

// regularSource makes a lower file with everything CopyUp must carry and
// the overlay's own attributes it must not.
func regularSource(t *testing.T, e *env, name, content string) {
	t.Helper()
	p := e.lower(name)
	writeFile(t, p, content, 0o644)
	if err := os.Lchown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	lset(t, p, "user.keep", []byte("kept value"))
	lset(t, p, "trusted.keep", []byte("trusted kept"))
	lset(t, p, "security.capability", capV2)
	lset(t, p, lower.TrustedPrefix+"origin", []byte("private"))
	lset(t, p, lower.TrustedPrefix+"goverlay.ino", []byte("99"))
	lset(t, p, lower.UserPrefix+"redirect", []byte("/private"))
	setTimes(t, p)
	if m := lstat(t, p).Mode; m&07777 != 04755 {
		t.Fatalf("setup: mode %#o", m)
	}
}

func checkRegularMeta(t *testing.T, p string) {
	t.Helper()
	st := lstat(t, p)
	if st.Mode != unix.S_IFREG|04755 {
		t.Errorf("mode %#o, want %#o", st.Mode, unix.S_IFREG|04755)
	}
	if st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("owner %d:%d, want 1234:5678", st.Uid, st.Gid)
	}
	wantTimes(t, st)
	xattrIs(t, p, "user.keep", "kept value")
	xattrIs(t, p, "trusted.keep", "trusted kept")
	xattrIs(t, p, "security.capability", string(capV2))
	for _, a := range xattrsOf(t, p) {
		if lower.IsPrivateXattr(a) {
			t.Errorf("the overlay's own %s was copied", a)
		}
	}
}

func TestCopyUpRegular(t *testing.T) {
	e := newEnv(t)
	content := "hello, copy-up\n" + string(bytes.Repeat([]byte{0, 1, 2, 0xff}, 5000))
	regularSource(t, e, "f", content)
	// The parent's times must survive the copy-up.
	setTimes(t, e.upperPath)

	if err := e.l.CopyUp(e.source(t, "f"), e.up.Root(), "f", true, 0); err != nil {
		t.Fatal(err)
	}
	checkRegularMeta(t, e.upper("f"))
	if got := readFile(t, e.upper("f")); got != content {
		t.Errorf("content: %d bytes differ from the %d-byte source", len(got), len(content))
	}
	wantTimes(t, lstat(t, e.upperPath))
	e.wantWorkEmpty(t)
	// The source is untouched.
	if st := lstat(t, e.lower("f")); st.Mode&07777 != 04755 || st.Uid != 1234 {
		t.Errorf("source changed: mode %#o uid %d", st.Mode, st.Uid)
	}
	if st := lstat(t, e.upper("f")); st.Ino == lstat(t, e.lower("f")).Ino {
		t.Errorf("the copy is the source's inode")
	}
}

func TestCopyUpWithoutData(t *testing.T) {
	e := newEnv(t)
	regularSource(t, e, "f", "some data that must not be copied")
	if err := e.l.CopyUp(e.source(t, "f"), e.up.Root(), "f", false, 0); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, e.upper("f")); st.Size != 0 {
		t.Errorf("size %d, want an empty file", st.Size)
	}
	checkRegularMeta(t, e.upper("f"))
	e.wantWorkEmpty(t)
}

func TestCopyUpSparse(t *testing.T) {
	e := newEnv(t)
	const size = 64 << 20
	p := e.lower("sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	chunks := map[int64][]byte{
		0:        bytes.Repeat([]byte("A"), 4096),
		20 << 20: bytes.Repeat([]byte("B"), 8192),
		size - 1: []byte("Z"),
	}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	src := e.source(t, "sparse")
	if src.Stat.Size != size || src.Stat.Blocks*512 > 1<<20 {
		t.Fatalf("setup: size %d, %d blocks: not sparse", src.Stat.Size, src.Stat.Blocks)
	}

	if err := e.l.CopyUp(src, e.up.Root(), "sparse", true, 0); err != nil {
		t.Fatal(err)
	}
	st := lstat(t, e.upper("sparse"))
	if st.Size != size {
		t.Fatalf("size %d, want %d", st.Size, size)
	}
	if st.Blocks*512 > 4<<20 {
		t.Errorf("%d bytes allocated for 12 KiB of data: holes filled", st.Blocks*512)
	}
	out, err := os.Open(e.upper("sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for off, want := range chunks {
		got := make([]byte, len(want))
		if _, err := out.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("bytes at %d differ", off)
		}
	}
	// Zeros around the data.
	for _, off := range []int64{4096, 1 << 20, 20<<20 - 1, 20<<20 + 8192, size - 2} {
		b := make([]byte, 1)
		if _, err := out.ReadAt(b, off); err != nil || b[0] != 0 {
			t.Errorf("byte at %d = %v, %v; want 0", off, b, err)
		}
	}
	if hole, err := unix.Seek(int(out.Fd()), 1<<20, unix.SEEK_HOLE); err != nil || hole != 1<<20 {
		t.Errorf("SEEK_HOLE from 1 MiB = %d, %v; want a hole at 1 MiB", hole, err)
	}
	e.wantWorkEmpty(t)
}

func TestCopyUpTypes(t *testing.T) {
	e := newEnv(t)
	owner := func(t *testing.T, name string) {
		if err := os.Lchown(e.lower(name), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		make  func(t *testing.T, p string)
		check func(t *testing.T, p string)
	}{
		{"symlink", func(t *testing.T, p string) {
			if err := os.Symlink("../some/where/../target", p); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, p string) {
			if got, err := os.Readlink(p); err != nil || got != "../some/where/../target" {
				t.Errorf("target %q, %v", got, err)
			}
		}},
		{"symlink to root", func(t *testing.T, p string) {
			if err := os.Symlink("/", p); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, p string) {
			if got, _ := os.Readlink(p); got != "/" {
				t.Errorf("target %q", got)
			}
		}},
		{"fifo", func(t *testing.T, p string) {
			mknod(t, p, unix.S_IFIFO|0o640, 0)
		}, func(t *testing.T, p string) {
			if m := lstat(t, p).Mode; m != unix.S_IFIFO|0o640 {
				t.Errorf("mode %#o", m)
			}
		}},
		{"char device", func(t *testing.T, p string) {
			mknod(t, p, unix.S_IFCHR|0o620, unix.Mkdev(4, 7))
		}, func(t *testing.T, p string) {
			st := lstat(t, p)
			if st.Mode != unix.S_IFCHR|0o620 || st.Rdev != unix.Mkdev(4, 7) {
				t.Errorf("mode %#o rdev %#x, want char 4/7 0620", st.Mode, st.Rdev)
			}
		}},
		{"block device", func(t *testing.T, p string) {
			mknod(t, p, unix.S_IFBLK|0o600, unix.Mkdev(7, 300))
		}, func(t *testing.T, p string) {
			st := lstat(t, p)
			if st.Mode != unix.S_IFBLK|0o600 || st.Rdev != unix.Mkdev(7, 300) {
				t.Errorf("mode %#o rdev %#x, want block 7/300", st.Mode, st.Rdev)
			}
		}},
		{"socket", func(t *testing.T, p string) {
			mknod(t, p, unix.S_IFSOCK|0o755, 0)
		}, func(t *testing.T, p string) {
			if m := lstat(t, p).Mode; m != unix.S_IFSOCK|0o755 {
				t.Errorf("mode %#o", m)
			}
		}},
		{"directory", func(t *testing.T, p string) {
			mkdir(t, p+"/sub")
			writeFile(t, p+"/file", "x", 0o644)
			if err := unix.Chmod(p, 0o2751); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, p string) {
			if m := lstat(t, p).Mode; m != unix.S_IFDIR|0o2751 {
				t.Errorf("mode %#o, want %#o", m, unix.S_IFDIR|0o2751)
			}
			if got := dirNames(t, p); len(got) != 0 {
				t.Errorf("contents copied: %q", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "obj-" + strconv.Itoa(len(tc.name)) + "-" + tc.name
			p := e.lower(name)
			tc.make(t, p)
			owner(t, name)
			// user.* is for regular files and directories only.
			lset(t, p, "trusted.keep", []byte("v"))
			if tc.name == "directory" {
				lset(t, p, "user.keep", []byte("u"))
			}
			lset(t, p, lower.TrustedPrefix+"opaque", []byte("y"))
			setTimes(t, p)
			if err := e.l.CopyUp(e.source(t, name), e.up.Root(), name, true, 0); err != nil {
				t.Fatal(err)
			}
			q := e.upper(name)
			st := lstat(t, q)
			if st.Uid != 1234 || st.Gid != 5678 {
				t.Errorf("owner %d:%d, want 1234:5678", st.Uid, st.Gid)
			}
			wantTimes(t, st) // before check, which may read it
			tc.check(t, q)
			xattrIs(t, q, "trusted.keep", "v")
			if tc.name == "directory" {
				xattrIs(t, q, "user.keep", "u")
			}
			noXattr(t, q, lower.TrustedPrefix+"opaque")
			e.wantWorkEmpty(t)
		})
	}
}

func TestCopyUpIno(t *testing.T) {
	for _, prefix := range []string{lower.TrustedPrefix, lower.UserPrefix} {
		t.Run(prefix, func(t *testing.T) {
			e := newEnvOpts(t, Options{XattrPrefix: prefix})
			writeFile(t, e.lower("f"), "x", 0o644)
			mkdir(t, e.lower("d"))
			if err := e.l.CopyUp(e.source(t, "f"), e.up.Root(), "f", true, 1234567890123); err != nil {
				t.Fatal(err)
			}
			if err := e.l.CopyUp(e.source(t, "d"), e.up.Root(), "d", true, 42); err != nil {
				t.Fatal(err)
			}
			if err := e.l.CopyUp(e.source(t, "f"), e.up.Root(), "zero", true, 0); err != nil {
				t.Fatal(err)
			}
			xattrIs(t, e.upper("f"), prefix+InoXattr, "1234567890123")
			xattrIs(t, e.upper("d"), prefix+InoXattr, "42")
			noXattr(t, e.upper("zero"), prefix+InoXattr)
			e.wantWorkEmpty(t)
		})
	}
}

// TestCopyUpRaced: a copy-up that finds its name taken in the upper layer
// leaves what is there and nothing in the workdir; for a file that is
// EEXIST (the caller serialises a file's copy-ups, so another file is
// there), for a directory nil (another copy-up of it won: they merge).
func TestCopyUpRaced(t *testing.T) {
	e := newEnv(t)
	writeFile(t, e.lower("f"), "first", 0o644)
	if err := e.l.CopyUp(e.source(t, "f"), e.up.Root(), "f", true, 0); err != nil {
		t.Fatal(err)
	}
	first := lstat(t, e.upper("f"))
	writeFile(t, e.lower("f"), "second, longer", 0o600)
	if err := e.l.CopyUp(e.source(t, "f"), e.up.Root(), "f", true, 0); !errors.Is(err, unix.EEXIST) {
		t.Errorf("second CopyUp of a file: %v, want EEXIST", err)
	}
	if got := readFile(t, e.upper("f")); got != "first" {
		t.Errorf("content %q, want the first copy's", got)
	}
	if st := lstat(t, e.upper("f")); st.Ino != first.Ino || st.Mode != first.Mode {
		t.Errorf("the first copy was replaced")
	}
	e.wantWorkEmpty(t)

	t.Run("directory", func(t *testing.T) {
		mkdir(t, e.lower("d"))
		mkdir(t, e.upper("d"))
		writeFile(t, e.upper("d/inside"), "up", 0o644)
		if err := e.l.CopyUp(e.source(t, "d"), e.up.Root(), "d", true, 0); err != nil {
			t.Errorf("CopyUp over an existing upper dir: %v", err)
		}
		if got := readFile(t, e.upper("d/inside")); got != "up" {
			t.Errorf("existing dir replaced")
		}
		e.wantWorkEmpty(t)
	})
}

func TestCopyUpIntoSubdir(t *testing.T) {
	e := newEnv(t)
	mkdir(t, e.upper("a/b"))
	writeFile(t, e.lower("f"), "data", 0o640)
	dst := e.upperDir(t, "a")
	sub, err := dst.OpenDir("b")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := e.l.CopyUp(e.source(t, "f"), sub, "g", true, 0); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.upper("a/b/g")); got != "data" {
		t.Errorf("content %q", got)
	}
	if exists(e.upper("g")) || exists(e.upper("a/g")) {
		t.Errorf("copied to the wrong directory")
	}
}

func TestCopyUpFailureLeavesNothing(t *testing.T) {
	e := newEnv(t)
	mkdir(t, e.lower("sub/d"))
	writeFile(t, e.lower("sub/f"), "data", 0o644)
	writeFile(t, e.lower("sub/empty"), "", 0o644)
	if err := os.Symlink("t", e.lower("sub/l")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data bool
	}{
		{"f", true},
		{"f", false},
		{"empty", true},
		{"d", true},
		{"l", true},
	} {
		t.Run("closed source dir/"+tc.name+"/data="+strconv.FormatBool(tc.data), func(t *testing.T) {
			sd, err := e.lo.Root().OpenDir("sub")
			if err != nil {
				t.Fatal(err)
			}
			src := Source{Dir: sd, Name: tc.name, Stat: lstat(t, e.lower("sub/"+tc.name))}
			sd.Close()
			err = e.l.CopyUp(src, e.up.Root(), tc.name, tc.data, 7)
			if err == nil {
				t.Fatal("CopyUp from a closed Dir succeeded")
			}
			if exists(e.upper(tc.name)) {
				t.Errorf("%s published despite the error", tc.name)
			}
			e.wantWorkEmpty(t)
		})
	}
	t.Run("closed destination", func(t *testing.T) {
		mkdir(t, e.upper("dst"))
		dst, err := e.up.Root().OpenDir("dst")
		if err != nil {
			t.Fatal(err)
		}
		dst.Close()
		if err := e.l.CopyUp(e.source(t, "sub"), dst, "x", true, 0); err == nil {
			t.Fatal("CopyUp into a closed Dir succeeded")
		}
		if got := dirNames(t, e.upper("dst")); len(got) != 0 {
			t.Errorf("dst holds %q", got)
		}
		e.wantWorkEmpty(t)
	})
	t.Run("missing parent", func(t *testing.T) {
		mkdir(t, e.upper("gone"))
		dst, err := e.up.Root().OpenDir("gone")
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Close()
		if err := os.Remove(e.upper("gone")); err != nil {
			t.Fatal(err)
		}
		err = e.l.CopyUp(e.source(t, "sub"), dst, "x", true, 0)
		if err == nil {
			t.Fatal("CopyUp into a removed directory succeeded")
		}
		e.wantWorkEmpty(t)
	})
}

// dataFile makes a file of n random bytes.
func dataFile(t *testing.T, p string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.New(rand.NewSource(int64(n))).Read(b)
	writeFile(t, p, string(b), 0o644)
	return b
}

func openRW(t *testing.T, p string, flags int) int {
	t.Helper()
	fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func TestCopyFunctions(t *testing.T) {
	dir := t.TempDir()
	const srcSize = 3<<20 + 123
	src := dataFile(t, filepath.Join(dir, "src"), srcSize)
	in := openRW(t, filepath.Join(dir, "src"), unix.O_RDONLY)

	funcs := []struct {
		name string
		fn   func(out, in int, outOff, inOff, n int64) (int64, error)
	}{
		{"readWriteAt", readWriteAt},
		{"CopyRange", CopyRange},
	}
	// shift moves the copy in the output: out[off+shift:] = src[off:].
	cases := []struct {
		name          string
		off, shift, n int64
	}{
		{"whole", 0, 0, srcSize},
		{"one buffer", 0, 0, 1 << 20},
		{"buffer and a bit at an offset", 12345, 0, 1<<20 + 777},
		{"across the 1 MiB boundary", 1<<20 - 5, 0, 10},
		{"two buffers and one byte", 1, 0, 2<<20 + 1},
		{"one byte", 999, 0, 1},
		{"zero", 100, 0, 0},
		{"past the end", srcSize - 10, 0, 1 << 20},
		{"all past the end", srcSize + 10, 0, 100},
		{"to a later offset", 4096, 70000, 1<<20 + 3},
		{"to an earlier offset", 1 << 20, -(1<<20 - 7), 200000},
	}
	for _, f := range funcs {
		for i, c := range cases {
			t.Run(f.name+"/"+c.name, func(t *testing.T) {
				outPath := filepath.Join(dir, f.name+strconv.Itoa(i))
				out := openRW(t, outPath, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
				copied, err := f.fn(out, in, c.off+c.shift, c.off, c.n)
				if err != nil {
					t.Fatal(err)
				}
				end := min(c.off+c.n, srcSize)
				if want := max(end-c.off, 0); copied != want {
					t.Errorf("copied %d bytes, want %d", copied, want)
				}
				got, err := os.ReadFile(outPath)
				if err != nil {
					t.Fatal(err)
				}
				wantLen := max(end+c.shift, 0)
				if c.off >= srcSize || c.n == 0 {
					wantLen = 0
				}
				if int64(len(got)) != wantLen {
					t.Fatalf("out is %d bytes, want %d", len(got), wantLen)
				}
				if wantLen == 0 {
					return
				}
				if !bytes.Equal(got[c.off+c.shift:], src[c.off:end]) {
					t.Errorf("bytes [%d, %d) differ", c.off+c.shift, end+c.shift)
				}
				if bytes.ContainsFunc(got[:c.off+c.shift], func(r rune) bool { return r != 0 }) {
					t.Errorf("bytes before %d written", c.off+c.shift)
				}
			})
		}
	}

	t.Run("copyData", func(t *testing.T) {
		// A sparse source with a trailing hole.
		sp := filepath.Join(dir, "sparse")
		f, err := os.Create(sp)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte("head"), 0)
		f.WriteAt(bytes.Repeat([]byte("m"), 100000), 5<<20)
		f.Truncate(16 << 20)
		f.Close()
		for _, tc := range []struct {
			name string
			size int64
		}{
			{"src", srcSize},
			{"sparse", 16 << 20},
			{"src", 1000}, // a shorter size than the file: only that much
		} {
			t.Run(tc.name+"/"+strconv.FormatInt(tc.size, 10), func(t *testing.T) {
				inp := filepath.Join(dir, tc.name)
				in := openRW(t, inp, unix.O_RDONLY)
				outPath := filepath.Join(dir, "cd-"+tc.name+strconv.FormatInt(tc.size, 10))
				out := openRW(t, outPath, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
				if err := copyData(out, in, tc.size); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(outPath)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := os.ReadFile(inp)
				want = want[:tc.size]
				if !bytes.Equal(got, want) {
					t.Errorf("copy differs (%d bytes, want %d)", len(got), len(want))
				}
				if tc.name == "sparse" {
					if st := lstat(t, outPath); st.Blocks*512 > 2<<20 {
						t.Errorf("%d bytes allocated: holes not kept", st.Blocks*512)
					}
				}
			})
		}
	})
}

func TestCopyXattrsSkipsPrivate(t *testing.T) {
	e := newEnv(t)
	writeFile(t, e.lower("f"), "", 0o644)
	writeFile(t, e.upper("g"), "", 0o644)
	lset(t, e.lower("f"), "user.a", []byte("1"))
	lset(t, e.lower("f"), "user.overlay.x", []byte("2"))
	lset(t, e.lower("f"), "trusted.overlay.y", []byte("3"))
	lset(t, e.lower("f"), "user.b", nil)
	if err := copyXattrs(e.lo.Root(), "f", e.up.Root(), "g"); err != nil {
		t.Fatal(err)
	}
	got := xattrsOf(t, e.upper("g"))
	if len(got) != 2 || got[0] != "user.a" || got[1] != "user.b" {
		t.Errorf("copied %q, want [user.a user.b]", got)
	}
	if v, err := xattr.LGet(e.upper("g"), "user.b"); err != nil || len(v) != 0 {
		t.Errorf("empty value: %q, %v", v, err)
	}
	if err := copyXattrs(e.lo.Root(), "missing", e.up.Root(), "g"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing source: %v", err)
	}
}
