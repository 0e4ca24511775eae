package privs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The per-inode "known clean" fact (NoSec) of a nosec=on mount must be
// forgotten when the file gains a privilege through the mount: chmod u+s,
// setcap. Each test writes once (the file is then known clean), adds the
// privilege through the mount as root, writes again, and expects the
// privilege gone, as on the kernel overlay doing the same.

// TestSuidAfterClean: chmod u+s after the cache said clean, then a write
// by the unprivileged user clears setuid, and the slow path ran
// (priv_checks increased). A root write (CAP_FSETID) keeps setuid, as on
// the kernel overlay.
func TestSuidAfterClean(t *testing.T) {
	afterClean(t, func(t *testing.T, path string) {
		if err := unix.Chmod(path, 0o4777); err != nil {
			t.Fatalf("chmod u+s %s: %v", path, err)
		}
		if s := stateOf(path); s.mode != 0o4777 {
			t.Fatalf("after chmod 4777 %s: %v", path, s)
		}
	}, map[string]fileState{
		"user": {exists: true, mode: 0o777},
		"root": {exists: true, mode: 0o4777},
	}, true)
}

// TestSetcapAfterClean: setcap through the mount after the cache said
// clean, then a write removes the capability, whoever writes
// (cap_inode_killpriv is not gated by CAP_FSETID).
func TestSetcapAfterClean(t *testing.T) {
	afterClean(t, func(t *testing.T, path string) {
		setcap(t, path)
		if s := stateOf(path); !s.cap {
			t.Fatalf("after setcap %s: %v", path, s)
		}
	}, map[string]fileState{
		"user": {exists: true, mode: 0o777},
		"root": {exists: true, mode: 0o777},
	}, false)
}

// afterClean runs the scenario on nosec=on mounts with passthrough on and
// off. want is the final state per writer name; checkSlowPath asks that
// the user's second write made goverlay check the file (priv_checks).
func afterClean(t *testing.T, change func(t *testing.T, path string), want map[string]fileState, checkSlowPath bool) {
	testutil.RequireRoot(t)
	ws := writers(t)
	byName := map[string]writer{}
	for _, w := range ws {
		byName[w.name] = w
	}
	uid, gid := testutil.TestUser(t)
	helper(t)
	for _, opts := range []string{"nosec=on,passthrough=on", "nosec=on,passthrough=off"} {
		t.Run(subtestName(opts), func(t *testing.T) {
			t.Parallel()
			// One file per writer.
			names := []string{"user", "root"}
			p := mountPair(t, opts, func(l *testutil.Layer) {
				for _, n := range names {
					l.File("f-"+n, "0123456789\n", 0o777).Chown("f-"+n, uid, gid).Chmod("f-"+n, 0o777)
				}
			})
			checkMountMode(t, testutil.ReadStats(t, p.g), opts, false)
			roots := []string{p.g.Dir, p.k}
			write := func(w writer, file string) {
				t.Helper()
				for _, root := range roots {
					path := filepath.Join(root, file)
					if r := runOps(t, w, [][2]string{{"write", path}})[path]; !r.ok {
						t.Fatalf("%s: write %s: %s", w.name, path, r.err)
					}
				}
			}
			// 1. A write: copy-up, and the file is then known clean.
			for _, n := range names {
				write(byName[n], "f-"+n)
			}
			// 2. The privilege, through the mounts, as root.
			for _, n := range names {
				for _, root := range roots {
					change(t, filepath.Join(root, "f-"+n))
				}
			}
			// 3. Write again.
			for _, n := range names {
				before := testutil.ReadStats(t, p.g)
				write(byName[n], "f-"+n)
				after := testutil.ReadStats(t, p.g)
				t.Logf("%s's second write: priv_checks %d → %d, skipped %d → %d, killed suid %d → %d, caps %d → %d",
					n, before.PrivChecks, after.PrivChecks, before.PrivSkipped, after.PrivSkipped,
					before.KilledSuid, after.KilledSuid, before.KilledCaps, after.KilledCaps)
				if checkSlowPath && n == "user" && after.PrivChecks <= before.PrivChecks {
					t.Errorf("-o %s: the user's write after chmod u+s: priv_checks %d → %d, want an increase (the file's privileges checked again)",
						opts, before.PrivChecks, after.PrivChecks)
				}
			}
			for _, n := range names {
				f := "f-" + n
				km, gm := stateOf(filepath.Join(p.k, f)), stateOf(filepath.Join(p.g.Dir, f))
				ku, gu := stateOf(filepath.Join(p.ks.upper, f)), stateOf(filepath.Join(p.gs.upper, f))
				if km != want[n] || ku != want[n] {
					t.Errorf("control: %s's file on the kernel overlay: %v (upper %v), expected %v", n, km, ku, want[n])
				}
				if gm != want[n] {
					t.Errorf("-o %s: %s's file through goverlay: %v, want %v (kernel overlay %v)", opts, n, gm, want[n], km)
				}
				if gu != want[n] {
					t.Errorf("-o %s: %s's file in goverlay's upper: %v, want %v (kernel overlay's upper %v)", opts, n, gu, want[n], ku)
				}
			}
		})
	}
}

