package reliability_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The I/O modes whose write-back differs: the default (files open without
// a request, writeback cache), files opened by request (passthrough as
// root), and writes sent through goverlay.
var wbModes = []string{"", "noopen=0", "writeback=0"}

// wbTarget names the target of mode: the kernel overlay ("kernel"), or
// goverlay with the options mode.
func wbTarget(mode string) string {
	switch mode {
	case "kernel":
		return "kernel"
	case "":
		return "goverlay"
	}
	return "goverlay " + mode
}

// fullStack is a stack whose upper and work dirs are on base (a small
// filesystem), with one lower layer elsewhere built by build.
func fullStack(t *testing.T, base string, build func(l *testutil.Layer)) stack {
	t.Helper()
	l := testutil.NewLayer(t, filepath.Join(t.TempDir(), "lower0"))
	if build != nil {
		build(l)
	}
	l.Finish()
	s := stack{base: base, lower: []string{l.Root}, upper: filepath.Join(base, "upper"), work: filepath.Join(base, "work")}
	for _, d := range []string{s.upper, s.work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// mountTarget mounts the kernel overlay ("kernel") or goverlay with mode.
func mountTarget(t *testing.T, s stack, target, mode string) string {
	t.Helper()
	if target == "kernel" {
		return mountK(t, s)
	}
	var extra []string
	if mode != "" {
		extra = []string{"-o", mode}
	}
	return mountG(t, s, extra...).Dir
}

// wbPattern is the 64 KiB block written over and over: no page of it is
// zeros, so a hole shows.
var wbPattern = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i*7%251 + 1)
	}
	return b
}()

// fillFile writes size bytes of wbPattern to a new file at p, 64 KiB per
// write(2), stopping at the first error; with sync it calls fsync(2)
// before close(2). It returns the errors of the write(2), fsync(2) and
// close(2) calls that failed, as "write: ENOSPC" and the like.
func fillFile(t *testing.T, p string, size int, sync bool, setup func(fd int)) []string {
	t.Helper()
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	if setup != nil {
		setup(fd)
	}
	var errs []string
	for off := 0; off < size; off += len(wbPattern) {
		if _, err := unix.Write(fd, wbPattern); err != nil {
			errs = append(errs, "write: "+errName(errnoOf(t, err)))
			break
		}
	}
	if sync {
		if err := unix.Fsync(fd); err != nil {
			errs = append(errs, "fsync: "+errName(errnoOf(t, err)))
		}
	}
	if err := unix.Close(fd); err != nil {
		errs = append(errs, "close: "+errName(errnoOf(t, err)))
	}
	return errs
}

// checkPrefix checks that the upper file at up is a prefix of what
// fillFile wrote, and that the mount's file at p shows its size.
func checkPrefix(t *testing.T, target, p, up string) {
	t.Helper()
	data, err := os.ReadFile(up)
	if err != nil {
		t.Errorf("%s: the upper file: %v", target, err)
		return
	}
	for off := 0; off < len(data); off += len(wbPattern) {
		want := wbPattern[:min(len(wbPattern), len(data)-off)]
		if got := data[off : off+len(want)]; !bytes.Equal(got, want) {
			i := 0
			for i < len(want) && got[i] == want[i] {
				i++
			}
			t.Errorf("%s: the upper file (%d bytes) is not a prefix of what was written: it differs from byte %d on", target, len(data), off+i)
			return
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Errorf("%s: stat through the mount: %v", target, err)
	} else if st.Size != int64(len(data)) {
		t.Errorf("%s: stat through the mount gives %d bytes, the upper file has %d", target, st.Size, len(data))
	}
}

// TestFullUpperWrite: 30 MiB written through the mount onto a 20 MiB upper
// filesystem. The kernel overlay fails write(2) with ENOSPC and leaves a
// clean prefix. goverlay, under the writeback cache, reports the error at
// close(2); its WRITEs are served in parallel, so before the fix a later
// page could land after an earlier one failed, leaving zeros in the middle
// of the file, and the mount kept showing the size and pages that never
// reached the disk.
func TestFullUpperWrite(t *testing.T) {
	testutil.RequireRoot(t)
	const size = 30 << 20
	for _, mode := range append([]string{"kernel"}, wbModes...) {
		target := wbTarget(mode)
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			s := fullStack(t, testutil.TmpfsSize(t, "20m"), nil)
			mnt := mountTarget(t, s, target, mode)
			p := filepath.Join(mnt, "f")
			errs := fillFile(t, p, size, false, nil)
			if !strings.Contains(strings.Join(errs, " "), "ENOSPC") {
				t.Errorf("%s: 30 MiB onto a 20 MiB upper: errors %v, none ENOSPC", target, errs)
			}
			switch {
			case mode == "kernel" || mode == "writeback=0":
				// Without the writeback cache the error comes
				// from write(2) itself.
				if len(errs) == 0 || !strings.HasPrefix(errs[0], "write: ") {
					t.Errorf("%s: errors %v, want write(2) to fail", target, errs)
				}
			}
			checkPrefix(t, target, p, filepath.Join(s.upper, "f"))
		})
	}
}

