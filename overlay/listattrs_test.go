package overlay

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReaddirPlusAttrsWhereUsed: a listing looks up the directories
// among its entries but not its files (find -name reads no inode of them);
// once a file a listing left without attributes has been looked up (a
// stat walk), listings give every entry's attributes, and stats of them
// then send nothing. Every entry has the attributes of its lower file
// either way.
func TestReaddirPlusAttrsWhereUsed(t *testing.T) {
	lo := t.TempDir()
	const files, sets = 12, 8
	// A set of directories for each try: a try that another test's
	// drop of the caches disturbed is run again on a fresh set.
	for k := range sets {
		for _, d := range []string{"a", "a/sub", "b"} {
			dir := fmt.Sprintf("%s/%d/%s", lo, k, d)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for i := range files {
				write(t, fmt.Sprintf("%s/f%d", dir, i), fmt.Sprintf("%*d", i+1, i))
			}
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

	// walk lists d (looked up first) and stats its files, and returns
	// the lookups of each.
	walk := func(d string) (listed, statted uint64) {
		t.Helper()
		if _, err := os.Stat(mnt + "/" + d); err != nil {
			t.Fatal(err)
		}
		before := lookups()
		if ents := list(d); len(ents) != files {
			t.Fatalf("%s lists %d entries, want %d", d, len(ents), files)
		}
		listed = lookups() - before
		before = lookups()
		statAll(d)
		return listed, lookups() - before
	}

	var listB, statB, listSub, statSub uint64
	k := 0
	if !undisturbed(t, func() bool {
		if k == sets {
			return false
		}
		set := strconv.Itoa(k)
		k++
		// No stat walk under way: a names-only walk of b does not
		// look up its files; they are still there to stat, each by a
		// LOOKUP, which starts a stat walk.
		f.statWalk.Store(0)
		listB, statB = walk(set + "/b")
		// During it, a listing of a/sub gives the attributes of its
		// files, and their stats send nothing.
		listSub, statSub = walk(set + "/a/sub")
		return true
	}) {
		t.Skip("other tests dropped the caches during every try: nothing to measure")
	}
	if listB != 0 {
		t.Errorf("listing b looked up %d entries, want none of its %d files", listB, files)
	}
	if statB != files {
		t.Errorf("stat of b's files: %d lookups, want %d", statB, files)
	}
	if listSub < files {
		t.Errorf("listing a/sub looked up %d entries, want its %d files (a stat walk is under way)", listSub, files)
	}
	if statSub != 0 {
		t.Errorf("stat of a/sub's files after the listing: %d lookups, want 0", statSub)
	}
}

// TestReaddirPlusKnownEntries: a listing of a directory whose entries
// the kernel already knows (made through the mount) looks up none of its
// files, even during a stat walk, but its subdirectory (whose attributes
// the kernel may have dropped); stats of the files still show what was
// written, and removing them all (rm -rf's listing) works.
func TestReaddirPlusKnownEntries(t *testing.T) {
	lo := t.TempDir()
	write(t, lo+"/keep", "lower")
	mnt, _, f := nosecMount(t, NoSecInherit, false, lo)
	const files, sets = 12, 8
	k := 0
	var listed, statted uint64
	if !undisturbed(t, func() bool {
		if k == sets {
			return false
		}
		d := fmt.Sprintf("%s/new%d", mnt, k)
		k++
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(d+"/sub", 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			write(t, fmt.Sprintf("%s/f%d", d, i), fmt.Sprintf("%*d", i+1, i))
		}
		// A stat walk under way would look up every entry the
		// kernel does not know.
		f.statWalk.Store(time.Now().Add(time.Hour).UnixNano())
		defer f.statWalk.Store(0)
		before := f.Stats().Lookups
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != files+1 {
			t.Fatalf("%s lists %d entries, want %d", d, len(ents), files+1)
		}
		listed = f.Stats().Lookups - before
		before = f.Stats().Lookups
		for i := range files {
			var st unix.Stat_t
			name := fmt.Sprintf("%s/f%d", d, i)
			if err := unix.Lstat(name, &st); err != nil {
				t.Fatal(err)
			}
			if st.Size != int64(i+1) || st.Mode != unix.S_IFREG|0o644 {
				t.Errorf("%s: size %d mode %#o, want %d %#o", name, st.Size, st.Mode, i+1, unix.S_IFREG|0o644)
			}
		}
		statted = f.Stats().Lookups - before
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Fatalf("%s after RemoveAll: %v", d, err)
		}
		return true
	}) {
		t.Skip("other tests dropped the caches during every try: nothing to measure")
	}
	if listed != 1 {
		t.Errorf("listing a directory of %d known files and a known subdirectory looked up %d entries, want 1 (the subdirectory)", files, listed)
	}
	if statted != 0 {
		t.Errorf("stats of known files sent %d lookups, want none", statted)
	}
}
