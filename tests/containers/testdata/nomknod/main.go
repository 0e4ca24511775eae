// Command nomknod runs a command with mknod(2) and mknodat(2) failing with
// EPERM, through a seccomp filter: the way some container hosts refuse
// device nodes (whiteouts included) to unprivileged users, which the
// overlay must answer with its AUFS whiteout fallback.
//
//	nomknod PROG [ARG...]
package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The filter and exec run on one thread: no_new_privs and a seccomp
// filter set with prctl are per thread.
func init() { runtime.LockOSThread() }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nomknod PROG [ARG...]")
		os.Exit(2)
	}
	var arch uint32
	var mknod uint32
	switch runtime.GOARCH {
	case "amd64":
		arch, mknod = unix.AUDIT_ARCH_X86_64, unix.SYS_MKNOD
	case "arm64":
		arch, mknod = unix.AUDIT_ARCH_AARCH64, unix.SYS_MKNODAT // no mknod(2) there
	default:
		fmt.Fprintf(os.Stderr, "nomknod: no filter for %s\n", runtime.GOARCH)
		os.Exit(2)
	}
	const eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // seccomp_data.arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: arch, Jt: 0, Jf: 3},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_MKNODAT, Jt: 2},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: mknod, Jt: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		{Code: unix.BPF_RET | unix.BPF_K, K: eperm},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "nomknod: no_new_privs: %v\n", err)
		os.Exit(1)
	}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "nomknod: seccomp: %v\n", err)
		os.Exit(1)
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "nomknod: %v\n", err)
		os.Exit(1)
	}
	err = syscall.Exec(path, os.Args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "nomknod: exec %s: %v\n", path, err)
	os.Exit(1)
}
