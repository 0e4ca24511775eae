package oracle_test

import (
	"fmt"
	"path/filepath"
	"sort"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// inodeScenario has hard links in several layers, shadowed and whited-out
// links, and many files and directories.
func inodeScenario(roots func(testing.TB) []string) scenario {
	return scenario{
		name: "inodes", layers: 3, roots: roots,
		build: func(t testing.TB, l []*testutil.Layer) {
			buildHardLinks(t, l[:2])
			for i, layer := range l {
				for j := range 25 {
					layer.File(fmt.Sprintf("layer%d/f%02d", i, j), "x", 0o644)
					layer.File(fmt.Sprintf("shared/f%02d", j), fmt.Sprint(i), 0o644)
				}
				layer.Dir(fmt.Sprintf("layer%d/sub", i), 0o755)
			}
			l[2].File("h/one", "h", 0o644).Link("h/one", "h/two").Link("h/one", "h3")
		},
		present: []string{"a", "a2", "layer0/f00", "layer1/f24", "layer2/sub", "shared/f10", "h/two", "h3"},
	}
}

// checkInodes: on goverlay, st_ino is unique across paths except within
// a hard-link group (taken from the kernel's view), equal within one, and
// the same at a second stat.
func checkInodes(t testing.TB, kt, gt, gt2 testutil.Tree) {
	t.Helper()
	byIno := map[uint64][]string{}
	for p, n := range gt {
		byIno[n.Ino] = append(byIno[n.Ino], p)
		if n2 := gt2[p]; n2 == nil || n2.Ino != n.Ino {
			t.Errorf("%q: st_ino not stable: %d, then %v", p, n.Ino, n2)
		}
	}
	for ino, ps := range byIno {
		if len(ps) < 2 {
			continue
		}
		sort.Strings(ps)
		k := kt[ps[0]]
		same := k != nil && k.Link != ""
		for _, p := range ps {
			if kp := kt[p]; kp == nil || kp.Link != k.Link {
				same = false
			}
		}
		if !same {
			t.Errorf("st_ino %d shared by %q, which are not hard links of one another", ino, ps)
		}
	}
	for p, k := range kt {
		if k.Link == "" || gt[p] == nil || gt[k.Link] == nil {
			continue
		}
		if gt[p].Ino != gt[k.Link].Ino {
			t.Errorf("hard links %q and %q have st_ino %d and %d", p, k.Link, gt[p].Ino, gt[k.Link].Ino)
		}
	}
}

func TestInodeNumbers(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	sc := inodeScenario(nil)
	kmnt, g := mountBoth(t, sc)
	kt := testutil.Snapshot(t, kmnt)
	checkExpect(t, sc, kt)
	gt := testutil.Snapshot(t, g.Dir)
	compareTrees(t, kt, gt)
	checkInodes(t, kt, gt, testutil.Snapshot(t, g.Dir))
}

// TestInodeNumbersCrossFS puts the top and bottom layers on two fresh
// tmpfs mounts, which hand out the same small inode numbers for the same
// sequence of creations, and the middle one on the temp dir's filesystem.
func TestInodeNumbersCrossFS(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	roots := func(t testing.TB) []string {
		return []string{
			filepath.Join(testutil.Tmpfs(t), "layer"),
			filepath.Join(t.TempDir(), "layer"),
			filepath.Join(testutil.Tmpfs(t), "layer"),
		}
	}
	sc := inodeScenario(roots)
	ks := buildStack(t, sc)
	gs := buildStack(t, sc)
	kmnt := testutil.KernelOverlay(t, ks.lower, "", "")
	g := testutil.Mount(t, testutil.Options{Lower: gs.lower})
	kt := testutil.Snapshot(t, kmnt)
	checkExpect(t, sc, kt)
	// What the test is about: files of the two tmpfs layers that share a
	// raw inode number and both show in the merged tree, under different
	// names. Fresh tmpfs mounts number their inodes from the same start
	// (per superblock since Linux 5.9), so they always do.
	var shown int
	for _, c := range rawCollisions(t, gs.lower[0], gs.lower[2]) {
		if c[0] != c[1] && kt[c[0]] != nil && kt[c[1]] != nil {
			shown++
		}
	}
	if shown == 0 {
		t.Fatal("no two files shown in the mount share a raw inode number across the tmpfs layers: the test proves nothing")
	}
	t.Logf("%d pairs of files shown share a raw inode number", shown)
	gt := testutil.Snapshot(t, g.Dir)
	compareTrees(t, kt, gt)
	checkInodes(t, kt, gt, testutil.Snapshot(t, g.Dir))
}

// rawCollisions returns the pairs of paths, one in each layer directory,
// that have the same raw inode number.
func rawCollisions(t testing.TB, a, b string) [][2]string {
	ia := map[uint64][]string{}
	for p, n := range testutil.UpperLayout(t, a) {
		ia[n.Ino] = append(ia[n.Ino], p)
	}
	var c [][2]string
	for p, n := range testutil.UpperLayout(t, b) {
		for _, q := range ia[n.Ino] {
			c = append(c, [2]string{q, p})
		}
	}
	return c
}
