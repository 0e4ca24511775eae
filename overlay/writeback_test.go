package overlay

import (
	"bytes"
	"encoding/binary"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// writebackMount mounts lower with the writeback cache and checks that the
// kernel granted it.
func writebackMount(t *testing.T, lower string) (mnt, up string) {
	t.Helper()
	up, work := openDir(t), openDir(t)
	mnt, f := mountFS(t, Options{Lower: []string{lower}, Upper: up, Work: work, NoSec: NoSecOn, Writeback: WritebackOn})
	if !f.io.writeback || f.io.passthrough {
		t.Fatalf("writeback cache %v, passthrough %v (%s): want the writeback cache alone", f.io.writeback, f.io.passthrough, f.io.why)
	}
	return mnt, up
}

func openT(t *testing.T, path string, flags int) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return fd
}

func pwriteT(t *testing.T, fd int, data string, off int64) {
	t.Helper()
	if n, err := unix.Pwrite(fd, []byte(data), off); err != nil || n != len(data) {
		t.Fatalf("pwrite %d bytes at %d: %d, %v", len(data), off, n, err)
	}
}

func sizeOf(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Size
}

// TestWritebackAppend: O_APPEND writes land at the end the kernel knows
// (its cached size, ahead of the upper file's), from two descriptors in
// turn, and reach the upper file at close. The upper file is opened
// without O_APPEND (the kernel gives each written-back page its offset).
func TestWritebackAppend(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/log", "start\n")
	mnt, up := writebackMount(t, lo)
	a := openT(t, mnt+"/log", unix.O_WRONLY|unix.O_APPEND)
	b := openT(t, mnt+"/log", unix.O_WRONLY|unix.O_APPEND)
	for i, fd := range []int{a, b, a, b} {
		if _, err := unix.Write(fd, []byte(strings.Repeat(string(rune('a'+i)), 3)+"\n")); err != nil {
			t.Fatal(err)
		}
	}
	want := "start\naaa\nbbb\nccc\nddd\n"
	if got := readFile(t, mnt+"/log"); got != want {
		t.Errorf("through the mount before close: %q, want %q", got, want)
	}
	unix.Close(a)
	unix.Close(b)
	if got := readFile(t, up+"/log"); got != want {
		t.Errorf("upper file after close: %q, want %q", got, want)
	}
}

// TestWritebackCachedSize: while written pages are cached, the size the
// mount reports is the kernel's, through a SETATTR (chmod) whose reply
// carries the upper file's size and a truncate; at close the upper file
// has it.
func TestWritebackCachedSize(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "0123456789")
	mnt, up := writebackMount(t, lo)
	fd := openT(t, mnt+"/f", unix.O_RDWR)
	defer unix.Close(fd)
	pwriteT(t, fd, strings.Repeat("x", 5000), 10000)
	if got := sizeOf(t, mnt+"/f"); got != 15000 {
		t.Errorf("size after an extending write: %d, want 15000", got)
	}
	if err := unix.Chmod(mnt+"/f", 0o600); err != nil {
		t.Fatal(err)
	}
	if got := sizeOf(t, mnt+"/f"); got != 15000 {
		t.Errorf("size after chmod: %d, want 15000", got)
	}
	if err := unix.Ftruncate(fd, 12000); err != nil {
		t.Fatal(err)
	}
	pwriteT(t, fd, "tail", 12000)
	if got := sizeOf(t, mnt+"/f"); got != 12004 {
		t.Errorf("size after truncate and write: %d, want 12004", got)
	}
	// A reader opened now sees the cached data.
	want := "0123456789" + strings.Repeat("\x00", 9990) + strings.Repeat("x", 2000) + "tail"
	if got := readFile(t, mnt+"/f"); got != want {
		t.Errorf("through the mount: %d bytes, want %d", len(got), len(want))
	}
	unix.Close(fd)
	if got := readFile(t, up+"/f"); got != want {
		t.Errorf("upper file after close: %d bytes, want %d", len(got), len(want))
	}
	if m := modeOf(t, up+"/f"); m != 0o600 {
		t.Errorf("upper mode %o, want 600", m)
	}
}

