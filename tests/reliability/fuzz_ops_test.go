package reliability_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// FuzzOps decodes its input into a short sequence of operations (at most
// 20) on a small tree of two lower layers, runs it on goverlay and on the
// kernel overlay over identical fresh layers, and compares every
// operation's errno (and what reads, listings and stats saw) and the final
// trees. Mounting costs about a second per input, so the seed corpus is
// small; for a longer run:
//
//	go test -run '^$' -fuzz FuzzOps -fuzztime 60s ./tests/reliability/
//
// Each operation is three bytes: kind, path, second path or value.
func FuzzOps(f *testing.F) {
	seeds := [][]fuzzOp{
		{ // copy-up, rename over a lower file, whiteouts
			{"append", "a", "", 1}, {"rename", "a", "b", 0}, {"read", "b", "", 0}, {"unlink", "d/a", "", 0},
			{"readdir", "d", "", 0}, {"create", "d/a", "", 2}, {"stat", "d/a", "", 0}, {"readdir", ".", "", 0},
		},
		{ // directory renames (redirects), then use of both names
			{"rename", "d", "n", 0}, {"read", "n/s/a", "", 0}, {"mkdir", "d", "", 0}, {"readdir", "d", "", 0},
			{"rename", "n/s", "d/s", 0}, {"readdir", "d/s", "", 0}, {"rmdir", "n", "", 0}, {"unlink", "n/a", "", 0},
			{"unlink", "n/b", "", 0}, {"rmdir", "n", "", 0}, {"readdir", ".", "", 0},
		},
		{ // a hard link outlives its first name
			{"link", "a", "n", 0}, {"unlink", "a", "", 0}, {"read", "n", "", 0}, {"create", "a", "", 3}, {"read", "n", "", 0},
		},
		{ // opaque and whited-out directories, non-empty rmdir, rename onto a directory
			{"readdir", "e", "", 0}, {"readdir", "o", "", 0}, {"rmdir", "d", "", 0}, {"unlink", "o/a", "", 0},
			{"rmdir", "o", "", 0}, {"mkdir", "o", "", 0}, {"readdir", "o", "", 0}, {"rename", "e", "o", 0},
			{"rename-noreplace", "d", "e", 0}, {"readdir", ".", "", 0},
		},
		{ // metadata: modes, xattrs, times, truncate, symlinks
			{"chmod", "b", "", 1}, {"setxattr", "d/b", "", 4}, {"removexattr", "d/b", "", 4}, {"setxattr", "d", "", 5},
			{"utimes", "a", "", 7}, {"truncate", "d/s/a", "", 3}, {"symlink", "n", "", 6}, {"stat", "n", "", 0},
			{"read", "n", "", 0}, {"stat", "d/s/a", "", 0},
		},
		{ // RENAME_EXCHANGE: merged directories (both redirected), a file and a directory, then use
			{"rename-exchange", "d", "e", 0}, {"readdir", "d", "", 0}, {"readdir", "e", "", 0}, {"create", "e/a", "", 1},
			{"rename-exchange", "a", "o", 0}, {"readdir", "a", "", 0}, {"read", "o", "", 0}, {"rename-exchange", "d", "n", 0},
			{"readdir", ".", "", 0}, {"rmdir", "e", "", 0},
		},
	}
	for _, s := range seeds {
		f.Add(encodeOps(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ops := decodeOps(data)
		if len(ops) == 0 {
			return
		}
		testutil.RequireRoot(t)
		start := time.Now()
		ks, gs := newStack(t, 2, buildFuzz), newStack(t, 2, buildFuzz)
		kmnt, g := mountK(t, ks), mountG(t, gs)
		var script []string
		for _, op := range ops {
			script = append(script, op.String())
		}
		for i, op := range ops {
			kr, gr := op.run(kmnt), op.run(g.Dir)
			if kr != gr {
				t.Errorf("op %d %s: goverlay %s, kernel %s\nscript: %s", i, op, gr, kr, strings.Join(script, "; "))
			}
		}
		d := diffTrees(normalize(testutil.Snapshot(t, g.Dir), start), normalize(testutil.Snapshot(t, kmnt), start), "goverlay", "kernel")
		if len(d) > 0 {
			reportDiff(t, "final trees after: "+strings.Join(script, "; "), d)
		}
	})
}

// buildFuzz: two lower layers with a merged directory (d), an opaque one
// (o), one whose only file is whited out (e), files in either layer.
func buildFuzz(l []*testutil.Layer, _ *testutil.Layer) {
	l[1].File("a", "l1 a\n", 0o644).File("d/a", "l1 d/a\n", 0o644).File("d/s/a", "l1 d/s/a\n", 0o600).
		File("e/a", "l1 e/a\n", 0o644).File("o/x", "l1 o/x (under opaque o)\n", 0o644)
	l[0].File("b", "l0 b\n", 0o640).File("d/b", "l0 d/b\n", 0o644).Whiteout("e/a").
		File("o/a", "l0 o/a\n", 0o644).Opaque("o").Xattr("d/b", "user.f0", "l0")
}

var (
	fuzzKinds = []string{"create", "append", "truncate", "unlink", "mkdir", "rmdir", "rename", "rename-noreplace",
		"link", "symlink", "chmod", "setxattr", "removexattr", "utimes", "read", "readdir", "stat", "rename-exchange"}
	fuzzPaths = []string{".", "a", "b", "d", "d/a", "d/b", "d/s", "d/s/a", "e", "e/a", "o", "o/a", "n", "n/a", "n/b", "n/s", "n/s/a"}
)

type fuzzOp struct {
	kind, a, b string
	v          byte
}

func (o fuzzOp) String() string {
	if o.b != "" {
		return fmt.Sprintf("%s %s %s", o.kind, o.a, o.b)
	}
	return fmt.Sprintf("%s %s (%d)", o.kind, o.a, o.v)
}

func indexOf(list []string, s string) byte {
	for i, x := range list {
		if x == s {
			return byte(i)
		}
	}
	panic("unknown " + s)
}

func encodeOps(ops []fuzzOp) []byte {
	var b []byte
	for _, o := range ops {
		third := o.v
		if o.b != "" {
			third = indexOf(fuzzPaths, o.b)
		}
		b = append(b, indexOf(fuzzKinds, o.kind), indexOf(fuzzPaths, o.a), third)
	}
	return b
}

func decodeOps(data []byte) []fuzzOp {
	var ops []fuzzOp
	for i := 0; i+3 <= len(data) && len(ops) < 20; i += 3 {
		o := fuzzOp{kind: fuzzKinds[int(data[i])%len(fuzzKinds)], a: fuzzPaths[int(data[i+1])%len(fuzzPaths)], v: data[i+2]}
		switch o.kind {
		case "rename", "rename-noreplace", "rename-exchange", "link":
			o.b = fuzzPaths[int(data[i+2])%len(fuzzPaths)]
		}
		ops = append(ops, o)
	}
	return ops
}

// run performs the operation on mnt and describes the outcome: the errno
// and, for read, readdir and stat, what was seen.
func (o fuzzOp) run(mnt string) string {
	a, b := filepath.Join(mnt, o.a), filepath.Join(mnt, o.b)
	var err error
	var seen string
	switch o.kind {
	case "create":
		var fd int
		if fd, err = unix.Open(a, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err == nil {
			_, err = unix.Write(fd, []byte(fmt.Sprintf("created %d\n", o.v)))
			unix.Close(fd)
		}
	case "append":
		var fd int
		if fd, err = unix.Open(a, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0); err == nil {
			_, err = unix.Write(fd, []byte(fmt.Sprintf("+%d\n", o.v)))
			unix.Close(fd)
		}
	case "truncate":
		err = unix.Truncate(a, int64(o.v%8))
	case "unlink":
		err = unix.Unlink(a)
	case "mkdir":
		err = unix.Mkdir(a, 0o755)
	case "rmdir":
		err = unix.Rmdir(a)
	case "rename":
		err = unix.Rename(a, b)
	case "rename-noreplace":
		err = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE)
	case "rename-exchange":
		err = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	case "link":
		err = unix.Link(a, b)
	case "symlink":
		err = unix.Symlink(fmt.Sprintf("target%d", o.v%4), a)
	case "chmod":
		err = unix.Chmod(a, []uint32{0o600, 0o644, 0o755, 0o640}[o.v%4])
	case "setxattr":
		err = unix.Setxattr(a, fmt.Sprintf("user.f%d", o.v%2), []byte{'v', o.v}, 0)
	case "removexattr":
		err = unix.Removexattr(a, fmt.Sprintf("user.f%d", o.v%2))
	case "utimes":
		ts := []unix.Timespec{unix.NsecToTimespec(int64(o.v) * 1e9), unix.NsecToTimespec(int64(o.v)*1e9 + 7)}
		err = unix.UtimesNano(a, ts)
	case "read":
		var data []byte
		data, err = os.ReadFile(a)
		seen = fmt.Sprintf(" %q", data)
	case "readdir":
		var ents []os.DirEntry
		ents, err = os.ReadDir(a)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		seen = " [" + strings.Join(names, " ") + "]"
	case "stat":
		var st unix.Stat_t
		if err = unix.Lstat(a, &st); err == nil {
			seen = fmt.Sprintf(" mode %o", st.Mode)
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				seen += fmt.Sprintf(" size %d nlink %d", st.Size, st.Nlink)
			}
		}
	}
	var e unix.Errno
	if err != nil {
		if !errors.As(err, &e) {
			return "error " + err.Error()
		}
	}
	return errName(e) + seen
}