// TestWriteCounters: 1000 1-KiB writes on one fd by root. With nosec=on
// the kernel trusts S_NOSEC and asks for security.capability about once;
// with nosec=off it asks before every write. With passthrough on the
// file is opened in passthrough.
func TestWriteCounters(t *testing.T) {
	testutil.RequireRoot(t)
	root := writers(t)[0]
	helper(t)
	const n = 1000
	for _, opts := range combos {
		t.Run(subtestName(opts), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, t.TempDir(), func(l *testutil.Layer) {
				l.File("bulk", "", 0o644)
			})
			m := testutil.Mount(t, testutil.Options{Lower: []string{s.lower}, Upper: s.upper, Work: s.work, Extra: []string{"-o", opts}})
			before := testutil.ReadStats(t, m)
			checkMountMode(t, before, opts, false)
			path := filepath.Join(m.Dir, "bulk")
			if r := runOps(t, root, [][2]string{{"writes=1000", path}})[path]; !r.ok {
				t.Fatalf("1000 writes to %s: %s", path, r.err)
			}
			after := testutil.ReadStats(t, m)
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(s.upper, "bulk"), &st); err != nil || st.Size != n*1024 {
				t.Fatalf("upper file after %d 1-KiB writes: size %d, %v", n, st.Size, err)
			}
			getx := after.CapGetxattr - before.CapGetxattr
			t.Logf("-o %s: %d writes: getxattr(security.capability) +%d (from the cache +%d), priv_checks +%d, skipped +%d, opens passthrough +%d cached +%d",
				opts, n, getx, after.CapGetxattrCached-before.CapGetxattrCached,
				after.PrivChecks-before.PrivChecks, after.PrivSkipped-before.PrivSkipped,
				after.OpensPassthrough-before.OpensPassthrough, after.OpensCached-before.OpensCached)
			if nosecOn(opts) && getx > 5 {
				t.Errorf("-o %s: %d writes made %d GETXATTR(security.capability), want at most 5 (SB_NOSEC)", opts, n, getx)
			}
			if !nosecOn(opts) && getx < n {
				t.Errorf("-o %s: %d writes made %d GETXATTR(security.capability), want at least %d (one per write without SB_NOSEC)", opts, n, getx, n)
			}
			if passthroughOn(opts) && after.OpensPassthrough <= before.OpensPassthrough {
				t.Errorf("-o %s: opens_passthrough %d → %d, want an increase", opts, before.OpensPassthrough, after.OpensPassthrough)
			}
			if !passthroughOn(opts) && after.OpensPassthrough != before.OpensPassthrough {
				t.Errorf("-o %s: opens_passthrough %d → %d although passthrough is off", opts, before.OpensPassthrough, after.OpensPassthrough)
			}
		})
	}
}

// TestNewFileKnownClean: a file made through the mount carries no
// capability and, unless asked, no set-id bit, so with NOSEC the
// GETXATTR(security.capability) the kernel sends before each new file's
// first write is answered from what goverlay knows, without asking the
// upper layer; with nosec=off every one is asked. A file created set-id is
// not known clean: a write by a caller without CAP_FSETID still clears it.
func TestNewFileKnownClean(t *testing.T) {
	testutil.RequireRoot(t)
	w := writers(t)[1] // root without CAP_FSETID
	helper(t)
	const files = 50
	for _, opts := range []string{"nosec=on,passthrough=on", "nosec=off,passthrough=on"} {
		t.Run(subtestName(opts), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, t.TempDir(), func(l *testutil.Layer) {})
			m := testutil.Mount(t, testutil.Options{Lower: []string{s.lower}, Upper: s.upper, Work: s.work, Extra: []string{"-o", opts}})
			before := testutil.ReadStats(t, m)
			checkMountMode(t, before, opts, false)
			for i := 0; i < files; i++ {
				p := filepath.Join(m.Dir, fmt.Sprintf("new%d", i))
				if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			after := testutil.ReadStats(t, m)
			getx, cached := after.CapGetxattr-before.CapGetxattr, after.CapGetxattrCached-before.CapGetxattrCached
			t.Logf("-o %s: %d new files written: getxattr(security.capability) +%d, from what goverlay knows +%d", opts, files, getx, cached)
			if getx < files {
				t.Errorf("-o %s: %d new files' first writes made %d GETXATTR(security.capability), want at least one each", opts, files, getx)
			}
			if nosecOn(opts) && cached != getx {
				t.Errorf("-o %s: %d of %d GETXATTR(security.capability) of new files asked the upper layer, want none", opts, getx-cached, getx)
			}
			if !nosecOn(opts) && cached != 0 {
				t.Errorf("-o %s: %d GETXATTR(security.capability) answered without the upper layer, want 0 with nosec=off", opts, cached)
			}

			// Created set-id, written by a caller without CAP_FSETID:
			// the bit goes.
			p := filepath.Join(m.Dir, "setid")
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o4777)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			if err := os.Chmod(p, 0o4777); err != nil { // past the umask
				t.Fatal(err)
			}
			if r := runOps(t, w, [][2]string{{"writes=1", p}})[p]; !r.ok {
				t.Fatalf("write by %s: %s", w.name, r.err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(s.upper, "setid"), &st); err != nil || st.Mode&unix.S_ISUID != 0 {
				t.Errorf("-o %s: a set-uid file made through the mount, then written by %s: upper mode %#o, %v; want suid cleared", opts, w.name, st.Mode, err)
			}
		})
	}
}
