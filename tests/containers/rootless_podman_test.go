package containers_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// newRootlessPodman is newPodman for the unprivileged test user: podman
// runs as the user (HOME and XDG_RUNTIME_DIR in the store), makes its own
// user namespace from /etc/subuid (newuidmap: 0 is the user, 1… its
// subordinate ids) and runs prog there, as root of that namespace. podman
// starts in a mount namespace of the test's where /dev/fuse is a device
// node owned by the user (/dev/fuse itself is root's only here); podman's
// own namespaces inherit it. The store and the program's copy belong to
// the user. The cleanup also ends podman's pause process, which keeps the
// user namespace for later commands.
func newRootlessPodman(t testing.TB, prog mountProgram, uid, gid int) *podman {
	t.Helper()
	p := newPodman(t, prog)
	if err := os.Chmod(p.store, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"home", "xdg"} {
		if err := os.Mkdir(filepath.Join(p.store, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mknod(filepath.Join(p.store, "fuse"), unix.S_IFCHR|0o600, int(unix.Mkdev(10, 229))); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(prog.name, "goverlay") {
		p.prog.path = filepath.Join(p.store, "goverlay")
		copyFile(t, prog.path, p.prog.path, 0o755)
		for i, f := range p.flags {
			if strings.HasPrefix(f, "overlay.mount_program=") {
				p.flags[i] = "overlay.mount_program=" + p.prog.path
			}
		}
	}
	for _, f := range []string{"", "home", "xdg", "fuse", "containers.conf", "goverlay"} {
		if err := os.Lchown(filepath.Join(p.store, f), uid, gid); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	// cd "$S": podman chdirs to its cwd as the user, and the checkout
	// (CI: under /root) need not be open to the user.
	p.wrap = []string{"unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount --bind "$FUSE" /dev/fuse && cd "$S" && exec setpriv --reuid "$U" --regid "$G" --init-groups ` +
			`env -u XDG_CONFIG_HOME -u XDG_DATA_HOME HOME="$S/home" XDG_RUNTIME_DIR="$S/xdg" "$@"`, "sh"}
	p.env = append(p.env, "FUSE="+filepath.Join(p.store, "fuse"), "U="+strconv.Itoa(uid), "G="+strconv.Itoa(gid), "S="+p.store)
	// Runs before newPodman's cleanup (system reset), which needs the
	// pause process no more than a fresh start does.
	t.Cleanup(func() {
		data, err := os.ReadFile(filepath.Join(p.store, "tmp", "pause.pid"))
		if err != nil {
			return
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return
		}
		if proc, err := testutil.Track(pid, t.Name()); err == nil {
			proc.Kill()
		}
	})
	return p
}

// TestRootlessPodman is TestPodman's flow with podman rootless, as the
// unprivileged test user with its subordinate ids: goverlay as
// mount_program, fuse-overlayfs as the reference. containers/storage
// passes no uidmapping= and no userxattr rootless; the mount program runs
// as root of podman's user namespace.
func TestRootlessPodman(t *testing.T) {
	rootfs := podmanSetup(t, rootlessTools)
	uid, gid := testutil.TestUser(t)
	ensureSubIDs(t, testutil.TestUserName)

	progs := podmanPrograms(t)
	results := map[string][]step{}
	for _, prog := range progs {
		t.Run(prog.name, func(t *testing.T) {
			results[prog.name] = podmanFlow(t, newRootlessPodman(t, prog, uid, gid), rootfs)
		})
	}
	compareSteps(t, results)
}
