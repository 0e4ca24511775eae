package upper

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pkg/xattr"
	"golang.org/x/sys/unix"
)

// acl builds an ACL xattr from "tag:id:perm" entries, the tag one of
// u, U (named user), g, G (named group), m, o; ids of the unnamed entries
// are the kernel's ACL_UNDEFINED_ID.
func acl(entries ...string) []byte {
	tags := map[string]uint16{"u": aclUserObj, "U": aclUser, "g": aclGroupObj, "G": aclGroup, "m": aclMask, "o": aclOther}
	var es []aclEntry
	for _, s := range entries {
		f := strings.Split(s, ":")
		id, err := strconv.ParseUint(f[1], 10, 32)
		if f[1] == "" {
			id, err = 1<<32-1, nil
		}
		perm, perr := strconv.ParseUint(f[2], 8, 16)
		if len(f) != 3 || err != nil || perr != nil {
			panic("bad ACL entry " + s)
		}
		es = append(es, aclEntry{tag: tags[f[0]], perm: uint16(perm), id: uint32(id)})
	}
	return formatACL(es)
}

// aclString renders an ACL xattr for messages.
func aclString(b []byte) string {
	if b == nil {
		return "none"
	}
	es, err := parseACL(b)
	if err != nil {
		return fmt.Sprintf("%x (%v)", b, err)
	}
	names := map[uint16]string{aclUserObj: "u", aclUser: "U", aclGroupObj: "g", aclGroup: "G", aclMask: "m", aclOther: "o"}
	var s []string
	for _, e := range es {
		id := ""
		if e.tag == aclUser || e.tag == aclGroup {
			id = fmt.Sprint(e.id)
		}
		s = append(s, fmt.Sprintf("%s:%s:%o", names[e.tag], id, e.perm))
	}
	return strings.Join(s, ",")
}

func TestInherit(t *testing.T) {
	const (
		reg = unix.S_IFREG
		dir = unix.S_IFDIR
		lnk = unix.S_IFLNK
		fif = unix.S_IFIFO
	)
	base := acl("u::7", "g::5", "o::0")
	named := acl("u::7", "U:1234:7", "g::5", "m::7", "o::5")
	narrow := acl("u::7", "U:1234:7", "g::7", "G:5678:6", "m::5", "o::7")
	for _, tc := range []struct {
		name        string
		def         []byte
		mode, umask uint32
		want        Inherited
	}{
		{"no default: umask", nil, reg | 0o666, 0o022, Inherited{Mode: reg | 0o644}},
		{"no default: umask 077 dir", nil, dir | 0o777, 0o077, Inherited{Mode: dir | 0o700}},
		{"no default: special bits kept", nil, dir | 0o3777, 0o027, Inherited{Mode: dir | 0o3750}},
		{"empty default is none", acl(), reg | 0o666, 0o022, Inherited{Mode: reg | 0o644}},
		{"symlink: nothing", named, lnk | 0o777, 0o077, Inherited{Mode: lnk | 0o777}},
		{"symlink without default: no umask", nil, lnk | 0o777, 0o022, Inherited{Mode: lnk | 0o777}},
		// Only the base entries: the mode says it all, but the ACL, not
		// the umask, narrows it.
		{"base only file", base, reg | 0o666, 0o077, Inherited{Mode: reg | 0o640}},
		{"base only dir", base, dir | 0o777, 0o077, Inherited{Mode: dir | 0o750, Default: base}},
		{"base only sgid dir", base, dir | 0o2777, 0, Inherited{Mode: dir | 0o2750, Default: base}},
		{"named user file", named, reg | 0o666, 0o077, Inherited{
			Mode:   reg | 0o664,
			Access: acl("u::6", "U:1234:7", "g::5", "m::6", "o::4"),
		}},
		{"named user dir", named, dir | 0o777, 0o022, Inherited{
			Mode:    dir | 0o775,
			Access:  named,
			Default: named,
		}},
		{"named user fifo 0600", named, fif | 0o600, 0o022, Inherited{
			Mode:   fif | 0o600,
			Access: acl("u::6", "U:1234:7", "g::5", "m::0", "o::0"),
		}},
		// The mask, not the group entry, meets the group bits.
		{"narrow mask file", narrow, reg | 0o666, 0, Inherited{
			Mode:   reg | 0o646,
			Access: acl("u::6", "U:1234:7", "g::7", "G:5678:6", "m::4", "o::6"),
		}},
		{"narrow mask dir", narrow, dir | 0o755, 0o077, Inherited{
			Mode:    dir | 0o755,
			Access:  acl("u::7", "U:1234:7", "g::7", "G:5678:6", "m::5", "o::5"),
			Default: narrow,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Inherit(tc.def, tc.mode, tc.umask)
			if err != nil {
				t.Fatal(err)
			}
			if got.Mode != tc.want.Mode {
				t.Errorf("mode %#o, want %#o", got.Mode, tc.want.Mode)
			}
			if !bytes.Equal(got.Access, tc.want.Access) {
				t.Errorf("access ACL %s, want %s", aclString(got.Access), aclString(tc.want.Access))
			}
			if !bytes.Equal(got.Default, tc.want.Default) {
				t.Errorf("default ACL %s, want %s", aclString(got.Default), aclString(tc.want.Default))
			}
		})
	}
}

func TestInheritMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		def  []byte
	}{
		{"short", []byte{2, 0}},
		{"ragged", append(acl("u::7", "g::5", "o::0"), 1)},
		{"version 1", append([]byte{1, 0, 0, 0}, acl("u::7", "g::5", "o::0")[4:]...)},
		{"unknown tag", formatACL([]aclEntry{{tag: aclUserObj, perm: 7}, {tag: 0x40, perm: 7}, {tag: aclGroupObj, perm: 5}, {tag: aclOther}})},
		{"no group entry", formatACL([]aclEntry{{tag: aclUserObj, perm: 7}, {tag: aclOther}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Inherit(tc.def, unix.S_IFREG|0o666, 0o022)
			if !errors.Is(err, unix.EIO) {
				t.Errorf("got %v, want EIO", err)
			}
		})
	}
}

// TestInheritLikeKernel: Inherit gives what the kernel gives an object
// created in place in a directory with a default ACL, on the filesystem of
// the test's temporary directory.
func TestInheritLikeKernel(t *testing.T) {
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Skip("setfacl not installed")
	}
	root := t.TempDir()
	for i, spec := range []string{
		"",
		"u::rwx,g::r-x,o::---",
		"u::rw-,g::rwx,o::r--",
		"u:1234:rwx,g::r-x",
		"u:1234:rwx,g:5678:rw-,m::r-x,o::rwx",
		"u::r-x,g:5678:rwx,m::-wx,o::--x",
	} {
		d := filepath.Join(root, fmt.Sprint(i))
		mkdir(t, d)
		if spec != "" {
			if out, err := exec.Command("setfacl", "-d", "-m", spec, d).CombinedOutput(); err != nil {
				t.Skipf("setfacl: %v: %s", err, out)
			}
		}
		def, err := xattr.Get(d, ACLDefaultXattr)
		if spec == "" {
			def, err = nil, nil
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, umask := range []uint32{0, 0o022, 0o077} {
			for _, mode := range []uint32{
				unix.S_IFREG | 0o666, unix.S_IFREG | 0o4751, unix.S_IFDIR | 0o777, unix.S_IFDIR | 0o1750,
				unix.S_IFIFO | 0o640, unix.S_IFLNK | 0o777,
			} {
				name := fmt.Sprintf("%o-%o", umask, mode)
				p := filepath.Join(d, name)
				t.Run(fmt.Sprintf("%q/%s", spec, name), func(t *testing.T) {
					withUmask(t, int(umask))
					var err error
					switch mode & unix.S_IFMT {
					case unix.S_IFREG:
						var fd int
						if fd, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, mode&07777); err == nil {
							unix.Close(fd)
						}
					case unix.S_IFDIR:
						err = unix.Mkdir(p, mode&07777)
					case unix.S_IFLNK:
						err = unix.Symlink("t", p)
					default:
						err = unix.Mknod(p, mode, 0)
					}
					if err != nil {
						t.Fatal(err)
					}
					want := lstat(t, p).Mode
					got, err := Inherit(def, mode, umask)
					if err != nil {
						t.Fatal(err)
					}
					if got.Mode != want {
						t.Errorf("mode %#o, the kernel's %#o", got.Mode, want)
					}
					for _, a := range []struct {
						name string
						v    []byte
					}{{ACLAccessXattr, got.Access}, {ACLDefaultXattr, got.Default}} {
						kv, err := xattr.LGet(p, a.name)
						if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP) {
							kv, err = nil, nil
						}
						if err != nil {
							t.Fatal(err)
						}
						if !bytes.Equal(a.v, kv) {
							t.Errorf("%s %s, the kernel's %s", a.name, aclString(a.v), aclString(kv))
						}
					}
				})
			}
		}
	}
}

