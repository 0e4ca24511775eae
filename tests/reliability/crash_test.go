package reliability_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The crash tests kill the daemon with SIGKILL in the middle of work and
// mount the same layers again with a new daemon. A SIGKILL loses nothing
// the daemon handed to the kernel (the page cache survives it), so every
// operation that returned must be there, the one in flight either
// complete or absent, and nothing half made may show: goverlay builds
// every object in workdir/work and publishes it with one rename, and
// empties workdir/work at mount.
//
// A power loss cannot be simulated here (it would need a virtual machine
// or a block device that drops unflushed writes): TestFsync checks what
// can be, that an fsync through the mount reaches the upper file.

const (
	bigCount = 8
	bigSize  = 32 << 20

	nRen      = 48 // ren/fNN renamed to ren/gNN
	nDel      = 96 // del/dNN unlinked (whiteouts)
	nDirs     = 12 // dirs/DN renamed to dirs/EN (redirects)
	nTgt      = 4  // tgt/TN emptied, then src/SN renamed onto it
	nTgtFiles = 60 // files in each tgt/TN
)

// crashLower is the lower layer of TestCrashKill, built once and shared
// by every round: it must never change.
type crashLower struct {
	dir    string
	ref    testutil.Tree // its Snapshot: the original contents
	raw    testutil.Tree // its raw layout, every xattr included
	bigNew [bigCount]string
}

func renName(c byte, i int) string { return fmt.Sprintf("ren/%c%02d", c, i) }
func delName(i int) string         { return fmt.Sprintf("del/d%02d", i) }
func tgtFile(i, j int) string      { return fmt.Sprintf("tgt/T%d/n%03d", i, j) }

func buildCrashLower(t testing.TB, dir string) *crashLower {
	t.Helper()
	cl := &crashLower{dir: dir}
	l := testutil.NewLayer(t, dir)
	for i := range bigCount {
		cl.bigNew[i] = writeBig(t, l.P(fmt.Sprintf("big/b%d", i)), i)
	}
	for i := range nRen {
		l.File(renName('f', i), fmt.Sprintf("renamed file %d\n", i), 0o644)
	}
	for i := range nDel {
		l.File(delName(i), fmt.Sprintf("deleted file %d\n", i), 0o600)
	}
	for i := range nDirs {
		d := fmt.Sprintf("dirs/D%d", i)
		l.File(d+"/x", "x"+d, 0o644).File(d+"/y", "y"+d, 0o640).File(d+"/sub/z", "z"+d, 0o644)
		l.Symlink(d+"/sub/link", "../x")
	}
	for i := range nTgt {
		for j := range nTgtFiles {
			l.File(tgtFile(i, j), fmt.Sprintf("target %d file %d\n", i, j), 0o644)
		}
		s := fmt.Sprintf("src/S%d", i)
		l.File(s+"/s1", "s1"+s, 0o644).File(s+"/s2", "s2"+s, 0o600)
	}
	l.Finish()
	// Written data settles first: ext4 counts an extent block in
	// st_blocks only once the data is written back.
	unix.Sync()
	// The raw layout (every xattr) is the reference of the final check,
	// and has the contents the checks need.
	cl.raw = testutil.UpperLayout(t, dir)
	cl.ref = cl.raw
	return cl
}

// writeBig writes a bigSize file whose every 4 KiB page starts with its
// file number and offset (a copy that shifts, repeats or zero-fills a
// range is told from the original), the rest pseudo-random. It returns
// the sha256 of the file with one "X" appended: the content after an
// appender's write.
func writeBig(t testing.TB, path string, idx int) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	x := uint64(idx)*0x9E3779B97F4A7C15 + 1
	for off := 0; off < bigSize; off += len(buf) {
		for i := 0; i < len(buf); i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(buf[i:], x)
		}
		for p := 0; p < len(buf); p += 4096 {
			binary.LittleEndian.PutUint64(buf[p:], uint64(idx)<<48|uint64(off+p))
		}
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
		h.Write(buf)
	}
	h.Write([]byte("X"))
	return hex.EncodeToString(h.Sum(nil))
}

// opLog collects what the workers saw. An operation ended by the dead
// connection (ENOTCONN for new requests, ECONNABORTED for those in
// flight) stops its worker; so does any other error, which fails the test
// if it came before the kill. After the kill, EIO is what the kernel makes
// of some aborted requests (a page-cache read, an inode it could not
// refresh), and is only counted.
type opLog struct {
	mu       sync.Mutex
	bad      []string
	aborted  int
	done     int
	killedAt time.Time
}

