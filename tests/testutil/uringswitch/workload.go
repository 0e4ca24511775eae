package uringswitch

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Workload makes every kind of request the kernel sends over a ring on
// the mount mnt and checks the answers: lookups, creates, writes and
// reads larger than one payload buffer, listings of several READDIRPLUS
// batches, xattrs, links, renames and removals. file is a file already in
// mnt that holds content; it gets an xattr (on an overlay, a lower file
// is copied up by it).
func Workload(t *testing.T, mnt, file, content string) {
	t.Helper()
	big := bytes.Repeat([]byte("0123456789abcdef"), (3<<20)/16+7) // 3 MiB and a bit
	if err := os.WriteFile(filepath.Join(mnt, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(big))
	}
	// Not from the page cache: through READ requests.
	fd, err := unix.Open(filepath.Join(mnt, "big"), unix.O_RDONLY|unix.O_DIRECT, 0)
	if err == nil {
		// Page-aligned, as O_DIRECT wants.
		al, err := unix.Mmap(-1, 0, 256<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(al)
		n, err := unix.Pread(fd, al, 1<<20)
		unix.Close(fd)
		if err != nil || n != len(al) || !bytes.Equal(al, big[1<<20:1<<20+n]) {
			t.Fatalf("O_DIRECT pread: %d, %v", n, err)
		}
	}
	dir := filepath.Join(mnt, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 600 {
		name := fmt.Sprintf("file-with-a-longish-name-%04d", i)
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != len(want) {
		t.Fatalf("listed %d entries (%v), want %d", len(ents), err, len(want))
	}
	for i, e := range ents {
		if e.Name() != want[i] {
			t.Fatalf("entry %d is %q, want %q", i, e.Name(), want[i])
		}
	}
	f := filepath.Join(mnt, file)
	if err := unix.Setxattr(f, "user.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 16)
	if n, err := unix.Getxattr(f, "user.k", val); err != nil || string(val[:n]) != "v" {
		t.Fatalf("getxattr: %q, %v", val[:n], err)
	}
	if n, err := unix.Listxattr(f, val); err != nil || !strings.Contains(string(val[:n]), "user.k") {
		t.Fatalf("listxattr: %q, %v", val[:n], err)
	}
	if got, err := os.ReadFile(f); err != nil || string(got) != content {
		t.Fatalf("%s reads %q (%v), want %q", file, got, err, content)
	}
	if err := os.Symlink("big", filepath.Join(mnt, "link")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(mnt, "link")); err != nil || got != "big" {
		t.Fatalf("readlink: %q, %v", got, err)
	}
	if err := os.Rename(filepath.Join(mnt, "big"), filepath.Join(mnt, "big2")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(mnt, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lstat of a missing name: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
}
