package overlay

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// getdents reads the names of the directory open as fd with a buffer of
// bufSize bytes per getdents64 call, at most max calls (0: to the end),
// and returns them with each entry's d_off.
func getdents(t *testing.T, fd, bufSize, max int) (names []string, offs []int64) {
	t.Helper()
	buf := make([]byte, bufSize)
	for calls := 0; max == 0 || calls < max; calls++ {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		for b := buf[:n]; len(b) > 0; {
			reclen := int(b[16]) | int(b[17])<<8
			off := int64(0)
			for i := 7; i >= 0; i-- {
				off = off<<8 | int64(b[8+i])
			}
			name := b[19:reclen]
			if i := slices.Index(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				names = append(names, s)
				offs = append(offs, off)
			}
			b = b[reclen:]
		}
	}
	return names, offs
}

func openDirFD(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestDirOpenWithoutRequest: directories are opened without OPENDIR (the
// kernel is told once, with ENOSYS), and their listings are still whole
// and consistent: read in small steps by several readers at once, with
// seeks back to an offset handed out, after passes left half done (more
// of them than the daemon keeps), and after a change; fsync of a
// directory works; a warm walk opens no listing in the daemon.
func TestDirOpenWithoutRequest(t *testing.T) {
	l := listingLayers(t)
	var want []string
	for i := 0; i < 600; i++ {
		name := fmt.Sprintf("a-rather-long-name-so-one-read-does-not-hold-them-all-%04d", i)
		write(t, fmt.Sprintf("%s/d/%s", l[i%3], name), "x")
		want = append(want, name)
	}
	for i := 0; i < 2*maxDirStreams; i++ {
		for j := 0; j < 40; j++ {
			write(t, fmt.Sprintf("%s/many/d%03d/file-with-a-longish-name-%02d", l[j%3], i, j), "x")
			write(t, fmt.Sprintf("%s/whole/directory-listed-whole-only-%03d/file-%02d", l[j%3], i, j), "x")
		}
	}
	mnt, _, f := nosecMount(t, NoSecInherit, false, l...)
	d := mnt + "/d"
	want = append(want, "all", "only0", "only1", "only2", "sub")
	sort.Strings(want)

	// Readers at once, each in steps of one small getdents.
	var wg sync.WaitGroup
	got := make([][]string, 4)
	for r := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(fd)
			got[r], _ = getdents(t, fd, 512, 0)
			sort.Strings(got[r])
		}()
	}
	wg.Wait()
	for r, g := range got {
		if !slices.Equal(g, want) {
			t.Errorf("reader %d read %d names, want the %d of the directory once each", r, len(g), len(want))
		}
	}

	// A seek back to an offset a read handed out goes on from there.
	fd := openDirFD(t, d)
	first, offs := getdents(t, fd, 1024, 3)
	if len(first) < 10 {
		t.Fatalf("3 reads gave %d names", len(first))
	}
	if _, err := unix.Seek(fd, offs[4], 0); err != nil {
		t.Fatal(err)
	}
	rest, _ := getdents(t, fd, 1024, 0)
	if all := append(slices.Clone(first[:5]), rest...); !slices.Equal(sorted(all), want) {
		t.Errorf("after a seek to the offset of the 5th name: %d names, want %d", len(all), len(want))
	}

	// Passes left half done in more directories than the daemon keeps
	// streams for, then finished.
	fds := make([]int, 2*maxDirStreams)
	heads := make([][]string, len(fds))
	for i := range fds {
		fds[i] = openDirFD(t, fmt.Sprintf("%s/many/d%03d", mnt, i))
		heads[i], _ = getdents(t, fds[i], 512, 1)
	}
	for i, fd := range fds {
		tail, _ := getdents(t, fd, 512, 0)
		if all := append(heads[i], tail...); len(all) != 40 {
			t.Errorf("many/d%03d read in two parts: %d names, want 40", i, len(all))
		}
	}

	// A change, then a fresh listing.
	if err := os.Remove(d + "/only1"); err != nil {
		t.Fatal(err)
	}
	want = slices.DeleteFunc(want, func(s string) bool { return s == "only1" })
	if g := names(t, d); !slices.Equal(g, want) {
		t.Errorf("after an unlink: %d names, want %d", len(g), len(want))
	}

	if err := unix.Fsync(openDirFD(t, d)); err != nil {
		t.Errorf("fsync of a directory: %v", err)
	}

	// Warm: no OPENDIR, no listing opened in the daemon. The walk lists
	// directories that were only ever read whole, from the start to the
	// end in one getdents loop. The kernel appends to its cached
	// listing, page after page (fuse_add_dirent_to_cache()), and a
	// listing read in part by the passes above may lose its last page
	// to a drop_caches of another test before the pass finishes it; the
	// kernel then never completes that listing nor starts it anew while
	// it keeps the inode (fuse_readdir_cached() returns UNCACHED for a
	// listing not complete, without looking for its pages), and every
	// later listing of the directory reaches the daemon.
	walk := func() {
		for _, dir := range names(t, mnt+"/whole") {
			names(t, mnt+"/whole/"+dir)
		}
	}
	var od, n, opened uint64
	if !undisturbed(t, func() bool {
		walk()
		var op uint64
		od, op = f.raw.dirs.opendirs.Load(), f.raw.dirs.opened.Load()
		lookups := f.stats.lookups.Load()
		walk()
		walk()
		n, opened = f.raw.dirs.opendirs.Load(), f.raw.dirs.opened.Load()-op
		// Lookups in a warm walk: the kernel dropped its dentries,
		// and its listings with them.
		return f.stats.lookups.Load() == lookups
	}) {
		t.Skip("other tests dropped the caches during every try: nothing to measure")
	}
	if od == 0 || n != od {
		t.Errorf("%d OPENDIR requests before the warm listings, %d after; want the first opens' only (answered ENOSYS, after which the kernel opens directories itself)", od, n)
	}
	if opened != 0 {
		t.Errorf("2 warm listings of %d directories opened %d listings in the daemon, want 0", 2*maxDirStreams+1, opened)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// streamDirsMount mounts three lowers holding directories t/d000 ... of
// 30 names each, spread over the lowers, with names long enough that a
// 512-byte getdents reads a directory only in part.
func streamDirsMount(t *testing.T, dirs int) string {
	t.Helper()
	l := listingLayers(t)
	for i := 0; i < dirs; i++ {
		for j := 0; j < 30; j++ {
			write(t, fmt.Sprintf("%s/t/d%03d/name-long-enough-to-fill-a-read-%02d", l[j%3], i, j), "x")
		}
	}
	mnt, _, _ := nosecMount(t, NoSecInherit, false, l...)
	return mnt
}

// TestDirStreamsForgotten: a directory left half read whose inode the
// kernel then forgets (drop_caches) takes its stream with it: go-fuse
// drops the node and reuses its ID, so a stream kept past the FORGET
// would be closed on an unknown node, or serve another directory's
// listing. Listings stay whole through forgets and reused IDs.
func TestDirStreamsForgotten(t *testing.T) {
	const dirs = 3 * maxDirStreams
	mnt := streamDirsMount(t, dirs)
	half := func(i int) {
		fd, err := unix.Open(fmt.Sprintf("%s/t/d%03d", mnt, i), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		getdents(t, fd, 512, 1)
	}
	for round := 0; round < 3; round++ {
		for i := 0; i < maxDirStreams/2; i++ {
			half(i)
		}
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
			t.Fatal(err)
		}
		for i := maxDirStreams / 2; i < dirs; i++ {
			half(i)
		}
		for i := 0; i < dirs; i++ {
			if n := len(names(t, fmt.Sprintf("%s/t/d%03d", mnt, i))); n != 30 {
				t.Fatalf("round %d: t/d%03d lists %d names, want 30", round, i, n)
			}
		}
	}
}

// TestDirStreamsForgottenConcurrently: readers leave directories half
// read, so streams are evicted beyond maxDirStreams, while the kernel
// forgets those directories (drop_caches). An eviction racing the FORGET
// of its directory must not close the stream through go-fuse after the
// node is gone: go-fuse panics on the unknown node and the READDIR that
// evicted gets EIO.
func TestDirStreamsForgottenConcurrently(t *testing.T) {
	const dirs = 4 * maxDirStreams
	mnt := streamDirsMount(t, dirs)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			buf := make([]byte, 512)
			for round := 0; ; round++ {
				for i := r; i < dirs; i += 4 {
					select {
					case <-stop:
						return
					default:
					}
					fd, err := unix.Open(fmt.Sprintf("%s/t/d%03d", mnt, i), unix.O_RDONLY|unix.O_DIRECTORY, 0)
					if err == nil {
						_, err = unix.Getdents(fd, buf)
						unix.Close(fd)
					}
					if err != nil {
						errs <- fmt.Errorf("reader %d, round %d, t/d%03d: %v", r, round, i, err)
						return
					}
				}
			}
		}(r)
	}
	for i := 0; i < 100; i++ {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
			t.Error(err)
			break
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := 0; i < dirs; i++ {
		if n := len(names(t, fmt.Sprintf("%s/t/d%03d", mnt, i))); n != 30 {
			t.Fatalf("t/d%03d lists %d names, want 30", i, n)
		}
	}
}