// TestQuotaWrite: as TestFullUpperWrite, the upper on a btrfs whose quota
// group is limited to 10 MiB (EDQUOT). fsync(2) reports the quota's own
// error under the writeback cache; close(2) would say EIO (the kernel
// keeps one bit for errors other than ENOSPC, mapping_set_error()).
func TestQuotaWrite(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("btrfs"); err != nil {
		t.Skipf("btrfs not installed: %v", err)
	}
	const size = 30 << 20
	for _, mode := range append([]string{"kernel"}, wbModes...) {
		target := wbTarget(mode)
		t.Run(target, func(t *testing.T) {
			base := testutil.LoopFS(t, "btrfs", 300<<20, "mkfs.btrfs", "-q", "-f")
			for _, args := range [][]string{{"quota", "enable", base}, {"qgroup", "limit", "10m", base}} {
				if out, err := exec.Command("btrfs", args...).CombinedOutput(); err != nil {
					t.Skipf("btrfs %s: %v: %s", strings.Join(args, " "), err, out)
				}
			}
			s := fullStack(t, base, nil)
			mnt := mountTarget(t, s, target, mode)
			p := filepath.Join(mnt, "f")
			errs := fillFile(t, p, size, true, nil)
			if !strings.Contains(strings.Join(errs, " "), "EDQUOT") {
				t.Errorf("%s: 30 MiB against a 10 MiB quota: errors %v, none EDQUOT", target, errs)
			}
			checkPrefix(t, target, p, filepath.Join(s.upper, "f"))
		})
	}
}

// TestFailedCopyUpShowsLower: a write to a 40 MiB lower file whose copy-up
// cannot fit on the 20 MiB upper fails (at open(2) on the kernel overlay,
// at close(2) under goverlay's writeback cache), and the mount then reads
// the lower file as it is, as the kernel overlay does: before the fix,
// goverlay showed the written byte, which no disk held.
func TestFailedCopyUpShowsLower(t *testing.T) {
	testutil.RequireRoot(t)
	lowerData := bytes.Repeat(wbPattern, 640) // 40 MiB
	for _, mode := range append([]string{"kernel"}, wbModes...) {
		target := wbTarget(mode)
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			s := fullStack(t, testutil.TmpfsSize(t, "20m"), func(l *testutil.Layer) {
				if err := os.WriteFile(l.P("big"), lowerData, 0o644); err != nil {
					t.Fatal(err)
				}
			})
			mnt := mountTarget(t, s, target, mode)
			p := filepath.Join(mnt, "big")
			var failed error
			if fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0); err != nil {
				failed = fmt.Errorf("open: %w", err)
			} else {
				if _, err := unix.Write(fd, []byte("x")); err != nil {
					failed = fmt.Errorf("write: %w", err)
				}
				if err := unix.Close(fd); err != nil && failed == nil {
					failed = fmt.Errorf("close: %w", err)
				}
			}
			if !errors.Is(failed, unix.ENOSPC) {
				t.Errorf("%s: writing a 40 MiB lower file with a 20 MiB upper: %v, want ENOSPC", target, failed)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatalf("%s: read after the failed write: %v", target, err)
			}
			if !bytes.Equal(got, lowerData) {
				t.Errorf("%s: after the failed copy-up the mount reads %d bytes starting %q, not the lower file's %d", target, len(got), got[:min(len(got), 8)], len(lowerData))
			}
			if _, err := os.Lstat(filepath.Join(s.upper, "big")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: after the failed copy-up the upper holds big (%v)", target, err)
			}
		})
	}
}

