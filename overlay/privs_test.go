package overlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// openDir makes a temporary directory that other users may traverse.
func openDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for p := d; p != "/" && p != "."; p = filepath.Dir(p) {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&0o005 != 0o005 {
			os.Chmod(p, os.FileMode(st.Mode&0o7777|0o005))
		}
	}
	return d
}

// run runs sh -c script through the wrapper argv (setpriv, capsh).
func run(t *testing.T, wrapper []string, script string) {
	t.Helper()
	if _, err := exec.LookPath(wrapper[0]); err != nil {
		t.Skipf("%s not installed", wrapper[0])
	}
	args := append(append([]string{}, wrapper[1:]...), "sh", "-c", script)
	if wrapper[0] == "capsh" {
		args = append(append([]string{}, wrapper[1:]...), "--", "-c", script)
	}
	out, err := exec.Command(wrapper[0], args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v %q: %v\n%s", wrapper, script, err, out)
	}
}

var (
	asNobody   = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}
	noFsetid   = []string{"capsh", "--drop=cap_fsetid"}
	privileged = []string{"env"}
)

func modeOf(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 07777
}

// matrix is {nosec on, off} × {write-through, passthrough, writeback
// cache}, files opened without a request (noopen.go) except with
// passthrough, which needs OPEN, and "opens": the writeback cache with
// OPEN requests.
var matrix = []struct {
	name        string
	mode        NoSecMode
	passthrough bool
	writeback   WritebackMode
	opens       bool
}{
	{"nosec-on", NoSecOn, false, WritebackOff, false},
	{"nosec-on+passthrough", NoSecOn, true, WritebackOff, true},
	{"nosec-off", NoSecOff, false, WritebackOff, false},
	{"nosec-off+passthrough", NoSecOff, true, WritebackOff, true},
	{"nosec-on+writeback", NoSecOn, false, WritebackOn, false},
	{"nosec-off+writeback", NoSecOff, false, WritebackOn, false},
	{"nosec-on+writeback+opens", NoSecOn, false, WritebackOn, true},
}

// nosecMount mounts lowers with write-through or passthrough.
func nosecMount(t *testing.T, mode NoSecMode, passthrough bool, lowers ...string) (mnt, up string, f *FS) {
	t.Helper()
	return nosecMountW(t, mode, passthrough, WritebackOff, passthrough, lowers...)
}

// nosecMountW is nosecMount with a writeback setting, and with OPEN
// requests when opens.
func nosecMountW(t *testing.T, mode NoSecMode, passthrough bool, wb WritebackMode, opens bool, lowers ...string) (mnt, up string, f *FS) {
	t.Helper()
	up, work := openDir(t), openDir(t)
	o := Options{Lower: lowers, Upper: up, Work: work, NoSec: mode, Passthrough: passthrough, OpenRequests: opens, Writeback: wb, AllowOther: true}
	mnt, f = mountFS(t, o)
	return mnt, up, f
}

// TestKillPrivsOnWrite: a write by a caller without CAP_FSETID clears suid,
// and sgid where the group may execute; a privileged write keeps them.
func TestKillPrivsOnWrite(t *testing.T) {
	for _, m := range matrix {
		t.Run(m.name, func(t *testing.T) {
			lo := openDir(t)
			for name, m := range map[string]uint32{"suid": 04777, "sgidx": 02777, "sgid": 02766, "root": 04777} {
				write(t, lo+"/"+name, "data")
				os.Chmod(lo+"/"+name, os.FileMode(m&0o777)|modeBits(m))
			}
			mnt, up, f := nosecMountW(t, m.mode, m.passthrough, m.writeback, m.opens, lo)
			run(t, asNobody, "echo x >> "+mnt+"/suid")
			run(t, noFsetid, "echo x >> "+mnt+"/sgidx")
			run(t, asNobody, "echo x >> "+mnt+"/sgid")
			run(t, privileged, "echo x >> "+mnt+"/root")
			for name, want := range map[string]uint32{"suid": 0o777, "sgidx": 0o777, "sgid": 02766, "root": 04777} {
				if got := modeOf(t, up+"/"+name); got != want {
					t.Errorf("%s: mode %o, want %o", name, got, want)
				}
			}
			if got := f.stats.opensPassthrough.Load() > 0; got != m.passthrough {
				t.Errorf("passthrough opens: %v, want %v", got, m.passthrough)
			}
			if got, want := f.io.writeback, m.writeback == WritebackOn; got != want {
				t.Errorf("writeback cache: %v, want %v (%s)", got, want, f.io.why)
			}
		})
	}
}

func modeBits(m uint32) os.FileMode {
	var fm os.FileMode
	if m&04000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&02000 != 0 {
		fm |= os.ModeSetgid
	}
	return fm
}

