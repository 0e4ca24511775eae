package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The host workloads: what a container host pays per container of one
// image. A host that runs N containers of an image mounts N overlays over
// the same lower directories, each with an upper and work directory of
// its own, and each container reads the same files and execs the same
// binaries. Each workload mounts N instances of the round's target, one
// after another, over one image built once (hostState), does its part on
// every instance, measures, and unmounts them all; the daemons are gone
// when it returns.
//
// The kernel overlay hands reads and mmaps to the lower file itself:
// ovl_read_iter() reads through backing_file_read_iter() and ovl_mmap()
// maps the real file with backing_file_mmap(), so every mount shares the
// lower file's page cache and N containers cache its pages once. A FUSE
// mount has an inode of its own for the file, and its own page cache:
// fuse_file_read_iter() reads through fuse_cache_read_iter() into
// generic_file_read_iter() on that inode's mapping, and fuse_file_mmap()
// maps the same mapping, so each mount caches a copy of what it reads,
// besides the lower file's pages that the daemon read, once. Only a file
// opened with FOPEN_PASSTHROUGH (at an OPEN request the daemon answers)
// is read and mapped through the backing file instead
// (fuse_passthrough_read_iter(), fuse_passthrough_mmap()).

const groupHost = "host"

// The image: one lower directory, the only lower of every instance.
const (
	hostData     = "data.bin"       // host-pagecache reads it through every instance
	hostDataSize = 40 << 20         // of random data
	hostConf     = "etc/os-release" // host-pss reads it through every instance ...
	hostWritten  = "etc/hostname"   // ... and writes this (a copy-up of etc/)
	hostStatic   = "bin/busybox"    // host-exec runs it, the static ctBusybox
)

// hostCounts are the N of the host workloads: N=10 is in the host group
// at any --scale, N=100 only at --scale 1 or more, or when named (their
// fullScale). The names keep N, as the dircache names keep their full
// size, but --scale does not shrink it: a count between 10 and 100 tells
// nothing the two do not, and a hundred mounts per workload, target and
// round (with as many daemons alive at once for the FUSE targets, and
// for host-pagecache as many 40 MiB copies in the page cache) is the
// full-size run's business, as the dircache and containers trees' full
// size is.
var hostCounts = []int{10, 100}

// hostState is the host workloads' image, built once per Run.
type hostState struct {
	lower string
	// static says why the exec workload cannot run, or "".
	static string
}

// HostInfo describes the host workloads in the report.
type HostInfo struct {
	DataBytes int64 `json:"data_bytes"`
	// Exec is the static binary host-exec runs, or why there is none.
	Exec string `json:"exec"`
	// Mounts is how many instances each selected host workload mounts.
	Mounts map[string]int `json:"mounts"`
}

func init() {
	var ws []*workloadDef
	for _, n := range hostCounts {
		k := len(ws)
		ws = append(ws,
			&workloadDef{name: fmt.Sprintf("host-pagecache-%d", n), unit: "MiB",
				desc: fmt.Sprintf("mount %d instances over one image, drop caches (root), then read its %d MiB %s fully through each: the growth of Cached in /proc/meminfo", n, hostDataSize>>20, hostData),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					return b.hostCached(ctx, inst, fmt.Sprintf("host-pagecache-%d", n), n, readThrough)
				}},
			&workloadDef{name: fmt.Sprintf("host-exec-%d", n), unit: "MiB",
				desc: fmt.Sprintf("mount %d instances over one image, drop caches (root), then exec its static busybox (true) once through each: the growth of Cached", n),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					if b.host.static != "" {
						return sample{}, errors.New(b.host.static)
					}
					return b.hostCached(ctx, inst, fmt.Sprintf("host-exec-%d", n), n, execThrough)
				}},
			&workloadDef{name: fmt.Sprintf("host-pss-%d", n), unit: "MiB", notFor: hostNoDaemon,
				desc: fmt.Sprintf("FUSE daemons only: mount %d instances over one image, read %s and write %s through each, then the daemons' summed Pss (smaps_rollup)", n, hostConf, hostWritten),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					return b.hostPSS(ctx, inst, fmt.Sprintf("host-pss-%d", n), n)
				}},
			&workloadDef{name: fmt.Sprintf("host-mount-%d", n), unit: "ms",
				desc: fmt.Sprintf("mount %d instances over one image, one after another: the mount commands' wall time per mount, each to the mount being live", n),
				run: func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
					return b.onHost(ctx, inst, fmt.Sprintf("host-mount-%d", n), n, func(insts []*instance) (float64, error) {
						var took time.Duration
						for _, in := range insts {
							took += in.mountTook
						}
						return took.Seconds() * 1000 / float64(len(insts)), nil
					})
				}},
		)
		for _, w := range ws[k:] {
			w.group, w.fullScale = groupHost, n > hostCounts[0]
			if w.notFor == nil {
				w.notFor = hostNotFor
			}
		}
	}
	allWorkloads = append(allWorkloads, ws...)
	workloadGroups = append(workloadGroups, groupHost)
}

