package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

// The directory-cache workloads (the fast-exec directory cache,
// docs/ARCHITECTURE.md): a cold walk of a large tree spread over three lower layers, a warm
// readdir of one huge merged directory, creating and unlinking many files,
// and the FUSE requests that warm stats and warm PATH misses still send.
//
// They are the "dircache" group, run only when asked for
// (--workloads dircache): at full size (--scale 1) they take longer than
// the whole default run. --scale (default DefaultScale) shrinks the
// 100,000s; the names keep the full size.

// DefaultScale is the --scale of the dircache workloads.
const DefaultScale = 0.2

// The full-size shapes, at --scale 1.
const (
	dcLayers      = 3        // the dircache lower layers, below the shared lower
	dcFullDirs    = 1000     // find-cold: directories ...
	dcFilesPerDir = 100      // ... of 100 files each: 100,000 files
	dcMergedEvery = 10       // every 10th directory is in all three layers
	dcFullBig     = 100_000  // readdir-100k: entries in the one directory
	dcBigUpperDiv = 40       // 1/40th of them (2.5 %) in the upper
	dcFullCreates = 100_000  // create-unlink-100k: files
	dcTreeDir     = "tree"   // find-cold walks this, merged in every layer
	dcBigDir      = "bigdir" // readdir-100k reads this, merged in every layer and the upper
	warmOps       = 1000     // warm-stat and warm-path-miss: stats after warming
	missingName   = "goverlay-bench-missing"
)

// dcLayout is the shape of the dircache trees at one scale.
type dcLayout struct {
	Scale       float64 `json:"scale"`
	TreeDirs    int     `json:"tree_dirs"`
	FilesPerDir int     `json:"files_per_dir"`
	BigEntries  int     `json:"big_entries"`
	BigUpper    int     `json:"big_upper_entries"`
	Creates     int     `json:"creates"`
}

func newDCLayout(scale float64) dcLayout {
	n := func(full int) int { return max(1, int(math.Round(float64(full)*scale))) }
	l := dcLayout{Scale: scale, TreeDirs: n(dcFullDirs), FilesPerDir: dcFilesPerDir, BigEntries: n(dcFullBig), Creates: n(dcFullCreates)}
	if l.BigEntries > 1 {
		l.BigUpper = max(1, l.BigEntries/dcBigUpperDiv)
	}
	return l
}

func (l dcLayout) treeFiles() int { return l.TreeDirs * l.FilesPerDir }

// treeEntries is what a walk of tree/ finds below it: directories and
// files.
func (l dcLayout) treeEntries() int { return l.TreeDirs + l.treeFiles() }

func dcDirName(i int) string   { return fmt.Sprintf("d%04d", i) }
func dcFileName(j int) string  { return fmt.Sprintf("f%03d", j) }
func dcEntryName(k int) string { return fmt.Sprintf("e%06d", k) }
func dcLayerDir(root string, layer int) string {
	return filepath.Join(root, fmt.Sprintf("lower-dc%d", layer+1))
}

// dirMerged says whether tree directory i is in all three layers (its
// files spread over them) rather than in one.
func dirMerged(i int) bool { return i%dcMergedEvery == 0 }

// fileLayer is the layer that holds file j of tree directory i.
func fileLayer(i, j int) int {
	if dirMerged(i) {
		return (i + j) % dcLayers
	}
	return i % dcLayers
}

// bigLayer is where entry k of the big directory lives: -1 is the upper.
func (l dcLayout) bigLayer(k int) int {
	if k < l.BigUpper {
		return -1
	}
	return k % dcLayers
}

