package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The containers workloads' generated tree: a seeded, deterministic tree
// shaped like a distribution image (/usr and friends), split over three
// lower layers. Its shape, at the default size of 50,000 entries:
//
//   - about 9 % directories, 78 % regular files, 11 % symlinks and 2 %
//     hard links (a second name of a file of the same layer), as in a
//     Debian /usr;
//   - directories grown as a random recursive tree below a distro
//     skeleton (bin, etc, lib, usr/bin, usr/lib, usr/share, ...), so the
//     depth is logarithmic (about 8 to 10 levels) and a few directories
//     (usr/bin, usr/lib) hold thousands of entries;
//   - file sizes mostly small (half under 1 KiB, nine in ten under 16 KiB)
//     with a tail of large ones (up to 1 MiB), about 5 KiB on average
//     (a real /usr has more large files; the steps here are bound by the
//     files' count more than by their bytes);
//   - symlinks relative, to a file elsewhere in the tree;
//   - every directory has a home layer holding its entries; one in eight
//     is merged, its entries spread over all three layers.

// ctFullEntries is the generated tree's size at --scale 1; the default
// --scale gives 50,000.
const ctFullEntries = 250_000

// The share of each kind of entry, in thousandths.
const (
	ctDirsPermil      = 90
	ctSymlinksPermil  = 110
	ctHardlinksPermil = 20
	ctMergedEvery     = 8 // one directory in 8 is spread over all layers
	ctLayers          = 3
)

// ctSizeClasses is the file-size mix: the share of files in thousandths,
// and the size range of each class.
var ctSizeClasses = []struct {
	permil   int
	min, max int64
}{
	{540, 0, 1 << 10},
	{300, 1 << 10, 4 << 10},
	{130, 4 << 10, 16 << 10},
	{25, 16 << 10, 64 << 10},
	{4, 64 << 10, 256 << 10},
	{1, 256 << 10, 1 << 20},
}

// ctSkeleton are the directories every generated tree starts with; the
// first ctBigDirs get a larger share of the files, as usr/bin and usr/lib
// do.
var ctSkeleton = []string{"usr/bin", "usr/lib", "usr/share", "etc", "usr/lib/x86_64-linux-gnu", "usr/share/doc",
	"usr/include", "usr/libexec", "usr/sbin", "var/lib", "opt", "usr/share/locale"}

const ctBigDirs = 2

var ctWords = []string{"lib", "doc", "share", "perl", "python3", "man", "locale", "icons", "x11", "gtk", "dbus",
	"systemd", "zoneinfo", "terminfo", "i18n", "fonts", "mime", "pixmaps", "info", "ssl", "apt", "dpkg"}

var ctExts = []string{"", ".so", ".py", ".pm", ".h", ".gz", ".conf", ".txt", ".mo", ".png", ".html", ".json"}

// ctKind is an entry's type.
type ctKind uint8

const (
	ctDir ctKind = iota
	ctFile
	ctSymlink
	ctHardlink
)

// ctEntry is one entry of the generated tree. Paths are relative to the
// tree's root, parents before children.
type ctEntry struct {
	Path string
	Kind ctKind
	// Size is a file's size.
	Size int64
	// Target is a symlink's target (relative to its directory) or a
	// hard link's first name (a tree path).
	Target string
	// Layer is the lower layer (0..2) that holds a file, symlink or
	// hard link; directories are in every layer that holds something
	// below them.
	Layer int
}

// ctTree is a generated tree.
type ctTree struct {
	Seed    uint64
	Entries []ctEntry
}

// ctEntriesAt is the generated tree's size at scale.
func ctEntriesAt(scale float64) int {
	return max(100, int(math.Round(ctFullEntries*scale)))
}