// TestWritebackFsync: fsync and fdatasync put what was written, and
// written through a shared mapping (msync), in the upper file while the
// descriptor stays open.
func TestWritebackFsync(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", strings.Repeat("-", 8192))
	mnt, up := writebackMount(t, lo)
	fd := openT(t, mnt+"/f", unix.O_WRONLY)
	defer unix.Close(fd)
	pwriteT(t, fd, "synced", 0)
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, up+"/f"); !strings.HasPrefix(got, "synced--") {
		t.Errorf("upper file after fsync: %q...", got[:16])
	}
	pwriteT(t, fd, "datasynced", 100)
	if err := unix.Fdatasync(fd); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, up+"/f"); got[100:110] != "datasynced" {
		t.Errorf("upper file after fdatasync: %q", got[100:110])
	}
	// A fault on a mapping of this process's own mount must not need
	// the daemon (TestNoFlushOnClose): read the pages into the cache
	// first, so the store below only makes a cached page dirty.
	readFile(t, mnt+"/f")
	rw := openT(t, mnt+"/f", unix.O_RDWR)
	defer unix.Close(rw)
	m, err := unix.Mmap(rw, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	copy(m[5000:], "mapped")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, up+"/f"); got[5000:5006] != "mapped" {
		t.Errorf("upper file after msync: %q", got[5000:5006])
	}
}

// TestWritebackCopyUpDirty: a file copied up by an open for writing has
// dirty pages while a second name is linked to it (link copies up and
// links in the upper layer) and a reader opens it: both see the cached
// data, and both upper names have it after close.
func TestWritebackCopyUpDirty(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/dir/f", "lower data")
	mnt, up := writebackMount(t, lo)
	fd := openT(t, mnt+"/dir/f", unix.O_RDWR)
	pwriteT(t, fd, "UPPER", 0)
	if err := os.Link(mnt+"/dir/f", mnt+"/g"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{mnt + "/dir/f", mnt + "/g"} {
		if got := readFile(t, p); got != "UPPER data" {
			t.Errorf("%s while dirty: %q", p, got)
		}
	}
	unix.Close(fd)
	for _, p := range []string{up + "/dir/f", up + "/g"} {
		if got := readFile(t, p); got != "UPPER data" {
			t.Errorf("%s after close: %q", p, got)
		}
	}
	if got := readFile(t, lo+"/dir/f"); got != "lower data" {
		t.Errorf("the lower file changed: %q", got)
	}
}

// TestWritebackMtime: the upper file ends with the mtime the mount
// showed, although the kernel writes the pages back after it took it.
func TestWritebackMtime(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "x")
	mnt, up := writebackMount(t, lo)
	fd := openT(t, mnt+"/f", unix.O_RDWR)
	pwriteT(t, fd, string(bytes.Repeat([]byte("y"), 1<<16)), 1<<20)
	if err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 2<<20, 1<<16); err != nil {
		t.Fatal(err)
	}
	var live unix.Stat_t
	if err := unix.Fstat(fd, &live); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	var disk unix.Stat_t
	if err := unix.Stat(up+"/f", &disk); err != nil {
		t.Fatal(err)
	}
	if live.Mtim != disk.Mtim {
		t.Errorf("mtime shown %d.%09d, upper file's %d.%09d", live.Mtim.Sec, live.Mtim.Nsec, disk.Mtim.Sec, disk.Mtim.Nsec)
	}
}

// TestDecideIO: the write path each option combination asks for, here
// (root in the initial namespace on 6.9+, where passthrough can be
// granted) and the kernel version parsing behind the rule.
func TestDecideIO(t *testing.T) {
	if ok, why := passthroughGrantable(); !ok {
		t.Skipf("passthrough cannot be granted here: %s", why)
	}
	for _, c := range []struct {
		o        Options
		readOnly bool
		pt, wb   bool
		share    bool
	}{
		{Options{Passthrough: true, OpenRequests: true}, false, true, false, false},
		{Options{Passthrough: false, OpenRequests: true}, false, false, true, false},
		{Options{Passthrough: true, OpenRequests: true, Writeback: WritebackOn}, false, false, true, false},
		{Options{Passthrough: false, OpenRequests: true, Writeback: WritebackOn}, false, false, true, false},
		{Options{Passthrough: true, OpenRequests: true, Writeback: WritebackOff}, false, true, false, false},
		{Options{Passthrough: false, OpenRequests: true, Writeback: WritebackOff}, false, false, false, false},
		{Options{Passthrough: true, OpenRequests: true, Writeback: WritebackOn}, true, false, false, false},
		// Without OPEN requests, no passthrough (noopen.go).
		{Options{Passthrough: true}, false, false, true, false},
		{Options{Passthrough: true, Writeback: WritebackOff}, false, false, false, false},
		{Options{Passthrough: true}, true, false, false, false},
		// sharecache: passthrough for lower files, read-only mounts
		// included; only with OPEN requests and passthrough, without
		// the writeback cache.
		{Options{Passthrough: true, OpenRequests: true, ShareCache: true}, false, true, false, true},
		{Options{Passthrough: true, OpenRequests: true, ShareCache: true}, true, true, false, true},
		{Options{Passthrough: true, OpenRequests: true, ShareCache: true, Writeback: WritebackOff}, false, true, false, true},
		{Options{Passthrough: true, OpenRequests: true, ShareCache: true, Writeback: WritebackOn}, false, false, true, false},
		{Options{Passthrough: false, OpenRequests: true, ShareCache: true}, false, false, true, false},
		{Options{Passthrough: true, ShareCache: true}, false, false, true, false},
		{Options{Passthrough: true, OpenRequests: true, ShareCache: true, Mask: maskOf(t, "passthrough")}, false, false, true, false},
	} {
		got := decideIO(c.o, c.readOnly)
		if got.share != c.share {
			t.Errorf("%+v, read-only %v: share %v (%s)", c.o, c.readOnly, got.share, got.why)
		}
		if got.noOpen == c.o.OpenRequests {
			t.Errorf("OpenRequests %v: noOpen %v", c.o.OpenRequests, got.noOpen)
		}
		if got.passthrough != c.pt || got.writeback != c.wb || got.why == "" {
			t.Errorf("passthrough %v, writeback %v, read-only %v: got passthrough %v, writeback %v (%s)",
				c.o.Passthrough, c.o.Writeback, c.readOnly, got.passthrough, got.writeback, got.why)
		}
	}
}

