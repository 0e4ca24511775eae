package oracle_test

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/testutil"
)

// scenarios are read-only views: the same layers must look the same
// through the kernel overlay and through goverlay.
var scenarios = []scenario{
	{
		name: "kernel-whiteouts", layers: 3, build: buildWhiteouts(false),
		present: []string{"b", "dir/z", "keep", "re/top", "only-bottom/f"},
		absent:  []string{"a", "gone", "gone/inner", "dir/x", "dir/y", "ghost", "re/bottom"},
	},
	{
		name: "opaque-xattr", layers: 3, build: buildOpaque(false),
		present: []string{"d/t", "d/m", "d2/y", "d2/sub/top", "newdir/n"},
		absent:  []string{"d/a", "d/sub", "d2/sub/x"},
	},
	{
		name: "shadowing", layers: 3, build: buildShadowing,
		present: []string{"f", "d/child", "d/mid", "m/t", "s", "n"},
		absent:  []string{"f/x", "d/old", "m/b", "s/inner", "n/inner"},
	},
	{
		name: "four-lowers", layers: 4, build: buildFourLowers,
		present: []string{"common/f0", "common/f1", "common/f2", "common/f3", "common/x", "l3only/deep/file"},
		absent:  []string{"common/hidden"},
	},
	{
		name: "deep", layers: 3, build: buildDeep,
		present: []string{deepPath(20) + "/leaf", deepPath(19) + "/from-mid", deepPath(5) + "/from-bottom"},
		absent:  []string{deepPath(15) + "/gone", deepPath(11) + "/below-opaque"},
	},
	{
		name: "odd-names", layers: 2, build: buildNames,
		present: []string{"with space", "colon:name", "new\nline", strings.Repeat("n", 255), "a=b,c"},
		absent:  []string{"gone\nline"},
	},
	{
		name: "symlinks", layers: 2, build: buildSymlinks,
		present: []string{"rel", "abs", "dangling", "outside", "todir", "chain", "long"},
	},
	{
		name: "special-files", layers: 2, build: buildSpecial,
		present: []string{"fifo", "sock", "null", "loop", "maxdev", "sub/fifo2"},
		check:   checkSpecial,
	},
	{
		name: "hard-links", layers: 2, build: buildHardLinks,
		present: []string{"a", "a2", "sub/a3", "b", "b-link", "c", "d", "d2"},
		absent:  []string{"c2"},
		check:   checkHardLinks,
	},
	{
		name: "modes", layers: 2, build: buildModes,
		present: []string{"m0000", "suid", "sgid", "sticky", "merged"},
	},
	{
		name: "owners", layers: 2, build: buildOwners,
		present: []string{"owned", "owned-dir/f", "owned-link", "owned-fifo"},
	},
	{
		name: "xattrs", layers: 2, build: buildXattrs,
		present: []string{"x", "many", "big", "merged", "link"},
		check:   checkXattrs,
	},
	{
		name: "acls", layers: 2, build: buildACLs,
		present: []string{"acl-file", "acl-dir", "merged/f"},
		check:   checkACLs,
	},
	{
		name: "sparse", layers: 2, build: buildSparse,
		present: []string{"holey", "allhole", "dense"},
		check:   checkSparse,
	},
	{
		name: "upper-as-top", layers: 3, upper: true, build: buildUpperTop,
		present: []string{"u", "dir/fromupper", "dir/fromlower", "opq/mine"},
		absent:  []string{"wo", "dir/wo", "opq/theirs"},
	},
	{
		name: "userxattr-opaque", layers: 2, kernelOpts: []string{"userxattr"}, build: buildUserOpaque,
		present: []string{"d/top", "e/top", "e/bottom"},
		absent:  []string{"d/bottom"},
	},
	{
		name: "xattr-whiteouts", layers: 2, build: buildXWhiteouts,
		present: []string{"d/keep", "d/top", "d/empty-but-not-whiteout"},
		absent:  []string{"d/gone"},
	},
}

func TestOracle(t *testing.T) {
	testutil.RequireRoot(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runOracle(t, sc)
		})
	}
}

// whiteout and opaque in the kernel's format or in AUFS's.
func wh(l *testutil.Layer, rel string, aufs bool) {
	if aufs {
		l.AufsWhiteout(rel)
	} else {
		l.Whiteout(rel)
	}
}

