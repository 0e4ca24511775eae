package oracle_test

import (
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// bigDir is one directory merged from four layers, with names shadowed,
// whited out and made opaque, large enough for many getdents calls.
var bigDir = scenario{
	name: "big-dir", layers: 4,
	build: func(_ testing.TB, l []*testutil.Layer) {
		for i, layer := range l {
			for j := range 120 {
				// Each layer overlaps half of the names of the one below.
				n := fmt.Sprintf("big/entry-%03d-%s", j+i*60, strings.Repeat("x", j%40))
				layer.File(n, fmt.Sprint("layer ", i), 0o644)
			}
			layer.File(fmt.Sprintf("big/only-%d", i), "", 0o644)
			layer.Dir(fmt.Sprintf("big/dir-%d", i), 0o755)
		}
		for j := 0; j < 120; j += 7 {
			l[1].Whiteout(fmt.Sprintf("big/entry-%03d-%s", j, strings.Repeat("x", j%40)))
		}
		l[0].File("top-file", "t", 0o644)
		l[3].File("bottom-file", "b", 0o644)
	},
	present: []string{"big/only-0", "big/only-3", "big/dir-2", "top-file", "bottom-file"},
	absent:  []string{"big/entry-007-" + strings.Repeat("x", 7)},
}

// listAll opens dir and reads it to the end with getdents buffers of size
// bytes.
func listAll(t testing.TB, dir string, size int) []testutil.Dirent {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ds, err := testutil.ReadAllDirents(fd, size)
	if err != nil {
		t.Fatalf("getdents %s: %v", dir, err)
	}
	return ds
}

func names(ds []testutil.Dirent) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Name
	}
	return out
}

// duplicates lists the names that occur more than once.
func duplicates(ns []string) []string {
	seen := map[string]int{}
	var dup []string
	for _, n := range ns {
		if seen[n]++; seen[n] == 2 {
			dup = append(dup, n)
		}
	}
	return dup
}

func sorted(ns []string) []string {
	s := slices.Clone(ns)
	sort.Strings(s)
	return s
}

// TestRootListing: the root lists "." and ".." (raw getdents and ls -a),
// each name once, the same names as the kernel.
func TestRootListing(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	kmnt, g := mountBoth(t, bigDir)
	kn := names(listAll(t, kmnt, 4096))
	gn := names(listAll(t, g.Dir, 4096))
	for _, want := range []string{".", "..", "big", "top-file", "bottom-file"} {
		if !slices.Contains(gn, want) {
			t.Errorf("getdents on the goverlay root lacks %q: %q", want, gn)
		}
	}
	if d := duplicates(gn); len(d) > 0 {
		t.Errorf("getdents on the goverlay root lists %q more than once", d)
	}
	if !slices.Equal(sorted(kn), sorted(gn)) {
		t.Errorf("root names differ:\n kernel:   %q\n goverlay: %q", sorted(kn), sorted(gn))
	}
	kls, err1 := exec.Command("ls", "-a", kmnt).Output()
	gls, err2 := exec.Command("ls", "-a", g.Dir).Output()
	if err1 != nil || err2 != nil {
		t.Fatalf("ls -a: %v, %v", err1, err2)
	}
	lines := strings.Split(strings.TrimSpace(string(gls)), "\n")
	if len(lines) < 2 || lines[0] != "." || lines[1] != ".." {
		t.Errorf("ls -a on goverlay does not start with . and ..: %q", lines)
	}
	if string(kls) != string(gls) {
		t.Errorf("ls -a differs:\n kernel:   %q\n goverlay: %q", kls, gls)
	}
}

