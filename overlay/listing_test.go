package overlay

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listingLayers builds three lowers whose directory d is merged, with a
// name in each layer, a name in all three, and each kind of whiteout: a
// char 0/0 and a ".wh." file in the middle layer hide names of the bottom
// one.
func listingLayers(t *testing.T) []string {
	t.Helper()
	l := []string{openDir(t), openDir(t), openDir(t)}
	for i, d := range l {
		write(t, fmt.Sprintf("%s/d/only%d", d, i), "x")
		write(t, d+"/d/all", fmt.Sprint(i))
	}
	write(t, l[2]+"/d/wh-char", "hidden")
	write(t, l[2]+"/d/wh-aufs", "hidden")
	write(t, l[2]+"/d/sub/deep", "x")
	whiteout(t, l[1]+"/d/wh-char")
	write(t, l[1]+"/d/.wh.wh-aufs", "")
	return l
}

// TestListingAnswersMisses: once a merged directory's lower listings are
// read, a lookup of a name no layer holds asks no lower layer (only the
// upper, which changes), and names in the listings are still found in
// their layer, whited-out ones not.
func TestListingAnswersMisses(t *testing.T) {
	mnt, _, f := nosecMount(t, NoSecInherit, false, listingLayers(t)...)
	if _, err := os.Stat(mnt + "/d/all"); err != nil {
		t.Fatal(err)
	}
	before := f.Stats()
	for i := 0; i < 20; i++ {
		if _, err := os.Stat(fmt.Sprintf("%s/d/missing%d", mnt, i)); !os.IsNotExist(err) {
			t.Fatalf("missing%d: %v", i, err)
		}
	}
	after := f.Stats()
	// Each miss asks the upper twice (the name, and ".wh.NAME"): its
	// directory is not listed, since it changes.
	if got := after.LayerProbes - before.LayerProbes; got > 2*20 {
		t.Errorf("20 misses asked the layers %d times; want at most 40 (upper only)", got)
	}
	if got := after.LayerAnswers - before.LayerAnswers; got < 3*20 {
		t.Errorf("20 misses were settled from listings %d times; want 60 (3 lowers each)", got)
	}
	checkListingView(t, mnt)
}

// TestListingWithoutCache: with no room for listings, every answer comes
// from the layers, and they are the same.
func TestListingWithoutCache(t *testing.T) {
	mnt, _, f := nosecMount(t, NoSecInherit, false, listingLayers(t)...)
	f.caches.SetListingBudget(0)
	checkListingView(t, mnt)
	read := f.Stats().ListingsRead
	checkListingView(t, mnt)
	if n := f.caches.CachedListingEntries(); n != 0 {
		t.Errorf("%d listing entries cached with a budget of 0", n)
	}
	// A listing that could not be kept is not read again for lookups,
	// only for readdir (one directory, d).
	if got := f.Stats().ListingsRead - read; got > 1 {
		t.Errorf("the second pass read %d listings, want at most 1 (readdir of d)", got)
	}
}

func checkListingView(t *testing.T, mnt string) {
	t.Helper()
	want := []string{"all", "only0", "only1", "only2", "sub"}
	if got := names(t, mnt+"/d"); !slices.Equal(got, want) {
		t.Errorf("d lists %q, want %q", got, want)
	}
	for name, data := range map[string]string{"all": "0", "only2": "x", "sub/deep": "x"} {
		if b, err := os.ReadFile(mnt + "/d/" + name); err != nil || string(b) != data {
			t.Errorf("d/%s: %q, %v; want %q", name, b, err, data)
		}
	}
	for _, name := range []string{"wh-char", "wh-aufs", ".wh.wh-aufs", "missing"} {
		var st unix.Stat_t
		if err := unix.Lstat(mnt+"/d/"+name, &st); !errors.Is(err, unix.ENOENT) {
			t.Errorf("d/%s: %v, want ENOENT", name, err)
		}
	}
}

// TestListingsFreedWithDirectories: listings go when the kernel forgets
// their directories.
func TestListingsFreedWithDirectories(t *testing.T) {
	l := listingLayers(t)
	for i := 0; i < 200; i++ {
		write(t, fmt.Sprintf("%s/many/d%d/f", l[2], i), "x")
	}
	mnt, _, f := nosecMount(t, NoSecInherit, false, l...)
	base := f.caches.CachedListingEntries()
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(fmt.Sprintf("%s/many/d%d/f", mnt, i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.caches.CachedListingEntries(); n < base+200 {
		t.Fatalf("%d entries cached after looking into 200 directories, want at least %d", n, base+200)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return f.caches.CachedListingEntries() < base+200 },
		"listings of forgotten directories dropped")
}

// waitFor polls cond for up to 10 s: the kernel sends FORGET on its own
// time.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not after 10 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestListingAfterChanges: names whose lower layers' listings are cached
// follow unlink, rename, create and rmdir through the mount at once, in
// lookups and in readdir.
func TestListingAfterChanges(t *testing.T) {
	mnt, up, _ := nosecMount(t, NoSecInherit, false, listingLayers(t)...)
	checkListingView(t, mnt) // reads every listing of d
	d := mnt + "/d/"
	for _, err := range []error{
		os.Remove(d + "only2"),
		os.Rename(d+"only1", d+"renamed"),
		os.Rename(d+"all", d+"only0"),
		os.WriteFile(d+"wh-char", []byte("new"), 0o644),
		os.RemoveAll(d + "sub"),
		os.Mkdir(d+"sub", 0o755),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"only0", "renamed", "sub", "wh-char"}
	if got := names(t, mnt+"/d"); !slices.Equal(got, want) {
		t.Errorf("d lists %q, want %q", got, want)
	}
	for name, data := range map[string]string{"only0": "0", "renamed": "x", "wh-char": "new"} {
		if b, err := os.ReadFile(d + name); err != nil || string(b) != data {
			t.Errorf("d/%s: %q, %v; want %q", name, b, err, data)
		}
	}
	for _, name := range []string{"only1", "only2", "all", "sub/deep", "wh-aufs"} {
		var st unix.Stat_t
		if err := unix.Lstat(d+name, &st); !errors.Is(err, unix.ENOENT) {
			t.Errorf("d/%s: %v, want ENOENT", name, err)
		}
	}
	if got := names(t, mnt+"/d/sub"); len(got) != 0 {
		t.Errorf("new sub lists %q, want nothing", got)
	}
	// And from the upper alone, as a later mount sees it.
	if _, err := os.Lstat(up + "/d/sub"); err != nil {
		t.Errorf("upper d/sub: %v", err)
	}
}