// hostNotFor says why the host workloads do not run on t: they mount
// more instances of an overlay, as root.
func hostNotFor(t *targetDef) string {
	switch {
	case t.kind == kindNative:
		return "not an overlay: nothing to mount over the image"
	case t.rootless:
		return "the host workloads mount as root, outside the rootless namespace"
	}
	return ""
}

// hostNoDaemon says why host-pss does not run on t.
func hostNoDaemon(t *targetDef) string {
	if why := hostNotFor(t); why != "" {
		return why
	}
	return noDaemon(t)
}

// setupHost builds the image when a host workload is selected.
func (b *bencher) setupHost() error {
	if !b.wantsGroup(groupHost) {
		return nil
	}
	h := &hostState{lower: filepath.Join(b.root, "lower-host")}
	if err := os.MkdirAll(filepath.Join(h.lower, filepath.Dir(hostConf)), 0o755); err != nil {
		return fmt.Errorf("bench: the host image: %w", err)
	}
	if err := writeRandom(filepath.Join(h.lower, hostData), hostDataSize); err != nil {
		return fmt.Errorf("bench: the host image: %w", err)
	}
	if err := os.WriteFile(filepath.Join(h.lower, hostConf), pattern(512), 0o644); err != nil {
		return fmt.Errorf("bench: the host image: %w", err)
	}
	var err error
	if h.static, err = copyStatic(filepath.Join(h.lower, hostStatic)); err != nil {
		return err
	}
	info := &HostInfo{DataBytes: hostDataSize, Exec: ctBusybox, Mounts: map[string]int{}}
	if h.static != "" {
		info.Exec = h.static
	}
	for _, w := range b.workloads {
		if w.group == groupHost {
			n, _ := strconv.Atoi(w.name[strings.LastIndexByte(w.name, '-')+1:])
			info.Mounts[w.name] = b.hostN(n)
		}
	}
	b.host = h
	b.rep.Host = info
	return nil
}

// hostN is how many instances a host workload named for n mounts: n,
// or the tests' size.
func (b *bencher) hostN(n int) int {
	if b.cfg.hostMounts > 0 {
		return b.cfg.hostMounts
	}
	return n
}

