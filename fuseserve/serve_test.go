package fuseserve

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// mountLoopback serves dir through fuseserve with go-fuse's loopback
// filesystem, wrapped by wrap when it is not nil, in this process, so
// that -race sees both sides; the mount goes when the test ends.
func mountLoopback(t *testing.T, dir string, o Options, wrap func(fuse.RawFileSystem) fuse.RawFileSystem) (string, *Server) {
	t.Helper()
	return mountWith(t, dir, &fuse.MountOptions{FsName: "fuseserve-test", Name: "fuseserve"}, o, wrap)
}

// mountWith is mountLoopback with the mount options mo.
func mountWith(t *testing.T, dir string, mo *fuse.MountOptions, o Options, wrap func(fuse.RawFileSystem) fuse.RawFileSystem) (string, *Server) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	root, err := fs.NewLoopbackRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	raw := fs.NewNodeFS(root, &fs.Options{})
	if wrap != nil {
		raw = wrap(raw)
	}
	mnt := t.TempDir()
	s, err := Mount(raw, mnt, mo, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var st, pst unix.Stat_t
		if unix.Stat(mnt, &st) != nil || unix.Stat(filepath.Dir(mnt), &pst) != nil || st.Dev != pst.Dev {
			if err := s.Unmount(); err != nil {
				t.Errorf("unmount: %v", err)
				unix.Unmount(mnt, unix.MNT_DETACH)
			}
		}
		s.Wait()
		s.Close()
	})
	return mnt, s
}

func TestMountServes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	mnt, s := mountLoopback(t, dir, Options{}, nil)
	if got, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(got) != "data" {
		t.Errorf("read through the mount: %q, %v", got, err)
	}
	if got := s.Transport(); got != "/dev/fuse" {
		t.Errorf("transport %q without io_uring asked for, want /dev/fuse", got)
	}
	if n := s.RingRequests(); n != 0 {
		t.Errorf("%d requests over io_uring, none asked for", n)
	}
}