func opq(l *testutil.Layer, rel string, aufs bool) {
	if aufs {
		l.AufsOpaque(rel)
	} else {
		l.Opaque(rel)
	}
}

func buildWhiteouts(aufs bool) func(testing.TB, []*testutil.Layer) {
	return func(_ testing.TB, l []*testutil.Layer) {
		top, mid, bot := l[0], l[1], l[2]
		bot.File("a", "a", 0o644).File("b", "bottom b", 0o644).File("keep", "k", 0o644)
		bot.File("dir/x", "x", 0o644).File("dir/y", "y", 0o644)
		bot.File("gone/inner", "i", 0o644).File("re/bottom", "rb", 0o644)
		bot.File("only-bottom/f", "f", 0o600)
		wh(mid, "a", aufs)
		wh(mid, "b", aufs)
		wh(mid, "gone", aufs)
		mid.Dir("dir", 0o755)
		wh(mid, "dir/x", aufs)
		wh(mid, "ghost", aufs) // hides nothing
		wh(mid, "re", aufs)
		top.File("b", "top b", 0o644).File("dir/z", "z", 0o644)
		wh(top, "dir/y", aufs)
		top.File("re/top", "rt", 0o644)
	}
}

func buildOpaque(aufs bool) func(testing.TB, []*testutil.Layer) {
	return func(_ testing.TB, l []*testutil.Layer) {
		top, mid, bot := l[0], l[1], l[2]
		bot.File("d/a", "a", 0o644).File("d/sub/b", "b", 0o644)
		bot.File("d2/sub/x", "x", 0o644).File("d2/y", "y", 0o644)
		bot.Dir("bottom-opaque", 0o755).File("bottom-opaque/f", "f", 0o644)
		opq(bot, "bottom-opaque", aufs) // nothing below: no effect
		mid.File("d/m", "m", 0o644)
		opq(mid, "d", aufs)
		top.File("d/t", "t", 0o644)
		top.File("d2/sub/top", "t", 0o644)
		opq(top, "d2/sub", aufs)
		top.File("newdir/n", "n", 0o644)
		opq(top, "newdir", aufs) // opaque with nothing below
	}
}

func buildShadowing(_ testing.TB, l []*testutil.Layer) {
	top, mid, bot := l[0], l[1], l[2]
	bot.File("f/x", "x", 0o644)                // a dir ...
	top.File("f", "file over dir", 0o644)      // ... hidden by a file
	bot.File("d", "file", 0o644)               // a file ...
	top.File("d/child", "c", 0o644)            // ... hidden by a dir
	mid.File("d/mid", "m", 0o644)              // a dir in between is merged with the top one
	bot.File("m/b", "b", 0o644)                // dir at the bottom,
	mid.File("m", "file in the middle", 0o644) // file in the middle,
	top.File("m/t", "t", 0o644)                // dir on top: the file cuts the merge
	bot.File("s/inner", "i", 0o644)
	top.Symlink("s", "elsewhere") // a symlink hides a dir
	bot.File("n/inner", "i", 0o644)
	top.Mknod("n", unix.S_IFIFO|0o644, 0, 0) // a FIFO hides a dir
}

func buildFourLowers(_ testing.TB, l []*testutil.Layer) {
	for i, layer := range l {
		n := string(rune('0' + i))
		layer.File("common/f"+n, "from layer "+n, 0o644)
		layer.File("common/x", "x from layer "+n, 0o600+os.FileMode(i))
		layer.Dir("common", 0o755-os.FileMode(i)*0o10) // the top's mode wins
		layer.Chown("common", 1000+i, 2000+i)
	}
	l[3].File("common/hidden", "h", 0o644)
	l[1].Whiteout("common/hidden")
	l[3].File("l3only/deep/file", "deep", 0o644)
	l[2].File("l3only/other", "o", 0o644)
}