// TestCreateACLs: Create gives a new object the ACLs of its Object, set
// before it has its name, whichever way it is made (O_TMPFILE, workdir and
// rename, over a whiteout), and nothing else: the upper directory's own
// default ACL does not reach an object built in the workdir.
func TestCreateACLs(t *testing.T) {
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Skip("setfacl not installed")
	}
	withUmask(t, 0o022)
	e := newEnv(t)
	mkdir(t, e.upper("acl"))
	if out, err := exec.Command("setfacl", "-d", "-m", "u:1234:rwx,g::r-x,o::---", e.upper("acl")).CombinedOutput(); err != nil {
		t.Skipf("setfacl: %v: %s", err, out)
	}
	def, err := xattr.Get(e.upper("acl"), ACLDefaultXattr)
	if err != nil {
		t.Fatal(err)
	}
	d := e.upperDir(t, "acl")
	mknod(t, e.upper("acl/wh"), unix.S_IFCHR, 0)
	for _, tc := range []struct {
		name  string
		mode  uint32
		flags int
		over  Over
		plain bool // no ACL in the Object
	}{
		{"tmpfile", unix.S_IFREG | 0o666, unix.O_WRONLY, OverNothing, false},
		{"workdir file", unix.S_IFREG | 0o640, unix.O_RDONLY, OverNothing, false},
		{"wh", unix.S_IFREG | 0o666, unix.O_RDWR, OverWhiteout, false},
		{"dir", unix.S_IFDIR | 0o777, 0, OverNothing, false},
		{"fifo", unix.S_IFIFO | 0o660, 0, OverNothing, false},
		{"plain tmpfile", unix.S_IFREG | 0o644, unix.O_WRONLY, OverNothing, true},
		{"plain workdir file", unix.S_IFREG | 0o644, unix.O_RDONLY, OverNothing, true},
		{"plain dir", unix.S_IFDIR | 0o755, 0, OverNothing, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "_")
			in := Inherited{Mode: tc.mode}
			if !tc.plain {
				if in, err = Inherit(def, tc.mode, 0o022); err != nil {
					t.Fatal(err)
				}
				if in.Access == nil {
					t.Fatal("the test's default ACL must give an access ACL")
				}
			}
			o := Object{Mode: in.Mode, Flags: tc.flags, ACL: in.Access, DefaultACL: in.Default}
			fd, err := e.l.Create(d, name, o, tc.over)
			if err != nil {
				t.Fatal(err)
			}
			if fd >= 0 {
				unix.Close(fd)
			}
			p := e.upper("acl/" + name)
			if st := lstat(t, p); st.Mode != in.Mode {
				t.Errorf("mode %#o, want %#o", st.Mode, in.Mode)
			}
			for _, a := range []struct {
				name string
				v    []byte
			}{{ACLAccessXattr, in.Access}, {ACLDefaultXattr, in.Default}} {
				if a.v == nil {
					noXattr(t, p, a.name)
					continue
				}
				if v, err := xattr.LGet(p, a.name); err != nil || !bytes.Equal(v, a.v) {
					t.Errorf("%s = %s, %v; want %s", a.name, aclString(v), err, aclString(a.v))
				}
			}
			e.wantWorkEmpty(t)
		})
	}
	// An ACL the upper refuses fails the create, and leaves nothing.
	bad := Object{Mode: unix.S_IFDIR | 0o755, ACL: []byte{9, 9, 9}}
	if _, err := e.l.Create(d, "bad", bad, OverNothing); err == nil {
		t.Error("Create with a malformed ACL succeeded")
	}
	if _, err := os.Lstat(e.upper("acl/bad")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("acl/bad after a failed create: %v", err)
	}
	e.wantWorkEmpty(t)
}

func TestMapACL(t *testing.T) {
	shift := func(id uint32) (uint32, bool) { return id + 100000, true }
	onlyLow := func(id uint32) (uint32, bool) { return id, id < 10 }
	for _, c := range []struct {
		in          []byte
		user, group func(uint32) (uint32, bool)
		want        []byte
		err         error
	}{
		// Only the named entries carry ids.
		{acl("u::6", "U:5:6", "g::4", "G:7:4", "m::6", "o::0"), shift, shift,
			acl("u::6", "U:100005:6", "g::4", "G:100007:4", "m::6", "o::0"), nil},
		{acl("u::6", "g::4", "o::4"), onlyLow, onlyLow, acl("u::6", "g::4", "o::4"), nil},
		// An id with no mapping refuses the whole ACL.
		{acl("u::6", "U:50:6", "g::4", "m::6", "o::0"), onlyLow, shift, nil, unix.EINVAL},
		{acl("u::6", "g::4", "G:50:4", "m::6", "o::0"), shift, onlyLow, nil, unix.EINVAL},
		{[]byte{2, 0, 0}, shift, shift, nil, unix.EIO},
	} {
		got, err := MapACL(c.in, c.user, c.group)
		if !errors.Is(err, c.err) || (c.err == nil && !bytes.Equal(got, c.want)) {
			t.Errorf("MapACL(%s) = %s, %v; want %s, %v", aclString(c.in), aclString(got), err, aclString(c.want), c.err)
		}
	}
}
