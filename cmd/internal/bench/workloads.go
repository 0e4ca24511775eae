package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// workloadDef is one measurement. run returns one sample.
type workloadDef struct {
	name, unit, desc string
	higherIsBetter   bool
	// group is the workload's group: "default", "dircache",
	// "containers", "host" or "build".
	group string
	// fullScale: its group (and "all") selects it only at --scale 1 or
	// more; its name or a prefix of it selects it at any scale.
	fullScale bool
	// notFor says why the workload means nothing on a target, or ""
	// where it does; nil is every target. The others get no sample,
	// show "-", and the report gives the reason.
	notFor func(*targetDef) string
	// countsRequests: the workload counts the FUSE requests of its timed
	// part (countRequests), so the request counter is set up for it.
	countsRequests bool
	// dropsCaches: the workload drops every cache first (root). On a
	// rootless target the bench does it, before it sends the workload
	// to the agent.
	dropsCaches bool
	// inBench: the workload runs in the bench even on a rootless
	// target, not in its agent (the build workloads run podman as the
	// rootless user themselves).
	inBench bool
	run     func(ctx context.Context, inst *instance, b *bencher) (sample, error)
}

// applies says whether w is run on t.
func (w *workloadDef) applies(t *targetDef) bool {
	return w.whyNot(t) == ""
}

// whyNot says why w is not run on t, or "" when it is.
func (w *workloadDef) whyNot(t *targetDef) string {
	if w.notFor == nil {
		return ""
	}
	return w.notFor(t)
}

// The workload groups --workloads takes besides names and prefixes; "all"
// is every group.
const (
	groupDefault  = "default"
	groupDircache = "dircache"
)

var workloadGroups = []string{groupDefault, groupDircache}

type sample struct {
	value float64
	// getxattr is GETXATTR(security.capability) per 1000 writes, for
	// fstime write phases on goverlay targets.
	getxattr *float64
	// reqs are the FUSE requests of a dircache workload's timed part,
	// on FUSE targets.
	reqs *ReqSample
}

// fstimeConf is one of UnixBench's three "File Copy" configurations.
type fstimeConf struct {
	bufSize   int // bytes per read/write
	maxBlocks int // file size in KiB
}

func (c fstimeConf) maxBuffs() int { return c.maxBlocks * 1024 / c.bufSize }
func (c fstimeConf) fileSize() int64 {
	return int64(c.maxBuffs()) * int64(c.bufSize)
}

var fstimeConfs = []fstimeConf{{256, 500}, {1024, 2000}, {4096, 8000}}