// kill records that the daemon is being killed now.
func (o *opLog) kill() {
	o.mu.Lock()
	o.killedAt = time.Now()
	o.mu.Unlock()
}

func (o *opLog) ok(what string, err error) bool {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	afterKill := !o.killedAt.IsZero() && !now.Before(o.killedAt)
	switch {
	case err == nil:
		o.done++
		return true
	case errors.Is(err, unix.ENOTCONN), errors.Is(err, unix.ECONNABORTED), afterKill && errors.Is(err, unix.EIO):
		o.aborted++
	case afterKill:
		o.bad = append(o.bad, what+": "+err.Error()+" (after the kill)")
	default:
		o.bad = append(o.bad, what+": "+err.Error()+" (before the kill)")
	}
	return false
}

// crashWorkload starts the workers on mnt and returns a channel closed
// when all of them have stopped. They do, in parallel: appends of one
// byte to each big file (8 concurrent copy-ups of 32 MiB), renames of
// lower files, unlinks of lower files (whiteouts), renames of lower
// directories (redirects), and for each tgt/TN the unlink of all its
// files followed by the rename of src/SN onto it. Each worker's
// operations run in order, so after a crash each worker's part of the
// tree must show a prefix of its operations.
func crashWorkload(mnt string, log *opLog) <-chan struct{} {
	p := func(rel string) string { return filepath.Join(mnt, rel) }
	var wg sync.WaitGroup
	start := make(chan struct{})
	run := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn()
		}()
	}
	for i := range bigCount {
		run(func() {
			name := p(fmt.Sprintf("big/b%d", i))
			f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
			if !log.ok("open "+name, err) {
				return
			}
			_, err = f.Write([]byte("X"))
			cerr := f.Close()
			if log.ok("append "+name, err) {
				log.ok("close "+name, cerr)
			}
		})
	}
	run(func() {
		for i := range nRen {
			if !log.ok("rename "+renName('f', i), unix.Rename(p(renName('f', i)), p(renName('g', i)))) {
				return
			}
		}
	})
	run(func() {
		for i := range nDel {
			if !log.ok("unlink "+delName(i), unix.Unlink(p(delName(i)))) {
				return
			}
		}
	})
	run(func() {
		for i := range nDirs {
			from, to := fmt.Sprintf("dirs/D%d", i), fmt.Sprintf("dirs/E%d", i)
			if !log.ok("rename "+from, unix.Rename(p(from), p(to))) {
				return
			}
		}
	})
	run(func() {
		for i := range nTgt {
			for j := range nTgtFiles {
				if !log.ok("unlink "+tgtFile(i, j), unix.Unlink(p(tgtFile(i, j)))) {
					return
				}
			}
			from, to := fmt.Sprintf("src/S%d", i), fmt.Sprintf("tgt/T%d", i)
			if !log.ok("rename "+from+" onto emptied "+to, unix.Rename(p(from), p(to))) {
				return
			}
		}
	})
	close(start)
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// subtree is the part of tr below root, keyed by the path relative to
// root ("." for root itself).
func subtree(tr testutil.Tree, root string) testutil.Tree {
	out := testutil.Tree{}
	for p, n := range tr {
		switch {
		case p == root:
			out["."] = n
		case strings.HasPrefix(p, root+"/"):
			out[p[len(root)+1:]] = n
		}
	}
	return out
}

// sameContent compares two subtrees by what a reader sees: names, types,
// modes, sizes, contents, link targets; not times, link counts or
// directory sizes (a moved or copied-up directory is another inode).
func sameContent(ref testutil.Tree, refRoot string, tr testutil.Tree, root string) []string {
	return testutil.DiffWith(subtree(ref, refRoot), subtree(tr, root), testutil.DiffOptions{
		IgnoreMtime: true, IgnoreDirNlink: true, IgnoreDirSize: true, IgnoreBlocks: true,
		A: "original " + refRoot, B: root,
	})
}

