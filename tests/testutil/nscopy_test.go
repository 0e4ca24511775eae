package testutil

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDetachCopyInUserNamespace: a mount namespace made while a goverlay
// mount exists holds a copy of it, and where a user namespace owns that
// namespace (rootless podman, unshare -Urm) the copy is locked and cannot
// be detached on its own. detachCopies then ends the FUSE connection, and
// the daemon exits 0 while the copy still exists; the test process stays
// in its own mount namespace throughout. The holder lives a second or so,
// not the harness's DaemonExitTimeout: its namespace copies the mounts of
// every test running at that moment, in other packages too.
func TestDetachCopyInUserNamespace(t *testing.T) {
	RequireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed (package util-linux)")
	}
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	lower := NewLayer(t, t.TempDir()).File("f", "x", 0o644).Root
	m := Mount(t, Options{Lower: []string{lower}})
	unmountHeld(t, m, "-Urm")
	if !m.proc.Wait(DaemonExitTimeout) {
		t.Errorf("the daemon did not exit once its connection was aborted (the copy still exists)")
	}
	m.WaitDaemon(t)
	if now, err := os.Readlink("/proc/self/ns/mnt"); err != nil || now != ns {
		t.Errorf("the test's mount namespace was %s, is %s (%v) after detachCopies", ns, now, err)
	}
}

// TestDetachCopyOfAdoptedMount: a mount the test made itself (mount(8),
// the mount-helper forms) and handed to Adopt is found in another mount
// namespace as well: Adopt records its device number, without which
// detachCopies had nothing to look for and the daemon outlived its
// unmount while another test's namespace held a copy.
func TestDetachCopyOfAdoptedMount(t *testing.T) {
	RequireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed (package util-linux)")
	}
	dir := t.TempDir()
	lower := NewLayer(t, t.TempDir()).File("f", "x", 0o644).Root
	upper, work, mnt := dir+"/upper", dir+"/work", dir+"/mnt"
	for _, d := range []string{upper, work, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if out, err := exec.Command(Binary(t), "-o", opts, mnt).CombinedOutput(); err != nil {
		t.Fatalf("goverlay: %v\n%s", err, out)
	}
	m := Adopt(t, mnt)
	unmountHeld(t, m, "-m", "--propagation", "private")
	m.WaitDaemon(t)
}

// unmountHeld starts a process in a new mount namespace (unshare with
// args), which holds a copy of m, then unmounts m and asserts that
// detachCopies found and detached that copy. The holder is killed when
// the test ends.
func unmountHeld(t *testing.T, m *Mounted, args ...string) {
	t.Helper()
	holder := exec.Command("unshare", append(args, "sleep", "60")...)
	if err := holder.Start(); err != nil {
		t.Skipf("unshare %s: %v", strings.Join(args, " "), err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	time.Sleep(200 * time.Millisecond) // the namespace exists once unshare has run
	if err := runUmount(m.Dir); err != nil {
		t.Fatal(err)
	}
	if !m.detachCopies(t) {
		t.Fatal("found no copy of the mount in the holder's namespace")
	}
}