// TestKillCapabilityOnWrite: a write removes security.capability, even a
// privileged one (the kernel's rule: capability removal is not gated by
// CAP_FSETID).
func TestKillCapabilityOnWrite(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/capped", "data")
	os.Chmod(lo+"/capped", 0o777)
	// v2 capability blob: cap_net_raw+ep.
	blob := []byte{0, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := xattr.Set(lo+"/capped", "security.capability", blob); err != nil {
		t.Skipf("cannot set security.capability here: %v", err)
	}
	mnt, up, _ := nosecMount(t, NoSecOn, true, lo)
	run(t, asNobody, "echo x >> "+mnt+"/capped")
	if _, err := xattr.Get(up+"/capped", "security.capability"); err == nil {
		t.Errorf("security.capability survived a write")
	}
}

// TestNoSecCacheInvalidatedByChmod: the cache said "clean"; chmod u+s
// through the mount must bring the slow path back, and the next
// unprivileged write clears suid.
func TestNoSecCacheInvalidatedByChmod(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "data")
	os.Chmod(lo+"/f", 0o777)
	mnt, up, f := nosecMount(t, NoSecOn, true, lo)
	run(t, asNobody, "echo x >> "+mnt+"/f; echo y >> "+mnt+"/f")
	if err := os.Chmod(mnt+"/f", 0o777|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	checks := f.privs.Checks.Load()
	run(t, asNobody, "echo z >> "+mnt+"/f")
	if got := modeOf(t, up+"/f"); got != 0o777 {
		t.Errorf("mode %o after chmod u+s and a write, want 777", got)
	}
	if f.privs.Checks.Load() == checks {
		t.Errorf("no privilege check after chmod: the cache was not invalidated")
	}
}

// TestNoSecKeptByChown: a chown adds no set-id bit and no capability, so
// a file known clean (one made through the mount is, from the start)
// stays known clean: the strip FATTR_KILL_SUIDGID asks for is skipped. A
// set-id file chowned loses its suid bit as on the kernel overlay.
func TestNoSecKeptByChown(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/suid", "data")
	os.Chmod(lo+"/suid", 0o4777)
	mnt, up, f := nosecMountW(t, NoSecOn, false, WritebackOn, false, lo)
	if err := os.WriteFile(mnt+"/clean", []byte("data"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(mnt+"/clean", 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mnt+"/clean", 42, 43); err != nil {
		t.Fatal(err)
	}
	checks, skipped := f.privs.Checks.Load(), f.privs.Skipped.Load()
	if err := os.Chown(mnt+"/clean", 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if f.privs.Checks.Load() != checks || f.privs.Skipped.Load() == skipped {
		t.Errorf("chown of a file known clean: %d checks, %d skipped, want none and one",
			f.privs.Checks.Load()-checks, f.privs.Skipped.Load()-skipped)
	}
	var st unix.Stat_t
	if err := unix.Stat(up+"/clean", &st); err != nil || st.Uid != 1234 || st.Gid != 5678 || st.Mode&07777 != 0o777 {
		t.Errorf("upper clean after chown: %d:%d mode %o, %v", st.Uid, st.Gid, st.Mode&07777, err)
	}
	if err := os.Chown(mnt+"/suid", 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if got := modeOf(t, up+"/suid"); got != 0o777 {
		t.Errorf("suid file after chown: mode %o, want 777", got)
	}
}

// TestNoSecCacheInvalidatedBySetcap: same, with setxattr security.capability.
func TestNoSecCacheInvalidatedBySetcap(t *testing.T) {
	lo := openDir(t)
	write(t, lo+"/f", "data")
	os.Chmod(lo+"/f", 0o777)
	mnt, up, _ := nosecMount(t, NoSecOn, true, lo)
	run(t, asNobody, "echo x >> "+mnt+"/f")
	blob := []byte{0, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	needXattr(t, filepath.Dir(up), "security.capability", blob)
	if err := xattr.Set(mnt+"/f", "security.capability", blob); err != nil {
		t.Fatalf("setcap through the mount: %v", err)
	}
	run(t, asNobody, "echo y >> "+mnt+"/f")
	if _, err := xattr.Get(up+"/f", "security.capability"); err == nil {
		t.Errorf("capability set after the cache said clean survived a write")
	}
}

// TestCapGetxattrPerWrite counts the kernel's GETXATTR(security.capability)
// round trips: one per write with nosec=off, about one per inode with it on.
func TestCapGetxattrPerWrite(t *testing.T) {
	for _, tc := range []struct {
		mode     NoSecMode
		min, max uint64
	}{{NoSecOff, 1000, 1000000}, {NoSecOn, 0, 10}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			lo := openDir(t)
			mnt, _, f := nosecMount(t, tc.mode, false, lo)
			w, err := os.Create(mnt + "/f")
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1024)
			for i := 0; i < 1000; i++ {
				if _, err := w.Write(buf); err != nil {
					t.Fatal(err)
				}
			}
			w.Close()
			if got := f.privs.CapGetxattr.Load(); got < tc.min || got > tc.max {
				t.Errorf("%d GETXATTR(security.capability) for 1000 writes, want %d..%d", got, tc.min, tc.max)
			}
		})
	}
}