var allWorkloads = func() []*workloadDef {
	var ws []*workloadDef
	for _, c := range fstimeConfs {
		c := c
		ws = append(ws,
			&workloadDef{
				name: fmt.Sprintf("fstime-%d-write", c.bufSize), unit: "KB/s", higherIsBetter: true,
				desc: fmt.Sprintf("fstime write: write(%d) x %d, lseek(0), repeat", c.bufSize, c.maxBuffs()),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					return fstimeWritePhase(ctx, inst, c, b.cfg.Duration)
				},
			},
			&workloadDef{
				name: fmt.Sprintf("fstime-%d-read", c.bufSize), unit: "KB/s", higherIsBetter: true,
				desc: fmt.Sprintf("fstime read: read(%d) of a %d KiB file, rewinding at EOF", c.bufSize, c.maxBlocks),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					v, err := fstimeRead(ctx, inst.root, c, b.cfg.Duration)
					return sample{value: v}, err
				},
			},
			&workloadDef{
				name: fmt.Sprintf("fstime-%d-copy", c.bufSize), unit: "KB/s", higherIsBetter: true,
				desc: fmt.Sprintf("fstime copy: read(%d) from one file, write it to another", c.bufSize),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					v, err := fstimeCopy(ctx, inst.root, c, b.cfg.Duration)
					return sample{value: v}, err
				},
			},
		)
	}
	ws = append(ws,
		&workloadDef{name: "metadata", unit: "ops/s", higherIsBetter: true,
			desc:           fmt.Sprintf("create, stat, unlink %d empty files in a lower directory, in batches", metaBatch),
			countsRequests: true,
			run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
				var v float64
				// Counted by type: the requests a create, stat and
				// unlink cost are what bounds this workload on a FUSE
				// overlay (docs/BENCHMARKS.md, "metadata").
				reqs, err := b.countRequests(inst, true, func() (float64, error) {
					var ops float64
					var err error
					v, ops, err = metadata(ctx, inst.root, b.cfg.Duration)
					return ops, err
				})
				return sample{value: v, reqs: reqs}, err
			}},
		&workloadDef{name: "stat-deep", unit: "ops/s", higherIsBetter: true,
			desc: "stat() of " + deepPath + ", 5 components deep in the lower",
			run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
				v, err := statDeep(ctx, inst.root, b.cfg.Duration)
				return sample{value: v}, err
			}},
		&workloadDef{name: "path-miss", unit: "µs", higherIsBetter: false,
			desc: "fork+exec of a binary found in the 7th of 7 PATH directories on the target; median per exec",
			run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
				v, err := pathMiss(ctx, inst.root, b.cfg.Duration)
				return sample{value: v}, err
			}},
		&workloadDef{name: "copyup", unit: "MB/s", higherIsBetter: true,
			desc: "open(O_WRONLY|O_APPEND) of a 64 MiB lower file and write 1 byte; native: copy+fsync by hand",
			run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
				v, err := copyup(inst)
				return sample{value: v}, err
			}},
		&workloadDef{name: "untar", unit: "files/s", higherIsBetter: true,
			desc:           fmt.Sprintf("extract a tar of %d small files in %d directories", untarFiles, untarDirs),
			countsRequests: true,
			run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
				var v float64
				reqs, err := b.countRequests(inst, true, func() (float64, error) {
					var files float64
					var err error
					v, files, err = untar(ctx, inst.root, b.tarball, b.cfg.Duration)
					return files, err
				})
				return sample{value: v, reqs: reqs}, err
			}},
	)
	for _, w := range ws {
		w.group = groupDefault
	}
	// The dircache group comes last, find-cold and the mem-* workloads
	// first in it, so that their cache drops come after every default
	// workload of the round.
	full := newDCLayout(1)
	dc := []*workloadDef{
		{name: "find-cold", unit: "entries/s", higherIsBetter: true,
			desc: fmt.Sprintf("drop caches (root), then walk %s files in %s directories spread over 3 lowers (getdents64, lstat of each entry)",
				fmtNum(float64(full.treeFiles())), fmtNum(float64(full.TreeDirs))),
			countsRequests: true, run: findCold},
		{name: "mem-per-inode", unit: "bytes/inode", higherIsBetter: false,
			desc:   "FUSE daemons only: drop dentries and inodes (root), then the daemon's VmRSS growth over a walk of find-cold's tree, per entry",
			notFor: noDaemon, run: memPerInode},
		{name: "mem-idle", unit: "MiB", higherIsBetter: false,
			desc:   fmt.Sprintf("FUSE daemons only: drop dentries and inodes (root), then the daemon's VmRSS once it stops falling (at most %v)", rssSettleLimit),
			notFor: noDaemon, run: memIdle},
		{name: "readdir-100k", unit: "entries/s", higherIsBetter: true,
			desc: fmt.Sprintf("warm readdir (getdents64, names only) of one directory of %s entries merged from 3 lowers and the upper",
				fmtNum(dcFullBig)),
			countsRequests: true, run: readdirBig},
		{name: "create-unlink-100k", unit: "ops/s", higherIsBetter: true,
			desc:           fmt.Sprintf("create then unlink %s empty files in a fresh directory (each phase stops after %v)", fmtNum(dcFullCreates), createUnlinkCap),
			countsRequests: true, run: createUnlink},
		{name: "warm-stat", unit: "ops/s", higherIsBetter: true,
			desc:           fmt.Sprintf("%d warm stat() of %s; counts the FUSE requests", warmOps, deepPath),
			countsRequests: true, run: warmStat},
		{name: "warm-path-miss", unit: "ops/s", higherIsBetter: true,
			desc:           fmt.Sprintf("%d warm stat() of a missing name in each of the 7 PATH directories; counts the FUSE requests", warmOps),
			countsRequests: true, run: warmPathMiss},
	}
	for _, w := range dc {
		w.group = groupDircache
	}
	return append(ws, dc...)
}()

