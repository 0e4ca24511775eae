package testutil

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MountEntry is one line of /proc/self/mountinfo.
type MountEntry struct {
	Point   string // mount point, unescaped
	Options string // per-mount options (ro, nosuid, ...)
	FSType  string // e.g. "fuse.goverlay", "overlay", "tmpfs"
	Source  string
	Super   string // per-superblock options
}

// Mounts parses /proc/self/mountinfo.
func Mounts() ([]MountEntry, error) { return MountsIn("/proc/self/mountinfo") }

// MountsIn parses a mountinfo file: /proc/PID/mountinfo lists the mounts
// of PID's mount namespace (proc(5)).
func MountsIn(mountinfo string) ([]MountEntry, error) {
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	var out []MountEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root point options [optional...] - type source super
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(f) < sep+3 {
			continue
		}
		e := MountEntry{
			Point:   unescapeMountinfo(f[4]),
			Options: f[5],
			FSType:  f[sep+1],
			Source:  unescapeMountinfo(f[sep+2]),
		}
		if len(f) > sep+3 {
			e.Super = f[sep+3]
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escaping of space, tab,
// newline and backslash (fs/proc_namespace.c mangle()).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}

// MountAt returns the topmost mount whose mount point is exactly dir.
func MountAt(dir string) (MountEntry, bool) {
	ms, err := Mounts()
	if err != nil {
		return MountEntry{}, false
	}
	dir = canonical(dir)
	var found MountEntry
	ok := false
	for _, m := range ms {
		if m.Point == dir {
			found, ok = m, true // later lines are mounted on top
		}
	}
	return found, ok
}

// IsMounted reports whether something is mounted exactly on dir.
func IsMounted(dir string) bool {
	_, ok := MountAt(dir)
	return ok
}

// MountsUnder lists the mount points at or below dir.
func MountsUnder(dir string) []string {
	ms, err := Mounts()
	if err != nil {
		return nil
	}
	dir = canonical(dir)
	var out []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	return out
}

// RequireMounted fails the test unless dir is a mount point of type fstype.
func RequireMounted(t testing.TB, dir, fstype string) MountEntry {
	t.Helper()
	m, ok := MountAt(dir)
	if !ok {
		t.Fatalf("%s is not mounted", dir)
	}
	if fstype != "" && m.FSType != fstype {
		t.Fatalf("%s is mounted as %q, want %q", dir, m.FSType, fstype)
	}
	return m
}

// canonical resolves symlinks in the parent of p, the way the kernel shows
// mount points. p itself is not touched: it may be a mount whose daemon
// hangs or is gone.
func canonical(p string) string {
	p = filepath.Clean(p)
	if r, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(r, filepath.Base(p))
	}
	return p
}