// checkCrashState checks the merged view tr after a crash of
// crashWorkload: every file complete (old or new), every worker's part a
// prefix of its operations, nothing else.
func checkCrashState(cl *crashLower, tr testutil.Tree) []string {
	var bad []string
	badf := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	known := map[string]bool{".": true, "big": true, "ren": true, "del": true, "dirs": true, "tgt": true, "src": true}

	for i := range bigCount {
		p := fmt.Sprintf("big/b%d", i)
		known[p] = true
		n := tr[p]
		switch {
		case n == nil:
			badf("%s is missing", p)
		case n.Hash != cl.ref[p].Hash && n.Hash != cl.bigNew[i]:
			badf("%s is neither its old nor its new content: size %d (old %d, new %d)", p, n.Size, bigSize, bigSize+1)
		}
	}

	// One of two names, in order: the renamed ones are a prefix.
	pendingSeen := ""
	for i := range nRen {
		f, g := renName('f', i), renName('g', i)
		known[f], known[g] = true, true
		nf, ng := tr[f], tr[g]
		switch {
		case nf == nil && ng == nil:
			badf("%s is lost: neither %s nor %s exists", f, f, g)
			continue
		case nf != nil && ng != nil:
			badf("%s is both %s and %s", f, f, g)
			continue
		}
		cur := nf
		if ng != nil {
			cur = ng
			if pendingSeen != "" {
				badf("%s was renamed but the earlier %s was not", f, pendingSeen)
			}
		} else if pendingSeen == "" {
			pendingSeen = f
		}
		if cur.Hash != cl.ref[f].Hash {
			badf("%s: content changed by its rename", f)
		}
	}

	pendingSeen = ""
	for i := range nDel {
		d := delName(i)
		known[d] = true
		n := tr[d]
		if n == nil {
			if pendingSeen != "" {
				badf("%s was unlinked but the earlier %s is still there", d, pendingSeen)
			}
			continue
		}
		if pendingSeen == "" {
			pendingSeen = d
		}
		if n.Hash != cl.ref[d].Hash || n.Mode != cl.ref[d].Mode {
			badf("%s: changed although only unlinks ran", d)
		}
	}

	pendingSeen = ""
	for i := range nDirs {
		from, to := fmt.Sprintf("dirs/D%d", i), fmt.Sprintf("dirs/E%d", i)
		nf, nt := tr[from], tr[to]
		for p := range tr {
			if p == from || p == to || strings.HasPrefix(p, from+"/") || strings.HasPrefix(p, to+"/") {
				known[p] = true
			}
		}
		switch {
		case nf == nil && nt == nil:
			badf("%s is lost: neither it nor %s exists", from, to)
			continue
		case nf != nil && nt != nil:
			badf("%s is both %s and %s", from, from, to)
			continue
		}
		cur := from
		if nt != nil {
			cur = to
			if pendingSeen != "" {
				badf("%s was renamed but the earlier %s was not", from, pendingSeen)
			}
		} else if pendingSeen == "" {
			pendingSeen = from
		}
		for _, d := range sameContent(cl.ref, from, tr, cur) {
			badf("%s", d)
		}
	}

	prevDone := true
	for i := range nTgt {
		src, tgt := fmt.Sprintf("src/S%d", i), fmt.Sprintf("tgt/T%d", i)
		for p := range tr {
			if p == src || p == tgt || strings.HasPrefix(p, src+"/") || strings.HasPrefix(p, tgt+"/") {
				known[p] = true
			}
		}
		if tr[tgt] == nil || tr[tgt].Type != "dir" {
			badf("%s is lost", tgt)
			prevDone = false
			continue
		}
		if tr[src] == nil {
			// Renamed onto the target: the target is the source.
			for _, d := range sameContent(cl.ref, src, tr, tgt) {
				badf("after rename onto %s: %s", tgt, d)
			}
			if !prevDone {
				badf("%s was renamed onto %s before the earlier targets were done", src, tgt)
			}
			continue
		}
		for _, d := range sameContent(cl.ref, src, tr, src) {
			badf("%s", d)
		}
		// Not renamed: the target's files must be those not unlinked
		// yet, a suffix n_k..n_last, each intact.
		var present []int
		for j := range nTgtFiles {
			p := tgtFile(i, j)
			if n := tr[p]; n != nil {
				present = append(present, j)
				if n.Hash != cl.ref[p].Hash {
					badf("%s: content changed", p)
				}
			}
		}
		unlinked := nTgtFiles - len(present)
		for k, j := range present {
			if j != unlinked+k {
				badf("%s shows %d of its %d files, %v, which no order of the unlinks leaves: files unlinked before the crash are back", tgt, len(present), nTgtFiles, present)
				break
			}
		}
		if unlinked > 0 && !prevDone {
			badf("%s lost files before the earlier targets were done", tgt)
		}
		for p := range subtree(tr, tgt) {
			if p != "." && !strings.HasPrefix(p, "n") {
				badf("%s/%s: unexpected in a target not renamed onto", tgt, p)
			}
		}
		prevDone = false
	}

	var extra []string
	for p := range tr {
		if !known[p] {
			extra = append(extra, p)
		}
	}
	sort.Strings(extra)
	for _, p := range extra {
		badf("%q: unexpected entry (%s)", p, tr[p].Type)
	}
	for _, p := range tr.Paths() {
		for _, e := range tr[p].Errs {
			badf("%q: %s", p, e)
		}
	}
	return bad
}