func deepPath(n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = "d" + itoa(i+1)
	}
	return strings.Join(p, "/")
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func buildDeep(_ testing.TB, l []*testutil.Layer) {
	top, mid, bot := l[0], l[1], l[2]
	for d := 1; d <= 20; d++ {
		switch d % 3 {
		case 0:
			top.File(deepPath(d)+"/at"+itoa(d), "top", 0o644)
		case 1:
			mid.File(deepPath(d)+"/at"+itoa(d), "mid", 0o644)
		case 2:
			bot.File(deepPath(d)+"/at"+itoa(d), "bottom", 0o644)
		}
	}
	top.File(deepPath(20)+"/leaf", "leaf", 0o644)
	mid.File(deepPath(19)+"/from-mid", "m", 0o644)
	bot.File(deepPath(5)+"/from-bottom", "b", 0o644)
	bot.File(deepPath(15)+"/gone", "g", 0o644)
	top.Whiteout(deepPath(15) + "/gone")
	bot.File(deepPath(11)+"/below-opaque", "b", 0o644)
	mid.Dir(deepPath(10), 0o755).Opaque(deepPath(10))
}

func buildNames(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	long := strings.Repeat("n", 255)
	for _, n := range []string{"with space", " leading space", "trailing space ", "colon:name", "a=b,c", "back\\slash", "tab\tname"} {
		bot.File(n, "bottom "+n, 0o644)
	}
	top.File("with space", "top wins", 0o644)
	bot.File("new\nline", "nl", 0o644).File("gone\nline", "g", 0o644)
	top.Whiteout("gone\nline")
	top.File(long, "255 bytes", 0o644)
	bot.File(strings.Repeat("d", 255)+"/"+strings.Repeat("f", 255), "deep long", 0o644)
	top.File(strings.Repeat("d", 255)+"/"+strings.Repeat("g", 254)+":", "top long", 0o644)
	top.File("ünïcödé ☃", "u", 0o644).File("-dash", "-", 0o644).File("...", "dots", 0o644).File(".hidden", "h", 0o644)
	top.Dir("dir with space:and colon", 0o755).File("dir with space:and colon/x y", "x", 0o644)
	bot.File("dir with space:and colon/z\nz", "z", 0o644)
}

func buildSymlinks(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	bot.File("file", "target", 0o644).File("dir/inner", "i", 0o644)
	top.Symlink("rel", "file")
	top.Symlink("abs", "/etc/passwd")
	top.Symlink("dangling", "nowhere/at/all")
	top.Symlink("outside", "../../../../../../etc/hostname")
	bot.Symlink("todir", "dir")
	bot.Symlink("chain", "rel")
	bot.Symlink("dir/up", "../file")
	top.Symlink("long", strings.Repeat("x/", 1500)+"end")
	top.Symlink("odd\ntarget", "a\nb c:d")
	top.Xattr("rel", "trusted.sym", "on a symlink")
	bot.Symlink("shadowed", "bottom-target")
	top.Symlink("shadowed", "top-target")
}

func buildSpecial(t testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	top.Mknod("fifo", unix.S_IFIFO|0o644, 0, 0)
	bot.Mknod("sub/fifo2", unix.S_IFIFO|0o600, 0, 0)
	top.Mknod("sock", unix.S_IFSOCK|0o755, 0, 0)
	top.Mknod("null", unix.S_IFCHR|0o666, 1, 3)
	bot.Mknod("tty", unix.S_IFCHR|0o620, 136, 5)
	top.Mknod("loop", unix.S_IFBLK|0o660, 7, 0)
	bot.Mknod("sda1", unix.S_IFBLK|0o660, 8, 1)
	top.Mknod("maxdev", unix.S_IFCHR|0o600, 4095, 1<<20-1)
	bot.Mknod("bigminor", unix.S_IFBLK|0o600, 259, 65536)
	listenSocket(t, top, "listened.sock")
}

func buildHardLinks(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	bot.File("a", "a", 0o644).Link("a", "a2").Link("a", "sub/a3")
	top.File("b", "b", 0o644).Link("b", "b-link")
	bot.File("c", "c", 0o644).Link("c", "c2")
	top.Whiteout("c2") // c stays, still with nlink 2
	bot.File("d", "d", 0o644).Link("d", "d2")
	top.File("d2", "shadows one link", 0o644)
	bot.Mknod("fifo", unix.S_IFIFO|0o644, 0, 0).Link("fifo", "fifo-link")
	bot.Symlink("sym", "a").Link("sym", "sym-link")
}

