package upper

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/lower"
)

func ownerMode(t *testing.T, p string) string {
	st := lstat(t, p)
	return fmt.Sprintf("%d:%d %o", st.Uid, st.Gid, st.Mode)
}

// TestCreateOverride: with owners kept in an override xattr, a new regular
// file or directory records its owner and mode there and is really the
// daemon's with mode 0755 (no set-id bits); a symlink, FIFO or device,
// which cannot carry user.* xattrs, is owned for real.
func TestCreateOverride(t *testing.T) {
	for _, mode := range []lower.OverrideMode{lower.OverrideContainers, lower.OverridePrivileged} {
		t.Run(mode.Xattr(), func(t *testing.T) {
			e := newEnv(t)
			e.up.Override = mode
			me := fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid())
			tests := []struct {
				name        string
				o           Object
				real, xattr string // xattr "" for none
			}{
				{"f", Object{Mode: unix.S_IFREG | 0o4710, Uid: 1000, Gid: 1001, Flags: unix.O_RDWR}, me + " 100755",
					map[lower.OverrideMode]string{lower.OverrideContainers: "1000:1001:4710:file", lower.OverridePrivileged: "1000:1001:4710"}[mode]},
				{"d", Object{Mode: unix.S_IFDIR | 0o700, Uid: 5, Gid: 6}, me + " 40755",
					map[lower.OverrideMode]string{lower.OverrideContainers: "5:6:0700:dir", lower.OverridePrivileged: "5:6:700"}[mode]},
				{"fifo", Object{Mode: unix.S_IFIFO | 0o640, Uid: 5, Gid: 6}, "5:6 10640", ""},
			}
			if mode == lower.OverridePrivileged {
				// security.* xattrs may be set on a FIFO.
				tests[2].real, tests[2].xattr = me+" 10755", "5:6:640"
			}
			for _, tc := range tests {
				fd, err := e.l.Create(e.up.Root(), tc.name, tc.o, OverNothing)
				if err != nil {
					t.Fatalf("Create(%s): %v", tc.name, err)
				}
				if fd >= 0 {
					unix.Close(fd)
				}
				p := e.upper(tc.name)
				if got := ownerMode(t, p); got != tc.real {
					t.Errorf("%s: really %s, want %s", tc.name, got, tc.real)
				}
				if tc.xattr == "" {
					noXattr(t, p, lower.OverrideContainersXattr)
				} else {
					xattrIs(t, p, mode.Xattr(), tc.xattr)
				}
			}
			e.wantWorkEmpty(t)
		})
	}
}

// TestCopyUpOverride: a copy-up into an upper layer that keeps owners in
// an xattr records the source's owner and mode as the mount shows them
// (its override, or its real ones) and is the daemon's, mode 0755; a
// source's override xattr is replaced, not doubled. Without an override
// mode on the upper, a source's override becomes the real owner and mode
// and its xattr is copied as it is.
func TestCopyUpOverride(t *testing.T) {
	me := fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid())
	e := newEnv(t)
	e.up.Override = lower.OverrideContainers
	writeFile(t, e.lower("plain"), "x", 0o640)
	if err := os.Lchown(e.lower("plain"), 7, 8); err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.lower("masked"), "x", 0o600)
	lset(t, e.lower("masked"), lower.OverrideContainersXattr, []byte("1000:1000:0644:file"))
	writeFile(t, e.lower("dev"), "", 0o600)
	lset(t, e.lower("dev"), lower.OverrideContainersXattr, []byte("0:0:0666:char-1-3"))

	for name, want := range map[string]string{"plain": "7:8:0640:file", "masked": "1000:1000:0644:file", "dev": "0:0:0666:char-1-3"} {
		src := e.source(t, name)
		o := lower.OverrideOf(&src.Stat)
		if v, err := lower.ParseOverride([]byte(map[string]string{"masked": "1000:1000:0644:file", "dev": "0:0:0666:char-1-3"}[name])); err == nil {
			o = v
		}
		src.Override = &o
		if err := e.l.CopyUp(src, e.up.Root(), name, true, 0); err != nil {
			t.Fatalf("CopyUp(%s): %v", name, err)
		}
		if got := ownerMode(t, e.upper(name)); got != me+" 100755" {
			t.Errorf("%s: the copy is really %s, want %s 100755", name, got, me)
		}
		xattrIs(t, e.upper(name), lower.OverrideContainersXattr, want)
	}

	// An upper without overrides: the override becomes real.
	e2 := newEnv(t)
	writeFile(t, e2.lower("masked"), "x", 0o600)
	lset(t, e2.lower("masked"), lower.OverrideContainersXattr, []byte("1000:1000:0644:file"))
	src := e2.source(t, "masked")
	o := lower.Override{Uid: 1000, Gid: 1000, Mode: unix.S_IFREG | 0o644}
	src.Override = &o
	if err := e2.l.CopyUp(src, e2.up.Root(), "masked", true, 0); err != nil {
		t.Fatal(err)
	}
	if got := ownerMode(t, e2.upper("masked")); got != "1000:1000 100644" {
		t.Errorf("without overrides on the upper, the copy is really %s, want 1000:1000 100644", got)
	}
	xattrIs(t, e2.upper("masked"), lower.OverrideContainersXattr, "1000:1000:0644:file")
}
