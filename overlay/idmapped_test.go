package overlay

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// idmappedBind makes an id-mapped mount of dir, as containers/storage does
// for a container's lower layers: a clone of dir (open_tree(2)
// OPEN_TREE_CLONE) given the idmap of a user namespace that maps
// m.Disk.. to m.Shown.. (mount_setattr(2) MOUNT_ATTR_IDMAP), attached on a
// new directory, whose path it returns. detach unmounts it lazily
// (MNT_DETACH, as containers/storage does right after the mount program
// returns); it runs at cleanup too.
func idmappedBind(t *testing.T, dir string, m IDMap) (path string, detach func()) {
	t.Helper()
	sleep := exec.Command("sleep", "1000")
	maps := []syscall.SysProcIDMap{{ContainerID: int(m.Disk), HostID: int(m.Shown), Size: int(m.Len)}}
	sleep.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: maps, GidMappings: maps}
	if err := sleep.Start(); err != nil {
		t.Skipf("a user namespace for the idmap: %v", err)
	}
	ns, err := unix.Open("/proc/"+strconv.Itoa(sleep.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	sleep.Process.Kill()
	sleep.Wait()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ns)
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Skipf("open_tree(OPEN_TREE_CLONE): %v", err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		t.Skipf("mount_setattr(MOUNT_ATTR_IDMAP) on %s: %v", dir, err)
	}
	path = openDir(t)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatalf("move_mount: %v", err)
	}
	done := false
	detach = func() {
		if !done {
			done = true
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				t.Errorf("detaching the id-mapped mount %s: %v", path, err)
			}
		}
	}
	t.Cleanup(detach)
	return path, detach
}

