package testutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UnmountKernel unmounts a mount made by KernelOverlay (or Tmpfs, LoopFS)
// before the end of the test, failing the test unless it is gone. The
// cleanup registered at mount time then has nothing left to do.
func UnmountKernel(t testing.TB, dir string) {
	t.Helper()
	if !IsMounted(dir) {
		t.Errorf("UnmountKernel: %s is not mounted", dir)
		return
	}
	unmountStrict(t, dir)
}

// LoopFS makes a filesystem image of size bytes under t.TempDir(), formats
// it with mkfs (the command and its arguments; the device is appended),
// attaches it to a loop device and mounts it with mount -t fstype. It
// returns the mount point. The test is skipped, with the reason, when the
// kernel lacks fstype, the mkfs command is missing or no loop device can
// be had. The mount and the loop device are released when the test ends,
// whatever happens; LeakCheck runs after that.
func LoopFS(t testing.TB, fstype string, size int64, mkfs ...string) string {
	t.Helper()
	RequireRoot(t)
	// First, so that its check runs after our unmount and detach.
	LeakCheck(t)
	if fs, err := os.ReadFile("/proc/filesystems"); err != nil || !hasFS(string(fs), fstype) {
		t.Skipf("the kernel has no %s filesystem (not in /proc/filesystems)", fstype)
	}
	if _, err := exec.LookPath(mkfs[0]); err != nil {
		t.Skipf("%s not installed: %v", mkfs[0], err)
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skipf("losetup not installed: %v", err)
	}
	base := t.TempDir()
	img := filepath.Join(base, fstype+".img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device: losetup -f --show: %v: %s", err, strings.TrimSpace(string(out)))
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	args := append(append([]string{}, mkfs[1:]...), dev)
	if out, err := exec.Command(mkfs[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", mkfs[0], strings.Join(args, " "), err, out)
	}
	mnt := filepath.Join(base, fstype)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	trackMount(mnt)
	t.Cleanup(func() { unmountStrict(t, mnt) })
	if out, err := exec.Command("mount", "-t", fstype, dev, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -t %s %s: %v: %s", fstype, dev, err, out)
	}
	return mnt
}

func hasFS(list, fstype string) bool {
	for _, l := range strings.Split(list, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[len(f)-1] == fstype {
			return true
		}
	}
	return false
}

// Extent is one extent FIEMAP reports.
type Extent struct {
	Logical, Physical, Length uint64
	Flags                     uint32
}

// FIEMAP extent flags (linux/fiemap.h).
const (
	FiemapExtentLast    = 0x1
	FiemapExtentUnknown = 0x2
	FiemapExtentShared  = 0x2000
)

// Shared reports FIEMAP_EXTENT_SHARED.
func (e Extent) Shared() bool { return e.Flags&FiemapExtentShared != 0 }

func (e Extent) String() string {
	return fmt.Sprintf("[log %d phys %d len %d flags %#x]", e.Logical, e.Physical, e.Length, e.Flags)
}

// Fiemap returns every extent of the file at path (FS_IOC_FIEMAP with
// FIEMAP_FLAG_SYNC, so delayed allocations are flushed first).
func Fiemap(path string) ([]Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	const (
		fsIocFiemap    = 0xC020660B // _IOWR('f', 11, struct fiemap)
		fiemapFlagSync = 0x1
		hdr            = 32 // struct fiemap without its extents
		extSize        = 56 // struct fiemap_extent
		batch          = 256
	)
	var out []Extent
	start := uint64(0)
	for {
		// A []uint64 keeps the buffer 8-byte aligned for the kernel.
		buf := make([]uint64, (hdr+batch*extSize)/8)
		b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*8)
		ne := binary.NativeEndian
		ne.PutUint64(b[0:], start)            // fm_start
		ne.PutUint64(b[8:], ^uint64(0)-start) // fm_length
		ne.PutUint32(b[16:], fiemapFlagSync)  // fm_flags
		ne.PutUint32(b[24:], batch)           // fm_extent_count
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0])))
		if errno != 0 {
			return out, fmt.Errorf("FS_IOC_FIEMAP %s: %w", path, errno)
		}
		n := int(ne.Uint32(b[20:])) // fm_mapped_extents
		if n == 0 {
			return out, nil
		}
		var last Extent
		for i := range n {
			o := hdr + i*extSize
			last = Extent{Logical: ne.Uint64(b[o:]), Physical: ne.Uint64(b[o+8:]), Length: ne.Uint64(b[o+16:]), Flags: ne.Uint32(b[o+40:])}
			out = append(out, last)
		}
		if last.Flags&FiemapExtentLast != 0 {
			return out, nil
		}
		start = last.Logical + last.Length
	}
}

// DataSegments lists the [start, end) data ranges of an open file as
// SEEK_DATA/SEEK_HOLE find them.
func DataSegments(fd int) ([][2]int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	var segs [][2]int64
	off := int64(0)
	for off < st.Size {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return segs, fmt.Errorf("SEEK_DATA %d: %w", off, err)
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return segs, fmt.Errorf("SEEK_HOLE %d: %w", d, err)
		}
		if h <= d {
			return segs, fmt.Errorf("SEEK_HOLE %d returned %d", d, h)
		}
		segs = append(segs, [2]int64{d, h})
		off = h
	}
	return segs, nil
}

// Clone copies a tree deeply enough that changing a node's fields or
// xattrs does not change tr.
func (tr Tree) Clone() Tree {
	out := make(Tree, len(tr))
	for p, n := range tr {
		c := *n
		if n.Xattrs != nil {
			c.Xattrs = make(map[string]string, len(n.Xattrs))
			for k, v := range n.Xattrs {
				c.Xattrs[k] = v
			}
		}
		c.Errs = append([]string(nil), n.Errs...)
		out[p] = &c
	}
	return out
}

// NoEINTR calls f again while it fails with EINTR. The kernel overlay
// waits for an inode's copy-up lock interruptibly (ovl_copy_up_start()),
// so a copy-up racing another one fails with EINTR, before anything is
// changed, when the Go runtime's preemption signal reaches the waiting
// thread. Tests that copy up concurrently retry, as a program must.
func NoEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
