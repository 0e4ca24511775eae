package overlay

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// The helpers below skip a test when the machine lacks a feature it needs,
// probed apart from goverlay, so that a test skips only for the machine
// and fails for goverlay.

// needKernel skips t on a kernel older than major.minor, which added what.
func needKernel(t testing.TB, major, minor int, what string) {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", u.Release[:], err)
	}
	if ma < major || ma == major && mi < minor {
		t.Skipf("kernel %d.%d: %s needs Linux %d.%d", ma, mi, what, major, minor)
	}
}

// needXattr skips t when the filesystem of dir refuses to store attr on a
// file of its own (security.capability needs CAP_SETFCAP and a filesystem
// with security.* attributes).
func needXattr(t testing.TB, dir, attr string, value []byte) {
	t.Helper()
	p, err := os.CreateTemp(dir, "xattr-probe")
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	defer os.Remove(p.Name())
	if err := xattr.Set(p.Name(), attr, value); err != nil {
		t.Skipf("the filesystem of %s does not store %s: %v", dir, attr, err)
	}
}

// needACLs skips t when setfacl(1) is missing or the filesystem of dir has
// no POSIX ACLs.
func needACLs(t testing.TB, dir string) {
	t.Helper()
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Skip("setfacl not installed")
	}
	p, err := os.MkdirTemp(dir, "acl-probe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	if out, err := exec.Command("setfacl", "-m", "u:nobody:---", p).CombinedOutput(); err != nil {
		t.Skipf("the filesystem of %s has no POSIX ACLs: %v %s", filepath.Dir(p), err, out)
	}
}