// TestIDMappedLower: a lower layer on an id-mapped mount, with the same
// shift given as uidmapping=/gidmapping= (podman 4.3's containers/storage
// with a mount program and --uidmap), is not shifted a second time: its
// owners and ACL ids show as the id-mapped mount shows them, a copy-up and
// what is created land in the upper layer in on-disk ids, as without the
// id-mapped mount. The id-mapped mount is detached as soon as the overlay
// is up, as containers/storage does; the layer stays readable, parts of it
// looked up for the first time after that included.
func TestIDMappedLower(t *testing.T) {
	for _, tool := range []string{"setfacl", "getfacl", "setpriv", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	lo := openDir(t)
	write(t, lo+"/etc/hosts", "127.0.0.1 localhost\n")
	write(t, lo+"/u1000", "u")
	os.Chown(lo+"/u1000", 1000, 1000)
	write(t, lo+"/far", "f")
	os.Chown(lo+"/far", 200000, 200000) // beyond the idmap
	write(t, lo+"/secret", "s")
	os.Chmod(lo+"/secret", 0o600)
	write(t, lo+"/d/deep/late.txt", "late\n")
	if out, err := exec.Command("setfacl", "-m", "u:1000:r", lo+"/secret").CombinedOutput(); err != nil {
		t.Skipf("setfacl: %v: %s", err, out)
	}
	m := IDMap{Disk: 0, Shown: 100000, Len: 65536}
	mapped, detach := idmappedBind(t, lo, m)
	if u, g := owner(t, mapped+"/etc/hosts"); u != 100000 || g != 100000 {
		t.Fatalf("the id-mapped mount shows etc/hosts as %d:%d, want 100000:100000", u, g)
	}
	up, work := openDir(t), openDir(t)
	maps := []IDMap{m}
	mnt, f := mountFS(t, Options{Lower: []string{mapped}, Upper: up, Work: work, AllowOther: true, Owners: Owners{UIDs: maps, GIDs: maps}})
	if !f.layers[1].IDMapped || f.layers[0].IDMapped {
		t.Errorf("id-mapped: lower %v, upper %v; want true, false", f.layers[1].IDMapped, f.layers[0].IDMapped)
	}
	detach()

	for _, c := range []struct {
		path     string
		uid, gid uint32
	}{
		{"", 100000, 100000}, // the upper layer's root, 0:0 on disk
		{"/etc", 100000, 100000},
		{"/etc/hosts", 100000, 100000},
		{"/u1000", 101000, 101000},
		{"/far", overflowUID, overflowGID},
		{"/d/deep/late.txt", 100000, 100000},
	} {
		if u, g := owner(t, mnt+c.path); u != c.uid || g != c.gid {
			t.Errorf("%s shown as %d:%d, want %d:%d", "/"+strings.TrimPrefix(c.path, "/"), u, g, c.uid, c.gid)
		}
	}
	if b, err := os.ReadFile(mnt + "/d/deep/late.txt"); err != nil || string(b) != "late\n" {
		t.Errorf("reading a file first looked up after the id-mapped mount was detached: %q, %v", b, err)
	}
	named := func(path string) string {
		t.Helper()
		out, err := exec.Command("getfacl", "-n", "-E", "--omit-header", path).CombinedOutput()
		if err != nil {
			t.Fatalf("getfacl %s: %v: %s", path, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Split(l, ":"); len(f) == 3 && f[0] == "user" && f[1] != "" {
				return f[1]
			}
		}
		return ""
	}
	if got := named(mnt + "/secret"); got != "101000" {
		t.Errorf("secret's ACL names user %q through the mount, want 101000", got)
	}
	// An owner the id-mapped mount could not show is lost: no copy-up
	// (the kernel's fails the same way).
	if err := os.Chmod(mnt+"/far", 0o600); !errors.Is(err, unix.EOVERFLOW) {
		t.Errorf("chmod of far (owner beyond the idmap): %v, want EOVERFLOW", err)
	}

	// The container's root (host uid 100000) at work: owners as the
	// mount shows them let it write, and what it makes lands on disk in
	// on-disk ids.
	script := "echo new > " + mnt + "/etc/new && echo more >> " + mnt + "/etc/hosts && mkdir " + mnt + "/etc/dir && chmod 640 " + mnt + "/secret"
	if out, err := exec.Command("setpriv", "--reuid=100000", "--regid=100000", "--clear-groups", "sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("as uid 100000: %v: %s", err, out)
	}
	for _, p := range []string{"/etc", "/etc/new", "/etc/hosts", "/etc/dir", "/secret"} {
		if u, g := owner(t, up+p); u != 0 || g != 0 {
			t.Errorf("upper%s on disk %d:%d, want 0:0", p, u, g)
		}
		if u, g := owner(t, mnt+p); u != 100000 || g != 100000 {
			t.Errorf("%s shown as %d:%d after the writes, want 100000:100000", p, u, g)
		}
	}
	if got := named(up + "/secret"); got != "1000" {
		t.Errorf("secret's copied-up ACL names user %q on disk, want 1000", got)
	}
	if got := named(mnt + "/secret"); got != "101000" {
		t.Errorf("secret's copied-up ACL names user %q through the mount, want 101000", got)
	}
}

// TestIDMappedUpperRefused: an upper layer on an id-mapped mount together
// with uidmapping= would have every write shifted twice: refused with a
// message that names the layer.
func TestIDMappedUpperRefused(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("sleep not installed")
	}
	m := IDMap{Disk: 0, Shown: 100000, Len: 65536}
	up, _ := idmappedBind(t, t.TempDir(), m)
	f, err := New(Options{Lower: []string{t.TempDir()}, Upper: up, Work: t.TempDir(), Owners: Owners{UIDs: []IDMap{m}, GIDs: []IDMap{m}}})
	if err == nil {
		f.Close()
		t.Fatal("an id-mapped upperdir with uidmapping= was accepted")
	}
	if !strings.Contains(err.Error(), up) || !strings.Contains(err.Error(), "id-mapped") {
		t.Errorf("error %q does not name the layer and the id-mapped mount", err)
	}
}
