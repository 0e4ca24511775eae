package fuseserve

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestDirectOptions: mount(2) gets the options go-fuse's mountDirect()
// gives it, with dev, suid and exec as flags.
func TestDirectOptions(t *testing.T) {
	mo := &fuse.MountOptions{
		Name: "goverlay", FsName: "src", MaxWrite: 131072, AllowOther: true,
		Options:          []string{"default_permissions", "suid", "noexec", "ro"},
		DirectMountFlags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_RDONLY,
	}
	flags, data := directOptions(mo, 7, unix.S_IFDIR, 0, 0)
	if want := uintptr(unix.MS_NODEV | unix.MS_RDONLY | unix.MS_NOEXEC); flags != want {
		t.Errorf("flags %#x, want %#x", flags, want)
	}
	if want := "fd=7,rootmode=40000,user_id=0,group_id=0,max_read=131072,default_permissions,ro,allow_other"; data != want {
		t.Errorf("data %q, want %q", data, want)
	}
	mo = &fuse.MountOptions{Name: "x", MaxWrite: 4096, IDMappedMount: true}
	flags, data = directOptions(mo, 3, unix.S_IFDIR, 1001, 1002)
	if want := uintptr(unix.MS_NOSUID | unix.MS_NODEV); flags != want {
		t.Errorf("default flags %#x, want %#x", flags, want)
	}
	if want := "fd=3,rootmode=40000,user_id=1001,group_id=1002,max_read=4096,default_permissions"; data != want {
		t.Errorf("data %q, want %q", data, want)
	}
}

