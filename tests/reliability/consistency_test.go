package reliability_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// Reductions of what TestStress found, each on goverlay and on the kernel
// overlay over identical layers.

// TestHardLinkOtherName: a file with two names (a hard link made through
// the mount) keeps being that file under the second name when the first
// is unlinked, replaced or renamed away; for a lower file too (the link
// copies it up). The kernel overlay and any POSIX filesystem: one inode,
// whichever name reaches it.
func TestHardLinkOtherName(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	build := func(l []*testutil.Layer, _ *testutil.Layer) {
		l[0].File("low", "lower\n", 0o644).File("low3", "lower3\n", 0o644)
	}
	type step struct {
		what string
		do   func(p func(string) string) error
		read string // the name to read after the step
	}
	write := func(rel, data string) func(p func(string) string) error {
		return func(p func(string) string) error { return os.WriteFile(p(rel), []byte(data), 0o644) }
	}
	steps := []step{
		{"create a", write("a", "first\n"), "a"},
		{"link a b", func(p func(string) string) error { return unix.Link(p("a"), p("b")) }, "b"},
		{"unlink a", func(p func(string) string) error { return unix.Unlink(p("a")) }, "b"},
		{"create a anew", write("a", "second\n"), "b"},
		{"append to b", func(p func(string) string) error {
			f, err := os.OpenFile(p("b"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteString("appended to b\n")
			return err
		}, "a"},
		{"link b c", func(p func(string) string) error { return unix.Link(p("b"), p("c")) }, "c"},
		{"rename b d", func(p func(string) string) error { return unix.Rename(p("b"), p("d")) }, "c"},
		{"link low low2 (lower file)", func(p func(string) string) error { return unix.Link(p("low"), p("low2")) }, "low2"},
		{"unlink low", func(p func(string) string) error { return unix.Unlink(p("low")) }, "low2"},
		{"link low3 low4", func(p func(string) string) error { return unix.Link(p("low3"), p("low4")) }, "low4"},
		{"rename low3 over a", func(p func(string) string) error { return unix.Rename(p("low3"), p("a")) }, "low4"},
		{"chmod low4", func(p func(string) string) error { return unix.Chmod(p("low4"), 0o600) }, "a"},
		{"mkdir dir", func(p func(string) string) error { return unix.Mkdir(p("dir"), 0o755) }, "dir"},
		{"create dir/x", write("dir/x", "x in dir\n"), "dir/x"},
		{"link dir/x y", func(p func(string) string) error { return unix.Link(p("dir/x"), p("y")) }, "y"},
		{"unlink dir/x", func(p func(string) string) error { return unix.Unlink(p("dir/x")) }, "y"},
		{"rmdir dir", func(p func(string) string) error { return unix.Rmdir(p("dir")) }, "y"},
	}
	run := func(mnt string) []string {
		p := func(rel string) string { return filepath.Join(mnt, rel) }
		var out []string
		for _, s := range steps {
			err := s.do(p)
			b, rerr := os.ReadFile(p(s.read))
			var st unix.Stat_t
			serr := unix.Lstat(p(s.read), &st)
			out = append(out, fmt.Sprintf("%s: %s; then read %s: %q %s, mode %o nlink %d %s", s.what, errName(errnoOf(t, err)), s.read, b, errName(errnoOf(t, rerr)), st.Mode, st.Nlink, errName(errnoOf(t, serr))))
		}
		return out
	}
	ks, gs := newStack(t, 1, build), newStack(t, 1, build)
	kres := run(mountK(t, ks))
	gres := run(mountG(t, gs).Dir)
	for i := range steps {
		if kres[i] != gres[i] {
			t.Errorf("step %d:\n  goverlay: %s\n  kernel:   %s", i, gres[i], kres[i])
		}
	}
	if !strings.Contains(kres[2], `read b: "first\n" OK`) {
		t.Errorf("control: the kernel after unlink a: %s", kres[2])
	}
}

// TestRenameRaceOpen: while one thread renames a lower file back and forth
// (a → b → a: each rename copies up and leaves a whiteout at the old
// name), another opens and reads both names. An open may find either name
// gone (ENOENT) but must never open anything else: ENXIO means it opened
// the whiteout (a character device 0/0) that took the old name's place.
func TestRenameRaceOpen(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	dur := pick(2*time.Second, 20*time.Second)
	build := func(l []*testutil.Layer, _ *testutil.Layer) { l[0].File("a", "aaaa", 0o644) }
	for _, kernel := range []bool{true, false} {
		name := map[bool]string{true: "kernel", false: "goverlay"}[kernel]
		t.Run(name, func(t *testing.T) {
			s := newStack(t, 1, build)
			var mnt string
			if kernel {
				mnt = mountK(t, s)
			} else {
				mnt = mountG(t, s).Dir
			}
			counts := map[string]int{}
			var mu sync.Mutex
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := unix.Rename(filepath.Join(mnt, "a"), filepath.Join(mnt, "b")); err != nil {
						t.Errorf("rename a b: %v", err)
						return
					}
					if err := unix.Rename(filepath.Join(mnt, "b"), filepath.Join(mnt, "a")); err != nil {
						t.Errorf("rename b a: %v", err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				buf := make([]byte, 16)
				for {
					select {
					case <-stop:
						return
					default:
					}
					for _, n := range []string{"a", "b"} {
						fd, err := unix.Open(filepath.Join(mnt, n), unix.O_RDONLY|unix.O_CLOEXEC, 0)
						r := "open " + errName(errnoOf(t, err))
						if err == nil {
							k, rerr := unix.Read(fd, buf)
							if rerr != nil || string(buf[:k]) != "aaaa" {
								r = fmt.Sprintf("read %q %v", buf[:max(k, 0)], rerr)
							}
							unix.Close(fd)
						}
						mu.Lock()
						counts[r]++
						mu.Unlock()
					}
				}
			}()
			time.Sleep(dur) // how long the race runs, not a synchronisation
			close(stop)
			wg.Wait()
			var bad, all []string
			for r, n := range counts {
				all = append(all, fmt.Sprintf("%s ×%d", r, n))
				if r != "open OK" && r != "open ENOENT" {
					bad = append(bad, fmt.Sprintf("%s ×%d", r, n))
				}
			}
			sort.Strings(all)
			t.Logf("outcomes: %s", strings.Join(all, ", "))
			if counts["open OK"] == 0 {
				t.Errorf("no open succeeded: the race did not run")
			}
			if len(bad) > 0 {
				sort.Strings(bad)
				t.Errorf("%s: opens of a name being renamed found something else than the file or nothing: %s", name, strings.Join(bad, ", "))
			}
		})
	}
}