// TestWritebackXattrBlocks: an xattr too large for the inode takes a block
// of its own in the upper file; with the writeback cache the kernel keeps
// the file's attributes, and a listing it has cached refreshes nothing,
// yet stat(2) reports the upper file's st_blocks after the xattr is set
// and after it is removed, as the kernel overlay does.
func TestWritebackXattrBlocks(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "f")
	mnt, up := writebackMount(t, lo)
	for range 2 { // the second listing comes from the kernel's cache
		if _, err := os.ReadDir(mnt); err != nil {
			t.Fatal(err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt+"/f", &st); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("x"), 3000)
	blocks := func(what string) {
		t.Helper()
		var live, upper unix.Stat_t
		if err := unix.Stat(mnt+"/f", &live); err != nil {
			t.Fatal(err)
		}
		if err := unix.Stat(up+"/f", &upper); err != nil {
			t.Fatal(err)
		}
		if live.Blocks != upper.Blocks {
			t.Errorf("after %s: st_blocks %d through the mount, %d in the upper file", what, live.Blocks, upper.Blocks)
		}
	}
	if err := unix.Setxattr(mnt+"/f", "user.big", big, 0); err != nil {
		t.Fatal(err)
	}
	var upper unix.Stat_t
	if err := unix.Stat(up+"/f", &upper); err != nil {
		t.Fatal(err)
	}
	if upper.Blocks == st.Blocks {
		t.Skipf("the upper filesystem keeps a %d-byte xattr without a block (st_blocks %d)", len(big), upper.Blocks)
	}
	blocks("setxattr")
	if err := unix.Removexattr(mnt+"/f", "user.big"); err != nil {
		t.Fatal(err)
	}
	blocks("removexattr")

	// A large ACL: under FUSE_POSIX_ACL the kernel drops the file's
	// attributes after it sets or removes one, and the daemon leaves
	// st_blocks to that.
	if err := unix.Setxattr(mnt+"/f", "system.posix_acl_access", bigACL(300), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(up+"/f", &upper); err != nil {
		t.Fatal(err)
	}
	if upper.Blocks == st.Blocks {
		t.Skipf("the upper filesystem keeps a 300-entry ACL without a block (st_blocks %d)", upper.Blocks)
	}
	blocks("setting an ACL")
	if err := unix.Removexattr(mnt+"/f", "system.posix_acl_access"); err != nil {
		t.Fatal(err)
	}
	blocks("removing the ACL")
}

// bigACL is a system.posix_acl_access value with n named users
// (include/uapi/linux/posix_acl_xattr.h: a version, then tag, perm and id
// per entry, sorted by tag and id).
func bigACL(n int) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	entry := func(tag, perm uint16, id uint32) {
		b = binary.LittleEndian.AppendUint16(b, tag)
		b = binary.LittleEndian.AppendUint16(b, perm)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	const undefined = 0xffffffff
	entry(0x01, 6, undefined) // ACL_USER_OBJ
	for i := range n {
		entry(0x02, 4, uint32(10000+i)) // ACL_USER
	}
	entry(0x04, 4, undefined) // ACL_GROUP_OBJ
	entry(0x10, 4, undefined) // ACL_MASK
	entry(0x20, 4, undefined) // ACL_OTHER
	return b
}
