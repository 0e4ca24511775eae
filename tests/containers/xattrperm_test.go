package containers_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// The stat-override xattrs (fuse-overlayfs xattr_permissions=1|2;
// containers/storage pkg/idtools ContainersOverrideXattr).
const (
	containersXattr = "user.containers.override_stat"
	fuseUserXattr   = "user.fuseoverlayfs.override_stat"
	privilegedXattr = "security.fuseoverlayfs.override_stat"
)

// forceMask turns the store's layers into what containers/storage extracts
// with force_mask=0700: every object really owned by root with mode 0700
// (directories) or 0600 (files), its owner and mode as the image has them
// in user.containers.override_stat, the layer roots included
// (drivers/overlay: SetContainersOverrideXattr on each diff). The upper
// gets one for its root too, as containers/storage makes it. owners gives
// some objects an image owner other than root.
func forceMask(t *testing.T, s *csStore, owners map[string]string) {
	t.Helper()
	for _, root := range []string{s.top, s.bottom} {
		err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if strings.HasPrefix(filepath.Base(p), ".wh.") {
				return nil
			}
			typ, real := "file", os.FileMode(0o600)
			if fi.IsDir() {
				typ, real = "dir", 0o700
			}
			own := "0:0"
			if o, ok := owners[rel]; ok {
				own = o
			}
			v := fmt.Sprintf("%s:%04o:%s", own, fi.Mode().Perm(), typ)
			if err := unix.Lsetxattr(p, containersXattr, []byte(v), 0); err != nil {
				return err
			}
			return os.Chmod(p, real)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(s.upper, containersXattr, []byte("0:0:0755:dir"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.upper, 0o700); err != nil {
		t.Fatal(err)
	}
}

// statLine is "UID:GID MODE TYPE" of p, not following a symlink.
func statLine(p string) string {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return "error: " + err.Error()
	}
	typ := map[uint32]string{unix.S_IFREG: "file", unix.S_IFDIR: "dir", unix.S_IFLNK: "symlink",
		unix.S_IFIFO: "fifo", unix.S_IFCHR: "char", unix.S_IFBLK: "block", unix.S_IFSOCK: "socket"}[st.Mode&unix.S_IFMT]
	if typ == "char" || typ == "block" {
		typ += fmt.Sprintf("-%d-%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	return fmt.Sprintf("%d:%d %04o %s", st.Uid, st.Gid, st.Mode&07777, typ)
}

// lxattr reads attribute name of p, not following a symlink; "" if absent.
func lxattr(p, name string) string {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// lxattrNames lists p's attribute names.
func lxattrNames(t *testing.T, p string) []string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Errorf("listxattr %s: %v", p, err)
		return nil
	}
	return strings.FieldsFunc(string(buf[:n]), func(r rune) bool { return r == 0 })
}

// checkStats compares the stat lines of rel under root with want, for
// every program (want is what both goverlay and fuse-overlayfs 1.10 show)
// or for goverlay only (then fuse-overlayfs's answer is only recorded).
func checkStats(t *testing.T, prog mountProgram, root string, want map[string]string, everyone bool, what string) {
	t.Helper()
	for _, rel := range sortedKeys(want) {
		got := statLine(filepath.Join(root, rel))
		switch {
		case got == want[rel]:
		case everyone || prog.name == "goverlay":
			t.Errorf("%s: %s %s is %q, want %q", what, prog.name, rel, got, want[rel])
		default:
			t.Logf("%s: %s %s is %q (goverlay: %q)", what, prog.name, rel, got, want[rel])
		}
	}
}

// checkDirType checks the type readdir (d_type) gives name in dir, for
// goverlay; fuse-overlayfs's answer is only recorded.
func checkDirType(t *testing.T, prog mountProgram, dir, name string, want os.FileMode, what string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Errorf("%s: %s readdir %s: %v", what, prog.name, dir, err)
		return
	}
	for _, e := range ents {
		if e.Name() != name {
			continue
		}
		switch got := e.Type(); {
		case got == want:
		case prog.name == "goverlay":
			t.Errorf("%s: readdir of %s gives %s the type %v, want %v (as stat says)", what, dir, name, got, want)
		default:
			t.Logf("%s: %s: readdir of %s gives %s the type %v (goverlay: %v)", what, prog.name, dir, name, got, want)
		}
		return
	}
	t.Errorf("%s: %s: readdir of %s does not list %s", what, prog.name, dir, name)
}

func sortedKeys(m map[string]string) []string {
	var k []string
	for r := range m {
		k = append(k, r)
	}
	sort.Strings(k)
	return k
}

// TestXattrPermissions: a store as containers/storage makes it with
// force_mask, mounted with its exact argv and ",xattr_permissions=2", by
// goverlay and by fuse-overlayfs as the reference. Owners and modes live in
// user.containers.override_stat; the real objects are root's, 0700/0600 in
// the layers and 0755 in the upper.
func TestXattrPermissions(t *testing.T) {
	testutil.RequireRoot(t)
	lookTools(t, map[string]string{"fusermount3": "fuse3"})
	for _, prog := range storagePrograms(t) {
		t.Run(prog.name, func(t *testing.T) {
			t.Run("containers", func(t *testing.T) { xpermContainers(t, prog) })
			t.Run("uidmapping", func(t *testing.T) { xpermUIDMapping(t, prog) })
			t.Run("privileged", func(t *testing.T) { xpermPrivileged(t, prog) })
			t.Run("without-option", func(t *testing.T) { xpermWithoutOption(t, prog) })
		})
	}
}

// xpermContainers: xattr_permissions=2. What fuse-overlayfs 1.10 also does
// is checked for both: stat through the override of the image's files,
// chown of lower files and directories, chmod of a new file, the copy-up
// keeping the image's override, the real objects owned by the daemon with
// mode 0755, and setxattr of the override refused. Where 1.10 has bugs
// that later releases fixed (chmod of a lower file forgets its owner; the
// umask is ignored on create; a copy-up records mode|0755; the upper's
// overrides are read and written as user.fuseoverlayfs.override_stat
// only, 1.14 prefers user.containers.override_stat), and where goverlay
// differs on purpose (the override is hidden from getxattr/listxattr;
// devices, FIFOs and symlinks, which cannot carry user.* xattrs, are owned
// for real), goverlay's answer is checked and fuse-overlayfs's recorded.
func xpermContainers(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	// A device node as containers/storage extracts it without the
	// privilege to make one: a plain file whose override names it.
	bl := testutil.NewLayer(t, s.bottom).File("dev/null", "", 0o600)
	// Names before it, enough that the kernel lists null with a plain
	// READDIR (READDIRPLUS_AUTO uses readdirplus for the first batch
	// only), whose d_type comes from the listing; readdirplus's comes
	// from the lookup.
	for i := range 300 {
		bl.File(fmt.Sprintf("dev/f%03d", i), "", 0o600)
	}
	forceMask(t, s, map[string]string{
		"home/user":         "1000:1000",
		"home/user/own.txt": "1000:1000",
	})
	if err := unix.Lsetxattr(filepath.Join(s.bottom, "dev/null"), containersXattr, []byte("0:0:0666:char-1-3"), 0); err != nil {
		t.Fatal(err)
	}
	m := storageMount(t, prog, s.home, s.rwOpts("xattr_permissions=2"), s.merged)
	noWarnings(t, prog, m, "xattr_permissions=2")
	mp := func(rel string) string { return filepath.Join(s.merged, rel) }

	// 1.10 reads the upper's own overrides from
	// user.fuseoverlayfs.override_stat only, so it shows the upper root
	// as it really is (0700); 1.14+ prefers user.containers.override_stat.
	checkStats(t, prog, s.merged, map[string]string{".": "0:0 0755 dir"}, false, "the upper root")
	// 1.15+ reads the type too; 1.10 shows a regular file.
	checkStats(t, prog, s.merged, map[string]string{"dev/null": "0:0 0666 char-1-3"}, false, "a device kept as a plain file")
	// readdir's d_type agrees with stat (goverlay; 1.10 says DT_REG).
	checkDirType(t, prog, mp("dev"), "null", os.ModeDevice|os.ModeCharDevice, "a device kept as a plain file")
	checkStats(t, prog, s.merged, map[string]string{
		"bin/tool":          "0:0 0755 file",
		"etc":               "0:0 0755 dir",
		"etc/passwd":        "0:0 0644 file",
		"home/user":         "1000:1000 0755 dir",
		"home/user/own.txt": "1000:1000 0644 file",
		"keep.txt":          "0:0 0644 file",
	}, true, "image files through the override")

	// Changes through the mount.
	steps := []struct {
		what string
		do   func() error
	}{
		{"chown 33:44 keep.txt", func() error { return os.Lchown(mp("keep.txt"), 33, 44) }},
		{"chown 9:9 home/user", func() error { return os.Lchown(mp("home/user"), 9, 9) }},
		{"append to home/user/own.txt (copy-up)", func() error {
			f, err := os.OpenFile(mp("home/user/own.txt"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteString("more\n")
			return errors.Join(err, f.Close())
		}},
		{"chmod 0751 etc/passwd", func() error { return os.Chmod(mp("etc/passwd"), 0o751) }},
		{"mkdir new-dir 0700", func() error { return unix.Mkdir(mp("new-dir"), 0o700) }},
		{"create new.txt 0666 (umask 022)", func() error {
			old := unix.Umask(0o22)
			defer unix.Umask(old)
			return os.WriteFile(mp("new.txt"), []byte("x"), 0o666)
		}},
		{"create chm.txt, chmod 0600", func() error {
			if err := os.WriteFile(mp("chm.txt"), []byte("x"), 0o644); err != nil {
				return err
			}
			return os.Chmod(mp("chm.txt"), 0o600)
		}},
		{"symlink sl", func() error { return os.Symlink("keep.txt", mp("sl")) }},
		{"mkfifo fifo 0640", func() error { return unix.Mkfifo(mp("fifo"), 0o640) }},
		{"mknod null c 1 3 0620", func() error { return unix.Mknod(mp("null"), unix.S_IFCHR|0o620, int(unix.Mkdev(1, 3))) }},
		{"chown 5:5 dev/null (copy-up of a device kept as a plain file)", func() error { return os.Lchown(mp("dev/null"), 5, 5) }},
	}
	old := unix.Umask(0)
	for _, st := range steps {
		if err := st.do(); err != nil {
			if prog.name == "goverlay" {
				t.Errorf("%s through the mount: %v", st.what, err)
			} else {
				t.Logf("%s: %s through the mount: %v", prog.name, st.what, err)
			}
		}
	}
	unix.Umask(old)

	checkStats(t, prog, s.merged, map[string]string{
		"keep.txt":  "33:44 0644 file",
		"home/user": "9:9 0755 dir",
		"chm.txt":   "0:0 0600 file",
	}, true, "after changes through the mount")
	checkStats(t, prog, s.merged, map[string]string{
		"home/user/own.txt": "1000:1000 0644 file", // 1.10: 0755, its copy-up records mode|0755
		"new-dir":           "0:0 0700 dir",        // 1.10: 0755
		"etc/passwd":        "0:0 0751 file",       // 1.10: the owner is lost (0:0 here anyway)
		"new.txt":           "0:0 0644 file",       // 1.10: 0755, the umask ignored
		"sl":                "0:0 0777 symlink",    // owned for real
		"fifo":              "0:0 0640 fifo",       // 1.10: 0755, the mode ignored
		"null":              "0:0 0620 char-1-3",
		"dev/null":          "5:5 0666 char-1-3", // copied up as a plain file with its override
	}, false, "after changes through the mount")
	// Now listed from the upper layer, read each time.
	checkDirType(t, prog, mp("dev"), "null", os.ModeDevice|os.ModeCharDevice, "a device kept as a plain file, copied up")
	if got, want := statLine(filepath.Join(s.upper, "dev/null")), "0:0 0755 file"; got != want && prog.name == "goverlay" {
		t.Errorf("upper dev/null is really %q, want %q (a plain file, as in the image layer)", got, want)
	}
	if v, want := lxattr(filepath.Join(s.upper, "dev/null"), containersXattr), "5:5:0666:char-1-3"; v != want {
		if prog.name == "goverlay" {
			t.Errorf("upper dev/null has %s=%q, want %q", containersXattr, v, want)
		} else {
			t.Logf("%s: upper dev/null has %s=%q (goverlay: %q)", prog.name, containersXattr, v, want)
		}
	}
	if got, want := statLine(mp("etc/passwd")), "0:0 0751 file"; got != want {
		if prog.name == "goverlay" {
			t.Errorf("chmod 0751 etc/passwd shows %q, want %q", got, want)
		} else {
			t.Logf("%s: chmod 0751 etc/passwd shows %q (goverlay: %q)", prog.name, got, want)
		}
	}

	// Copy-up kept the image's override, and the upper's objects are the
	// daemon's, mode 0755, whatever the mount shows.
	for _, rel := range []string{"keep.txt", "home/user", "home/user/own.txt", "etc/passwd", "new-dir", "new.txt", "chm.txt"} {
		if got := statLine(filepath.Join(s.upper, rel)); !strings.HasPrefix(got, "0:0 0755 ") {
			t.Errorf("%s: upper %s is really %q, want owned by 0:0 with mode 0755", prog.name, rel, got)
		}
	}
	if v := lxattr(filepath.Join(s.upper, "home/user/own.txt"), containersXattr); v != "1000:1000:0644:file" {
		t.Errorf("%s: after the copy-up, upper home/user/own.txt has %s=%q, want the image's %q", prog.name, containersXattr, v, "1000:1000:0644:file")
	}
	// Where a change through the mount is recorded: 1.14+ and goverlay
	// in user.containers.override_stat; 1.10 in
	// user.fuseoverlayfs.override_stat.
	for rel, want := range map[string]string{
		"keep.txt":   "33:44:0644:file",
		"home/user":  "9:9:0755:dir",
		"etc/passwd": "0:0:0751:file",
		"new-dir":    "0:0:0700:dir",
		"new.txt":    "0:0:0644:file",
		"chm.txt":    "0:0:0600:file",
	} {
		p := filepath.Join(s.upper, rel)
		got := lxattr(p, containersXattr)
		switch {
		case got == want:
		case prog.name == "goverlay":
			t.Errorf("upper %s has %s=%q, want %q", rel, containersXattr, got, want)
		default:
			t.Logf("%s: upper %s has %s=%q, %s=%q", prog.name, rel, containersXattr, got, fuseUserXattr, lxattr(p, fuseUserXattr))
		}
	}
	for rel, want := range map[string]string{"sl": "0:0 0777 symlink", "fifo": "0:0 0640 fifo", "null": "0:0 0620 char-1-3"} {
		if got := statLine(filepath.Join(s.upper, rel)); got != want && prog.name == "goverlay" {
			t.Errorf("upper %s is really %q, want %q (user.* xattrs cannot be set on it: owned for real)", rel, got, want)
		}
	}

	// The override through the mount: hidden (goverlay; 1.10 shows it),
	// and never settable or removable.
	for _, rel := range []string{"home/user/own.txt", "keep.txt", "bin/tool", "."} {
		var names []string
		for _, n := range lxattrNames(t, mp(rel)) {
			if strings.HasSuffix(n, ".override_stat") {
				names = append(names, n)
			}
		}
		buf := make([]byte, 64)
		_, gerr := unix.Lgetxattr(mp(rel), containersXattr, buf)
		switch {
		case len(names) == 0 && errors.Is(gerr, unix.ENODATA):
		case prog.name == "goverlay":
			t.Errorf("%s: listxattr shows %q, getxattr(%s) = %v; want none shown and ENODATA", rel, names, containersXattr, gerr)
		default:
			t.Logf("%s: %s: listxattr shows %q, getxattr(%s) = %v", prog.name, rel, names, containersXattr, gerr)
		}
	}
	for _, name := range []string{containersXattr, fuseUserXattr} {
		if err := unix.Lsetxattr(mp("keep.txt"), name, []byte("0:0:4777:file"), 0); !errors.Is(err, unix.EPERM) {
			t.Errorf("%s: setxattr(%s) through the mount: %v, want EPERM", prog.name, name, err)
		}
	}
	if err := unix.Lremovexattr(mp("keep.txt"), containersXattr); err == nil && prog.name == "goverlay" {
		t.Errorf("removexattr(%s) through the mount succeeded, want EPERM", containersXattr)
	}
	if got := statLine(mp("keep.txt")); got != "33:44 0644 file" {
		t.Errorf("%s: after the refused xattr changes keep.txt shows %q", prog.name, got)
	}
	m.unmount(t)

	// A second mount reads what the first one wrote.
	m = storageMount(t, prog, s.home, s.rwOpts("xattr_permissions=2"), s.merged)
	checkStats(t, prog, s.merged, map[string]string{
		"keep.txt":  "33:44 0644 file",
		"home/user": "9:9 0755 dir",
	}, true, "after a remount")
	checkStats(t, prog, s.merged, map[string]string{
		"home/user/own.txt": "1000:1000 0644 file",
		"new-dir":           "0:0 0700 dir",
	}, false, "after a remount")
	m.unmount(t)
}

// xpermUIDMapping: xattr_permissions=2 with containers/storage's id
// mapping: the override holds container ids, as real owners would, and the
// mapping applies on top of it (fuse-overlayfs: rpl_stat() maps what
// override_mode() read; chown maps back, then writes the xattr).
func xpermUIDMapping(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	forceMask(t, s, map[string]string{"home/user": "1000:1000", "home/user/own.txt": "1000:1000"})
	testutil.OpenUp(t, s.merged)
	m := storageMount(t, prog, s.home, s.rwOpts("uidmapping=:0:100000:65536,gidmapping=:0:100000:65536,xattr_permissions=2"), s.merged)
	mp := func(rel string) string { return filepath.Join(s.merged, rel) }
	checkStats(t, prog, s.merged, map[string]string{".": "100000:100000 0755 dir"}, false, "the upper root through uidmapping")
	checkStats(t, prog, s.merged, map[string]string{
		"etc/passwd":        "100000:100000 0644 file",
		"home/user/own.txt": "101000:101000 0644 file",
	}, true, "through the override and uidmapping")
	if err := os.Lchown(mp("keep.txt"), 101000, 102000); err != nil {
		t.Errorf("%s: chown 101000:102000 through the mount: %v", prog.name, err)
	}
	if err := asUser(100000, 100000, s.merged, "echo x > by-ctr-root.txt && mkdir by-ctr-root.d"); err != nil {
		t.Errorf("%s: the container's root (uid 100000) creating through the mount: %v", prog.name, err)
	}
	checkStats(t, prog, s.merged, map[string]string{
		"keep.txt":      "101000:102000 0644 file",
		"by-ctr-root.d": "100000:100000 0755 dir",
	}, true, "after changes through the override and uidmapping")
	// 1.10 ignores the umask (0755).
	checkStats(t, prog, s.merged, map[string]string{"by-ctr-root.txt": "100000:100000 0644 file"}, false, "after changes through the override and uidmapping")
	for rel, want := range map[string]string{"keep.txt": "1000:2000:", "by-ctr-root.txt": "0:0:", "by-ctr-root.d": "0:0:"} {
		p := filepath.Join(s.upper, rel)
		got := lxattr(p, containersXattr)
		switch {
		case strings.HasPrefix(got, want):
		case prog.name == "goverlay":
			t.Errorf("upper %s has %s=%q, want container ids %s...", rel, containersXattr, got, want)
		default:
			t.Logf("%s: upper %s has %s=%q, %s=%q", prog.name, rel, containersXattr, got, fuseUserXattr, lxattr(p, fuseUserXattr))
		}
		if got := statLine(p); !strings.HasPrefix(got, "0:0 ") {
			t.Errorf("%s: upper %s is really %q, want owned by the daemon (0:0)", prog.name, rel, got)
		}
	}
	m.unmount(t)
}

// xpermPrivileged: xattr_permissions=1, security.fuseoverlayfs.override_stat
// ("UID:GID:MODE", no type). A lower layer whose root carries it is read
// through it (fuse-overlayfs decides per layer, from the root), and changes
// through the mount go to it.
func xpermPrivileged(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	for rel, v := range map[string]string{".": "0:0:755", "etc/passwd": "5:6:640", "home/user": "1000:1000:750"} {
		p := filepath.Join(s.bottom, rel)
		if err := unix.Lsetxattr(p, privilegedXattr, []byte(v), 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	m := storageMount(t, prog, s.home, s.rwOpts("xattr_permissions=1"), s.merged)
	mp := func(rel string) string { return filepath.Join(s.merged, rel) }
	checkStats(t, prog, s.merged, map[string]string{
		"keep.txt": "0:0 0644 file", // the top layer keeps no overrides
	}, true, "through security.fuseoverlayfs.override_stat")
	// 1.10 fails these lookups (ENODATA, ENOENT).
	checkStats(t, prog, s.merged, map[string]string{
		"etc/passwd": "5:6 0640 file",
		"home/user":  "1000:1000 0750 dir",
	}, false, "through security.fuseoverlayfs.override_stat")
	if err := os.Lchown(mp("keep.txt"), 7, 8); err != nil {
		t.Errorf("%s: chown 7:8 through the mount: %v", prog.name, err)
	}
	if err := unix.Mkdir(mp("d1"), 0o711); err != nil {
		t.Errorf("%s: mkdir through the mount: %v", prog.name, err)
	}
	checkStats(t, prog, s.merged, map[string]string{"keep.txt": "7:8 0644 file"}, true, "after chown through security.fuseoverlayfs.override_stat")
	// 1.10: 0755.
	checkStats(t, prog, s.merged, map[string]string{"d1": "0:0 0711 dir"}, false, "after mkdir through security.fuseoverlayfs.override_stat")
	if got := statLine(filepath.Join(s.upper, "keep.txt")); !strings.HasPrefix(got, "0:0 ") {
		t.Errorf("%s: upper keep.txt is really %q, want owned by the daemon", prog.name, got)
	}
	if v := lxattr(filepath.Join(s.upper, "keep.txt"), privilegedXattr); !strings.HasPrefix(v, "7:8:") {
		t.Errorf("%s: upper keep.txt has %s=%q, want 7:8:...", prog.name, privilegedXattr, v)
	}
	m.unmount(t)
}

// xpermWithoutOption: without xattr_permissions, a lower layer whose root
// carries an override xattr is still read through it (fuse-overlayfs
// decides per layer, from the layer's root), while the upper keeps real
// owners: a chown through the mount changes the real owner of the copy,
// which also takes the image's owner and mode for real.
func xpermWithoutOption(t *testing.T, prog mountProgram) {
	s := newCSStore(t)
	storageLeakCheck(t, prog, s.home)
	forceMask(t, s, map[string]string{"home/user/own.txt": "1000:1000"})
	if err := unix.Removexattr(s.upper, containersXattr); err != nil {
		t.Fatal(err)
	}
	m := storageMount(t, prog, s.home, s.rwOpts("volatile"), s.merged)
	checkStats(t, prog, s.merged, map[string]string{
		"etc/passwd":        "0:0 0644 file",
		"home/user/own.txt": "1000:1000 0644 file",
	}, true, "a force_mask store without xattr_permissions")
	if err := os.Lchown(filepath.Join(s.merged, "etc/passwd"), 5, 6); err != nil {
		t.Errorf("%s: chown 5:6 through the mount: %v", prog.name, err)
	}
	want := map[string]string{"etc/passwd": "5:6 0644 file"}
	checkStats(t, prog, s.merged, want, true, "chown without xattr_permissions")
	checkStats(t, prog, s.upper, want, true, "the copy, really")
	m.unmount(t)
}
