package upper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// withUmask sets the process umask for one test.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func TestCreateModesAndOwners(t *testing.T) {
	withUmask(t, 0o077)
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		o      Object
		target string
	}{
		{"file", Object{Mode: unix.S_IFREG | 0o644, Uid: 1234, Gid: 5678, Flags: unix.O_RDWR}, ""},
		{"file suid", Object{Mode: unix.S_IFREG | 0o4755, Uid: 1234, Gid: 5678, Flags: unix.O_WRONLY}, ""},
		{"file sgid", Object{Mode: unix.S_IFREG | 0o2775, Uid: 1000, Gid: 1000, Flags: unix.O_RDONLY}, ""},
		{"file no access", Object{Mode: unix.S_IFREG | 0o000, Uid: 1, Gid: 2, Flags: unix.O_WRONLY}, ""},
		{"dir", Object{Mode: unix.S_IFDIR | 0o755, Uid: 1234, Gid: 5678}, ""},
		{"dir sticky", Object{Mode: unix.S_IFDIR | 0o1777, Uid: 0, Gid: 0}, ""},
		{"dir sgid", Object{Mode: unix.S_IFDIR | 0o2770, Uid: 5, Gid: 6}, ""},
		{"symlink", Object{Mode: unix.S_IFLNK | 0o777, Uid: 1234, Gid: 5678, Target: "../x/y"}, "../x/y"},
		{"fifo", Object{Mode: unix.S_IFIFO | 0o666, Uid: 7, Gid: 8}, ""},
		{"char", Object{Mode: unix.S_IFCHR | 0o620, Uid: 7, Gid: 8, Rdev: uint32(unix.Mkdev(1, 3))}, ""},
		{"socket", Object{Mode: unix.S_IFSOCK | 0o770, Uid: 9, Gid: 9}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "_")
			fd, err := e.l.Create(e.up.Root(), name, tc.o, OverNothing)
			if err != nil {
				t.Fatal(err)
			}
			isReg := tc.o.Mode&unix.S_IFMT == unix.S_IFREG
			if isReg != (fd >= 0) {
				t.Errorf("fd %d for a %#o", fd, tc.o.Mode)
			}
			if isReg && fd >= 0 {
				// The fd is the published file's, with the flags asked.
				fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
				if fl&unix.O_ACCMODE != tc.o.Flags&unix.O_ACCMODE {
					t.Errorf("fd access mode %#o, want %#o", fl&unix.O_ACCMODE, tc.o.Flags&unix.O_ACCMODE)
				}
				if tc.o.Flags&unix.O_ACCMODE != unix.O_RDONLY {
					if _, err := unix.Write(fd, []byte("through the fd")); err != nil {
						t.Errorf("write: %v", err)
					}
				}
				unix.Close(fd)
			}
			p := e.upper(name)
			st := lstat(t, p)
			wantMode := tc.o.Mode
			if tc.o.Mode&unix.S_IFMT == unix.S_IFLNK {
				wantMode = st.Mode // a symlink's mode is not settable
			}
			if st.Mode != wantMode {
				t.Errorf("mode %#o, want %#o (umask 077 must not apply)", st.Mode, wantMode)
			}
			if st.Uid != tc.o.Uid || st.Gid != tc.o.Gid {
				t.Errorf("owner %d:%d, want %d:%d", st.Uid, st.Gid, tc.o.Uid, tc.o.Gid)
			}
			if tc.o.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev != uint64(tc.o.Rdev) {
				t.Errorf("rdev %#x, want %#x", st.Rdev, tc.o.Rdev)
			}
			if tc.target != "" {
				if got, _ := os.Readlink(p); got != tc.target {
					t.Errorf("target %q, want %q", got, tc.target)
				}
			}
			if isReg && tc.o.Flags&unix.O_ACCMODE != unix.O_RDONLY {
				if got := readFile(t, p); got != "through the fd" {
					t.Errorf("content %q", got)
				}
			}
			noXattr(t, p, lower.TrustedPrefix+"opaque")
			e.wantWorkEmpty(t)
		})
	}
}

