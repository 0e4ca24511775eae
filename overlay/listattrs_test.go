package overlay

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReaddirPlusAttrsWhereUsed: a listing of a directory nobody has
// stat'ed in looks up its directories but not its files (find -name reads
// no inode of them); once a file of a directory has been looked up, the
// listings of its subtree give every entry's attributes, and stats of
// them then send nothing. Every entry has the attributes of its lower file
// either way.
func TestReaddirPlusAttrsWhereUsed(t *testing.T) {
	lo := t.TempDir()
	const files = 12
	for _, d := range []string{"a", "a/sub", "b"} {
		if err := os.Mkdir(lo+"/"+d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			write(t, fmt.Sprintf("%s/%s/f%d", lo, d, i), fmt.Sprintf("%*d", i+1, i))
		}
	}
	mnt, _, f := nosecMount(t, NoSecInherit, false, lo)
	lookups := func() uint64 { return f.Stats().Lookups }
	list := func(d string) []os.DirEntry {
		t.Helper()
		ents, err := os.ReadDir(mnt + "/" + d) // getdents only, no stat
		if err != nil {
			t.Fatal(err)
		}
		return ents
	}
	statAll := func(d string) {
		t.Helper()
		for i := range files {
			var st, want unix.Stat_t
			name := fmt.Sprintf("%s/f%d", d, i)
			if err := unix.Lstat(mnt+"/"+name, &st); err != nil {
				t.Fatal(err)
			}
			if err := unix.Lstat(lo+"/"+name, &want); err != nil {
				t.Fatal(err)
			}
			if st.Size != want.Size || st.Mode != want.Mode || st.Mtim != want.Mtim {
				t.Errorf("%s: size %d mode %#o mtime %v; the lower file has %d %#o %v",
					name, st.Size, st.Mode, st.Mtim, want.Size, want.Mode, want.Mtim)
			}
		}
	}

	// A names-only walk of b: its files are not looked up.
	before := lookups()
	if ents := list("b"); len(ents) != files {
		t.Fatalf("b lists %d entries, want %d", len(ents), files)
	}
	if got := lookups() - before; got > 1 {
		t.Errorf("listing b looked up %d entries, want none of its %d files", got, files)
	}
	// Its files are still there to stat, each by a LOOKUP.
	before = lookups()
	statAll("b")
	if got := lookups() - before; got != files {
		t.Errorf("stat of b's files: %d lookups, want %d", got, files)
	}

	// a: a file looked up first; a listing of its subdirectory sub then
	// gives the attributes of sub's files, and their stats send nothing.
	var st unix.Stat_t
	if err := unix.Lstat(mnt+"/a/f0", &st); err != nil {
		t.Fatal(err)
	}
	before = lookups()
	if ents := list("a/sub"); len(ents) != files {
		t.Fatalf("a/sub lists %d entries, want %d", len(ents), files)
	}
	if got := lookups() - before; got < files {
		t.Errorf("listing a/sub looked up %d entries, want its %d files (a was statted)", got, files)
	}
	before = lookups()
	statAll("a/sub")
	if got := lookups() - before; got != 0 {
		t.Errorf("stat of a/sub's files after the listing: %d lookups, want 0", got)
	}
}
