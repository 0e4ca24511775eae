// Command helper performs file operations for the privilege-removal tests,
// as whatever user and with whatever capabilities it was started with.
//
//	helper OP PATH [OP PATH ...]
//
// It first prints "id uid=U gid=G groups=G1,G2 capeff=HEX", then one line
// per operation: "OP PATH ok" or "OP PATH err ERROR". It exits 1 if any
// operation failed, 2 on bad usage.
//
// Operations:
//
//	openrw     open O_RDWR and close (a copy-up, nothing written)
//	write      open O_WRONLY|O_APPEND, write one byte (the shell's >>)
//	otrunc     open O_WRONLY|O_CREAT|O_TRUNC (the shell's : >)
//	truncate   truncate(2) to 1 byte
//	ftruncate  open O_WRONLY, ftruncate(2) to 1 byte
//	chown      chown(2) to 0:0
//	fallocate  open O_WRONLY, fallocate(2) mode 0, 8192 bytes from 0
//	mmap       open O_RDWR, mmap MAP_SHARED, store one byte, msync, munmap
//	copyrange  open O_RDWR, copy_file_range(2) of the first byte to the end
//	writes=N   open O_WRONLY|O_APPEND, N writes of 1 KiB on that one fd
//	state      print "state PATH ok MODE CAP": the 07777 bits in octal, and
//	           "cap", "nocap" or "absent" for security.capability
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

func main() {
	args := os.Args[1:]
	if len(args) == 0 || len(args)%2 != 0 {
		fmt.Fprintln(os.Stderr, "usage: helper OP PATH [OP PATH ...]")
		os.Exit(2)
	}
	groups, _ := unix.Getgroups()
	gs := make([]string, len(groups))
	for i, g := range groups {
		gs[i] = strconv.Itoa(g)
	}
	fmt.Printf("id uid=%d gid=%d groups=%s capeff=%s\n", unix.Geteuid(), unix.Getegid(), strings.Join(gs, ","), capEff())
	failed := false
	for i := 0; i < len(args); i += 2 {
		op, path := args[i], args[i+1]
		if op == "state" {
			if st, err := state(path); err != nil {
				failed = true
				fmt.Printf("%s %s err %v\n", op, path, err)
			} else {
				fmt.Printf("%s %s ok %s\n", op, path, st)
			}
			continue
		}
		if err := do(op, path); err != nil {
			failed = true
			fmt.Printf("%s %s err %v\n", op, path, err)
		} else {
			fmt.Printf("%s %s ok\n", op, path)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// capEff is the CapEff line of /proc/self/status.
func capEff() string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return "?"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func do(op, path string) error {
	switch op {
	case "openrw":
		return withFd(path, unix.O_RDWR, func(int) error { return nil })
	case "write":
		return withFd(path, unix.O_WRONLY|unix.O_APPEND, func(fd int) error {
			return writeAll(fd, []byte("w"))
		})
	case "otrunc":
		return withFd(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, func(int) error { return nil })
	case "truncate":
		return noEINTR(func() error { return unix.Truncate(path, 1) })
	case "ftruncate":
		return withFd(path, unix.O_WRONLY, func(fd int) error { return noEINTR(func() error { return unix.Ftruncate(fd, 1) }) })
	case "chown":
		return noEINTR(func() error { return unix.Chown(path, 0, 0) })
	case "fallocate":
		return withFd(path, unix.O_WRONLY, func(fd int) error { return noEINTR(func() error { return unix.Fallocate(fd, 0, 0, 8192) }) })
	case "copyrange":
		return withFd(path, unix.O_RDWR, func(fd int) error {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return err
			}
			if st.Size == 0 {
				return fmt.Errorf("copy_file_range: empty file")
			}
			in, out := int64(0), st.Size
			var n int
			err := noEINTR(func() (err error) {
				n, err = unix.CopyFileRange(fd, &in, fd, &out, 1, 0)
				return err
			})
			if err == nil && n != 1 {
				err = fmt.Errorf("copy_file_range copied %d bytes", n)
			}
			return err
		})
	case "mmap":
		return withFd(path, unix.O_RDWR, func(fd int) error {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return err
			}
			if st.Size == 0 {
				return fmt.Errorf("mmap: empty file")
			}
			b, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				return err
			}
			b[0] = 'm'
			if err := noEINTR(func() error { return unix.Msync(b, unix.MS_SYNC) }); err != nil {
				unix.Munmap(b)
				return fmt.Errorf("msync: %w", err)
			}
			return unix.Munmap(b)
		})
	}
	if v, ok := strings.CutPrefix(op, "writes="); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("bad count %q", v)
		}
		buf := make([]byte, 1024)
		for i := range buf {
			buf[i] = byte('a' + i%26)
		}
		return withFd(path, unix.O_WRONLY|unix.O_APPEND, func(fd int) error {
			for range n {
				if err := writeAll(fd, buf); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return fmt.Errorf("unknown operation %q", op)
}

func withFd(path string, flags int, f func(fd int) error) error {
	var fd int
	err := noEINTR(func() (err error) {
		fd, err = unix.Open(path, flags|unix.O_CLOEXEC, 0o666)
		return err
	})
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	err = f(fd)
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	return err
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// noEINTR retries f while it fails with EINTR (the Go runtime's signals
// can interrupt a FUSE request).
func noEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// state is the state operation's answer for path.
func state(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if err == unix.ENOENT {
			return "absent", nil
		}
		return "", err
	}
	c := "cap"
	if _, err := unix.Lgetxattr(path, "security.capability", nil); err == unix.ENODATA {
		c = "nocap"
	} else if err != nil {
		return "", fmt.Errorf("getxattr security.capability: %w", err)
	}
	return fmt.Sprintf("%04o %s", st.Mode&0o7777, c), nil
}