func TestCreateOverWhiteouts(t *testing.T) {
	withUmask(t, 0o077)
	e := newEnv(t)
	root := e.up.Root()
	for _, tc := range []struct {
		name string
		o    Object
	}{
		{"file", Object{Mode: unix.S_IFREG | 0o640, Uid: 3, Gid: 4, Flags: unix.O_WRONLY}},
		{"dir", Object{Mode: unix.S_IFDIR | 0o751, Uid: 3, Gid: 4, Opaque: true}},
		{"symlink", Object{Mode: unix.S_IFLNK | 0o777, Target: "t"}},
		{"fifo", Object{Mode: unix.S_IFIFO | 0o600}},
	} {
		t.Run("kernel/"+tc.name, func(t *testing.T) {
			name := "k-" + tc.name
			mknod(t, e.upper(name), unix.S_IFCHR, 0)
			if over, err := Probe(root, name); err != nil || over != OverWhiteout {
				t.Fatalf("Probe = %v, %v; want OverWhiteout", over, err)
			}
			fd, err := e.l.Create(root, name, tc.o, OverWhiteout)
			if err != nil {
				t.Fatal(err)
			}
			if fd >= 0 {
				unix.Close(fd)
			}
			st := lstat(t, e.upper(name))
			if lower.IsWhiteout(&st) || st.Mode&unix.S_IFMT != tc.o.Mode&unix.S_IFMT {
				t.Errorf("mode %#o rdev %#x, want a %#o", st.Mode, st.Rdev, tc.o.Mode&unix.S_IFMT)
			}
			e.wantWorkEmpty(t)
		})
		t.Run("aufs/"+tc.name, func(t *testing.T) {
			name := "a-" + tc.name
			writeFile(t, e.upper(lower.WhiteoutPrefix+name), "", 0o600)
			if over, err := Probe(root, name); err != nil || over != OverAUFSWhiteout {
				t.Fatalf("Probe = %v, %v; want OverAUFSWhiteout", over, err)
			}
			fd, err := e.l.Create(root, name, tc.o, OverAUFSWhiteout)
			if err != nil {
				t.Fatal(err)
			}
			if fd >= 0 {
				unix.Close(fd)
			}
			if st := lstat(t, e.upper(name)); st.Mode&unix.S_IFMT != tc.o.Mode&unix.S_IFMT {
				t.Errorf("mode %#o, want a %#o", st.Mode, tc.o.Mode&unix.S_IFMT)
			}
			if exists(e.upper(lower.WhiteoutPrefix + name)) {
				t.Errorf("%s%s left", lower.WhiteoutPrefix, name)
			}
			e.wantWorkEmpty(t)
		})
	}
}

func TestCreateOpaqueDir(t *testing.T) {
	for _, prefix := range []string{lower.TrustedPrefix, lower.UserPrefix} {
		t.Run(prefix, func(t *testing.T) {
			withUmask(t, 0o077)
			e := newEnvOpts(t, Options{XattrPrefix: prefix})
			mknod(t, e.upper("d"), unix.S_IFCHR, 0)
			o := Object{Mode: unix.S_IFDIR | 0o755, Uid: 1234, Gid: 5678, Opaque: true}
			if _, err := e.l.Create(e.up.Root(), "d", o, OverWhiteout); err != nil {
				t.Fatal(err)
			}
			p := e.upper("d")
			xattrIs(t, p, prefix+"opaque", "y")
			if got := dirNames(t, p); len(got) != 0 {
				t.Errorf("the new opaque dir holds %q (no %s marker wanted)", got, lower.OpaqueMarker)
			}
			st := lstat(t, p)
			if st.Mode != unix.S_IFDIR|0o755 || st.Uid != 1234 || st.Gid != 5678 {
				t.Errorf("mode %#o owner %d:%d", st.Mode, st.Uid, st.Gid)
			}
			e.wantWorkEmpty(t)
		})
	}
	t.Run("marker where the xattr cannot be set", func(t *testing.T) {
		// An xattr namespace the filesystem refuses stands for an
		// upper filesystem without overlay xattrs.
		e := newEnvOpts(t, Options{XattrPrefix: "bogus.overlay."})
		o := Object{Mode: unix.S_IFDIR | 0o755, Opaque: true}
		if _, err := e.l.Create(e.up.Root(), "d", o, OverNothing); err != nil {
			t.Fatal(err)
		}
		if got := dirNames(t, e.upper("d")); len(got) != 1 || got[0] != lower.OpaqueMarker {
			t.Errorf("dir holds %q, want just %s", got, lower.OpaqueMarker)
		}
		e.wantWorkEmpty(t)
	})
}

