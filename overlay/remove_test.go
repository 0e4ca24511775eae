package overlay

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveWithoutLookup: files and directories the kernel knows by one
// name in the upper layer are removed without asking the layers where
// they are (node.soleUpperName, node.rmdirMadeHere); what the removal
// leaves must be what a lookup would have led to: a whiteout over a lower
// name, none otherwise, ENOTEMPTY for a directory with names, EISDIR and
// ENOTDIR for the wrong kind.
func TestRemoveWithoutLookup(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lo+"/low", "lower")
	write(t, lo+"/ldir/inner", "lower")
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn})
	p := func(name string) string { return mnt + "/" + name }
	mustErr := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	gone := func(name string) {
		t.Helper()
		if _, err := os.Lstat(p(name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after its removal: %v", name, err)
		}
	}

	// Made through the mount: no whiteout after.
	write(t, p("new"), "x")
	if err := os.Mkdir(p("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, p("d/f"), "x")
	mustErr("rmdir of a directory with a file", unix.Rmdir(p("d")), unix.ENOTEMPTY)
	if got := readFile(t, p("d/f")); got != "x" {
		t.Errorf("d/f after the failed rmdir: %q", got)
	}
	mustErr("unlink of a directory", unix.Unlink(p("d")), unix.EISDIR)
	mustErr("rmdir of a file", unix.Rmdir(p("new")), unix.ENOTDIR)
	for _, err := range []error{unix.Unlink(p("new")), unix.Unlink(p("d/f")), unix.Rmdir(p("d"))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	gone("new")
	gone("d")
	for _, n := range []string{"new", "d"} {
		if _, err := os.Lstat(up + "/" + n); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("upper %s: %v, want nothing (no lower name to hide)", n, err)
		}
	}

	// Over lower names: a whiteout after.
	if err := os.Truncate(p("low"), 1); err != nil { // copied up
		t.Fatal(err)
	}
	if err := os.RemoveAll(p("ldir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p("ldir"), 0o755); err != nil { // opaque, made here
		t.Fatal(err)
	}
	if err := unix.Unlink(p("low")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Rmdir(p("ldir")); err != nil {
		t.Fatal(err)
	}
	gone("low")
	gone("ldir")
	for _, n := range []string{"low", "ldir"} {
		if !isWhiteout(t, up+"/"+n) {
			t.Errorf("upper %s: not a whiteout over the lower name", n)
		}
	}

	// One of two names.
	write(t, p("a"), "data")
	if err := os.Link(p("a"), p("b")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unlink(p("a")); err != nil {
		t.Fatal(err)
	}
	gone("a")
	if got := readFile(t, p("b")); got != "data" {
		t.Errorf("b after the removal of a: %q", got)
	}
}
