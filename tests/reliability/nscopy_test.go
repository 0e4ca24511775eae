package reliability_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestMountCopyInUserNamespace: a mount namespace made while a goverlay
// mount exists holds a copy of it, and where a user namespace owns that
// namespace (rootless podman, unshare -Urm) the copy is locked and cannot
// be detached on its own. Unmounting ends the mount all the same: the
// harness ends the FUSE connection, the daemon sees the end of its mount
// and exits 0. Other tests' mounts meet this whenever rootless containers
// run beside them.
func TestMountCopyInUserNamespace(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed (package util-linux)")
	}
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	lower := testutil.NewLayer(t, t.TempDir()).File("f", "x", 0o644).Root
	m := testutil.Mount(t, testutil.Options{Lower: []string{lower}})
	holder := exec.Command("unshare", "-Urm", "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Skipf("unshare -Urm: %v", err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	time.Sleep(200 * time.Millisecond) // the namespace exists once unshare has run
	m.Unmount(t)
	// The harness detached the copy from inside the other namespace:
	// the process (its main thread, which /proc/self shows) must still
	// be in its own.
	if now, err := os.Readlink("/proc/self/ns/mnt"); err != nil || now != ns {
		t.Errorf("the test's mount namespace was %s, is %s (%v) after the harness detached a copy elsewhere", ns, now, err)
	}
}
