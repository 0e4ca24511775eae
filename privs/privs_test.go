package privs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// capV2 is a valid VFS_CAP_REVISION_2 security.capability value
// (cap_net_raw permitted).
var capV2 = []byte{0, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// fileIn makes name in a fresh directory with mode (applied with chmod,
// after the umask) and, when caps, a security.capability. The directory fd
// is closed at the end of the test.
func fileIn(t *testing.T, name string, mode uint32, caps bool) (File, string) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if caps {
		if err := xattr.Set(p, CapabilityXattr, capV2); err != nil {
			t.Skipf("cannot set %s: %v", CapabilityXattr, err)
		}
	}
	// After the setxattr: setting a capability does not touch the mode,
	// but keep the order of a real file (caps set on an existing file).
	if err := unix.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(dfd) })
	return File{Dir: dfd, Name: name, ProcPath: "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name}, p
}

func statMode(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode
}

func hasCaps(t *testing.T, p string) bool {
	t.Helper()
	_, err := xattr.LGet(p, CapabilityXattr)
	if err == nil {
		return true
	}
	if !errors.Is(err, unix.ENODATA) {
		t.Fatalf("getxattr %s: %v", CapabilityXattr, err)
	}
	return false
}

func TestStrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     uint32
		caps     bool
		wantMode uint32
		want     Killed
		clean    bool
	}{
		{"suid", 0o4755, false, 0o755, Killed{Suid: true}, true},
		{"sgid with g+x", 0o2775, false, 0o775, Killed{Sgid: true}, true},
		{"sgid without g+x", 0o2765, false, 0o2765, Killed{}, false},
		{"suid and sgid", 0o6755, false, 0o755, Killed{Suid: true, Sgid: true}, true},
		{"suid, sgid without g+x", 0o6745, false, 0o2745, Killed{Suid: true}, false},
		{"suid without any x", 0o4644, false, 0o644, Killed{Suid: true}, true},
		{"sticky kept", 0o1755, false, 0o1755, Killed{}, true},
		{"capability", 0o755, true, 0o755, Killed{Caps: true}, true},
		{"suid and capability", 0o4711, true, 0o711, Killed{Suid: true, Caps: true}, true},
		{"plain", 0o644, false, 0o644, Killed{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, p := fileIn(t, "f", tc.mode, tc.caps)
			before := statMode(t, p)
			if before&07777 != tc.mode {
				t.Fatalf("setup: mode %#o, want %#o", before&07777, tc.mode)
			}
			k, clean, err := Strip(f, before)
			if err != nil {
				t.Fatalf("Strip: %v", err)
			}
			if k != tc.want {
				t.Errorf("Killed = %+v, want %+v", k, tc.want)
			}
			if k.Any() != (tc.want != Killed{}) {
				t.Errorf("Any() = %v for %+v", k.Any(), k)
			}
			if clean != tc.clean {
				t.Errorf("clean = %v, want %v", clean, tc.clean)
			}
			after := statMode(t, p)
			if after&07777 != tc.wantMode || after&unix.S_IFMT != unix.S_IFREG {
				t.Errorf("mode after = %#o, want regular %#o", after, tc.wantMode)
			}
			if hasCaps(t, p) {
				t.Errorf("%s still set", CapabilityXattr)
			}
			// What Strip reports as clean, Check agrees with.
			if c, err := Check(f, after); err != nil || c != tc.clean {
				t.Errorf("Check after Strip = %v, %v; want %v", c, err, tc.clean)
			}
			// A second Strip finds nothing more to do.
			k2, clean2, err := Strip(f, after)
			if err != nil || k2.Any() || clean2 != tc.clean {
				t.Errorf("second Strip = %+v, %v, %v; want nothing, %v", k2, clean2, err, tc.clean)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		f, p := fileIn(t, "f", 0o644, false)
		os.Remove(p)
		if _, clean, err := Strip(f, unix.S_IFREG|0o644); err == nil || clean {
			t.Errorf("Strip of a missing file: clean %v, err %v; want an error", clean, err)
		}
	})
	t.Run("chmod fails", func(t *testing.T) {
		f, p := fileIn(t, "f", 0o4755, false)
		os.Remove(p)
		k, clean, err := Strip(f, unix.S_IFREG|0o4755)
		if !errors.Is(err, unix.ENOENT) || clean || k.Any() {
			t.Errorf("got %+v, %v, %v; want nothing killed, ENOENT", k, clean, err)
		}
	})
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  uint32
		caps  bool
		clean bool
	}{
		{"plain", 0o644, false, true},
		{"executable", 0o755, false, true},
		{"suid", 0o4755, false, false},
		{"sgid", 0o2755, false, false},
		{"sgid without g+x", 0o2745, false, false},
		{"capability", 0o755, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, p := fileIn(t, "f", tc.mode, tc.caps)
			mode := statMode(t, p)
			clean, err := Check(f, mode)
			if err != nil || clean != tc.clean {
				t.Errorf("Check = %v, %v; want %v, nil", clean, err, tc.clean)
			}
			// Check never changes anything.
			if statMode(t, p) != mode || hasCaps(t, p) != tc.caps {
				t.Errorf("Check changed the file")
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		f, p := fileIn(t, "f", 0o644, false)
		os.Remove(p)
		if clean, err := Check(f, unix.S_IFREG|0o644); err == nil || clean {
			t.Errorf("Check of a missing file = %v, %v; want an error", clean, err)
		}
	})
}

func TestNoSec(t *testing.T) {
	t.Run("zero value unknown", func(t *testing.T) {
		var n NoSec
		if n.Known() {
			t.Error("Known on a zero NoSec")
		}
	})
	t.Run("set after begin", func(t *testing.T) {
		var n NoSec
		n.Set(n.Begin())
		if !n.Known() {
			t.Error("not Known after Begin, Set")
		}
		n.Set(n.Begin()) // again: still known
		if !n.Known() {
			t.Error("not Known after a second Begin, Set")
		}
	})
	t.Run("clear forgets", func(t *testing.T) {
		var n NoSec
		n.Set(n.Begin())
		n.Clear()
		if n.Known() {
			t.Error("Known after Clear")
		}
	})
	t.Run("clear between begin and set", func(t *testing.T) {
		var n NoSec
		gen := n.Begin()
		n.Clear()
		n.Set(gen)
		if n.Known() {
			t.Error("a check begun before a Clear recorded its stale answer")
		}
		// Known, then a check begins, then Clear, then the stale Set.
		n.Set(n.Begin())
		gen = n.Begin()
		n.Clear()
		n.Set(gen)
		if n.Known() {
			t.Error("stale Set after Clear of a known fact")
		}
		// Two Clears between Begin and Set.
		gen = n.Begin()
		n.Clear()
		n.Clear()
		n.Set(gen)
		if n.Known() {
			t.Error("stale Set after two Clears")
		}
	})
	t.Run("clear then check again", func(t *testing.T) {
		var n NoSec
		for i := 0; i < 5; i++ {
			n.Clear()
			n.Set(n.Begin())
			if !n.Known() {
				t.Fatalf("round %d: not Known after Clear, Begin, Set", i)
			}
		}
	})
	t.Run("set with a later generation", func(t *testing.T) {
		var n NoSec
		gen := n.Begin()
		n.Clear()
		newer := n.Begin()
		if newer == gen {
			t.Fatal("Begin returned the same generation across a Clear")
		}
		n.Set(newer)
		n.Set(gen) // a stale one after: must not undo anything
		if !n.Known() {
			t.Error("the current check's Set was lost")
		}
	})
}

func TestNoSecConcurrent(t *testing.T) {
	var n NoSec
	const workers, rounds = 8, 2000
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				n.Set(n.Begin())
				_ = n.Known()
			}
		}()
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				n.Clear()
			}
		}()
	}
	wg.Wait()
	// Every Clear counted: none lost to a racing Set or Clear.
	if got, want := n.Begin(), uint64(2*workers*rounds); got != want {
		t.Errorf("generation after %d Clears = %d, want %d", workers*rounds, got, want)
	}
	n.Clear()
	if n.Known() {
		t.Error("Known after the last Clear")
	}
	n.Set(n.Begin())
	if !n.Known() {
		t.Error("not Known after a quiet Begin, Set")
	}

	// The race NoSec exists for, with real goroutines: a check that
	// began before a Clear (ordered by channels) never records.
	var stale sync.WaitGroup
	for w := 0; w < workers; w++ {
		stale.Add(1)
		go func() {
			defer stale.Done()
			var m NoSec
			for i := 0; i < 200; i++ {
				gen := m.Begin()
				done := make(chan struct{})
				go func() { m.Clear(); close(done) }()
				<-done
				m.Set(gen)
				if m.Known() {
					t.Errorf("round %d: stale Set recorded after a Clear", i)
					return
				}
				m.Set(m.Begin())
				if !m.Known() {
					t.Errorf("round %d: fresh Set lost", i)
					return
				}
			}
		}()
	}
	stale.Wait()
}