// TestCrashKill kills the daemon with SIGKILL at a random moment of
// crashWorkload, seeded, in a loop (8 rounds; 24 with GOVERLAY_LONG=1).
// After each kill: the dead mount answers ENOTCONN; the test detaches it
// (umount2 MNT_DETACH) and mounts the same layers with a new daemon,
// which must empty workdir/work; the upper holds no "#" temporary; the
// merged view passes checkCrashState and equals the kernel overlay's view
// of the same layers. The shared lower layer is unchanged at the end.
func TestCrashKill(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	rng := rand.New(rand.NewSource(seed(t, 20260301)))
	base := t.TempDir()
	cl := buildCrashLower(t, filepath.Join(base, "lower"))
	rounds := pick(8, 24)
	for r := range rounds {
		// Chaos input, not synchronisation: when to kill.
		delay := time.Duration(rng.Int63n(int64(300 * time.Millisecond)))
		if !t.Run(fmt.Sprintf("round%02d", r), func(t *testing.T) { crashRound(t, cl, delay) }) && !long() {
			break
		}
	}
	if d := testutil.DiffWith(cl.raw, testutil.UpperLayout(t, cl.dir), testutil.DiffOptions{A: "lower before", B: "lower after"}); len(d) > 0 {
		reportDiff(t, "the lower layer changed", d)
	}
}

func crashRound(t *testing.T, cl *crashLower, delay time.Duration) {
	rb := t.TempDir()
	s := stack{base: rb, lower: []string{cl.dir}, upper: filepath.Join(rb, "upper"), work: filepath.Join(rb, "work")}
	for _, d := range []string{s.upper, s.work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	defer os.RemoveAll(s.upper) // 256 MiB of copies per round

	m := mountG(t, s)
	var log opLog
	done := crashWorkload(m.Dir, &log)
	time.Sleep(delay) // chaos: the kill point
	log.kill()
	m.Crash(t)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("workers still blocked 60s after the daemon died")
	}
	t.Logf("killed after %v: %d operations done, %d ended by the kill", delay, log.done, log.aborted)
	for _, b := range log.bad {
		t.Errorf("operation failed with another error than the dead connection's: %s", b)
	}

	if err := statSync(m.Dir); !errors.Is(err, unix.ENOTCONN) {
		t.Errorf("stat of the dead mount %s: %v, want ENOTCONN", m.Dir, err)
	}
	if err := unix.Unmount(m.Dir, unix.MNT_DETACH); err != nil {
		t.Fatalf("umount2(%s, MNT_DETACH): %v", m.Dir, err)
	}
	if testutil.IsMounted(m.Dir) {
		t.Fatalf("%s still mounted after a lazy unmount", m.Dir)
	}

	t0 := time.Now()
	m2 := mountG(t, s)
	testutil.WorkEmpty(t, s.work)
	if stray := strayTemps(t, s.upper); len(stray) > 0 {
		t.Errorf("temporary files published in the upper layer: %q", stray)
	}
	unix.Sync() // the copies' st_blocks settle (see buildCrashLower)
	t1 := time.Now()
	gt := testutil.Snapshot(t, m2.Dir)
	t2 := time.Now()
	if bad := checkCrashState(cl, gt); len(bad) > 0 {
		reportDiff(t, "merged view after the crash and a remount", bad)
	}
	m2.Unmount(t)
	testutil.WorkEmpty(t, s.work)

	// The kernel overlay reads the same upper layer the same way.
	kmnt := mountK(t, s)
	kt := testutil.Snapshot(t, kmnt)
	testutil.UnmountKernel(t, kmnt)
	t.Logf("remount+sync %v, goverlay snapshot %v, kernel %v", t1.Sub(t0), t2.Sub(t1), time.Since(t2))
	reportDiff(t, "goverlay vs kernel overlay on the upper left by the crash", diffTrees(normalize(gt, never), normalize(kt, never), "goverlay", "kernel"))
}
