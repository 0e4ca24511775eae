package reliability_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// Hostile names: at and over NAME_MAX, paths at PATH_MAX, bytes that are
// not text, and the AUFS format's reserved prefix.

// oddNames are valid names that are not text, or are text that breaks
// naive parsers (mountinfo, option strings, shells).
var oddNames = []string{
	"new\nline", "\xff\xfe\xfd", "tab\there", " leading space", "trailing space ", "back\\slash",
	"colon:name", "comma,name", "star*?[", "\x01\x02ctrl", "-dash", "ünïcødé", "\xc3\x28", "a\x7fdel",
	"..dots", "...", "%s%n", "=equals",
}

// TestNames: 255-byte names work for every kind of object and through
// rename and copy-up; 256-byte ones fail with ENAMETOOLONG (not ENOENT) for
// stat, open O_CREAT, mkdir, the target of rename, link and symlink; odd
// names round-trip byte for byte, created through the mount or found in a
// lower layer, and read back alike by a remount and by the kernel overlay
// over the same upper; ".wh." names cannot be created (EINVAL) nor looked
// up (ENOENT).
func TestNames(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	n255 := func(c string) string { return strings.Repeat(c, 255) }
	n256 := strings.Repeat("z", 256)
	s := newStack(t, 1, func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File(n255("L"), "lower 255", 0o644).File("d/"+n255("M"), "lower 255 in d", 0o644)
		for i, n := range oddNames {
			l[0].File("lowerodd/"+n, "odd "+string(rune('a'+i)), 0o644)
		}
	})
	// A file 4095 bytes deep (see PATH_MAX below), made after
	// Layer.Finish, whose walk cannot go deeper than PATH_MAX.
	lroot, err := unix.Open(s.lower[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mkdirs(t, lroot, deepLower)
	writeAt(t, lroot, deepLowerFile, "lower at PATH_MAX")
	unix.Close(lroot)
	m := mountG(t, s)
	p := func(rel string) string { return filepath.Join(m.Dir, rel) }

	t.Run("NAME_MAX", func(t *testing.T) {
		must := func(what string, err error) {
			t.Helper()
			if err != nil {
				t.Errorf("%s (255-byte name): %v", what, err)
			}
		}
		must("create", os.WriteFile(p(n255("a")), []byte("255"), 0o644))
		must("mkdir", unix.Mkdir(p(n255("b")), 0o755))
		must("create in dir", os.WriteFile(p(n255("b")+"/"+n255("c")), []byte("x"), 0o644))
		must("symlink", unix.Symlink(n255("t"), p(n255("s"))))
		must("link", unix.Link(p(n255("a")), p(n255("h"))))
		must("mknod fifo", unix.Mknod(p(n255("f")), unix.S_IFIFO|0o644, 0))
		must("rename", unix.Rename(p(n255("a")), p(n255("r"))))
		must("rename lower file (copy-up)", unix.Rename(p(n255("L")), p(n255("K"))))
		must("rename lower dir (redirect)", unix.Rename(p("d"), p(n255("D"))))
		f, err := os.OpenFile(p(n255("D")+"/"+n255("M")), os.O_WRONLY|os.O_APPEND, 0)
		must("open for append (copy-up)", err)
		if err == nil {
			_, err = f.WriteString("+")
			must("append", err)
			f.Close()
		}
		if got, err := os.ReadFile(p(n255("D") + "/" + n255("M"))); err != nil || string(got) != "lower 255 in d+" {
			t.Errorf("read back: %q %v", got, err)
		}
		if got, err := os.Readlink(p(n255("s"))); err != nil || got != n255("t") {
			t.Errorf("readlink: %q %v", got, err)
		}
		ents, err := os.ReadDir(m.Dir)
		must("readdir", err)
		var long []string
		for _, e := range ents {
			if len(e.Name()) == 255 {
				long = append(long, e.Name()[:1])
			}
		}
		sort.Strings(long)
		if got := strings.Join(long, " "); got != "D K b f h r s" {
			t.Errorf("readdir lists the 255-byte names %q (first letters), want D K b f h r s", got)
		}

		tooLong := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, unix.ENAMETOOLONG) {
				t.Errorf("%s with a 256-byte name: %v, want ENAMETOOLONG", what, err)
			}
		}
		var st unix.Stat_t
		tooLong("lstat", unix.Lstat(p(n256), &st))
		tooLong("stat in a subdirectory", unix.Lstat(p(n255("b")+"/"+n256), &st))
		_, err = unix.Open(p(n256), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		tooLong("open O_CREAT", err)
		_, err = unix.Open(p(n256), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		tooLong("open", err)
		tooLong("mkdir", unix.Mkdir(p(n256), 0o755))
		tooLong("rename target", unix.Rename(p(n255("r")), p(n256)))
		tooLong("rename source", unix.Rename(p(n256), p("x")))
		tooLong("link target", unix.Link(p(n255("r")), p(n256)))
		tooLong("symlink", unix.Symlink("t", p(n256)))
		tooLong("mknod", unix.Mknod(p(n256), unix.S_IFIFO|0o644, 0))
		tooLong("unlink", unix.Unlink(p(n256)))
		tooLong("rmdir", unix.Rmdir(p(n256)))
		_, err = unix.Getxattr(p(n256), "user.x", nil)
		tooLong("getxattr", err)
	})

	t.Run("PATH_MAX", func(t *testing.T) {
		// A relative path of exactly 4095 bytes (PATH_MAX less the NUL)
		// from the mount's root, through 16 directories of 250-byte
		// names: created through the mount, and found in a lower layer
		// and copied up (the upper's absolute path is then longer than
		// PATH_MAX: only *at calls reach it).
		comps := make([]string, 16)
		for i := range comps {
			comps[i] = strings.Repeat(string(rune('a'+i)), 250)
		}
		dirs := strings.Join(comps, "/")
		file := strings.Repeat("f", 4095-len(dirs)-1)
		rel := dirs + "/" + file
		if len(rel) != 4095 {
			t.Fatalf("path of %d bytes", len(rel))
		}
		root, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(root)
		mkdirs(t, root, comps)
		writeAt(t, root, rel, "at PATH_MAX")
		if got := readAt(t, root, rel); got != "at PATH_MAX" {
			t.Errorf("read back %q", got)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(root, rel, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Errorf("stat of a 4095-byte path: %v", err)
		}
		if err := unix.Renameat(root, rel, root, dirs+"/"+strings.Repeat("g", len(file))); err != nil {
			t.Errorf("rename at PATH_MAX: %v", err)
		}
		_, err = unix.Openat(root, rel+"x", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.ENAMETOOLONG) {
			t.Errorf("open of a 4096-byte path: %v, want ENAMETOOLONG (control)", err)
		}

		// The same depth in the lower layer, copied up by an append.
		lroot, err := unix.Open(s.lower[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(lroot)
		lrel := deepLowerFile
		fd, err := unix.Openat(root, lrel, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open a lower file at PATH_MAX for append: %v", err)
		}
		if _, err := unix.Write(fd, []byte("+")); err != nil {
			t.Errorf("append: %v", err)
		}
		unix.Close(fd)
		if got := readAt(t, root, lrel); got != "lower at PATH_MAX+" {
			t.Errorf("through the mount: %q", got)
		}
		uroot, err := unix.Open(s.upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(uroot)
		if got := readAt(t, uroot, lrel); got != "lower at PATH_MAX+" {
			t.Errorf("the copy in the upper layer: %q", got)
		}
		if got := readAt(t, lroot, lrel); got != "lower at PATH_MAX" {
			t.Errorf("the lower file changed: %q", got)
		}
	})

	t.Run("odd bytes", func(t *testing.T) {
		for i, n := range oddNames {
			if err := os.WriteFile(p(n), []byte{byte(i)}, 0o644); err != nil {
				t.Errorf("create %q: %v", n, err)
			}
			if err := unix.Mkdir(p("dir"+n), 0o755); err != nil {
				t.Errorf("mkdir %q: %v", "dir"+n, err)
			}
		}
		if err := unix.Rename(p("lowerodd/"+oddNames[0]), p("lowerodd/renamed\n"+oddNames[1])); err != nil {
			t.Errorf("rename a lower odd name: %v", err)
		}
		ents, err := os.ReadDir(m.Dir)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, e := range ents {
			got[e.Name()] = true
		}
		for i, n := range oddNames {
			if !got[n] || !got["dir"+n] {
				t.Errorf("readdir does not list %q or %q byte for byte", n, "dir"+n)
			}
			if b, err := os.ReadFile(p(n)); err != nil || !bytes.Equal(b, []byte{byte(i)}) {
				t.Errorf("read %q: %q %v", n, b, err)
			}
		}
		lents, err := os.ReadDir(p("lowerodd"))
		if err != nil {
			t.Fatal(err)
		}
		var lnames []string
		for _, e := range lents {
			lnames = append(lnames, e.Name())
		}
		want := append([]string{"renamed\n" + oddNames[1]}, oddNames[1:]...)
		sort.Strings(lnames)
		sort.Strings(want)
		if strings.Join(lnames, "\x00") != strings.Join(want, "\x00") {
			t.Errorf("lowerodd lists %q, want %q", lnames, want)
		}
	})

	t.Run("whiteout prefix", func(t *testing.T) {
		inval := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, unix.EINVAL) {
				t.Errorf("%s: %v, want EINVAL", what, err)
			}
		}
		if err := os.WriteFile(p("plain"), []byte("p"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{".wh.foo", ".wh..wh..opq", ".wh.", ".wh.plain"} {
			_, err := unix.Open(p(n), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			inval("open O_CREAT "+n, err)
			inval("mkdir "+n, unix.Mkdir(p(n), 0o755))
			inval("symlink "+n, unix.Symlink("t", p(n)))
			inval("mknod "+n, unix.Mknod(p(n), unix.S_IFIFO|0o644, 0))
			inval("link to "+n, unix.Link(p("plain"), p(n)))
			inval("rename to "+n, unix.Rename(p("plain"), p(n)))
			var st unix.Stat_t
			if err := unix.Lstat(p(n), &st); !errors.Is(err, unix.ENOENT) {
				t.Errorf("lstat %s: %v, want ENOENT", n, err)
			}
		}
		if b, err := os.ReadFile(p("plain")); err != nil || string(b) != "p" {
			t.Errorf("plain after the refused renames: %q %v", b, err)
		}
	})

	live := testutil.Snapshot(t, m.Dir)
	m.Unmount(t)
	again := mountG(t, s)
	reportDiff(t, "names after a remount", diffTrees(normalize(live, never), normalize(testutil.Snapshot(t, again.Dir), never), "live", "remounted"))
	again.Unmount(t)
	k := mountK(t, s)
	reportDiff(t, "names: goverlay vs the kernel overlay over the same upper", diffTrees(normalize(live, never), normalize(testutil.Snapshot(t, k), never), "goverlay", "kernel"))
}

// deepLower is a chain of 16 directories with 250-byte names, and
// deepLowerFile a file in it whose relative path is 4095 bytes long.
var (
	deepLower = func() []string {
		var c []string
		for i := range 16 {
			c = append(c, strings.Repeat(string(rune('A'+i)), 250))
		}
		return c
	}()
	deepLowerFile = strings.Join(deepLower, "/") + "/" + strings.Repeat("l", 4095-len(strings.Join(deepLower, "/"))-1)
)

// mkdirs makes the chain of directories comps under dirfd, one *at step
// at a time (the whole path may be longer than PATH_MAX from /).
func mkdirs(t *testing.T, dirfd int, comps []string) {
	t.Helper()
	fd, err := unix.Dup(dirfd)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range comps {
		if err := unix.Mkdirat(fd, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			t.Fatalf("mkdir %d-byte name: %v", len(c), err)
		}
		next, err := unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
}

func writeAt(t *testing.T, dirfd int, rel, data string) {
	t.Helper()
	fd, err := unix.Openat(dirfd, rel, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("create a %d-byte path: %v", len(rel), err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(data)); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, dirfd int, rel string) string {
	t.Helper()
	fd, err := unix.Openat(dirfd, rel, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Errorf("open a %d-byte path: %v", len(rel), err)
		return ""
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Errorf("read: %v", err)
	}
	return string(buf[:max(n, 0)])
}