// generateTree makes the tree of n entries for seed. The same seed and
// size give the same tree.
func generateTree(seed uint64, n int) *ctTree {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	t := &ctTree{Seed: seed}
	type dirInfo struct {
		path   string
		layer  int
		merged bool
		depth  int
	}
	var dirs []dirInfo
	have := map[string]bool{}
	addDir := func(p string) {
		for _, d := range ancestors(p) {
			if have[d] {
				continue
			}
			have[d] = true
			i := len(dirs)
			dirs = append(dirs, dirInfo{path: d, layer: r.IntN(ctLayers), merged: i%ctMergedEvery == ctMergedEvery-1,
				depth: strings.Count(d, "/") + 1})
			t.Entries = append(t.Entries, ctEntry{Path: d, Kind: ctDir})
		}
	}
	for _, d := range ctSkeleton {
		addDir(d)
	}
	nDirs := max(len(dirs), n*ctDirsPermil/1000)
	for len(dirs) < nDirs {
		// A random recursive tree: the parent is any directory so far,
		// so that depth grows with the log of the count.
		parent := dirs[r.IntN(len(dirs))].path
		addDir(fmt.Sprintf("%s/%s%d", parent, ctWords[r.IntN(len(ctWords))], len(dirs)))
	}
	nSymlinks := n * ctSymlinksPermil / 1000
	nHardlinks := n * ctHardlinksPermil / 1000
	nFiles := max(1, n-len(dirs)-nSymlinks-nHardlinks)
	pickDir := func() dirInfo {
		if r.IntN(100) < 15 {
			return dirs[r.IntN(ctBigDirs)]
		}
		return dirs[r.IntN(len(dirs))]
	}
	layerIn := func(d dirInfo) int {
		if d.merged {
			return r.IntN(ctLayers)
		}
		return d.layer
	}
	var files []int // indexes into t.Entries
	for i := 0; i < nFiles; i++ {
		d := pickDir()
		name := fmt.Sprintf("%s/f%06d%s", d.path, i, ctExts[r.IntN(len(ctExts))])
		files = append(files, len(t.Entries))
		t.Entries = append(t.Entries, ctEntry{Path: name, Kind: ctFile, Size: ctSize(r), Layer: layerIn(d)})
	}
	for i := 0; i < nSymlinks; i++ {
		d := pickDir()
		to := t.Entries[files[r.IntN(len(files))]].Path
		rel, err := filepath.Rel(d.path, to)
		if err != nil {
			rel = to
		}
		t.Entries = append(t.Entries, ctEntry{Path: fmt.Sprintf("%s/l%06d", d.path, i), Kind: ctSymlink, Target: rel, Layer: layerIn(d)})
	}
	for i := 0; i < nHardlinks; i++ {
		// A second name in the first one's directory: the same layer,
		// as a package's hard-linked binaries are.
		to := t.Entries[files[r.IntN(len(files))]]
		t.Entries = append(t.Entries, ctEntry{Path: fmt.Sprintf("%s/h%06d", filepath.Dir(to.Path), i), Kind: ctHardlink,
			Target: to.Path, Layer: to.Layer})
	}
	return t
}

// ancestors returns p's ancestors and p itself, outermost first.
func ancestors(p string) []string {
	var out []string
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			out = append(out, p[:i])
		}
	}
	return append(out, p)
}

// ctSize draws a file size from ctSizeClasses.
func ctSize(r *rand.Rand) int64 {
	x := r.IntN(1000)
	for _, c := range ctSizeClasses {
		if x < c.permil {
			return c.min + r.Int64N(c.max-c.min)
		}
		x -= c.permil
	}
	return 0
}