// buildDircacheLayers makes the three lower layers (and, with native, the
// merged tree the native target uses) under root: tree/ when withTree,
// big/ when withBig. Each layer is built by its own goroutine.
func buildDircacheLayers(root string, l dcLayout, withTree, withBig bool, native string) error {
	var wg sync.WaitGroup
	errs := make([]error, dcLayers+1)
	for layer := 0; layer < dcLayers; layer++ {
		wg.Go(func() {
			errs[layer] = buildDCLayer(dcLayerDir(root, layer), l, layer, withTree, withBig)
		})
	}
	if native != "" {
		wg.Go(func() { errs[dcLayers] = buildDCLayer(native, l, -2, withTree, withBig) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// buildDCLayer builds one layer's share of the trees: layer 0..2 is a
// lower layer, -1 the upper's share (the big directory's upper entries),
// -2 everything (the native target's merged view).
func buildDCLayer(dir string, l dcLayout, layer int, withTree, withBig bool) error {
	all := layer == -2
	if withTree && layer != -1 {
		for i := 0; i < l.TreeDirs; i++ {
			if !all && !dirMerged(i) && fileLayer(i, 0) != layer {
				continue
			}
			d := filepath.Join(dir, dcTreeDir, dcDirName(i))
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			var names []string
			for j := 0; j < l.FilesPerDir; j++ {
				if all || fileLayer(i, j) == layer {
					names = append(names, dcFileName(j))
				}
			}
			if err := createEmpty(d, names); err != nil {
				return err
			}
		}
		// tree/ itself is in every layer, even one that got no
		// directory at a tiny scale.
		if err := os.MkdirAll(filepath.Join(dir, dcTreeDir), 0o755); err != nil {
			return err
		}
	}
	if withBig {
		d := filepath.Join(dir, dcBigDir)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		var names []string
		for k := 0; k < l.BigEntries; k++ {
			if all || l.bigLayer(k) == layer {
				names = append(names, dcEntryName(k))
			}
		}
		if err := createEmpty(d, names); err != nil {
			return err
		}
	}
	return nil
}

// createEmpty creates empty files in dir.
func createEmpty(dir string, names []string) error {
	dfd, err := sysOpen(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	for _, n := range names {
		fd, err := sysOpenat(dfd, n, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("create %s/%s: %w", dir, n, err)
		}
		unix.Close(fd)
	}
	return nil
}

// eintr retries a system call that a signal (Go's preemption SIGURG)
// interrupted on FUSE.
func eintr(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func sysOpenat(dirfd int, name string, flags int, mode uint32) (fd int, err error) {
	err = eintr(func() error {
		fd, err = unix.Openat(dirfd, name, flags|unix.O_CLOEXEC, mode)
		return err
	})
	return fd, err
}

func sysGetdents(fd int, buf []byte) (n int, err error) {
	err = eintr(func() error {
		n, err = unix.Getdents(fd, buf)
		return err
	})
	return n, err
}

// direntNames appends the names in a getdents64 buffer, without "." and
// "..", to names.
func direntNames(buf []byte, names []string) []string {
	lower.ParseDirents(buf, func(d lower.Dirent) {
		if !lower.IsDots(d.Name) {
			names = append(names, string(d.Name))
		}
	})
	return names
}

// countDirents counts the names in a getdents64 buffer, without "." and
// "..".
func countDirents(buf []byte) int {
	n := 0
	lower.ParseDirents(buf, func(d lower.Dirent) {
		if !lower.IsDots(d.Name) {
			n++
		}
	})
	return n
}

// direntBuf is the getdents buffer size, glibc's readdir's.
const direntBuf = 32 << 10

// dropCaches writes what to /proc/sys/vm/drop_caches: 3 drops the page
// cache, the dentries and the inodes, 2 only the dentries and inodes. On a
// FUSE mount the kernel then FORGETs the daemon's inodes. Dirty data was
// synced before each workload.
func dropCaches(what int) error {
	f, err := os.OpenFile("/proc/sys/vm/drop_caches", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("drop caches (needs root): %w", err)
	}
	if _, err := fmt.Fprintf(f, "%d\n", what); err != nil {
		f.Close()
		return fmt.Errorf("drop caches: %w", err)
	}
	return f.Close()
}

// findCold drops the caches and walks tree/ as find(1) would with a stat
// of everything: getdents64 of each directory, then fstatat
// (AT_SYMLINK_NOFOLLOW) of each of its entries, then down into the
// subdirectories. It returns entries/s and checks that every directory and
// file was seen.
func findCold(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	unix.Sync()
	if err := dropCaches(3); err != nil {
		return sample{}, err
	}
	var elapsed float64
	var seen int64
	reqs, err := b.countRequests(inst, true, func() (float64, error) {
		start := time.Now()
		fd, err := sysOpen(filepath.Join(inst.root, dcTreeDir), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return 0, err
		}
		seen, err = walkFd(ctx, fd, make([]byte, direntBuf))
		elapsed = since(start)
		return float64(seen), err
	})
	if err != nil {
		return sample{}, err
	}
	if want := int64(b.dc.treeEntries()); seen != want {
		return sample{}, fmt.Errorf("the walk found %d entries, want %d", seen, want)
	}
	return sample{value: float64(seen) / elapsed, reqs: reqs}, nil
}

// walkFd walks the directory open on fd (and closes it): all its names
// first, then a stat of each, then its subdirectories. It returns the
// number of entries below.
func walkFd(ctx context.Context, fd int, buf []byte) (int64, error) {
	return walkDir(ctx, fd, "", buf, nil)
}

// walkDir is walkFd that also calls each, if not nil, with the path of
// every entry (dir, the path of fd's directory, then "/" and the name),
// right after its stat.
func walkDir(ctx context.Context, fd int, dir string, buf []byte, each func(path string) error) (int64, error) {
	defer unix.Close(fd)
	var names []string
	for {
		n, err := sysGetdents(fd, buf)
		if err != nil {
			return 0, fmt.Errorf("getdents: %w", err)
		}
		if n == 0 {
			break
		}
		names = direntNames(buf[:n], names)
	}
	var st unix.Stat_t
	var subdirs []string
	for _, name := range names {
		if err := eintr(func() error { return unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
			return 0, fmt.Errorf("lstat %s: %w", name, err)
		}
		if each != nil {
			if err := each(dir + "/" + name); err != nil {
				return 0, err
			}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			subdirs = append(subdirs, name)
		}
	}
	total := int64(len(names))
	for _, d := range subdirs {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		sub, err := sysOpenat(fd, d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return 0, fmt.Errorf("open %s: %w", d, err)
		}
		n, err := walkDir(ctx, sub, dir+"/"+d, buf, each)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// readdirBig reads big/ once untimed (warming it), then again and again
// for the duration (at least twice): open, getdents64 until the end,
// close; names only. It returns entries/s and checks the count.
func readdirBig(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	dir := filepath.Join(inst.root, dcBigDir)
	buf := make([]byte, direntBuf)
	want := b.dc.BigEntries
	if _, err := readdirCount(dir, buf, want); err != nil {
		return sample{}, err
	}
	var elapsed float64
	var entries int64
	reqs, err := b.countRequests(inst, true, func() (float64, error) {
		start := time.Now()
		for reads := 0; reads < 2 || time.Since(start) < b.cfg.Duration; reads++ {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			n, err := readdirCount(dir, buf, want)
			if err != nil {
				return 0, err
			}
			entries += int64(n)
		}
		elapsed = since(start)
		return float64(entries), nil
	})
	if err != nil {
		return sample{}, err
	}
	return sample{value: float64(entries) / elapsed, reqs: reqs}, nil
}

func readdirCount(dir string, buf []byte, want int) (int, error) {
	fd, err := sysOpen(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	total := 0
	for {
		n, err := sysGetdents(fd, buf)
		if err != nil {
			return 0, fmt.Errorf("getdents: %w", err)
		}
		if n == 0 {
			break
		}
		total += countDirents(buf[:n])
	}
	if total != want {
		return 0, fmt.Errorf("readdir of %s: %d entries, want %d", dcBigDir, total, want)
	}
	return total, nil
}

// createUnlinkCap bounds each phase of create-unlink-100k: fuse-overlayfs
// 1.10 unlinks from a directory of 100,000 files at under 100 files/s
// (its daemon busy on the CPU), which would take half an hour a round.
const createUnlinkCap = 30 * time.Second

// createUnlink makes a fresh directory at the top of the target, creates
// the files in it (openat O_CREAT|O_EXCL, close), unlinks them
// (unlinkat), and removes it. An op is one create or one unlink; it
// returns ops/s. A phase that reaches createUnlinkCap stops there: the
// rate is then projected from each phase's own rate over the files it
// did (2N / (N/create rate + N/unlink rate)), the target gets a note, and
// what is left is removed with the round's layers.
func createUnlink(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	dir := filepath.Join(inst.root, fmt.Sprintf("create-unlink-%d", time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return sample{}, err
	}
	dfd, err := sysOpen(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return sample{}, err
	}
	defer unix.Close(dfd)
	names := make([]string, b.dc.Creates)
	for i := range names {
		names[i] = fmt.Sprintf("f%06d", i)
	}
	var tCreate, tUnlink float64
	var created, unlinked int
	reqs, err := b.countRequests(inst, false, func() (float64, error) {
		start := time.Now()
		for created < len(names) {
			if created%256 == 0 {
				if err := ctx.Err(); err != nil {
					return 0, err
				}
				if time.Since(start) >= createUnlinkCap {
					break
				}
			}
			fd, err := sysOpenat(dfd, names[created], unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
			if err != nil {
				return 0, fmt.Errorf("create: %w", err)
			}
			unix.Close(fd)
			created++
		}
		tCreate = since(start)
		start = time.Now()
		for unlinked < created {
			if unlinked%256 == 0 {
				if err := ctx.Err(); err != nil {
					return 0, err
				}
				if time.Since(start) >= createUnlinkCap {
					break
				}
			}
			n := names[unlinked]
			if err := eintr(func() error { return unix.Unlinkat(dfd, n, 0) }); err != nil {
				return 0, fmt.Errorf("unlink: %w", err)
			}
			unlinked++
		}
		tUnlink = since(start)
		return float64(created + unlinked), nil
	})
	if err != nil {
		return sample{}, err
	}
	n := float64(len(names))
	if created < len(names) || unlinked < created {
		b.targetNote(inst.def.name, fmt.Sprintf("create-unlink-100k stopped after %v per phase: %s of %s files created, %s unlinked; its ops/s are projected from the two phases' rates",
			createUnlinkCap, fmtInt(created), fmtInt(len(names)), fmtInt(unlinked)))
		if created == 0 || unlinked == 0 {
			return sample{}, fmt.Errorf("no file created or unlinked in %v", createUnlinkCap)
		}
		return sample{value: 2 * n / (n*tCreate/float64(created) + n*tUnlink/float64(unlinked)), reqs: reqs}, nil
	}
	if err := os.Remove(dir); err != nil {
		return sample{}, err
	}
	return sample{value: 2 * n / (tCreate + tUnlink), reqs: reqs}, nil
}

// warmStat stats deepPath once, then warmOps times, counting the requests
// the warm stats send. It returns stats/s.
func warmStat(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	p := filepath.Join(inst.root, deepPath)
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return sample{}, fmt.Errorf("stat: %w", err)
	}
	var elapsed float64
	reqs, err := b.countRequests(inst, true, func() (float64, error) {
		start := time.Now()
		for i := 0; i < warmOps; i++ {
			if err := eintr(func() error { return unix.Stat(p, &st) }); err != nil {
				return 0, fmt.Errorf("stat: %w", err)
			}
		}
		elapsed = since(start)
		return warmOps, nil
	})
	if err != nil {
		return sample{}, err
	}
	return sample{value: warmOps / elapsed, reqs: reqs}, ctx.Err()
}

// warmPathMiss stats a name that is in none of the 7 PATH directories,
// in each of them once, then warmOps times in each (what execvp's PATH
// search does before it finds a binary further on), counting the requests
// the warm misses send. It returns stats/s.
func warmPathMiss(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	var paths []string
	for i := 1; i <= pathDirs; i++ {
		paths = append(paths, filepath.Join(inst.root, pathDir(i), missingName))
	}
	var st unix.Stat_t
	miss := func(p string) error {
		err := eintr(func() error { return unix.Stat(p, &st) })
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("stat %s: exists", p)
		}
		return fmt.Errorf("stat %s: %w, want ENOENT", p, err)
	}
	for _, p := range paths {
		if err := miss(p); err != nil {
			return sample{}, err
		}
	}
	var elapsed float64
	ops := float64(warmOps * len(paths))
	reqs, err := b.countRequests(inst, true, func() (float64, error) {
		start := time.Now()
		for i := 0; i < warmOps; i++ {
			for _, p := range paths {
				if err := miss(p); err != nil {
					return 0, err
				}
			}
		}
		elapsed = since(start)
		return ops, nil
	})
	if err != nil {
		return sample{}, err
	}
	return sample{value: ops / elapsed, reqs: reqs}, ctx.Err()
}

// countRequests runs the timed part of a workload, fn, which returns its
// number of ops, and counts the FUSE requests the kernel sent the daemon
// meanwhile: with the tracepoint counter on any FUSE target (byType: one
// count per request type too), and with the daemon's own counters
// (LOOKUP, negative LOOKUP, GETATTR) on goverlay targets. On the native
// and kernel targets it only runs fn and returns nil.
func (b *bencher) countRequests(inst *instance, byType bool, fn func() (float64, error)) (*ReqSample, error) {
	gov := inst.def.kind == kindGoverlay
	if !gov && inst.def.kind != kindFuseOverlayfs {
		_, err := fn()
		return nil, err
	}
	// The daemon's counters are read twice before: reading them costs
	// requests of its own (ReadStats resolves the mountpoint's path),
	// which the second read measures and the one after fn pays again.
	var s0, s1 daemonCounts
	var derr error
	if gov {
		if s0, derr = readDaemonCounts(inst.root); derr == nil {
			s1, derr = readDaemonCounts(inst.root)
		}
	}
	var ctr *reqCounter
	var terr error
	if inst.conn != 0 {
		ctr, terr = b.tracer.start(inst.conn, byType)
	} else if b.link != nil {
		// The rootless agent: the bench counts, as root.
		if err := b.link.begin(byType); err != nil {
			return nil, err
		}
	}
	ops, err := fn()
	var counts map[string]uint64
	if ctr != nil {
		counts, terr = ctr.stop()
	} else if b.link != nil {
		if lerr := b.link.end(); lerr != nil && err == nil {
			err = lerr
		}
	}
	if err != nil {
		return nil, err
	}
	rs := &ReqSample{Ops: ops}
	if terr == nil && counts != nil {
		rs.setCounts(counts)
	} else if terr != nil {
		b.targetNote(inst.def.name, "FUSE request counter: "+terr.Error())
	}
	if gov && derr == nil {
		s2, err := readDaemonCounts(inst.root)
		if err == nil {
			d := s2.minus(s1).minus(s1.minus(s0))
			rs.Daemon = &d
		} else {
			derr = err
		}
	}
	if derr != nil {
		b.targetNote(inst.def.name, "daemon counters: "+derr.Error())
	}
	return rs, nil
}

type daemonCounts = DaemonRequests

// setCounts records a request counter's result: the total and, when it
// was counted by type, the breakdown.
func (rs *ReqSample) setCounts(counts map[string]uint64) {
	total := counts["total"]
	rs.FuseRequests = &total
	if len(counts) > 1 {
		rs.FuseRequestsByType = map[string]uint64{}
		for k, v := range counts {
			if k != "total" {
				rs.FuseRequestsByType[k] = v
			}
		}
	}
}

func readDaemonCounts(mnt string) (daemonCounts, error) {
	st, err := readStats(mnt)
	if err != nil {
		return daemonCounts{}, err
	}
	return daemonCounts{Lookups: st.Lookups, NegativeLookups: st.NegativeLookups, Getattrs: st.Getattrs}, nil
}

// minus subtracts counter by counter, stopping at 0.
func (d DaemonRequests) minus(e DaemonRequests) DaemonRequests {
	sub := func(a, b uint64) uint64 {
		if a < b {
			return 0
		}
		return a - b
	}
	return DaemonRequests{
		Lookups:         sub(d.Lookups, e.Lookups),
		NegativeLookups: sub(d.NegativeLookups, e.NegativeLookups),
		Getattrs:        sub(d.Getattrs, e.Getattrs),
	}
}