func TestCreateExisting(t *testing.T) {
	e := newEnv(t)
	writeFile(t, e.upper("f"), "original", 0o644)
	mkdir(t, e.upper("d"))
	fdsBefore := countFDs(t)
	for _, o := range []Object{
		{Mode: unix.S_IFREG | 0o600, Flags: unix.O_RDWR},
		{Mode: unix.S_IFDIR | 0o700},
		{Mode: unix.S_IFLNK | 0o777, Target: "x"},
	} {
		for _, name := range []string{"f", "d"} {
			fd, err := e.l.Create(e.up.Root(), name, o, OverNothing)
			if !errors.Is(err, unix.EEXIST) {
				t.Errorf("Create(%s, %#o) over an existing name: fd %d, %v; want EEXIST", name, o.Mode, fd, err)
			}
			if fd != -1 {
				t.Errorf("fd %d returned with an error", fd)
			}
		}
	}
	if got := readFile(t, e.upper("f")); got != "original" {
		t.Errorf("existing file now %q", got)
	}
	e.wantWorkEmpty(t)
	if n := countFDs(t); n != fdsBefore {
		t.Errorf("open fds %d, %d before: a failed Create leaked its fd", n, fdsBefore)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	return len(dirNames(t, "/proc/self/fd"))
}

func TestCreateInClosedDir(t *testing.T) {
	e := newEnv(t)
	mkdir(t, e.upper("d"))
	d, err := e.up.Root().OpenDir("d")
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if _, err := e.l.Create(d, "x", Object{Mode: unix.S_IFREG | 0o600, Flags: unix.O_RDWR}, OverNothing); err == nil {
		t.Fatal("Create in a closed Dir succeeded")
	}
	e.wantWorkEmpty(t)
}

func TestProbe(t *testing.T) {
	e := newEnv(t)
	root := e.up.Root()
	mknod(t, e.upper("kw"), unix.S_IFCHR, 0)
	writeFile(t, e.upper(".wh.aw"), "", 0o600)
	writeFile(t, e.upper("file"), "", 0o600)
	mknod(t, e.upper("null"), unix.S_IFCHR|0o666, unix.Mkdev(1, 3))
	mkdir(t, e.upper("dir"))
	writeFile(t, e.upper("both"), "", 0o600)
	writeFile(t, e.upper(".wh.both"), "", 0o600)
	for _, tc := range []struct {
		name string
		over Over
		err  error
	}{
		{"absent", OverNothing, nil},
		{"kw", OverWhiteout, nil},
		{"aw", OverAUFSWhiteout, nil},
		{"file", OverNothing, unix.EEXIST},
		{"null", OverNothing, unix.EEXIST},
		{"dir", OverNothing, unix.EEXIST},
		{"both", OverNothing, unix.EEXIST},
		{strings.Repeat("n", 256), OverNothing, unix.ENAMETOOLONG},
	} {
		t.Run(tc.name[:min(len(tc.name), 10)], func(t *testing.T) {
			over, err := Probe(root, tc.name)
			if over != tc.over || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Errorf("Probe(%s) = %v, %v; want %v, %v", tc.name[:min(len(tc.name), 10)], over, err, tc.over, tc.err)
			}
		})
	}
	// A 252-byte name whose ".wh." form is too long is simply free.
	if over, err := Probe(root, strings.Repeat("m", 253)); over != OverNothing || err != nil {
		t.Errorf("Probe(253-byte name) = %v, %v; want OverNothing, nil", over, err)
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t)
	root := e.up.Root()
	fill := func(t *testing.T, dir string) {
		mkdir(t, dir+"/sub")
		mknod(t, dir+"/kw", unix.S_IFCHR, 0)
		writeFile(t, dir+"/.wh.aw", "", 0o600)
		writeFile(t, dir+"/"+lower.OpaqueMarker, "", 0o600)
		mknod(t, dir+"/sub/kw2", unix.S_IFCHR, 0)
	}
	for _, tc := range []struct {
		name     string
		dir      bool
		whiteout bool
		aufs     bool
		empty    bool
	}{
		{"file", false, false, false, false},
		{"empty dir", true, false, false, true},
		{"empty dir with whiteout", true, true, false, true},
		{"file with whiteout", false, true, false, false},
		{"dir", true, false, false, false},
		{"dir with whiteout", true, true, false, false},
		{"aufs file", false, true, true, false},
		{"aufs dir", true, true, true, false},
		{"aufs file without whiteout", false, false, true, false},
		{"aufs dir without whiteout", true, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.aufs {
				e.l.Whiteouts = AUFSWhiteouts
				defer func() { e.l.Whiteouts = KernelWhiteouts }()
			}
			name := strings.ReplaceAll(tc.name, " ", "_")
			p := e.upper(name)
			if tc.dir {
				mkdir(t, p)
				if !tc.empty {
					fill(t, p)
				}
			} else {
				writeFile(t, p, "x", 0o644)
			}
			if err := e.l.Remove(root, name, tc.dir, tc.whiteout); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.whiteout && !tc.aufs:
				if !isWhiteout(t, p) {
					t.Errorf("%s is not a whiteout", name)
				}
			case tc.whiteout && tc.aufs:
				if exists(p) {
					t.Errorf("%s still exists", name)
				}
				st := lstat(t, e.upper(lower.WhiteoutPrefix+name))
				if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
					t.Errorf(".wh.%s mode %#o size %d, want an empty file", name, st.Mode, st.Size)
				}
			default:
				if exists(p) {
					t.Errorf("%s still exists", name)
				}
			}
			if !tc.whiteout || !tc.aufs {
				if exists(e.upper(lower.WhiteoutPrefix + name)) {
					t.Errorf("unexpected .wh.%s", name)
				}
			}
			e.wantWorkEmpty(t)
		})
	}
	t.Run("missing", func(t *testing.T) {
		for _, tc := range []struct{ dir, wh bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
			if err := e.l.Remove(root, "missing", tc.dir, tc.wh); !errors.Is(err, unix.ENOENT) {
				t.Errorf("Remove(missing, dir=%v, whiteout=%v) = %v, want ENOENT", tc.dir, tc.wh, err)
			}
			if exists(e.upper("missing")) {
				t.Errorf("Remove of a missing name made something")
			}
		}
		e.wantWorkEmpty(t)
	})
}