// build writes the tree: layer 0..2 under dirs[layer], or with all the
// whole tree into dirs[0]. Each file's content is a slice of one
// pseudo-random block, so files differ.
func (t *ctTree) build(dirs []string, all bool) error {
	data := pattern(1<<20 + 4096)
	made := map[string]bool{}
	mkdir := func(root, rel string) error {
		if made[root+"\x00"+rel] {
			return nil
		}
		for _, a := range ancestors(rel) {
			made[root+"\x00"+a] = true
		}
		return os.MkdirAll(filepath.Join(root, rel), 0o755)
	}
	for i, e := range t.Entries {
		root := dirs[0]
		if !all {
			root = dirs[e.Layer]
		}
		p := filepath.Join(root, e.Path)
		var err error
		switch e.Kind {
		case ctDir:
			// Made where something goes below it; the top ones in
			// every layer.
			if !all && strings.Contains(e.Path, "/") {
				continue
			}
			if all {
				err = mkdir(root, e.Path)
			} else {
				for _, d := range dirs {
					if err = mkdir(d, e.Path); err != nil {
						break
					}
				}
			}
		case ctFile:
			if err = mkdir(root, filepath.Dir(e.Path)); err == nil {
				off := (i * 4099) % 4096
				err = os.WriteFile(p, data[off:off+int(e.Size)], 0o644)
			}
		case ctSymlink:
			if err = mkdir(root, filepath.Dir(e.Path)); err == nil {
				err = os.Symlink(e.Target, p)
			}
		case ctHardlink:
			if err = mkdir(root, filepath.Dir(e.Path)); err == nil {
				err = os.Link(filepath.Join(root, e.Target), p)
			}
		}
		if err != nil {
			return err
		}
	}
	// Every directory of the tree is in at least one layer: one that
	// got no entry below it goes into its home layer, layer 0 here.
	for _, e := range t.Entries {
		if e.Kind != ctDir {
			continue
		}
		found := false
		for _, d := range dirs {
			if made[d+"\x00"+e.Path] {
				found = true
				break
			}
		}
		if !found {
			if err := mkdir(dirs[0], e.Path); err != nil {
				return err
			}
		}
	}
	return nil
}

// buildLayers writes the three lower layers and, when native is not "",
// the merged tree, in parallel.
func (t *ctTree) buildLayers(layers []string, native string) error {
	var wg sync.WaitGroup
	var errLayers, errNative error
	wg.Go(func() { errLayers = t.build(layers, false) })
	if native != "" {
		wg.Go(func() { errNative = t.build([]string{native}, true) })
	}
	wg.Wait()
	if errLayers != nil {
		return fmt.Errorf("build the layers: %w", errLayers)
	}
	if errNative != nil {
		return fmt.Errorf("build the merged tree: %w", errNative)
	}
	return nil
}

// ctIndex is what the workloads need to know of a tree, generated or
// real, from one walk of its merged view.
type ctIndex struct {
	// Entries is everything below the root (not the root itself).
	Entries, Dirs, Files, Symlinks, Other int
	Bytes                                 int64
	// Files are the regular files' paths, relative to the root, in walk
	// order: the read workloads read them all.
	FilePaths []string
	// Subtree is the directory cp -a copies, rm -rf removes and the
	// untar workload extracts a tar of: the one whose entry count is
	// nearest a tenth of the whole, relative to the root.
	Subtree        string
	SubtreeEntries int
}

// indexTree walks root (not following symlinks) and indexes it.
func indexTree(root string) (*ctIndex, error) {
	x := &ctIndex{}
	below := map[string]int{} // entries below each directory
	var walk func(rel string) (int, error)
	walk = func(rel string) (int, error) {
		dir := filepath.Join(root, rel)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, e := range ents {
			p := filepath.Join(rel, e.Name())
			n++
			x.Entries++
			switch t := e.Type(); {
			case t.IsDir():
				x.Dirs++
				k, err := walk(p)
				if err != nil {
					return 0, err
				}
				below[p] = k
				n += k
			case t.IsRegular():
				x.Files++
				x.FilePaths = append(x.FilePaths, p)
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(root, p), &st); err == nil {
					x.Bytes += st.Size
				}
			case t&os.ModeSymlink != 0:
				x.Symlinks++
			default:
				x.Other++
			}
		}
		return n, nil
	}
	if _, err := walk(""); err != nil {
		return nil, err
	}
	want := x.Entries / 10
	var best []string
	bestDiff := -1
	for p, k := range below {
		d := k - want
		if d < 0 {
			d = -d
		}
		if bestDiff < 0 || d < bestDiff {
			best, bestDiff = []string{p}, d
		} else if d == bestDiff {
			best = append(best, p)
		}
	}
	if len(best) == 0 {
		return nil, fmt.Errorf("%s has no subdirectory to copy", root)
	}
	sort.Strings(best)
	x.Subtree, x.SubtreeEntries = best[0], below[best[0]]+1
	return x, nil
}
