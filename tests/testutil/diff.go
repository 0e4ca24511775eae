package testutil

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DiffOptions relax a comparison.
type DiffOptions struct {
	IgnoreDirNlink bool // directories' link counts
	IgnoreMtime    bool
	IgnoreDirSize  bool // directories' st_size (depends on the filesystem)
	IgnoreBlocks   bool // regular files' st_blocks
	// Labels name the two trees in messages; default "a" and "b".
	A, B string
}

// Diff lists the differences between two trees in readable form; none
// means equal. Raw inode and device numbers are not compared; hard-link
// groups are.
func Diff(a, b Tree) []string { return DiffWith(a, b, DiffOptions{}) }

// DiffWith is Diff with options.
func DiffWith(a, b Tree, o DiffOptions) []string {
	la, lb := o.A, o.B
	if la == "" {
		la = "a"
	}
	if lb == "" {
		lb = "b"
	}
	paths := map[string]bool{}
	for p := range a {
		paths[p] = true
	}
	for p := range b {
		paths[p] = true
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	var out []string
	for _, p := range sorted {
		na, nb := a[p], b[p]
		q := strconv.Quote(p)
		switch {
		case nb == nil:
			out = append(out, fmt.Sprintf("%s: only in %s (%s)", q, la, na.Type))
			continue
		case na == nil:
			out = append(out, fmt.Sprintf("%s: only in %s (%s)", q, lb, nb.Type))
			continue
		}
		field := func(name string, va, vb any) {
			out = append(out, fmt.Sprintf("%s: %s: %s=%v %s=%v", q, name, la, va, lb, vb))
		}
		if na.Type != nb.Type {
			field("type", na.Type, nb.Type)
			continue
		}
		dir := na.Type == "dir"
		if na.Mode != nb.Mode {
			field("mode", fmt.Sprintf("%04o", na.Mode), fmt.Sprintf("%04o", nb.Mode))
		}
		if na.UID != nb.UID || na.GID != nb.GID {
			field("owner", fmt.Sprintf("%d:%d", na.UID, na.GID), fmt.Sprintf("%d:%d", nb.UID, nb.GID))
		}
		if na.Size != nb.Size && !(dir && o.IgnoreDirSize) {
			field("size", na.Size, nb.Size)
		}
		if na.Blocks != nb.Blocks && !o.IgnoreBlocks {
			field("blocks", na.Blocks, nb.Blocks)
		}
		if na.Nlink != nb.Nlink && !(dir && o.IgnoreDirNlink) {
			field("nlink", na.Nlink, nb.Nlink)
		}
		if na.Mtime != nb.Mtime && !o.IgnoreMtime {
			field("mtime", na.Mtime, nb.Mtime)
		}
		if na.Hash != nb.Hash {
			field("content sha256", short(na.Hash), short(nb.Hash))
		}
		if na.Target != nb.Target {
			field("symlink target", strconv.Quote(na.Target), strconv.Quote(nb.Target))
		}
		if na.Rdev != nb.Rdev {
			field("rdev", devString(na.Rdev), devString(nb.Rdev))
		}
		if na.Link != nb.Link {
			field("hard-link group", strconv.Quote(na.Link), strconv.Quote(nb.Link))
		}
		if xa, xb := xattrString(na.Xattrs), xattrString(nb.Xattrs); xa != xb {
			field("xattrs", xa, xb)
		}
		if ea, eb := strings.Join(na.Errs, "; "), strings.Join(nb.Errs, "; "); ea != eb {
			field("errors", strconv.Quote(ea), strconv.Quote(eb))
		}
	}
	return out
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	if h == "" {
		return "(none)"
	}
	return h
}

func devString(d uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(d), unix.Minor(d))
}

// xattrString renders xattrs sorted by name, values quoted.
func xattrString(m map[string]string) string {
	if len(m) == 0 {
		return "{}"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	b.WriteString("{")
	for i, k := range ks {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	b.WriteString("}")
	return b.String()
}

// String renders a tree one path a line, for failure messages.
func (tr Tree) String() string {
	var b strings.Builder
	for _, p := range tr.Paths() {
		n := tr[p]
		fmt.Fprintf(&b, "%q %s %04o %d:%d size=%d nlink=%d", p, n.Type, n.Mode, n.UID, n.GID, n.Size, n.Nlink)
		switch {
		case n.Hash != "":
			fmt.Fprintf(&b, " sha=%s", short(n.Hash))
		case n.Target != "":
			fmt.Fprintf(&b, " -> %q", n.Target)
		case n.Rdev != 0:
			fmt.Fprintf(&b, " rdev=%s", devString(n.Rdev))
		}
		if n.Link != "" {
			fmt.Fprintf(&b, " link=%q", n.Link)
		}
		if len(n.Xattrs) > 0 {
			fmt.Fprintf(&b, " xattrs=%s", xattrString(n.Xattrs))
		}
		if len(n.Errs) > 0 {
			fmt.Fprintf(&b, " errs=%q", n.Errs)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// DiffLines lists the positions where two logs of steps differ, one line
// each, naming a's entry la and b's lb; none means equal.
func DiffLines(a, b []string, la, lb string) []string {
	var d []string
	for i := range max(len(a), len(b)) {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			d = append(d, fmt.Sprintf("%s %q, %s %q", la, x, lb, y))
		}
	}
	return d
}