func TestCounters(t *testing.T) {
	var c Counters
	for _, k := range []Killed{
		{Suid: true},
		{Sgid: true},
		{Caps: true},
		{Suid: true, Sgid: true, Caps: true},
		{},
		{Suid: true, Caps: true},
	} {
		c.Count(k)
	}
	if got := [3]uint64{c.KilledSuid.Load(), c.KilledSgid.Load(), c.KilledCaps.Load()}; got != [3]uint64{3, 2, 3} {
		t.Errorf("suid, sgid, caps = %v, want [3 2 3]", got)
	}
	if c.Checks.Load() != 0 || c.Skipped.Load() != 0 || c.CapGetxattr.Load() != 0 || c.CapGetxattrCached.Load() != 0 {
		t.Errorf("Count touched other counters")
	}

	var wg sync.WaitGroup
	var cc Counters
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				cc.Count(Killed{Suid: true, Caps: j%2 == 0})
			}
		}()
	}
	wg.Wait()
	if cc.KilledSuid.Load() != 8000 || cc.KilledCaps.Load() != 4000 || cc.KilledSgid.Load() != 0 {
		t.Errorf("concurrent counts: suid %d caps %d sgid %d", cc.KilledSuid.Load(), cc.KilledCaps.Load(), cc.KilledSgid.Load())
	}
}
