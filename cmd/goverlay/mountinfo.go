package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// mountEntry is what goverlay reads of one line of /proc/self/mountinfo
// (proc(5)): ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] -
// TYPE SOURCE SUPER-OPTIONS.
type mountEntry struct {
	dev        string // MAJ:MIN
	mountpoint string // unescaped
	fsType     string
	superOpts  string // still escaped
}

// readMountinfo reads the mount table at path, in its order (a mount
// stacked on another comes after it); lines it cannot make out are left
// out.
func readMountinfo(path string) ([]mountEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || len(f) < sep+4 {
			continue
		}
		out = append(out, mountEntry{dev: f[2], mountpoint: unescapeMountinfo(f[4]), fsType: f[sep+1], superOpts: f[sep+3]})
	}
	return out, nil
}

// owner is the user a FUSE mount belongs to: the user_id of its super
// options (fuse(4)); 0, root, when there is none.
func (m mountEntry) owner() int {
	for _, opt := range strings.Split(m.superOpts, ",") {
		if v, ok := strings.CutPrefix(opt, "user_id="); ok {
			if uid, err := strconv.ParseUint(v, 10, 32); err == nil {
				return int(uid)
			}
		}
	}
	return 0
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, \054 for
// a comma, ...) of /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
