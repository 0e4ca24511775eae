package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestMountHelperForm: "goverlay SOURCE MOUNTPOINT -o OPTS", the way
// mount(8) calls a helper, mounts with SOURCE as the source.
func TestMountHelperForm(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	t.Parallel()
	lower, mnt := layers(t)
	r := goverlay(t, "my-source", mnt, "-o", "lowerdir="+lower)
	if r.Code != 0 {
		if testutil.IsMounted(mnt) {
			testutil.Adopt(t, mnt)
		}
		t.Fatalf("goverlay SOURCE MNT -o ...: %s", r)
	}
	m := testutil.Adopt(t, mnt)
	checkHelperMount(t, m, "my-source")
	m.Unmount(t)
}

// TestMountTypeFuse: the mount(8) routes to goverlay through mount.fuse3.
func TestMountTypeFuse(t *testing.T) {
	testutil.RequireRoot(t)
	helper := ""
	for _, p := range []string{"/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"} {
		if _, err := os.Stat(p); err == nil {
			helper = p
		}
	}
	if helper == "" {
		t.Skip("no /sbin/mount.fuse3 (package fuse3)")
	}
	bin := testutil.Binary(t)
	if filepath.Base(bin) != "goverlay" {
		t.Fatalf("the binary must be called goverlay for mount.fuse3 to find it, not %s", bin)
	}
	withPath := []string{"PATH=" + filepath.Dir(bin) + ":" + os.Getenv("PATH")}
	cases := []struct {
		name string
		env  []string
		cmd  func(lower, mnt string) []string
		// prepare runs before cmd in the subtest.
		prepare func(t *testing.T, mnt string)
	}{
		{
			// What mount -t fuse.goverlay runs, with goverlay on PATH.
			name: "mount.fuse3 -t goverlay", env: withPath,
			cmd: func(lower, mnt string) []string {
				return []string{helper, "goverlay-src", mnt, "-t", "goverlay", "-o", "lowerdir=" + lower}
			},
		},
		{
			// mount(8) itself, naming the binary by its path.
			name: "mount -t fuse BIN#SRC",
			cmd: func(lower, mnt string) []string {
				return []string{"mount", "-t", "fuse", bin + "#goverlay-src", mnt, "-o", "lowerdir=" + lower}
			},
		},
		{
			// The real thing. mount(8) runs helpers with a fixed PATH,
			// so goverlay must be in one of its directories: in a
			// private mount namespace the binary's directory is bound
			// over /usr/local/sbin, and the FUSE mount comes back to
			// ours through a shared bind mount of the test's directory.
			name: "mount -t fuse.goverlay",
			cmd: func(lower, mnt string) []string {
				return []string{"unshare", "-m", "--propagation", "unchanged", "sh", "-c",
					`mount --bind "$1" /usr/local/sbin && exec mount -t fuse.goverlay goverlay-src "$2" -o "lowerdir=$3"`,
					"sh", filepath.Dir(bin), mnt, lower}
			},
			prepare: func(t *testing.T, mnt string) {
				if _, err := exec.LookPath("unshare"); err != nil {
					t.Skip("unshare not installed (util-linux)")
				}
				sharedBind(t, filepath.Dir(mnt))
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testutil.LeakCheck(t)
			t.Parallel()
			lower, mnt := layers(t)
			if c.prepare != nil {
				c.prepare(t, mnt)
			}
			args := c.cmd(lower, mnt)
			r := testutil.Run(t, cmdTimeout, c.env, args[0], args[1:]...)
			if r.Code != 0 {
				if testutil.IsMounted(mnt) {
					testutil.Adopt(t, mnt)
				}
				t.Fatalf("%q: %s", args, r)
			}
			m := testutil.Adopt(t, mnt)
			checkHelperMount(t, m, "goverlay-src")
			if err := testutil.Umount(mnt); err != nil {
				t.Fatal(err)
			}
			m.WaitDaemon(t)
		})
	}
}

func checkHelperMount(t *testing.T, m *testutil.Mounted, source string) {
	t.Helper()
	e := testutil.RequireMounted(t, m.Dir, "fuse.goverlay")
	if e.Source != source {
		t.Errorf("source of the mount is %q, want %q", e.Source, source)
	}
	if typ := procMountsType(t, m.Dir); typ != "fuse.goverlay" {
		t.Errorf("/proc/mounts type %q, want fuse.goverlay", typ)
	}
	if data, err := os.ReadFile(filepath.Join(m.Dir, "file")); err != nil || string(data) != "hello\n" {
		t.Errorf("read through the mount: %q, %v", data, err)
	}
}

// sharedBind bind-mounts dir on itself and makes it shared, so that mounts
// made below it in another mount namespace show up in ours; it is
// unmounted when the test ends (after whatever is mounted below it).
func sharedBind(t *testing.T, dir string) {
	t.Helper()
	t.Cleanup(func() {
		if testutil.IsMounted(dir) {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", dir, err, out)
				exec.Command("umount", "-l", dir).Run()
			}
		}
	})
	for _, args := range [][]string{{"--bind", dir, dir}, {"--make-shared", dir}} {
		if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
			t.Fatalf("mount %q: %v: %s", args, err, out)
		}
	}
}
