package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Node is what a Snapshot records for one path.
type Node struct {
	Type     string // file, dir, symlink, fifo, socket, chardev, blockdev (whiteout in UpperLayout)
	Mode     uint32 // permission bits with suid, sgid and sticky
	UID, GID uint32
	Size     int64
	Blocks   int64  // st_blocks, regular files only (sparse files)
	Nlink    uint64 // for directories too; see DiffOptions.IgnoreDirNlink
	Mtime    int64  // nanoseconds since the epoch
	Hash     string // sha256 of a regular file's content
	Target   string // symlink target
	Rdev     uint64 // device nodes
	Xattrs   map[string]string
	// Link is the hard-link group of a non-directory: the lexicographically
	// smallest path of the tree sharing its inode, "" when none does.
	Link string
	// Ino and Dev are the raw numbers; Diff never compares them.
	Ino, Dev uint64
	// Errs are the problems met reading this entry (a failed read, a name
	// listed twice, ...); Diff compares them like any field.
	Errs []string
}

// Tree maps the path of every entry below a root ("." is the root, then
// "a", "a/b", ...: names as raw bytes, so they may hold newlines, spaces
// and colons) to what it is.
type Tree map[string]*Node

// Paths is the tree's paths in order.
func (tr Tree) Paths() []string {
	ps := make([]string, 0, len(tr))
	for p := range tr {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// Snapshot walks root without following symlinks. Overlay-private xattrs
// (trusted.overlay.*, user.overlay.*) are left out.
func Snapshot(t testing.TB, root string) Tree {
	t.Helper()
	tr, err := snapshot(root, false)
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return tr
}

// UpperLayout is the raw on-disk view of a layer directory: kernel
// whiteouts (char 0/0) have type "whiteout" and every xattr, the overlay's
// own included, is recorded.
func UpperLayout(t testing.TB, dir string) Tree {
	t.Helper()
	tr, err := snapshot(dir, true)
	if err != nil {
		t.Fatalf("layout of %s: %v", dir, err)
	}
	return tr
}

func snapshot(root string, raw bool) (Tree, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	tr := Tree{}
	n := newNode(&st, raw)
	n.Xattrs = xattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
		func(name string, b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) }, raw, n)
	tr["."] = n
	walk(fd, ".", tr, raw)
	linkGroups(tr)
	return tr, nil
}

func walk(dirfd int, rel string, tr Tree, raw bool) {
	parent := tr[rel]
	names, err := readNames(dirfd)
	if err != nil {
		parent.Errs = append(parent.Errs, "readdir: "+err.Error())
	}
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			parent.Errs = append(parent.Errs, fmt.Sprintf("readdir lists %q twice", name))
			continue
		}
		seen[name] = true
		p := name
		if rel != "." {
			p = rel + "/" + name
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			tr[p] = &Node{Type: "?", Errs: []string{"listed but lstat: " + err.Error()}}
			continue
		}
		n := newNode(&st, raw)
		tr[p] = n
		// The dirfd's /proc link reaches the entry without a path
		// that could exceed PATH_MAX, and without following it.
		proc := fmt.Sprintf("/proc/self/fd/%d/%s", dirfd, name)
		n.Xattrs = xattrs(func(b []byte) (int, error) { return unix.Llistxattr(proc, b) },
			func(x string, b []byte) (int, error) { return unix.Lgetxattr(proc, x, b) }, raw, n)
		switch n.Type {
		case "file":
			n.Hash = hashAt(dirfd, name, n)
		case "symlink":
			buf := make([]byte, unix.PathMax)
			k, err := unix.Readlinkat(dirfd, name, buf)
			if err != nil {
				n.Errs = append(n.Errs, "readlink: "+err.Error())
			}
			n.Target = string(buf[:max(k, 0)])
		case "dir":
			sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				n.Errs = append(n.Errs, "open: "+err.Error())
				continue
			}
			walk(sub, p, tr, raw)
			unix.Close(sub)
		}
	}
}

func newNode(st *unix.Stat_t, raw bool) *Node {
	n := &Node{
		Mode:  st.Mode & 0o7777,
		UID:   st.Uid,
		GID:   st.Gid,
		Size:  st.Size,
		Nlink: uint64(st.Nlink),
		Mtime: st.Mtim.Nano(),
		Ino:   st.Ino,
		Dev:   st.Dev,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		n.Type = "file"
		n.Blocks = st.Blocks
	case unix.S_IFDIR:
		n.Type = "dir"
	case unix.S_IFLNK:
		n.Type = "symlink"
	case unix.S_IFIFO:
		n.Type = "fifo"
	case unix.S_IFSOCK:
		n.Type = "socket"
	case unix.S_IFCHR:
		n.Type = "chardev"
		n.Rdev = st.Rdev
		if raw && st.Rdev == 0 {
			n.Type = "whiteout"
		}
	case unix.S_IFBLK:
		n.Type = "blockdev"
		n.Rdev = st.Rdev
	default:
		n.Type = fmt.Sprintf("mode%o", st.Mode&unix.S_IFMT)
	}
	return n
}

func hashAt(dirfd int, name string, n *Node) string {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		n.Errs = append(n.Errs, "open: "+err.Error())
		return ""
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		n.Errs = append(n.Errs, "read: "+err.Error())
	}
	return hex.EncodeToString(h.Sum(nil))
}

// xattrs lists and reads every xattr through the given calls.
func xattrs(list func([]byte) (int, error), get func(string, []byte) (int, error), raw bool, n *Node) map[string]string {
	names, err := growCall(list)
	if err != nil {
		if !errors.Is(err, unix.ENOTSUP) {
			n.Errs = append(n.Errs, "listxattr: "+err.Error())
		}
		return nil
	}
	var out map[string]string
	for _, x := range strings.Split(string(names), "\x00") {
		if x == "" || (!raw && IsPrivateXattr(x)) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		v, err := growCall(func(b []byte) (int, error) { return get(x, b) })
		if err != nil {
			out[x] = "<getxattr error: " + err.Error() + ">"
			continue
		}
		out[x] = string(v)
	}
	return out
}

// growCall calls f with a growing buffer until it fits (size query first).
func growCall(f func([]byte) (int, error)) ([]byte, error) {
	for range 8 {
		sz, err := f(nil)
		if err != nil {
			return nil, err
		}
		if sz == 0 {
			return nil, nil
		}
		buf := make([]byte, sz+64)
		k, err := f(buf)
		if errors.Is(err, unix.ERANGE) {
			continue // it grew in between
		}
		if err != nil {
			return nil, err
		}
		return buf[:k], nil
	}
	return nil, unix.ERANGE
}

// IsPrivateXattr reports whether name belongs to the overlay itself.
func IsPrivateXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// linkGroups fills Link for non-directories that share an inode.
func linkGroups(tr Tree) {
	type key struct{ dev, ino uint64 }
	groups := map[key][]string{}
	for p, n := range tr {
		if n.Type != "dir" && n.Type != "?" {
			k := key{n.Dev, n.Ino}
			groups[k] = append(groups[k], p)
		}
	}
	for _, ps := range groups {
		if len(ps) < 2 {
			continue
		}
		sort.Strings(ps)
		for _, p := range ps {
			tr[p].Link = ps[0]
		}
	}
}