func findWorkload(name string) *workloadDef {
	for _, w := range allWorkloads {
		if w.name == name {
			return w
		}
	}
	return nil
}

func workloadNames() []string {
	var n []string
	for _, w := range allWorkloads {
		n = append(n, w.name)
	}
	return n
}

// Syscalls that a signal (Go's preemption SIGURG) may interrupt on FUSE.

func sysWrite(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Write(fd, p)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

func sysRead(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Read(fd, p)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

func sysOpen(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

func rewind(fd int) error {
	_, err := unix.Seek(fd, 0, io.SeekStart)
	return err
}

// The fstime files, as fstime's dummy0 and dummy1, one pair per
// configuration; they stay from one phase to the next, as in fstime.
func fstimeFile(root string, c fstimeConf, i int) string {
	return filepath.Join(root, fmt.Sprintf("fstime-%d.dummy%d", c.bufSize, i))
}

// checkEvery is how many I/Os go between looks at the clock and at ctx.
const checkEvery = 64

// fstimeWritePhase runs fstimeWrite, and on goverlay targets reads the
// daemon's GETXATTR(security.capability) counter around it.
func fstimeWritePhase(ctx context.Context, inst *instance, c fstimeConf, d time.Duration) (sample, error) {
	gov := inst.def.kind == kindGoverlay
	var before uint64
	var statsErr error
	if gov {
		st, err := readStats(inst.root)
		before, statsErr = st.CapGetxattr, err
	}
	kbps, writes, err := fstimeWrite(ctx, fstimeFile(inst.root, c, 0), c, d)
	if err != nil {
		return sample{}, err
	}
	s := sample{value: kbps}
	if gov && statsErr == nil && writes > 0 {
		if st, err := readStats(inst.root); err == nil {
			per := float64(st.CapGetxattr-before) * 1000 / float64(writes)
			s.getxattr = &per
		}
	}
	return s, nil
}

// fstimeWrite is fstime's write phase: write(bufSize) maxBuffs times,
// lseek(0), repeat. The file starts empty (fstime creat()s it), so the
// first pass extends it and later passes overwrite it in place. fstime
// looks at its alarm after each pass; we look at the clock every
// checkEvery writes once the file has its full size. It returns KB/s (bytes
// written / elapsed / 1024) and the number of writes.
func fstimeWrite(ctx context.Context, path string, c fstimeConf, d time.Duration) (float64, int64, error) {
	fd, err := sysOpen(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	buf := pattern(c.bufSize)
	max := c.maxBuffs()
	unix.Sync()
	var bytes, writes int64
	full := false
	start := time.Now()
	for {
		if err := rewind(fd); err != nil {
			return 0, 0, err
		}
		for i := 0; i < max; i++ {
			n, err := sysWrite(fd, buf)
			if err != nil {
				return 0, 0, fmt.Errorf("write: %w", err)
			}
			if n != len(buf) {
				return 0, 0, fmt.Errorf("short write: %d of %d bytes", n, len(buf))
			}
			bytes += int64(n)
			writes++
			if writes%checkEvery == 0 {
				if err := ctx.Err(); err != nil {
					return 0, 0, err
				}
				if full && time.Since(start) >= d {
					return float64(bytes) / since(start) / 1024, writes, nil
				}
			}
		}
		full = true
		if time.Since(start) >= d {
			return float64(bytes) / since(start) / 1024, writes, nil
		}
	}
}

// ensureFull makes path hold c's full file, untimed, for a read or copy
// phase that runs without the write phase before it.
func ensureFull(path string, c fstimeConf) error {
	var st unix.Stat_t
	if unix.Stat(path, &st) == nil && st.Size >= c.fileSize() {
		return nil
	}
	fd, err := sysOpen(path, unix.O_WRONLY|unix.O_CREAT, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf := pattern(c.bufSize)
	for i := 0; i < c.maxBuffs(); i++ {
		if _, err := sysWrite(fd, buf); err != nil {
			return err
		}
	}
	return nil
}

// fstimeRead is fstime's read phase: read(bufSize) in a loop, rewinding at
// EOF. It returns KB/s.
func fstimeRead(ctx context.Context, root string, c fstimeConf, d time.Duration) (float64, error) {
	path := fstimeFile(root, c, 0)
	if err := ensureFull(path, c); err != nil {
		return 0, err
	}
	fd, err := sysOpen(path, unix.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	buf := make([]byte, c.bufSize)
	unix.Sync()
	var bytes, reads int64
	start := time.Now()
	for {
		n, err := sysRead(fd, buf)
		if err != nil {
			return 0, fmt.Errorf("read: %w", err)
		}
		if n < len(buf) {
			if err := rewind(fd); err != nil {
				return 0, err
			}
		}
		bytes += int64(n)
		reads++
		if reads%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if time.Since(start) >= d {
				return float64(bytes) / since(start) / 1024, nil
			}
		}
	}
}

// fstimeCopy is fstime's copy phase: read(bufSize) from the first file,
// write what was read to the second, rewinding both when the first is at
// EOF. It returns KB/s copied.
func fstimeCopy(ctx context.Context, root string, c fstimeConf, d time.Duration) (float64, error) {
	from, to := fstimeFile(root, c, 0), fstimeFile(root, c, 1)
	if err := ensureFull(from, c); err != nil {
		return 0, err
	}
	src, err := sysOpen(from, unix.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(src)
	dst, err := sysOpen(to, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dst)
	buf := make([]byte, c.bufSize)
	unix.Sync()
	var bytes, ops int64
	start := time.Now()
	for {
		n, err := sysRead(src, buf)
		if err != nil {
			return 0, fmt.Errorf("read: %w", err)
		}
		if n == 0 {
			if err := rewind(src); err != nil {
				return 0, err
			}
			if err := rewind(dst); err != nil {
				return 0, err
			}
			continue
		}
		w, err := sysWrite(dst, buf[:n])
		if err != nil {
			return 0, fmt.Errorf("write: %w", err)
		}
		if w != n {
			return 0, fmt.Errorf("short write: %d of %d bytes", w, n)
		}
		bytes += int64(n)
		ops++
		if ops%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if time.Since(start) >= d {
				return float64(bytes) / since(start) / 1024, nil
			}
		}
	}
}

// metaBatch is how many files metadata creates, stats and unlinks at a time.
const metaBatch = 256

// metadata creates metaBatch empty files in a directory that exists in
// the lower (a merged directory on the overlays), stats each, unlinks each,
// and repeats for the duration. An op is one create (open+close), stat or
// unlink; it returns ops/s and the number of ops.
func metadata(ctx context.Context, root string, d time.Duration) (rate, ops float64, err error) {
	dir := filepath.Join(root, metaDir)
	names := make([]string, metaBatch)
	var n int64
	var st unix.Stat_t
	start := time.Now()
	for batch := 0; batch == 0 || time.Since(start) < d; batch++ {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		for i := range names {
			names[i] = filepath.Join(dir, fmt.Sprintf("b%d-%d", batch, i))
			fd, err := sysOpen(names[i], unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
			if err != nil {
				return 0, 0, fmt.Errorf("create: %w", err)
			}
			unix.Close(fd)
		}
		for _, name := range names {
			if err := unix.Stat(name, &st); err != nil {
				return 0, 0, fmt.Errorf("stat: %w", err)
			}
		}
		for _, name := range names {
			if err := unix.Unlink(name); err != nil {
				return 0, 0, fmt.Errorf("unlink: %w", err)
			}
		}
		n += 3 * metaBatch
	}
	return float64(n) / since(start), float64(n), nil
}

// statDeep stats a path 5 components deep that comes from the lower.
func statDeep(ctx context.Context, root string, d time.Duration) (float64, error) {
	p := filepath.Join(root, deepPath)
	var st unix.Stat_t
	var ops int64
	start := time.Now()
	for {
		if err := unix.Stat(p, &st); err != nil {
			return 0, fmt.Errorf("stat: %w", err)
		}
		ops++
		if ops%256 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if time.Since(start) >= d {
				return float64(ops) / since(start), nil
			}
		}
	}
}

// pathMiss runs the binary in the 7th of 7 PATH directories, all on the
// target, for the duration (at least minExecs times). Each exec is timed
// from the PATH search to the child's exit; it returns the median in µs.
//
// exec.Command searches the PATH of our own environment, not the one it
// hands the child, so the search through the custom PATH is done here,
// the way execvp does it: each directory in turn until the name is an
// executable file there.
func pathMiss(ctx context.Context, root string, d time.Duration) (float64, error) {
	const minExecs = 5
	var dirs []string
	for i := 1; i <= pathDirs; i++ {
		dirs = append(dirs, filepath.Join(root, pathDir(i)))
	}
	env := []string{"PATH=" + strings.Join(dirs, ":")}
	var lat []float64
	start := time.Now()
	for len(lat) < minExecs || time.Since(start) < d {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		bin, err := lookPath(pathBinary, dirs)
		if err != nil {
			return 0, err
		}
		cmd := exec.Command(bin)
		cmd.Args[0] = pathBinary
		cmd.Env = env
		if err := cmd.Run(); err != nil {
			return 0, fmt.Errorf("exec %s: %w", bin, err)
		}
		lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	return median(lat), nil
}

func lookPath(name string, dirs []string) (string, error) {
	var st unix.Stat_t
	for _, dir := range dirs {
		p := dir + "/" + name
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in the %d PATH directories", name, len(dirs))
}

// copyup opens the 64 MiB lower file for appending and writes one byte:
// the overlays copy the whole file up to the upper first. It returns MB/s
// (10^6 bytes) of file copied. The native target has nothing to copy up; it
// does by hand what a copy-up amounts to, copying the file
// (copy_file_range) and fsyncing it before the append, as a baseline.
func copyup(inst *instance) (float64, error) {
	src := filepath.Join(inst.root, bigFile)
	target := src
	start := time.Now()
	if inst.def.kind == kindNative {
		target = src + ".copy"
		if err := copyAndSync(src, target); err != nil {
			return 0, err
		}
	}
	fd, err := sysOpen(target, unix.O_WRONLY|unix.O_APPEND, 0)
	if err != nil {
		return 0, err
	}
	if _, err := sysWrite(fd, []byte{'\n'}); err != nil {
		unix.Close(fd)
		return 0, fmt.Errorf("write: %w", err)
	}
	if err := unix.Close(fd); err != nil {
		return 0, err
	}
	return bigSize / 1e6 / since(start), nil
}

func copyAndSync(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// untar extracts the archive into a fresh directory below a lower
// directory, as tar would (mkdir; create, write, close, utimes), for the
// duration (at least once). It returns files/s.
func untar(ctx context.Context, root string, tarball []byte, d time.Duration) (rate, files float64, err error) {
	if tarball == nil {
		return 0, 0, errors.New("no tarball")
	}
	var n int64
	start := time.Now()
	for i := 0; i == 0 || time.Since(start) < d; i++ {
		dest := filepath.Join(root, untarDir, fmt.Sprintf("x%d", i))
		k, err := extract(ctx, tarball, dest)
		n += k
		if err != nil {
			return 0, 0, err
		}
	}
	return float64(n) / since(start), float64(n), nil
}

func extract(ctx context.Context, tarball []byte, dest string) (int64, error) {
	if err := os.Mkdir(dest, 0o755); err != nil {
		return 0, err
	}
	tr := tar.NewReader(bytes.NewReader(tarball))
	var files int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return files, err
		}
		if err := ctx.Err(); err != nil {
			return files, err
		}
		p := filepath.Join(dest, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, os.FileMode(h.Mode).Perm()); err != nil {
				return files, err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(h.Mode).Perm())
			if err != nil {
				return files, err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return files, err
			}
			if err := f.Close(); err != nil {
				return files, err
			}
			if err := os.Chtimes(p, h.ModTime, h.ModTime); err != nil {
				return files, err
			}
			files++
		}
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