// TestRemoveKeep: the file leaves its name in one step, with a whiteout
// when asked, and lives on in the workdir under the returned name, data
// and inode unchanged, until RemoveTemp.
func TestRemoveKeep(t *testing.T) {
	e := newEnv(t)
	root := e.up.Root()
	for _, wh := range []bool{false, true} {
		name := fmt.Sprintf("f-%v", wh)
		writeFile(t, e.upper(name), "data", 0o644)
		before := lstat(t, e.upper(name))
		keep, err := e.l.RemoveKeep(root, name, wh)
		if err != nil {
			t.Fatal(err)
		}
		if wh && !isWhiteout(t, e.upper(name)) {
			t.Errorf("%s is not a whiteout", name)
		}
		if !wh && exists(e.upper(name)) {
			t.Errorf("%s still exists", name)
		}
		kept := filepath.Join(e.workPath, "work", keep)
		if st := lstat(t, kept); st.Ino != before.Ino || readFile(t, kept) != "data" {
			t.Errorf("whiteout=%v: kept %s is inode %d holding %q, want %d holding \"data\"", wh, keep, st.Ino, readFile(t, kept), before.Ino)
		}
		if err := e.l.RemoveTemp(keep); err != nil {
			t.Fatal(err)
		}
	}
	e.wantWorkEmpty(t)
	if _, err := e.l.RemoveKeep(root, "missing", false); !errors.Is(err, unix.ENOENT) {
		t.Errorf("RemoveKeep(missing) = %v, want ENOENT", err)
	}
	e.wantWorkEmpty(t)
}

func TestWhiteout(t *testing.T) {
	e := newEnv(t)
	root := e.up.Root()
	if err := e.l.Whiteout(root, "k"); err != nil {
		t.Fatal(err)
	}
	if !isWhiteout(t, e.upper("k")) || exists(e.upper(".wh.k")) {
		t.Errorf("kernel format: want just a char 0/0")
	}
	if err := e.l.Whiteout(root, "k"); !errors.Is(err, unix.EEXIST) {
		t.Errorf("second Whiteout: %v, want EEXIST", err)
	}
	e.l.Whiteouts = AUFSWhiteouts
	defer func() { e.l.Whiteouts = KernelWhiteouts }()
	if err := e.l.Whiteout(root, "a"); err != nil {
		t.Fatal(err)
	}
	if exists(e.upper("a")) {
		t.Errorf("aufs format made %q", "a")
	}
	if st := lstat(t, e.upper(".wh.a")); st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
		t.Errorf(".wh.a mode %#o size %d", st.Mode, st.Size)
	}
	if err := e.l.Whiteout(root, "a"); !errors.Is(err, unix.EEXIST) {
		t.Errorf("second aufs Whiteout: %v, want EEXIST", err)
	}
}

