package overlay

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMknodRegular: mknod(2) of regular files makes them, with their mode,
// and leaves no fd open in the daemon.
func TestMknodRegular(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn})
	fds := openFDs(t)
	const files = 20
	for i := range files {
		p := mnt + "/r" + string(rune('a'+i))
		if err := unix.Mknod(p, unix.S_IFREG|0o640, 0); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(up+"/r"+string(rune('a'+i)), &st); err != nil {
			t.Fatal(err)
		} else if st.Mode != unix.S_IFREG|0o640 || st.Size != 0 {
			t.Errorf("r%c in the upper: mode %o size %d", 'a'+i, st.Mode, st.Size)
		}
	}
	// A few fds may come and go with the daemon's own work; one per
	// file would be a leak.
	if grown := openFDs(t) - fds; grown > 4 {
		t.Errorf("%d mknods left %d more fds open in the daemon", files, grown)
	}
}

// TestCreateOnTakenName: a create the kernel sends for a name it believes
// free, where the upper layer has something by now, is answered as the
// upper says: EEXIST for a file, and over a whiteout the new file, with
// the whiteout gone.
func TestCreateOnTakenName(t *testing.T) {
	lo, up, work := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lo+"/w", "lower")
	mnt, _ := mountFS(t, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: NoSecOn})
	// The kernel caches both names as missing.
	for _, name := range []string{"x", "w2"} {
		if _, err := os.Lstat(mnt + "/" + name); !os.IsNotExist(err) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	write(t, up+"/x", "behind the mount")
	_, err := unix.Open(mnt+"/x", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if !errors.Is(err, unix.EEXIST) {
		t.Errorf("create of a name taken in the upper: %v, want EEXIST", err)
	}
	if got := readFile(t, up+"/x"); got != "behind the mount" {
		t.Errorf("the upper file was changed: %q", got)
	}

	// A whiteout put in the upper behind the mount, on a name the
	// kernel has cached as missing.
	if err := unix.Mknod(up+"/w2", unix.S_IFCHR|0o600, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mnt+"/w2", []byte("new"), 0o644); err != nil {
		t.Fatalf("create over a whiteout: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(up+"/w2", &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Errorf("w2 in the upper: mode %o, %v: want the new file", st.Mode, err)
	}
	if got := readFile(t, mnt+"/w2"); got != "new" {
		t.Errorf("w2 through the mount: %q", got)
	}
	// A directory made through the mount holds no whiteout, and its
	// creates do not look for one; a name taken behind the mount still
	// fails each kind of create with EEXIST.
	if err := os.Mkdir(mnt+"/new", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f", "d", "l", "p"} {
		if _, err := os.Lstat(mnt + "/new/" + name); !os.IsNotExist(err) {
			t.Fatalf("new/%s: %v", name, err)
		}
		write(t, up+"/new/"+name, "taken")
	}
	_, err = unix.Open(mnt+"/new/f", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	for what, err := range map[string]error{
		"create":  err,
		"mkdir":   unix.Mkdir(mnt+"/new/d", 0o755),
		"symlink": unix.Symlink("t", mnt+"/new/l"),
		"mkfifo":  unix.Mkfifo(mnt+"/new/p", 0o644),
	} {
		if !errors.Is(err, unix.EEXIST) {
			t.Errorf("%s on a name taken in a new directory: %v, want EEXIST", what, err)
		}
	}
	for _, name := range []string{"f", "d", "l", "p"} {
		if got := readFile(t, up+"/new/"+name); got != "taken" {
			t.Errorf("new/%s in the upper: %q", name, got)
		}
	}

	es, err := os.ReadDir(work + "/work")
	if err != nil {
		es, _ = os.ReadDir(work)
	}
	for _, e := range es {
		if e.Name() != "work" && e.Name() != "index" {
			t.Errorf("left in the workdir: %s", e.Name())
		}
	}
}