// writeRandom writes size bytes of random data (from a fixed seed) to a
// new file.
func writeRandom(path string, size int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	rng := rand.NewChaCha8([32]byte{'g', 'o', 'v', 'e', 'r', 'l', 'a', 'y'})
	chunk := make([]byte, 1<<20)
	for n := 0; n < size; n += len(chunk) {
		c := chunk[:min(len(chunk), size-n)]
		rng.Read(c)
		if _, err := f.Write(c); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// onHost mounts n instances (b.hostN) of inst's target over the image,
// one after another, each with fresh upper and work directories, and
// returns fn's value on them as the sample. Whatever happens (an error,
// Ctrl-C), every instance is unmounted, its daemon waited for and its
// directories removed before it returns; a mount that is still there
// then is detached (removeScratch).
func (b *bencher) onHost(ctx context.Context, inst *instance, workload string, n int, fn func(insts []*instance) (float64, error)) (s sample, err error) {
	n = b.hostN(n)
	dir := filepath.Join(b.root, "host", workload+"-"+inst.def.name)
	var cl cleanups
	defer func() {
		if cerr := cl.run(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	cl.push(func() error { return removeScratch(dir) })
	insts := make([]*instance, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return sample{}, err
		}
		in, err := inst.def.mountOver(ctx, b, filepath.Join(dir, fmt.Sprintf("%03d", i)), []string{b.host.lower}, nil, &cl)
		if err != nil {
			return sample{}, fmt.Errorf("mount %d of %d: %w", i+1, n, err)
		}
		insts = append(insts, in)
	}
	// fuse-overlayfs writes no pidfile: its daemons are looked up now,
	// untimed, so that the unmounts wait for them too.
	if inst.def.kind == kindFuseOverlayfs {
		for _, in := range insts {
			if _, err := daemonPID(in); err != nil {
				return sample{}, err
			}
		}
	}
	v, err := fn(insts)
	return sample{value: v}, err
}

// hostCached mounts n instances, drops every cache, does each to every
// instance and returns the growth of Cached in /proc/meminfo, in MiB.
//
// The caches are dropped after the mounts, not before, so that the
// growth is the image's pages alone: drop_caches evicts every clean page
// that no process maps (drop_pagecache_sb(): invalidate_mapping_pages()
// skips mapped pages), so the running daemons' own binaries and
// libraries stay resident and uncounted, while what the mounts read
// before (nothing of the image) is gone. Cached is the page cache
// (meminfo_proc_show(): NR_FILE_PAGES less the swap cache and the block
// devices' buffers): every FUSE inode's pages and the lower file's alike.
// It is the whole machine's, so anything else running adds to it.
func (b *bencher) hostCached(ctx context.Context, inst *instance, workload string, n int, each func(ctx context.Context, in *instance) error) (sample, error) {
	return b.onHost(ctx, inst, workload, n, func(insts []*instance) (float64, error) {
		if err := dropAll(); err != nil {
			return 0, err
		}
		before, err := meminfoCached()
		if err != nil {
			return 0, err
		}
		for _, in := range insts {
			if err := each(ctx, in); err != nil {
				return 0, err
			}
		}
		after, err := meminfoCached()
		if err != nil {
			return 0, err
		}
		return float64(after-before) / (1 << 20), nil
	})
}

// readThrough reads the image's data file fully through in, and checks
// its size.
func readThrough(ctx context.Context, in *instance) error {
	n, err := readFile(ctx, filepath.Join(in.root, hostData), make([]byte, 1<<20))
	if err == nil && n != hostDataSize {
		err = fmt.Errorf("read %d bytes of %s, want %d", n, hostData, hostDataSize)
	}
	return err
}

// execThrough runs the image's static busybox (as true) through in.
func execThrough(ctx context.Context, in *instance) error {
	return ctRun(ctx, nil, filepath.Join(in.root, hostStatic), "true")
}

// readFile reads path to its end with buf and returns its size.
func readFile(ctx context.Context, path string, buf []byte) (int64, error) {
	fd, err := sysOpen(path, unix.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var total int64
	for i := 0; ; i++ {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return total, err
			}
		}
		n, err := sysRead(fd, buf)
		if err != nil {
			return total, fmt.Errorf("read %s: %w", path, err)
		}
		if n == 0 {
			return total, nil
		}
		total += int64(n)
	}
}

// hostIdle is how long host-pss lets the mounts idle before it reads the
// daemons' memory: idle mounts, as a host's are between its containers'
// starts, whose daemons have had the time to settle (a shared server
// returns its free memory half a second after the last mount).
const hostIdle = time.Second

// hostPSS mounts n instances, has each read a small file and write one,
// as a container does when it starts, lets them idle for hostIdle, and
// returns the daemons' summed proportional set size in MiB. A page that k processes map counts 1/k
// to each (smaps_account()), so the sum counts the pages the daemons
// share (their binary's text, the libraries) once and each one's own
// memory in full: what the N daemons cost the host together. Processes
// outside the sum that map the same binary (the round's own instance of
// the target) take their share of those shared pages with them.
func (b *bencher) hostPSS(ctx context.Context, inst *instance, workload string, n int) (sample, error) {
	return b.onHost(ctx, inst, workload, n, func(insts []*instance) (float64, error) {
		buf := make([]byte, 4096)
		for i, in := range insts {
			if _, err := readFile(ctx, filepath.Join(in.root, hostConf), buf); err != nil {
				return 0, err
			}
			if err := os.WriteFile(filepath.Join(in.root, hostWritten), []byte(fmt.Sprintf("container%d\n", i)), 0o644); err != nil {
				return 0, err
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(hostIdle):
		}
		var total int64
		counted := map[int]bool{} // a shared server counts once
		for _, in := range insts {
			pid, err := daemonPID(in)
			if err != nil {
				return 0, err
			}
			if counted[pid] {
				continue
			}
			counted[pid] = true
			pss, err := procPSS(pid)
			if err != nil {
				return 0, err
			}
			total += pss
		}
		return float64(total) / (1 << 20), nil
	})
}

// meminfoCached is Cached in /proc/meminfo, in bytes.
func meminfoCached() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseKB(data, "Cached", "/proc/meminfo")
}

// procPSS is process pid's proportional set size in bytes, the Pss line
// of /proc/PID/smaps_rollup (show_smaps_rollup(): every mapping's, summed).
func procPSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, fmt.Errorf("the daemon's memory: %w", err)
	}
	return parseKB(data, "Pss", "/proc/PID/smaps_rollup")
}

// line is the host workloads' line above the table.
func (h *HostInfo) line() string {
	var counts []string
	for _, n := range hostCounts {
		suffix := fmt.Sprintf("-%d", n)
		for _, w := range sortedKeys(h.Mounts) {
			if strings.HasSuffix(w, suffix) {
				counts = append(counts, fmt.Sprintf("%d for the *%s ones", h.Mounts[w], suffix))
				break
			}
		}
	}
	exe := fmt.Sprintf("%s, a copy of %s", hostStatic, h.Exec)
	if h.Exec != ctBusybox {
		exe = "no " + hostStatic + ": " + h.Exec
	}
	return fmt.Sprintf("host workloads: N instances of each target mounted one after another over one image (%s, %s MiB of random data; %s), unmounted after each workload; N is %s",
		hostData, fmtInt(int(h.DataBytes>>20)), exe, strings.Join(counts, ", "))
}