// TestReaddirEachNameOnce: a big merged directory read with small getdents
// buffers shows every name exactly once, the same names as the kernel.
func TestReaddirEachNameOnce(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	kmnt, g := mountBoth(t, bigDir)
	for _, size := range []int{300, 1024, 32 << 10} {
		kn := names(listAll(t, kmnt+"/big", size))
		gn := names(listAll(t, g.Dir+"/big", size))
		if d := duplicates(gn); len(d) > 0 {
			t.Errorf("buffer %d: goverlay lists %d names more than once: %q", size, len(d), d)
		}
		if d := duplicates(kn); len(d) > 0 {
			t.Fatalf("control: the kernel lists %q twice", d)
		}
		if !slices.Equal(sorted(kn), sorted(gn)) {
			t.Errorf("buffer %d: names differ (kernel %d, goverlay %d)\n only kernel: %q\n only goverlay: %q",
				size, len(kn), len(gn), minus(kn, gn), minus(gn, kn))
		}
	}
}

func minus(a, b []string) []string {
	in := map[string]bool{}
	for _, x := range b {
		in[x] = true
	}
	var out []string
	for _, x := range a {
		if !in[x] {
			out = append(out, x)
		}
	}
	return out
}

// TestSeekdir: telldir/seekdir are stable. Read half a directory, note
// the position, read the rest, seek back and read again: the same names.
// Then seek to the d_off of arbitrary entries: what follows is the rest of
// the listing. The kernel overlay runs the same checks as a control.
func TestSeekdir(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	kmnt, g := mountBoth(t, bigDir)
	if errs := seekdirChecks(t, kmnt+"/big"); len(errs) > 0 {
		t.Fatalf("control: the kernel overlay fails the seekdir checks, so they are wrong:\n  %s", strings.Join(errs, "\n  "))
	}
	if errs := seekdirChecks(t, g.Dir+"/big"); len(errs) > 0 {
		t.Errorf("goverlay:\n  %s", strings.Join(errs, "\n  "))
	}
}

func seekdirChecks(t testing.TB, dir string) []string {
	t.Helper()
	var errs []string
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	all, err := testutil.ReadAllDirents(fd, 1024)
	if err != nil {
		t.Fatal(err)
	}
	total := len(all)

	// telldir after reading about half, in whole getdents calls.
	if _, err := unix.Seek(fd, 0, unix.SEEK_SET); err != nil {
		t.Fatal(err)
	}
	var first []testutil.Dirent
	for len(first) < total/2 {
		ds, err := testutil.Getdents(fd, 1024)
		if err != nil || len(ds) == 0 {
			return append(errs, fmt.Sprintf("second pass ended after %d of %d entries (%v)", len(first), total, err))
		}
		first = append(first, ds...)
	}
	pos, err := unix.Seek(fd, 0, unix.SEEK_CUR)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := testutil.ReadAllDirents(fd, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(append(slices.Clone(first), rest...)); !slices.Equal(got, names(all)) {
		errs = append(errs, fmt.Sprintf("rewinddir then reading again gives another listing (%d vs %d entries)", len(got), total))
	}
	if _, err := unix.Seek(fd, pos, unix.SEEK_SET); err != nil {
		return append(errs, fmt.Sprintf("seekdir(%d): %v", pos, err))
	}
	again, err := testutil.ReadAllDirents(fd, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names(again), names(rest)) {
		errs = append(errs, fmt.Sprintf("after seekdir(telldir()) at entry %d: %d names, want %d; first %q, want %q",
			len(first), len(again), len(rest), head(names(again)), head(names(rest))))
	}

	// seekdir to the d_off of single entries, in a scrambled order.
	for _, k := range []int{total - 2, 0, total / 3, 1, total / 2, 2 * total / 3, total - 1} {
		if k < 0 || k >= total {
			continue
		}
		if _, err := unix.Seek(fd, all[k].Off, unix.SEEK_SET); err != nil {
			errs = append(errs, fmt.Sprintf("seekdir to d_off of entry %d: %v", k, err))
			continue
		}
		got, err := testutil.ReadAllDirents(fd, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if want := names(all[k+1:]); !slices.Equal(names(got), want) {
			errs = append(errs, fmt.Sprintf("seekdir to d_off of entry %d (%q): %d names follow, want %d; first %q, want %q",
				k, all[k].Name, len(got), len(want), head(names(got)), head(want)))
		}
	}
	return errs
}

func head(ns []string) []string {
	if len(ns) > 3 {
		return ns[:3]
	}
	return ns
}