func buildModes(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	top.File("m0000", "zero", 0)
	top.File("m0777", "all", 0o777)
	top.File("m0444", "ro", 0o444)
	top.File("suid", "s", 0o755|os.ModeSetuid)
	top.File("sgid", "s", 0o755|os.ModeSetgid)
	bot.File("suid-sgid", "s", 0o750|os.ModeSetuid|os.ModeSetgid)
	bot.File("all-special", "s", 0o777|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
	top.Dir("sticky", 0o777|os.ModeSticky)
	bot.Dir("sgid-dir", 0o775|os.ModeSetgid)
	bot.Dir("d0000", 0).Dir("d0700", 0o700)
	bot.File("d0700/inside", "i", 0o600)
	bot.Dir("merged", 0o700).File("merged/b", "b", 0o644)
	top.Dir("merged", 0o751).File("merged/t", "t", 0o640)
	bot.Mknod("fifo0000", unix.S_IFIFO, 0, 0)
}

func buildOwners(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	top.File("owned", "o", 0o644).Chown("owned", 1234, 5678)
	bot.File("owned-dir/f", "f", 0o644).Chown("owned-dir", 1234, 5678).Chown("owned-dir/f", 0, 5678)
	top.Symlink("owned-link", "owned").Chown("owned-link", 1234, 5678)
	bot.Mknod("owned-fifo", unix.S_IFIFO|0o644, 0, 0).Chown("owned-fifo", 65534, 65534)
	bot.Dir("merged", 0o755).Chown("merged", 1, 1).File("merged/b", "b", 0o644)
	top.Dir("merged", 0o755).Chown("merged", 1234, 5678).File("merged/t", "t", 0o644)
	top.File("suid-owned", "s", 0o644).Chown("suid-owned", 1234, 5678).Chmod("suid-owned", 0o755|os.ModeSetuid|os.ModeSetgid)
}

func buildXattrs(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	top.File("x", "x", 0o644).Xattr("x", "user.foo", "bar").Xattr("x", "user.empty", "")
	top.Xattr("x", "user.bin", "\x00\x01\xff\n").Xattr("x", "security.test", "sec").Xattr("x", "trusted.foo", "tru")
	top.Xattr("x", "trusted.overlay.custom", "hidden").Xattr("x", "trusted.overlayfoo", "not private")
	bot.File("many", "m", 0o644)
	for i := range 40 {
		bot.Xattr("many", "user.k"+itoa(i), strings.Repeat("v", i))
	}
	bot.File("big", "b", 0o644).Xattr("big", "user.big", strings.Repeat("B", 3000))
	bot.Dir("merged", 0o755).Xattr("merged", "user.bottom", "b").File("merged/f", "f", 0o644)
	top.Dir("merged", 0o755).Xattr("merged", "user.top", "t")
	bot.Symlink("link", "x").Xattr("link", "trusted.link", "l")
	bot.Mknod("fifo", unix.S_IFIFO|0o644, 0, 0).Xattr("fifo", "trusted.fifo", "f")
	top.Xattr(".", "user.root", "r")
}

func buildACLs(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	top.File("acl-file", "a", 0o640).Setfacl("acl-file", "-m", "u:1234:rw-,g:5678:r--,m::rw-")
	bot.Dir("acl-dir", 0o750).Setfacl("acl-dir", "-m", "u:1234:rwx").Setfacl("acl-dir", "-d", "-m", "u:1234:r-x,g::r-x")
	bot.Dir("merged", 0o755).Setfacl("merged", "-m", "u:99:rwx").File("merged/f", "f", 0o644)
	top.Dir("merged", 0o755).Setfacl("merged", "-m", "u:1234:r-x")
}

func buildSparse(t testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	sparse(t, top.P("holey"), 4<<20, []byte("end of a holey file"))
	sparse(t, bot.P("allhole"), 16<<20, nil)
	bot.File("dense", strings.Repeat("d", 64<<10), 0o644)
}

func buildUpperTop(_ testing.TB, l []*testutil.Layer) {
	up, mid, bot := l[0], l[1], l[2]
	bot.File("wo", "whited out by the upper", 0o644)
	bot.File("dir/fromlower", "l", 0o644).File("dir/wo", "w", 0o644)
	bot.File("opq/theirs", "t", 0o644)
	mid.File("dir/mid", "m", 0o644)
	up.File("u", "upper", 0o644).File("dir/fromupper", "u", 0o644)
	up.Whiteout("wo").Whiteout("dir/wo")
	up.File("opq/mine", "m", 0o644).Opaque("opq")
	up.Xattr("dir", "trusted.overlay.origin", "") // private: hidden
}

func buildUserOpaque(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	bot.File("d/bottom", "b", 0o644).File("e/bottom", "b", 0o644)
	top.File("d/top", "t", 0o644).Xattr("d", "user.overlay.opaque", "y")
	top.File("e/top", "t", 0o644).Xattr("e", "user.overlay.opaque", "n")
}

// buildXWhiteouts uses the 6.7+ xattr whiteouts: a directory marked
// overlay.opaque=x may hold empty files with an overlay.whiteout xattr.
func buildXWhiteouts(_ testing.TB, l []*testutil.Layer) {
	top, bot := l[0], l[1]
	bot.File("d/keep", "k", 0o644).File("d/gone", "g", 0o644).File("d/empty-but-not-whiteout", "e", 0o644)
	top.File("d/top", "t", 0o644).Xattr("d", "trusted.overlay.opaque", "x")
	top.File("d/gone", "", 0o644).Xattr("d/gone", "trusted.overlay.whiteout", "")
}

// claim fails t when cond is false: a scenario that does not hold on the
// kernel overlay tests nothing.
func claim(t testing.TB, cond bool, format string, a ...any) {
	t.Helper()
	if !cond {
		t.Errorf("scenario broken on the kernel overlay: "+format, a...)
	}
}

func checkHardLinks(t testing.TB, kt testutil.Tree) {
	claim(t, kt["a"].Link == "a" && kt["a2"].Link == "a" && kt["sub/a3"].Link == "a", "a, a2, sub/a3 not one group")
	claim(t, kt["b"].Link == "b" && kt["b-link"].Link == "b", "b, b-link not one group")
	claim(t, kt["c"].Link == "" && kt["c"].Nlink == 2, "c: link %q nlink %d", kt["c"].Link, kt["c"].Nlink)
	claim(t, kt["d"].Link == "" && kt["d2"].Link == "", "d and d2 grouped")
	claim(t, kt["fifo"].Link == "fifo" && kt["sym"].Link == "sym", "fifo or symlink hard links not grouped")
}

func checkXattrs(t testing.TB, kt testutil.Tree) {
	x := kt["x"].Xattrs
	claim(t, x["user.foo"] == "bar" && x["trusted.foo"] == "tru" && x["security.test"] == "sec", "xattrs of x: %q", x)
	claim(t, x["trusted.overlayfoo"] == "not private", "trusted.overlayfoo missing: %q", x)
	claim(t, len(kt["many"].Xattrs) == 40, "many has %d xattrs", len(kt["many"].Xattrs))
	m := kt["merged"].Xattrs
	claim(t, m["user.top"] == "t" && m["user.bottom"] == "", "merged dir xattrs %q", m)
}

func checkACLs(t testing.TB, kt testutil.Tree) {
	claim(t, kt["acl-file"].Xattrs["system.posix_acl_access"] != "", "acl-file has no ACL: %q", kt["acl-file"].Xattrs)
	claim(t, kt["acl-dir"].Xattrs["system.posix_acl_default"] != "", "acl-dir has no default ACL: %q", kt["acl-dir"].Xattrs)
}

func checkSparse(t testing.TB, kt testutil.Tree) {
	claim(t, kt["holey"].Size == 4<<20 && kt["holey"].Blocks < 64, "holey: size %d blocks %d", kt["holey"].Size, kt["holey"].Blocks)
	claim(t, kt["allhole"].Blocks == 0, "allhole has %d blocks", kt["allhole"].Blocks)
}

func checkSpecial(t testing.TB, kt testutil.Tree) {
	claim(t, kt["sock"].Type == "socket" && kt["listened.sock"].Type == "socket", "sockets: %s %s", kt["sock"].Type, kt["listened.sock"].Type)
	claim(t, kt["maxdev"].Rdev == unix.Mkdev(4095, 1<<20-1), "maxdev rdev %#x", kt["maxdev"].Rdev)
	claim(t, kt["loop"].Type == "blockdev" && kt["null"].Type == "chardev", "device types")
}