// seekSteps writes a file through mnt and answers SEEK_DATA and SEEK_HOLE
// while its data is still in the kernel's cache: after a write(2), after
// one beyond a hole, after a store through a shared mapping into a hole,
// after a truncation; and on a sparse lower file. The kernel sends
// FUSE_LSEEK without writing back first, so before the fix goverlay
// answered from an upper file still short of the data: ENXIO for both on
// a 4 KiB file just written.
func seekSteps(t *testing.T, mnt string) []string {
	t.Helper()
	var out []string
	fd, err := unix.Open(filepath.Join(mnt, "f"), unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	seek := func(what string, fd int, off int64, whence int) {
		r, err := unix.Seek(fd, off, whence)
		name := map[int]string{unix.SEEK_DATA: "SEEK_DATA", unix.SEEK_HOLE: "SEEK_HOLE"}[whence]
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %s %d: %s", what, name, off, errName(errnoOf(t, err))))
		} else {
			out = append(out, fmt.Sprintf("%s: %s %d: %d", what, name, off, r))
		}
	}
	page := bytes.Repeat([]byte("a"), 4096)
	if _, err := unix.Write(fd, page); err != nil {
		t.Fatal(err)
	}
	seek("4 KiB written", fd, 0, unix.SEEK_DATA)
	seek("4 KiB written", fd, 0, unix.SEEK_HOLE)
	if _, err := unix.Pwrite(fd, page, 1<<20); err != nil {
		t.Fatal(err)
	}
	seek("4 KiB at 1 MiB", fd, 0, unix.SEEK_HOLE)
	seek("4 KiB at 1 MiB", fd, 8192, unix.SEEK_DATA)
	seek("4 KiB at 1 MiB", fd, 1<<20, unix.SEEK_HOLE)
	if err := unix.Ftruncate(fd, 3<<20); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 2<<20, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	m[0] = 'm'
	seek("a mapping's store at 2 MiB", fd, (1<<20)+8192, unix.SEEK_DATA)
	seek("a mapping's store at 2 MiB", fd, 2<<20, unix.SEEK_HOLE)
	unix.Munmap(m)
	if err := unix.Ftruncate(fd, 2048); err != nil {
		t.Fatal(err)
	}
	seek("truncated to 2 KiB", fd, 0, unix.SEEK_HOLE)
	seek("truncated to 2 KiB", fd, 4096, unix.SEEK_DATA)
	lfd, err := unix.Open(filepath.Join(mnt, "sparse"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	seek("sparse lower file", lfd, 0, unix.SEEK_HOLE)
	seek("sparse lower file", lfd, 8192, unix.SEEK_DATA)
	return out
}

// TestSeekDataCached: SEEK_DATA and SEEK_HOLE give what the kernel overlay
// gives, in every I/O mode, while the data is still in the kernel's cache.
func TestSeekDataCached(t *testing.T) {
	testutil.RequireRoot(t)
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		f, err := os.Create(l[0].P("sparse"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		page := bytes.Repeat([]byte("s"), 4096)
		if _, err := f.WriteAt(page, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(page, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	want := seekSteps(t, mountK(t, newStack(t, 1, build)))
	for _, mode := range append(wbModes, "noopen=0,writeback=0", "noopen=0,writeback=1") {
		t.Run(strings.ReplaceAll(wbTarget(mode), ",", "+"), func(t *testing.T) {
			t.Parallel()
			var extra []string
			if mode != "" {
				extra = []string{"-o", mode}
			}
			got := seekSteps(t, mountG(t, newStack(t, 1, build), extra...).Dir)
			reportDiff(t, "SEEK_DATA and SEEK_HOLE", testutil.DiffLines(want, got, "kernel", "goverlay"))
		})
	}
}
