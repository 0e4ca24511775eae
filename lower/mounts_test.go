package lower

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs on dir with one file, mounted, in it.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(dir, "mounted"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// layerMountsBase makes l/sub, u/sub and w in a new directory, a file
// l/sub/own, and tmpfs mounts on l/sub and u/sub, and returns the
// directory.
func layerMountsBase(t *testing.T) string {
	base := t.TempDir()
	for _, d := range []string{"l/sub", "u/sub", "w"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "l/sub/own"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mountTmpfs(t, filepath.Join(base, "l/sub"))
	mountTmpfs(t, filepath.Join(base, "u/sub"))
	return base
}

// TestLayerMounts: a lower layer is a clone of its mount without the
// mounts inside it (its own sub is seen); a layer opened in place does
// not enter them (EXDEV); the upper layer and its workdir share one
// clone, so that a rename between them works.
func TestLayerMounts(t *testing.T) {
	base := layerMountsBase(t)

	l, err := OpenLayer(filepath.Join(base, "l"), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Cloned() {
		t.Fatalf("a lower layer opened by root is not a clone of its mount")
	}
	sub, err := l.Root().OpenDir("sub")
	if err != nil {
		t.Fatalf("sub of the cloned layer: %v", err)
	}
	ents, err := sub.ReadDirRaw()
	sub.Close()
	if err != nil || len(ents) != 1 || ents[0].Name != "own" {
		t.Errorf("sub of the cloned layer lists %v (%v), want the layer's own sub: own", ents, err)
	}

	in, err := OpenLayer(filepath.Join(base, "l"), 1, true) // in place
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if in.Cloned() {
		t.Fatalf("OpenLayer(upper) cloned the layer")
	}
	if d, err := in.Root().OpenDir("sub"); err != unix.EXDEV {
		if err == nil {
			d.Close()
		}
		t.Errorf("sub of a layer opened in place, a mount point: %v, want EXDEV", err)
	}

	u, wfd, err := OpenUpper(filepath.Join(base, "u"), filepath.Join(base, "w"), Atime{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	defer unix.Close(wfd)
	if !u.Cloned() {
		t.Fatalf("the upper layer opened by root is not a clone of its mount")
	}
	if err := unix.Mkdirat(wfd, "tmp", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := u.Root().Do(func(fd int) error { return unix.Renameat(wfd, "tmp", fd, "moved") }); err != nil {
		t.Errorf("rename from the workdir into the upper layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "u/moved")); err != nil {
		t.Errorf("the rename did not land in the upper layer: %v", err)
	}
	sub, err = u.Root().OpenDir("sub")
	if err != nil {
		t.Fatal(err)
	}
	ents, err = sub.ReadDirRaw()
	sub.Close()
	if err != nil || len(ents) != 0 {
		t.Errorf("sub of the upper layer lists %v (%v), want its own, empty", ents, err)
	}
}

// TestLayerMountsMasked: where open_tree(2) is taken for absent (-o
// mask=), as before Linux 5.2, a layer is opened in place: a mount inside
// it is not entered (EXDEV). Where mount_setattr(2) is, as before 5.12,
// the clone is kept, though not made private: the layer's own sub shows.
// Either way the upper layer and its workdir still rename into each
// other, and each fallback is counted.
func TestLayerMountsMasked(t *testing.T) {
	for _, masked := range []Features{OpenTree, MountSetattr} {
		t.Run(masked.String(), func(t *testing.T) {
			base := layerMountsBase(t)
			cloned := masked != OpenTree
			l, err := OpenLayerMasked(filepath.Join(base, "l"), 1, false, masked)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.Cloned() != cloned || l.Counters.Fallbacks.Of(masked) != 1 {
				t.Errorf("%s masked: the layer is a clone %v, %d fallbacks counted; want %v, 1", masked, l.Cloned(), l.Counters.Fallbacks.Of(masked), cloned)
			}
			sub, err := l.Root().OpenDir("sub")
			switch {
			case cloned && err != nil:
				t.Errorf("sub of the cloned layer: %v", err)
			case cloned:
				ents, err := sub.ReadDirRaw()
				sub.Close()
				if err != nil || len(ents) != 1 || ents[0].Name != "own" {
					t.Errorf("sub of the cloned layer lists %v (%v), want the layer's own sub: own", ents, err)
				}
			case err != unix.EXDEV:
				if err == nil {
					sub.Close()
				}
				t.Errorf("sub of a layer opened in place, a mount point: %v, want EXDEV", err)
			}
			u, wfd, err := OpenUpperMasked(filepath.Join(base, "u"), filepath.Join(base, "w"), Atime{}, masked)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			defer unix.Close(wfd)
			if u.Cloned() != cloned || u.Counters.Fallbacks.Of(masked) != 1 {
				t.Errorf("%s masked: upper a clone %v, %d fallbacks counted; want %v, 1", masked, u.Cloned(), u.Counters.Fallbacks.Of(masked), cloned)
			}
			if err := unix.Mkdirat(wfd, "tmp", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := u.Root().Do(func(fd int) error { return unix.Renameat(wfd, "tmp", fd, "moved") }); err != nil {
				t.Errorf("rename from the workdir into the upper layer: %v", err)
			}
		})
	}
}

// TestStatxMntIDMasked: with STATX_MNT_ID masked the layer is taken for
// not id-mapped without asking (the answer of every kernel before Linux
// 5.8, which had no id-mapped mounts either), and the fallback is counted.
func TestStatxMntIDMasked(t *testing.T) {
	l, err := OpenLayerMasked(t.TempDir(), 1, false, StatxMntID)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.IDMapped || l.Counters.Fallbacks.Of(StatxMntID) != 1 {
		t.Errorf("id-mapped %v, %d fallbacks counted; want false, 1", l.IDMapped, l.Counters.Fallbacks.Of(StatxMntID))
	}
}

// TestCloneAtime: a lower layer's clone is noatime, the upper layer's
// carries the policy it is opened with (atime.go), as statfs(2) shows
// them; the host's mount keeps its own.
func TestCloneAtime(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("cloning a mount needs root")
	}
	base := t.TempDir()
	for _, d := range []string{"l", "u", "w"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	flags := func(l *Layer) int64 {
		var fs unix.Statfs_t
		if err := l.Root().Do(func(fd int) error { return unix.Fstatfs(fd, &fs) }); err != nil {
			t.Fatal(err)
		}
		return fs.Flags & (unix.ST_NOATIME | unix.ST_NODIRATIME | unix.ST_RELATIME)
	}
	l, err := OpenLayer(filepath.Join(base, "l"), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := flags(l); got != unix.ST_NOATIME {
		t.Errorf("lower clone: statfs flags %#x, want ST_NOATIME", got)
	}
	for _, c := range []struct {
		a    Atime
		want int64
	}{
		{Atime{}, unix.ST_RELATIME},
		{Atime{Mode: Strictatime}, 0},
		{Atime{Mode: Noatime}, unix.ST_NOATIME},
		{Atime{Mode: Strictatime, NoDirs: true}, unix.ST_NODIRATIME},
	} {
		u, wfd, err := OpenUpper(filepath.Join(base, "u"), filepath.Join(base, "w"), c.a)
		if err != nil {
			t.Fatal(err)
		}
		if got := flags(u); got != c.want {
			t.Errorf("upper clone with %+v: statfs flags %#x, want %#x", c.a, got, c.want)
		}
		unix.Close(wfd)
		u.Close()
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(base, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Flags&unix.ST_NOATIME != 0 {
		t.Errorf("the host's mount of %s became noatime", base)
	}
}

// TestOpenNoatime: reads of a lower layer opened in place, files and
// listings, leave access times alone (O_NOATIME); a listing of the upper
// layer read through the mount (ReadDirAccess) updates its directory's
// as the host's mount says (relatime or strictatime: the atime is old).
func TestOpenNoatime(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{"l/d", "u/d"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "l/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := []unix.Timespec{unix.NsecToTimespec(1e9), unix.NsecToTimespec(1e9)}
	atime := func(rel string) int64 {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(base, rel), &st); err != nil {
			t.Fatal(err)
		}
		return st.Atim.Nano()
	}
	for _, rel := range []string{"l/f", "l/d", "u/d"} {
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(base, rel), old, 0); err != nil {
			t.Fatal(err)
		}
	}
	l, err := OpenLayer(filepath.Join(base, "l"), 1, true) // in place
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.atime = Atime{Mode: Noatime}
	fd, err := l.Root().Open("f", unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	_, err = unix.Read(fd, make([]byte, 1))
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Root().OpenDir("d")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Chain{{Dir: d}}.ReadDirAccess()
	d.Close()
	if err != nil {
		t.Fatal(err)
	}
	if a := atime("l/f"); a != 1e9 {
		t.Errorf("a read of a lower file changed its atime to %d", a)
	}
	if a := atime("l/d"); a != 1e9 {
		t.Errorf("a listing of a lower directory changed its atime to %d", a)
	}

	var fs unix.Statfs_t
	if err := unix.Statfs(base, &fs); err != nil || fs.Flags&(unix.ST_NOATIME|unix.ST_NODIRATIME) != 0 {
		return // the host's mount updates no directory's atime
	}
	u, err := OpenLayer(filepath.Join(base, "u"), 0, true) // the host's policy
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	d, err = u.Root().OpenDir("d")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := (Chain{{Dir: d}}).ReadDir(); err != nil {
		t.Fatal(err)
	}
	if a := atime("u/d"); a != 1e9 {
		t.Errorf("the mount's own read of an upper directory changed its atime to %d", a)
	}
	if _, err := (Chain{{Dir: d}}).ReadDirAccess(); err != nil {
		t.Fatal(err)
	}
	if a := atime("u/d"); a == 1e9 {
		t.Errorf("a listing of an upper directory through the mount left its atime")
	}
}

// TestStatmountIDMapped: statmount(2) and the mount table tell the same
// of a mount that is not id-mapped, and of one that is (an id-mapped
// bind of a temporary directory, where the kernel allows it).
func TestStatmountIDMapped(t *testing.T) {
	dir := t.TempDir()
	check := func(path string, want bool) {
		t.Helper()
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil || stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
			t.Skipf("no unique mount ids (Linux 6.8+): %v", err)
		}
		got, err := statmountIDMapped(stx.Mnt_id)
		if errors.Is(err, unix.ENOSYS) {
			t.Skip("no statmount(2) (Linux 6.8+)")
		}
		byTable, terr := idMappedByMountinfo(path)
		if err != nil || terr != nil || got != want || byTable != want {
			t.Errorf("%s: statmount says %v (%v), the mount table %v (%v); want %v", path, got, err, byTable, terr, want)
		}
	}
	check(dir, false)
	mapped, detach, err := idmappedBindForTest(dir)
	if err != nil {
		t.Skipf("no id-mapped bind: %v", err)
	}
	defer detach()
	check(mapped, true)
}

// idmappedBindForTest attaches an id-mapped bind of dir (ids 0–999 shown
// as 1000–1999) on a new directory, whose path it returns with its
// detach.
func idmappedBindForTest(dir string) (string, func(), error) {
	sleep := exec.Command("sleep", "1000")
	maps := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1000, Size: 1000}}
	sleep.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: maps, GidMappings: maps}
	if err := sleep.Start(); err != nil {
		return "", nil, err
	}
	ns, err := unix.Open("/proc/"+strconv.Itoa(sleep.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	sleep.Process.Kill()
	sleep.Wait()
	if err != nil {
		return "", nil, err
	}
	defer unix.Close(ns)
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return "", nil, err
	}
	defer unix.Close(tree)
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}); err != nil {
		return "", nil, err
	}
	path, err := os.MkdirTemp("", "idmapped")
	if err != nil {
		return "", nil, err
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		os.Remove(path)
		return "", nil, err
	}
	return path, func() {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
	}, nil
}
