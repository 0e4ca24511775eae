package rundir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpen: the directory of the control socket is made 0700 when
// missing, and refused when it is a symlink or not a directory, belongs
// to another user, or others may write it (or, in /tmp, read it).
func TestOpen(t *testing.T) {
	base := t.TempDir()
	uid := os.Geteuid()
	good := filepath.Join(base, "good")
	fd, err := Open(Dir{Path: good}, uid, true)
	if err != nil {
		t.Fatalf("make %s: %v", good, err)
	}
	unix.Close(fd)
	if fi, err := os.Lstat(good); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, %v; want a directory of mode 0700", good, fi, err)
	}
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		d    Dir
		want string // "" for accepted
	}{
		{Dir{Path: good}, ""},
		{Dir{Path: link}, "not a directory"},
		{Dir{Path: file}, "not a directory"},
		{Dir{Path: mk("readable", 0o755)}, "others may use it"},
		{Dir{Path: mk("shared", 0o755), Shared: true}, ""},
		{Dir{Path: mk("groupw", 0o770), Shared: true}, "others may use it"},
		{Dir{Path: filepath.Join(base, "missing")}, "no such file"},
	}
	if uid == 0 {
		other := mk("other", 0o700)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			d    Dir
			want string
		}{Dir{Path: other}, "belongs to uid 65534"})
	}
	for _, c := range cases {
		fd, err := Open(c.d, uid, false)
		if err == nil {
			unix.Close(fd)
		}
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Open(%+v): %v; want %q", c.d, err, c.want)
		}
	}
}

func TestMapUID(t *testing.T) {
	const m = "         0       1000          1\n         1     100000      65536\n"
	for uid, want := range map[int]int{0: 1000, 1: 100000, 65536: 165535, 65537: 65537, 1000: 100999} {
		if got := mapUID(m, uid); got != want {
			t.Errorf("mapUID(%d) = %d, want %d", uid, got, want)
		}
	}
	if got := mapUID("0 0 4294967295\n", 1234); got != 1234 {
		t.Errorf("initial namespace: mapUID(1234) = %d", got)
	}
}