// TestFusermountOptions: fusermount3 gets go-fuse's options, escaped.
func TestFusermountOptions(t *testing.T) {
	mo := &fuse.MountOptions{
		Name: "goverlay", FsName: `a,b\c`, MaxWrite: 131072, AllowOther: true,
		Options: []string{"default_permissions", "noatime"},
	}
	if got, want := fusermountOptions(mo), `default_permissions,noatime,allow_other,fsname=a\,b\\c,subtype=goverlay,max_read=131072`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// mountEntry is a line of /proc/self/mountinfo (proc(5)).
type mountEntry struct{ opts, fsType, source, superOpts string }

// mountOf returns the mount on mnt, and whether there is one.
func mountOf(t *testing.T, mnt string) (mountEntry, bool) {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var e mountEntry
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 6 || len(f) < sep+4 {
			continue
		}
		if strings.NewReplacer(`\040`, " ", `\134`, `\`).Replace(f[4]) == mnt {
			// The last one: a mount stacked on another comes after it.
			e, found = mountEntry{opts: f[5], fsType: f[sep+1], source: f[sep+2], superOpts: f[sep+3]}, true
		}
	}
	return e, found
}

// fds lists this process's descriptors of what a mount opens (/dev/fuse,
// the socket pair of fusermount3) with what they are open on; the
// served filesystem's files, which it closes in its own time, are left
// out.
func fds(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && (target == fuseDevice || strings.HasPrefix(target, "socket:")) {
			out = append(out, e.Name()+" "+target)
		}
	}
	return out
}

// settledFDs is fds once no descriptor of /dev/fuse is open, as none is
// when no mount of this process is live: go-fuse closes its own once its
// readers have ended, after Wait returns (fuse.Server.Serve).
func settledFDs(t *testing.T) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := fds(t)
		if !slices.ContainsFunc(open, func(fd string) bool { return strings.HasSuffix(fd, " "+fuseDevice) }) || time.Now().After(deadline) {
			return open
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// needFusermount skips the test without fusermount3.
func needFusermount(t *testing.T) {
	t.Helper()
	if _, err := fusermountBinary(); err != nil {
		t.Skip(err)
	}
}

// TestMountWays: goverlay's own mount(2) and fusermount3 give the kernel
// the same mount, which Unmount takes down either way and no descriptor
// of either outlives.
func TestMountWays(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	needFusermount(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	mount := func(t *testing.T, fusermount bool) (string, *Server) {
		mo := &fuse.MountOptions{FsName: "src,with comma", Name: "fuseserve", AllowOther: true, Options: []string{"default_permissions"}}
		return mountWith(t, dir, mo, Options{fusermount: fusermount}, nil)
	}
	// A first mount, so that what the Go runtime opens once (its epoll)
	// is open before the descriptors are counted.
	mnt, s := mount(t, false)
	if err := s.Unmount(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	var seen []mountEntry
	for _, way := range []string{"mount(2)", "fusermount3"} {
		t.Run(way, func(t *testing.T) {
			before := settledFDs(t)
			mnt, s = mount(t, way == "fusermount3")
			if s.direct == (way == "fusermount3") {
				t.Fatalf("mounted directly: %v", s.direct)
			}
			e, ok := mountOf(t, mnt)
			if !ok {
				t.Fatalf("%s is not in /proc/self/mountinfo", mnt)
			}
			seen = append(seen, e)
			if e.fsType != "fuse.fuseserve" || e.source != "src,with\\040comma" {
				t.Errorf("type %q, source %q; want fuse.fuseserve, src,with comma", e.fsType, e.source)
			}
			for _, o := range []string{"user_id=0", "group_id=0", "default_permissions", "allow_other", "max_read=131072"} {
				if !slices.Contains(strings.Split(e.superOpts, ","), o) {
					t.Errorf("super options %q lack %s", e.superOpts, o)
				}
			}
			if got, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(got) != "data" {
				t.Errorf("read through the mount: %q, %v", got, err)
			}
			if err := s.Unmount(); err != nil {
				t.Fatalf("unmount: %v", err)
			}
			if _, ok := mountOf(t, mnt); ok {
				t.Errorf("%s still mounted after Unmount", mnt)
			}
			if err := s.Unmount(); err != nil {
				t.Errorf("second unmount: %v", err)
			}
			s.Close()
			if after := settledFDs(t); !slices.Equal(before, after) {
				t.Errorf("descriptors before the mount %q, after it and its unmount %q", before, after)
			}
		})
	}
	if len(seen) == 2 && seen[0] != seen[1] {
		t.Errorf("mount(2) made %+v, fusermount3 %+v", seen[0], seen[1])
	}
}

// TestMountFailureLeavesNothing: a refused mount leaves no mount and no
// descriptor. A failed mount(2) tries fusermount3 too, as go-fuse does,
// whose refusal is a FusermountError.
func TestMountFailureLeavesNothing(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	needFusermount(t)
	root, err := fs.NewLoopbackRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	raw := fs.NewNodeFS(root, &fs.Options{})
	missing := filepath.Join(t.TempDir(), "missing")
	before := settledFDs(t)
	if fd, err := mountDirect(missing, &fuse.MountOptions{Name: "fuseserve", MaxWrite: maxWrite}); err == nil || !errors.Is(err, unix.ENOENT) {
		if err == nil {
			unix.Close(fd)
		}
		t.Errorf("mount(2) on a missing directory: %v, want ENOENT", err)
	}
	if after := fds(t); !slices.Equal(before, after) {
		t.Errorf("descriptors before the failed mount(2) %q, after it %q", before, after)
	}
	for _, fusermount := range []bool{false, true} {
		before := settledFDs(t)
		s, err := Mount(raw, missing, &fuse.MountOptions{Name: "fuseserve"}, Options{fusermount: fusermount})
		if err == nil {
			s.Unmount()
			s.Close()
			t.Fatalf("fusermount %v: mounted on a missing directory", fusermount)
		}
		var fe *FusermountError
		if !errors.As(err, &fe) || fe.Status.ExitStatus() == 0 || !strings.Contains(err.Error(), "refused to mount (exit status") {
			t.Errorf("fusermount %v: error %v (%T), want fusermount3's", fusermount, err, err)
		}
		if _, ok := mountOf(t, missing); ok {
			t.Errorf("a failed mount left %s mounted", missing)
		}
		if after := fds(t); !slices.Equal(before, after) {
			t.Errorf("descriptors before the failed mount %q, after it %q", before, after)
		}
	}
}

// TestUnmountedFromOutside: go-fuse's readers end when someone else
// unmounts (umount, fusermount3 -u), as the daemon's exit waits for.
func TestUnmountedFromOutside(t *testing.T) {
	for _, how := range []string{"umount2", "fusermount3 -u"} {
		t.Run(how, func(t *testing.T) {
			if how != "umount2" {
				needFusermount(t)
			}
			mnt, s := mountLoopback(t, t.TempDir(), Options{}, nil)
			var err error
			if how == "umount2" {
				err = unix.Unmount(mnt, 0)
			} else {
				bin, _ := fusermountBinary()
				if out, cerr := exec.Command(bin, "-u", mnt).CombinedOutput(); cerr != nil {
					err = errors.New(strings.TrimSpace(string(out)))
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				s.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("go-fuse still serves a mount that is gone")
			}
		})
	}
}

// TestPollsStopped: go-fuse answers the file Mount opens to have the
// kernel stop sending POLL (stopPolls), which it does not show in the
// root's listing; a go-fuse without it would fail here.
func TestPollsStopped(t *testing.T) {
	mnt, _ := mountLoopback(t, t.TempDir(), Options{}, nil)
	fd, err := unix.Open(filepath.Join(mnt, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("go-fuse does not answer %s: %v", pollHackName, err)
	}
	unix.Close(fd)
	ents, err := os.ReadDir(mnt)
	if err != nil || len(ents) != 0 {
		t.Errorf("listing of an empty directory: %v, %v", ents, err)
	}
}

// TestMountLivesOnElsewhere: when the mount lives on elsewhere (bound to
// another place) after Unmount took it from its mountpoint, the
// connection and go-fuse's readers go on, Unmount waits for them, and
// Close does not wait for Unmount; the readers end with the last place.
func TestMountLivesOnElsewhere(t *testing.T) {
	mnt, s := mountLoopback(t, t.TempDir(), Options{}, nil)
	other := t.TempDir()
	if err := unix.Mount(mnt, other, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(other, unix.MNT_DETACH) })
	unmounted := make(chan error, 1)
	go func() { unmounted <- s.Unmount() }()
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waits for an Unmount that waits for the mount's last place")
	}
	select {
	case err := <-unmounted:
		t.Fatalf("Unmount returned (%v) while the mount lives on at %s", err, other)
	case <-time.After(100 * time.Millisecond):
	}
	if _, ok := mountOf(t, mnt); ok {
		t.Errorf("%s still mounted", mnt)
	}
	if err := unix.Unmount(other, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-unmounted:
		if err != nil {
			t.Errorf("unmount: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("go-fuse's readers outlived the mount's last place")
	}
}