func TestRename(t *testing.T) {
	setup := func(t *testing.T) (*env, *lower.Dir, *lower.Dir) {
		e := newEnv(t)
		mkdir(t, e.upper("other"))
		return e, e.up.Root(), e.upperDir(t, "other")
	}
	t.Run("plain", func(t *testing.T) {
		e, root, _ := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		if err := e.l.Rename(root, "a", root, "b", RenameOptions{}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		if exists(e.upper("a")) || readFile(t, e.upper("b")) != "A" {
			t.Errorf("a not moved to b")
		}
		e.wantWorkEmpty(t)
	})
	t.Run("plain replaces", func(t *testing.T) {
		e, root, _ := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		writeFile(t, e.upper("b"), "B", 0o644)
		if err := e.l.Rename(root, "a", root, "b", RenameOptions{}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		if exists(e.upper("a")) || readFile(t, e.upper("b")) != "A" {
			t.Errorf("b not replaced")
		}
	})
	t.Run("across directories", func(t *testing.T) {
		e, root, other := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		if err := e.l.Rename(root, "a", other, "b", RenameOptions{}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		if exists(e.upper("a")) || readFile(t, e.upper("other/b")) != "A" {
			t.Errorf("a not moved to other/b")
		}
	})
	for _, aufs := range []bool{false, true} {
		name := "kernel"
		if aufs {
			name = "aufs"
		}
		t.Run("whiteout at the old name/"+name, func(t *testing.T) {
			e, root, other := setup(t)
			if aufs {
				e.l.Whiteouts = AUFSWhiteouts
			}
			writeFile(t, e.upper("a"), "A", 0o644)
			if err := e.l.Rename(root, "a", other, "b", RenameOptions{Whiteout: true}, &Undo{}); err != nil {
				t.Fatal(err)
			}
			if readFile(t, e.upper("other/b")) != "A" {
				t.Errorf("not moved")
			}
			if aufs {
				if exists(e.upper("a")) || !exists(e.upper(".wh.a")) {
					t.Errorf("want .wh.a and no a")
				}
			} else if !isWhiteout(t, e.upper("a")) {
				t.Errorf("a is not a whiteout")
			}
			e.wantWorkEmpty(t)
		})
	}
	for _, wh := range []bool{false, true} {
		t.Run("over a kernel whiteout/whiteout="+map[bool]string{false: "no", true: "yes"}[wh], func(t *testing.T) {
			e, root, other := setup(t)
			writeFile(t, e.upper("a"), "A", 0o644)
			mknod(t, e.upper("other/b"), unix.S_IFCHR, 0)
			if err := e.l.Rename(root, "a", other, "b", RenameOptions{Whiteout: wh, Over: OverWhiteout}, &Undo{}); err != nil {
				t.Fatal(err)
			}
			if readFile(t, e.upper("other/b")) != "A" {
				t.Errorf("b is not a's file")
			}
			if wh {
				if !isWhiteout(t, e.upper("a")) {
					t.Errorf("the old name is not a whiteout")
				}
			} else if exists(e.upper("a")) {
				t.Errorf("the old name still exists")
			}
			e.wantWorkEmpty(t)
		})
	}
	t.Run("over an aufs whiteout", func(t *testing.T) {
		e, root, _ := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		writeFile(t, e.upper(".wh.b"), "", 0o600)
		if err := e.l.Rename(root, "a", root, "b", RenameOptions{Over: OverAUFSWhiteout}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		if readFile(t, e.upper("b")) != "A" || exists(e.upper(".wh.b")) || exists(e.upper("a")) {
			t.Errorf("want b moved in, .wh.b and a gone: %q", dirNames(t, e.upperPath))
		}
	})
	t.Run("noreplace onto an existing name", func(t *testing.T) {
		e, root, _ := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		writeFile(t, e.upper("b"), "B", 0o644)
		err := e.l.Rename(root, "a", root, "b", RenameOptions{Flags: unix.RENAME_NOREPLACE, Whiteout: true}, &Undo{})
		if !errors.Is(err, unix.EEXIST) {
			t.Errorf("error %v, want EEXIST", err)
		}
		if readFile(t, e.upper("a")) != "A" || readFile(t, e.upper("b")) != "B" {
			t.Errorf("files changed by a refused rename")
		}
		e.wantWorkEmpty(t)
	})
	t.Run("exchange", func(t *testing.T) {
		e, root, other := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		mkdir(t, e.upper("other/b"))
		if err := e.l.Rename(root, "a", other, "b", RenameOptions{Flags: unix.RENAME_EXCHANGE}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		if readFile(t, e.upper("other/b")) != "A" {
			t.Errorf("other/b is not a's file")
		}
		if st := lstat(t, e.upper("a")); st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Errorf("a is not the directory")
		}
	})
	t.Run("exchange with a missing name", func(t *testing.T) {
		e, root, _ := setup(t)
		writeFile(t, e.upper("a"), "A", 0o644)
		if err := e.l.Rename(root, "a", root, "b", RenameOptions{Flags: unix.RENAME_EXCHANGE}, &Undo{}); !errors.Is(err, unix.ENOENT) {
			t.Errorf("error %v, want ENOENT", err)
		}
	})
	t.Run("opaque marks the moved dir", func(t *testing.T) {
		e, root, other := setup(t)
		mkdir(t, e.upper("d"))
		writeFile(t, e.upper("d/inside"), "", 0o644)
		if err := e.l.Rename(root, "d", other, "e", RenameOptions{Whiteout: true, Opaque: true}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		xattrIs(t, e.upper("other/e"), lower.TrustedPrefix+"opaque", "y")
		if got := dirNames(t, e.upper("other/e")); len(got) != 1 || got[0] != "inside" {
			t.Errorf("moved dir holds %q", got)
		}
		if !isWhiteout(t, e.upper("d")) {
			t.Errorf("old name is not a whiteout")
		}
		e.wantWorkEmpty(t)
	})
	t.Run("opaque over a whiteout", func(t *testing.T) {
		e, root, _ := setup(t)
		mkdir(t, e.upper("d"))
		mknod(t, e.upper("e"), unix.S_IFCHR, 0)
		if err := e.l.Rename(root, "d", root, "e", RenameOptions{Over: OverWhiteout, Opaque: true}, &Undo{}); err != nil {
			t.Fatal(err)
		}
		xattrIs(t, e.upper("e"), lower.TrustedPrefix+"opaque", "y")
		if exists(e.upper("d")) {
			t.Errorf("old name left")
		}
	})
	t.Run("missing source", func(t *testing.T) {
		e, root, _ := setup(t)
		if err := e.l.Rename(root, "nope", root, "b", RenameOptions{Whiteout: true}, &Undo{}); !errors.Is(err, unix.ENOENT) {
			t.Errorf("error %v, want ENOENT", err)
		}
		if exists(e.upper("nope")) || exists(e.upper("b")) {
			t.Errorf("a failed rename made names: %q", dirNames(t, e.upperPath))
		}
	})
}

func TestLink(t *testing.T) {
	e := newEnv(t)
	root := e.up.Root()
	mkdir(t, e.upper("other"))
	other := e.upperDir(t, "other")
	writeFile(t, e.upper("src"), "S", 0o644)
	srcIno := lstat(t, e.upper("src")).Ino

	check := func(t *testing.T, p string, nlink uint64) {
		t.Helper()
		st := lstat(t, p)
		if st.Ino != srcIno || st.Nlink != nlink {
			t.Errorf("%s: ino %d nlink %d, want ino %d nlink %d", filepath.Base(p), st.Ino, st.Nlink, srcIno, nlink)
		}
	}
	if err := e.l.Link(root, "src", other, "plain", OverNothing); err != nil {
		t.Fatal(err)
	}
	check(t, e.upper("other/plain"), 2)

	mknod(t, e.upper("other/kw"), unix.S_IFCHR, 0)
	if err := e.l.Link(root, "src", other, "kw", OverWhiteout); err != nil {
		t.Fatal(err)
	}
	check(t, e.upper("other/kw"), 3)

	writeFile(t, e.upper("other/.wh.aw"), "", 0o600)
	if err := e.l.Link(root, "src", other, "aw", OverAUFSWhiteout); err != nil {
		t.Fatal(err)
	}
	check(t, e.upper("other/aw"), 4)
	if exists(e.upper("other/.wh.aw")) {
		t.Errorf(".wh.aw left")
	}
	e.wantWorkEmpty(t)

	if err := e.l.Link(root, "src", other, "plain", OverNothing); !errors.Is(err, unix.EEXIST) {
		t.Errorf("Link onto an existing name: %v, want EEXIST", err)
	}
	check(t, e.upper("src"), 4)
	e.wantWorkEmpty(t)
	if err := e.l.Link(root, "missing", other, "x", OverNothing); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Link of a missing name: %v, want ENOENT", err)
	}
	e.wantWorkEmpty(t)
}

func TestEmptyDir(t *testing.T) {
	e := newEnv(t)
	d := e.upper("d")
	mkdir(t, d+"/sub")
	mknod(t, d+"/kw1", unix.S_IFCHR, 0)
	writeFile(t, d+"/.wh.aw", "", 0o600)
	mknod(t, d+"/sub/kw", unix.S_IFCHR, 0)
	if err := e.l.EmptyDir(e.up.Root(), "d"); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, d); len(got) != 0 {
		t.Errorf("left %q, want an empty directory", got)
	}
	if v, err := xattr.Get(d, "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Errorf("opaque: %q %v, want y", v, err)
	}
	e.wantWorkEmpty(t)
	if err := e.l.EmptyDir(e.up.Root(), "missing"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing dir: %v", err)
	}
	e.wantWorkEmpty(t)
}

func TestSetRedirect(t *testing.T) {
	for _, prefix := range []string{lower.TrustedPrefix, lower.UserPrefix} {
		t.Run(prefix, func(t *testing.T) {
			e := newEnvOpts(t, Options{XattrPrefix: prefix})
			mkdir(t, e.upper("d"))
			d := e.upperDir(t, "d")
			var u1, u2 Undo
			if err := e.l.SetRedirect(d, "/a/b", &u1); err != nil {
				t.Fatal(err)
			}
			xattrIs(t, e.upper("d"), prefix+"redirect", "/a/b")
			if err := e.l.SetRedirect(d, "c", &u2); err != nil {
				t.Fatal(err)
			}
			xattrIs(t, e.upper("d"), prefix+"redirect", "c")
			noXattr(t, e.upperPath, prefix+"redirect")
			// Undone in turn: the value before, then none.
			if err := u2.Run(); err != nil {
				t.Fatal(err)
			}
			xattrIs(t, e.upper("d"), prefix+"redirect", "/a/b")
			if err := u1.Run(); err != nil {
				t.Fatal(err)
			}
			noXattr(t, e.upper("d"), prefix+"redirect")
		})
	}
}

// Every operation reopens its directories' fds when the fd cache closed
// them: the Dirs here are deep, and evicted before each call.
func TestOperationsWithEvictedDirs(t *testing.T) {
	e := newEnv(t)
	e.up.Caches.SetFDCacheSize(1)
	mkdir(t, e.upper("a/b/c"))
	for i := 0; i < 4; i++ {
		mkdir(t, e.upper("evict/"+string(rune('0'+i))))
	}
	a := e.upperDir(t, "a")
	b, err := a.OpenDir("b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := b.OpenDir("c")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	evict := func() {
		t.Helper()
		ev := e.upperDir(t, "evict")
		for i := 0; i < 4; i++ {
			d, err := ev.OpenDir(string(rune('0' + i)))
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
		}
		if n := e.up.Caches.OpenDirFDs(); n > 1 {
			t.Fatalf("setup: %d idle directory fds with a cache of 1", n)
		}
	}
	before := countFDs(t)

	writeFile(t, e.lower("f"), "F", 0o644)
	evict()
	if err := e.l.CopyUp(e.source(t, "f"), c, "f", true, 0); err != nil {
		t.Fatalf("CopyUp: %v", err)
	}
	evict()
	fd, err := e.l.Create(b, "new", Object{Mode: unix.S_IFREG | 0o600, Flags: unix.O_WRONLY}, OverNothing)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	unix.Close(fd)
	evict()
	if err := e.l.Rename(c, "f", b, "g", RenameOptions{Whiteout: true}, &Undo{}); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	evict()
	if err := e.l.Link(b, "g", c, "h", OverWhiteout); err == nil {
		t.Fatalf("Link over a whiteout that is not there succeeded")
	}
	evict()
	if err := e.l.Link(b, "g", c, "f", OverWhiteout); err != nil {
		t.Fatalf("Link: %v", err)
	}
	evict()
	if err := e.l.Remove(b, "new", false, true); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	evict()
	if err := e.l.SetOpaque(b, "c"); err != nil {
		t.Fatalf("SetOpaque: %v", err)
	}
	evict()
	mkdir(t, e.upper("a/e"))
	mknod(t, e.upper("a/e/kw"), unix.S_IFCHR, 0)
	if err := e.l.EmptyDir(a, "e"); err != nil {
		t.Fatalf("EmptyDir: %v", err)
	}
	evict()
	if over, err := Probe(c, "f"); over != OverNothing || !errors.Is(err, unix.EEXIST) {
		t.Errorf("Probe: %v, %v", over, err)
	}

	if got := readFile(t, e.upper("a/b/c/f")); got != "F" {
		t.Errorf("a/b/c/f = %q", got)
	}
	if got := strings.Join(dirNames(t, e.upper("a/b")), ","); got != "c,g,new" {
		t.Errorf("a/b holds %q, want c,g,new (new is the whiteout Remove left)", got)
	}
	xattrIs(t, e.upper("a/b/c"), lower.TrustedPrefix+"opaque", "y")
	e.wantWorkEmpty(t)
	if n := countFDs(t); n > before+1 {
		t.Errorf("open fds %d, %d before, with a cache of 1", n, before)
	}
}

// TestCreateFileLinkMethods: a regular file on a free name is made unnamed
// (O_TMPFILE) and linked into place, by either link method, or built in the
// workdir and renamed where O_TMPFILE is unavailable; every way gives the
// same file: owner, exact mode (suid kept, the umask not applied), the fd,
// nothing left in the workdir, and EEXIST without harm on a taken name.
func TestCreateFileLinkMethods(t *testing.T) {
	withUmask(t, 0o077)
	e := newEnv(t)
	if os.Geteuid() == 0 && e.l.tmpfile != tmpfileEmptyPath {
		t.Errorf("probe chose link method %d as root, want tmpfileEmptyPath", e.l.tmpfile)
	}
	root := e.up.Root()
	for _, how := range []struct {
		name string
		how  int
	}{{"emptypath", tmpfileEmptyPath}, {"proc", tmpfileProc}, {"workdir", tmpfileNone}} {
		t.Run(how.name, func(t *testing.T) {
			e.l.tmpfile = how.how
			name := "f-" + how.name
			o := Object{Mode: unix.S_IFREG | 0o4751, Uid: 1234, Gid: 5678, Flags: unix.O_RDWR}
			fd, err := e.l.Create(root, name, o, OverNothing)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := unix.Write(fd, []byte("data")); err != nil {
				t.Errorf("write: %v", err)
			}
			unix.Close(fd)
			st := lstat(t, e.upper(name))
			if st.Mode != o.Mode || st.Uid != o.Uid || st.Gid != o.Gid || st.Nlink != 1 {
				t.Errorf("mode %#o owner %d:%d nlink %d, want %#o %d:%d 1", st.Mode, st.Uid, st.Gid, st.Nlink, o.Mode, o.Uid, o.Gid)
			}
			if got := readFile(t, e.upper(name)); got != "data" {
				t.Errorf("content %q", got)
			}
			e.wantWorkEmpty(t)
			// The daemon's own owner (no chown), other groups.
			for i, owner := range [][2]uint32{e.l.tmpOwner, {e.l.tmpOwner[0], 5678}, {1234, e.l.tmpOwner[1]}} {
				n := name + "-" + strconv.Itoa(i)
				o := Object{Mode: unix.S_IFREG | 0o2755, Uid: owner[0], Gid: owner[1], Flags: unix.O_WRONLY}
				fd, err := e.l.Create(root, n, o, OverNothing)
				if err != nil {
					t.Fatal(err)
				}
				unix.Close(fd)
				if st := lstat(t, e.upper(n)); st.Mode != o.Mode || st.Uid != o.Uid || st.Gid != o.Gid {
					t.Errorf("%s: mode %#o owner %d:%d, want %#o %d:%d", n, st.Mode, st.Uid, st.Gid, o.Mode, o.Uid, o.Gid)
				}
			}
			// A taken name: EEXIST, the file there untouched.
			if fd, err := e.l.Create(root, name, Object{Mode: unix.S_IFREG | 0o600, Flags: unix.O_WRONLY}, OverNothing); !errors.Is(err, unix.EEXIST) {
				if fd >= 0 {
					unix.Close(fd)
				}
				t.Errorf("create over an existing file: %v, want EEXIST", err)
			}
			if got := readFile(t, e.upper(name)); got != "data" {
				t.Errorf("content after the failed create %q", got)
			}
			e.wantWorkEmpty(t)
		})
	}
}

// A rename whose renameat2 fails takes off the marks made for it: the
// opaque mark Rename makes, and what the caller recorded in the Undo (a
// redirect); a directory that was opaque already stays so. A rename that
// succeeds empties the Undo.
func TestRenameUndo(t *testing.T) {
	e := newEnv(t)
	root := e.up.Root()
	mkdir(t, e.upper("d"))
	mkdir(t, e.upper("o"))
	mkdir(t, e.upper("taken"))
	writeFile(t, e.upper("taken/f"), "f", 0o644)
	if err := e.l.SetOpaque(root, "o"); err != nil {
		t.Fatal(err)
	}
	var u Undo
	d := e.upperDir(t, "d")
	if err := e.l.SetRedirect(d, "/x", &u); err != nil {
		t.Fatal(err)
	}
	err := e.l.Rename(root, "d", root, "taken", RenameOptions{Flags: unix.RENAME_NOREPLACE, Opaque: true}, &u)
	if !errors.Is(err, unix.EEXIST) {
		t.Fatalf("rename onto taken: %v, want EEXIST", err)
	}
	noXattr(t, e.upper("d"), lower.TrustedPrefix+"redirect")
	noXattr(t, e.upper("d"), lower.TrustedPrefix+"opaque")
	if len(u.steps) != 0 {
		t.Errorf("the undo still holds %d steps", len(u.steps))
	}
	if err := e.l.Rename(root, "o", root, "taken", RenameOptions{Flags: unix.RENAME_NOREPLACE, Opaque: true}, &u); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("rename onto taken: %v, want EEXIST", err)
	}
	xattrIs(t, e.upper("o"), lower.TrustedPrefix+"opaque", "y")
	if err := e.l.SetRedirect(d, "/y", &u); err != nil {
		t.Fatal(err)
	}
	if err := e.l.Rename(root, "d", root, "e", RenameOptions{Opaque: true}, &u); err != nil {
		t.Fatal(err)
	}
	if len(u.steps) != 0 {
		t.Errorf("the undo holds %d steps after a rename that succeeded", len(u.steps))
	}
	xattrIs(t, e.upper("e"), lower.TrustedPrefix+"redirect", "/y")
	xattrIs(t, e.upper("e"), lower.TrustedPrefix+"opaque", "y")
	e.wantWorkEmpty(t)
}

// TestCreateInPlace: a regular file that the open gives all it must have
// (the daemon's own owner, no ACL, a mode the umask leaves whole) is made
// in place with its exact mode and nothing passes through the workdir;
// one the umask would cut, one with a set-id bit, one of another owner
// and one in a directory with a default ACL go the other way, and every
// one ends with its exact mode and owner. A umask changed after the probe
// still gives the exact mode.
func TestCreateInPlace(t *testing.T) {
	withUmask(t, 0o022)
	e := newEnv(t)
	if e.l.tmpfile == tmpfileNone {
		t.Skip("no O_TMPFILE on this filesystem")
	}
	root := e.up.Root()
	own := e.l.tmpOwner
	for _, c := range []struct {
		name    string
		o       Object
		inPlace bool
	}{
		{"plain", Object{Mode: unix.S_IFREG | 0o644, Uid: own[0], Gid: own[1], DirHasNoACL: true}, true},
		{"read-only", Object{Mode: unix.S_IFREG | 0o400, Uid: own[0], Gid: own[1], DirHasNoACL: true, Flags: unix.O_RDONLY}, true},
		{"umask", Object{Mode: unix.S_IFREG | 0o666, Uid: own[0], Gid: own[1], DirHasNoACL: true}, false},
		{"suid", Object{Mode: unix.S_IFREG | 0o4755, Uid: own[0], Gid: own[1], DirHasNoACL: true}, false},
		{"owner", Object{Mode: unix.S_IFREG | 0o644, Uid: own[0] + 1000, Gid: own[1], DirHasNoACL: true}, false},
		{"default ACL unknown", Object{Mode: unix.S_IFREG | 0o644, Uid: own[0], Gid: own[1]}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.o.Flags == 0 {
				c.o.Flags = unix.O_WRONLY
			}
			if got := e.l.inPlace(c.o, OverNothing); got != c.inPlace {
				t.Errorf("inPlace %v, want %v", got, c.inPlace)
			}
			if e.l.inPlace(c.o, OverWhiteout) {
				t.Errorf("in place over a whiteout")
			}
			var st unix.Stat_t
			fd, err := e.l.CreateStat(root, c.name, c.o, OverNothing, &st)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			disk := lstat(t, e.upper(c.name))
			if disk.Mode != c.o.Mode || disk.Uid != c.o.Uid || disk.Gid != c.o.Gid || disk.Nlink != 1 {
				t.Errorf("mode %#o owner %d:%d nlink %d, want %#o %d:%d 1", disk.Mode, disk.Uid, disk.Gid, disk.Nlink, c.o.Mode, c.o.Uid, c.o.Gid)
			}
			if st.Ino != disk.Ino || st.Mode != disk.Mode {
				t.Errorf("stat returned ino %d mode %#o, the file's %d %#o", st.Ino, st.Mode, disk.Ino, disk.Mode)
			}
			e.wantWorkEmpty(t)
		})
	}
	// The umask changed after the probe: still the exact mode.
	withUmask(t, 0o077)
	o := Object{Mode: unix.S_IFREG | 0o644, Uid: own[0], Gid: own[1], DirHasNoACL: true, Flags: unix.O_WRONLY}
	fd, err := e.l.Create(root, "late", o, OverNothing)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st := lstat(t, e.upper("late")); st.Mode != o.Mode {
		t.Errorf("after a umask change: mode %#o, want %#o", st.Mode, o.Mode)
	}
	// A taken name: EEXIST.
	if fd, err := e.l.Create(root, "plain", o, OverNothing); !errors.Is(err, unix.EEXIST) {
		if fd >= 0 {
			unix.Close(fd)
		}
		t.Errorf("create over an existing file: %v, want EEXIST", err)
	}
}
