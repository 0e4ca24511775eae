package cli_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goverlay/goverlay/tests/testutil"
)

// installTimeout bounds make install, which builds the binary.
const installTimeout = 5 * time.Minute

// TestMakeInstall: make install puts goverlay, statically linked,
// goverlay-bench, goverlay-mount and the man page under DESTDIR, where mount(8) (through
// mount.fuse3) and man(1) find them; the binary says which commit it was
// built from; make uninstall removes them.
func TestMakeInstall(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.LeakCheck(t)
	for _, tool := range []string{"make", "git", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	root := testutil.ModuleRoot(t)
	dest := t.TempDir()
	bin := filepath.Join(t.TempDir(), "goverlay")
	r := testutil.Run(t, installTimeout, nil, "make", "-C", root, "install", "DESTDIR="+dest, "BIN="+bin)
	if r.Code != 0 {
		t.Fatalf("make install: %s", r)
	}
	installed := filepath.Join(dest, "usr/local/bin/goverlay")
	page := filepath.Join(dest, "usr/local/share/man/man1/goverlay.1")
	for _, p := range []string{installed, filepath.Join(dest, "usr/local/bin/goverlay-bench"), filepath.Join(dest, "usr/local/bin/goverlay-mount"), page} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("make install did not install %s: %v", p, err)
		}
	}
	// Static: each of a mount's two starts skips the dynamic loader.
	if f, err := elf.Open(installed); err != nil {
		t.Error(err)
	} else {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked (it has a PT_INTERP)", installed)
			}
		}
		f.Close()
	}

	t.Run("version", func(t *testing.T) {
		out, err := exec.Command("git", "-C", root, "describe", "--tags", "--always", "--dirty").Output()
		if err != nil {
			t.Skipf("not a git checkout: %v", err)
		}
		r := testutil.Run(t, cmdTimeout, nil, installed, "--version")
		want := "goverlay " + strings.TrimSpace(string(out))
		if first, _, _ := strings.Cut(r.Stdout, "\n"); r.Code != 0 || first != want {
			t.Errorf("--version: %s; want the first line %q", r, want)
		}
	})

	t.Run("man", func(t *testing.T) {
		if _, err := exec.LookPath("man"); err != nil {
			t.Skip("man is not installed (apt-get install man-db)")
		}
		r := testutil.Run(t, cmdTimeout, []string{"MANPATH=" + filepath.Join(dest, "usr/local/share/man")}, "man", "-w", "goverlay")
		if r.Code != 0 || strings.TrimSpace(r.Stdout) != page {
			t.Errorf("man -w goverlay: %s; want %s", r, page)
		}
	})

	t.Run("mount -t fuse.goverlay", func(t *testing.T) {
		testutil.LeakCheck(t)
		if _, err := os.Stat("/usr/local/bin"); err != nil {
			t.Skip("no /usr/local/bin to bind the installed tree over")
		}
		lower, mnt := layers(t)
		sharedBind(t, filepath.Dir(mnt))
		// In a private mount namespace, the installed bin directory
		// stands in for /usr/local/bin; mount(8) runs mount.fuse3 with
		// its own fixed PATH, so this finds goverlay only where make
		// install put it. An unusable PATH of our own proves it.
		r := testutil.Run(t, cmdTimeout, []string{"PATH=/nonexistent"}, "/usr/bin/unshare", "-m", "--propagation", "unchanged", "/bin/sh", "-c",
			`/bin/mount --bind "$1" /usr/local/bin && exec /bin/mount -t fuse.goverlay installed-src "$2" -o "lowerdir=$3"`,
			"sh", filepath.Dir(installed), mnt, lower)
		if r.Code != 0 {
			if testutil.IsMounted(mnt) {
				testutil.AdoptOf(t, mnt, installed)
			}
			t.Fatalf("mount -t fuse.goverlay: %s", r)
		}
		m := testutil.AdoptOf(t, mnt, installed)
		checkHelperMount(t, m, "installed-src")
		if err := testutil.Umount(mnt); err != nil {
			t.Fatal(err)
		}
		m.WaitDaemon(t)
	})

	r = testutil.Run(t, installTimeout, nil, "make", "-C", root, "uninstall", "DESTDIR="+dest)
	if r.Code != 0 {
		t.Fatalf("make uninstall: %s", r)
	}
	for _, p := range []string{installed, filepath.Join(dest, "usr/local/bin/goverlay-bench"), filepath.Join(dest, "usr/local/bin/goverlay-mount"), page} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("make uninstall left %s (%v)", p, err)
		}
	}
}

// TestVersionOfPlainBuild: a plain go build of a git checkout, without
// the Makefile's -ldflags, says which commit it is.
func TestVersionOfPlainBuild(t *testing.T) {
	root := testutil.ModuleRoot(t)
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Skip("not a git clone with a .git directory (go build records no VCS information in a git worktree)")
	}
	rev, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("git rev-parse HEAD: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "goverlay")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/goverlay")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	r := testutil.Run(t, cmdTimeout, nil, bin, "--version")
	// Go stamps a pseudo-version (v0.0.0-TIME-REV) from the VCS; older
	// toolchains leave "(devel)", and goverlay then says devel-REV.
	want := strings.TrimSpace(string(rev))[:12]
	if first, _, _ := strings.Cut(r.Stdout, "\n"); !strings.HasPrefix(first, "goverlay ") || !strings.Contains(first, want) {
		t.Errorf("--version: %s; want the first line to name commit %s", r, want)
	}
}
