package fuseserve

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The /dev/fuse descriptor is goverlay's.
//
// goverlay opens /dev/fuse and mounts it with mount(2) where it may:
// CAP_SYS_ADMIN in its user namespace, that is root, or root of a user
// namespace that owns its mount namespace, where FUSE mounts are allowed
// (FS_USERNS_MOUNT, fs/fuse/inode.c). Elsewhere fusermount3, setuid root,
// opens and mounts it and sends the descriptor back over a socket pair
// named by _FUSE_COMMFD (an SCM_RIGHTS message, unix(7); libfuse's
// util/fusermount.c, send_fd()). go-fuse is then given the mountpoint
// /dev/fd/N, a duplicate of the descriptor, which it takes for a mount
// made by someone else (fuse/mount_linux.go, mount(); "Mount styles" in
// its package documentation): it reads and answers there, and the
// descriptor stays goverlay's for the io_uring queues (uring.go). Either
// way the kernel is given the options go-fuse would have given it
// (fuse/mount_linux.go: mountDirect(), callFusermount()).
//
// go-fuse cannot unmount a /dev/fd/N mountpoint, whose path it does not
// know (fuse.Server.Unmount): Server.Unmount does, with umount2(2) or
// fusermount3 -u, as go-fuse's would.

// fuseDevice is the FUSE character device (Documentation/filesystems/fuse.rst).
const fuseDevice = "/dev/fuse"

// mayMount reports whether this process may mount FUSE itself:
// CAP_SYS_ADMIN in its effective set, in its own user namespace
// (capabilities(7)).
func mayMount() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return os.Geteuid() == 0
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
}

// mountDevice mounts a FUSE connection on mnt and returns its /dev/fuse
// descriptor: with mount(2) when direct, else through fusermount3. A
// failed mount(2) tries fusermount3 as well, as go-fuse does with
// DirectMount; with no fusermount3 to try, the error is mount(2)'s.
func mountDevice(mnt string, mo *fuse.MountOptions, direct bool) (int, error) {
	var directErr error
	if direct {
		fd, err := mountDirect(mnt, mo)
		if err == nil {
			return fd, nil
		}
		if mo.Debug {
			mo.Logger.Printf("mount(2) on %s: %v; trying fusermount3", mnt, err)
		}
		directErr = err
	}
	fd, err := callFusermount(mnt, mo)
	if errors.Is(err, errNoFusermount) && directErr != nil {
		return -1, directErr
	}
	return fd, err
}

// mountDirect opens /dev/fuse and mounts it on mnt with mount(2); the
// data string is fuse(4)'s mount options.
func mountDirect(mnt string, mo *fuse.MountOptions) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return -1, &os.PathError{Op: "stat", Path: mnt, Err: err}
	}
	fd, err := unix.Open(fuseDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: fuseDevice, Err: err}
	}
	flags, data := directOptions(mo, fd, st.Mode&unix.S_IFMT, os.Geteuid(), os.Getegid())
	source := mo.FsName
	if source == "" {
		source = mo.Name
	}
	if mo.Debug {
		mo.Logger.Printf("mount(%q, %q, %q, %#x, %q)", source, mnt, "fuse."+mo.Name, flags, data)
	}
	if err := unix.Mount(source, mnt, "fuse."+mo.Name, flags, data); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount(2): %w", err)
	}
	return fd, nil
}

// directOptions are mount(2)'s flags and data for a FUSE mount of fd:
// what the kernel needs (fd, rootmode, user_id, group_id), max_read, and
// mo.Options, of which dev, suid and exec and their no- forms are flags
// (MS_NODEV, MS_NOSUID, MS_NOEXEC) rather than text.
func directOptions(mo *fuse.MountOptions, fd int, rootmode uint32, uid, gid int) (uintptr, string) {
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if mo.DirectMountFlags != 0 {
		flags = mo.DirectMountFlags
	}
	opts := []string{
		"fd=" + strconv.Itoa(fd),
		fmt.Sprintf("rootmode=%o", rootmode),
		"user_id=" + strconv.Itoa(uid),
		"group_id=" + strconv.Itoa(gid),
		"max_read=" + strconv.Itoa(mo.MaxWrite),
	}
	for _, o := range mo.Options {
		switch o {
		case "nodev":
			flags |= unix.MS_NODEV
		case "dev":
			flags &^= unix.MS_NODEV
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "suid":
			flags &^= unix.MS_NOSUID
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "exec":
			flags &^= unix.MS_NOEXEC
		default:
			opts = append(opts, o)
		}
	}
	if mo.AllowOther {
		opts = append(opts, "allow_other")
	}
	if mo.IDMappedMount && !slices.Contains(mo.Options, "default_permissions") {
		opts = append(opts, "default_permissions")
	}
	return flags, strings.Join(opts, ",")
}

// fusermountOptions is fusermount3's -o: mo.Options and what it passes
// on to the kernel itself, each with its commas and backslashes escaped
// (fusermount3 splits at unescaped commas).
func fusermountOptions(mo *fuse.MountOptions) string {
	opts := slices.Clone(mo.Options)
	if mo.AllowOther {
		opts = append(opts, "allow_other")
	}
	if mo.FsName != "" {
		opts = append(opts, "fsname="+mo.FsName)
	}
	if mo.Name != "" {
		opts = append(opts, "subtype="+mo.Name)
	}
	opts = append(opts, "max_read="+strconv.Itoa(mo.MaxWrite))
	if mo.IDMappedMount && !slices.Contains(mo.Options, "default_permissions") {
		opts = append(opts, "default_permissions")
	}
	for i, o := range opts {
		opts[i] = strings.NewReplacer(`\`, `\\`, `,`, `\,`).Replace(o)
	}
	return strings.Join(opts, ",")
}

// errNoFusermount is callFusermount's error when neither fusermount3 nor
// fusermount is installed.
var errNoFusermount = errors.New("no fusermount3 on PATH or in /bin")

// fusermountBinary is fusermount3, or the fusermount of FUSE 2, on PATH
// or in /bin (PATH may be empty), as go-fuse looks for it.
func fusermountBinary() (string, error) {
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		if p, err := exec.LookPath(filepath.Join("/bin", name)); err == nil {
			return p, nil
		}
	}
	return "", errNoFusermount
}

// FusermountError is Mount's error when fusermount3 refused to mount; it
// printed its reason on stderr.
type FusermountError struct {
	// Path is the fusermount3 that ran.
	Path string
	// Status is how it ended.
	Status syscall.WaitStatus
}

func (e *FusermountError) Error() string {
	how := fmt.Sprintf("exit status %d", e.Status.ExitStatus())
	if e.Status.Signaled() {
		how = "killed by " + unix.SignalName(e.Status.Signal())
	}
	return filepath.Base(e.Path) + " refused to mount (" + how + ")"
}

// callFusermount has fusermount3 mount a FUSE connection on mnt and
// returns the descriptor it sends back.
func callFusermount(mnt string, mo *fuse.MountOptions) (int, error) {
	bin, err := fusermountBinary()
	if err != nil {
		return -1, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socketpair", err)
	}
	local, remote := os.NewFile(uintptr(pair[0]), "fusermount3 socket"), os.NewFile(uintptr(pair[1]), "fusermount3 socket")
	defer local.Close()
	args := []string{mnt}
	if o := fusermountOptions(mo); o != "" {
		args = append(args, "-o", o)
	}
	cmd := exec.Command(bin, args...)
	// fusermount3 finds its end of the socket pair by the number in
	// _FUSE_COMMFD: the first of ExtraFiles is fd 3.
	cmd.Env = []string{"_FUSE_COMMFD=3"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{remote}
	if mo.Debug {
		mo.Logger.Printf("_FUSE_COMMFD=3 %q", cmd.Args)
	}
	err = cmd.Run()
	remote.Close()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		ws, _ := ee.Sys().(syscall.WaitStatus)
		return -1, &FusermountError{Path: bin, Status: ws}
	}
	if err != nil {
		return -1, err
	}
	fd, err := receiveFD(int(local.Fd()))
	if err != nil {
		// fusermount3 said it mounted: do not leave the mount behind.
		detach(mnt, false)
		return -1, fmt.Errorf("%s: %w", filepath.Base(bin), err)
	}
	return fd, nil
}

// receiveFD receives the one descriptor fusermount3 sends on sock
// (send_fd() in util/fusermount.c: a byte of data and SCM_RIGHTS).
func receiveFD(sock int) (int, error) {
	buf := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var oobn int
	var err error
	for {
		_, oobn, _, _, err = unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return -1, os.NewSyscallError("recvmsg", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return -1, err
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("received %d descriptors, want the one of /dev/fuse", len(fds))
	}
	return fds[0], nil
}

// unmount takes the mount on mnt down once: umount2(2) where goverlay
// may, else, or when that fails, fusermount3 -u, as go-fuse's unmount()
// does with DirectMount. Its error names fusermount3's reason, which
// says when the mount is busy.
func unmount(mnt string, direct bool, logger *log.Logger, debug bool) error {
	var directErr error
	if direct {
		directErr = unix.Unmount(mnt, 0)
		if directErr == nil {
			return nil
		}
		directErr = &os.PathError{Op: "umount2", Path: mnt, Err: directErr}
	}
	bin, err := fusermountBinary()
	if err != nil {
		if directErr != nil {
			return directErr
		}
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-u", mnt)
	cmd.Stderr = &stderr
	if debug {
		logger.Printf("%q", cmd.Args)
	}
	err = cmd.Run()
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		return fmt.Errorf("%s (%v)", msg, err)
	}
	return err
}

// detach lets the mount on mnt go at once (umount2(2) with MNT_DETACH,
// fusermount3 -u -z): a mount that goverlay made and cannot serve.
func detach(mnt string, direct bool) {
	if direct && unix.Unmount(mnt, unix.MNT_DETACH) == nil {
		return
	}
	if bin, err := fusermountBinary(); err == nil {
		exec.Command(bin, "-u", "-z", mnt).Run()
	}
}

// Unmount takes the mount down and returns once go-fuse's readers have
// ended. A busy mount is tried again for a while, as go-fuse's
// Server.Unmount does (which cannot unmount a /dev/fd/N mountpoint).
// Unmounting again returns at once. The readers end when the kernel ends
// the connection, which a mount that lives on elsewhere (bound into
// another mount namespace, or into one of its layers) puts off.
func (s *Server) Unmount() error {
	s.mu.Lock()
	if s.unmounted {
		s.mu.Unlock()
		return nil
	}
	var err error
	delay := time.Duration(0)
	for range 5 {
		if err = unmount(s.mountpoint, s.direct, s.log, s.debug); err == nil {
			break
		}
		// The kernel may not have seen every file closed yet.
		delay = 2*delay + 5*time.Millisecond
		time.Sleep(delay)
	}
	s.unmounted = err == nil
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.Server.Wait()
	return nil
}

// pollHackName is the name go-fuse answers itself under the root
// (fuse/poll.go): opening it and polling it has the kernel send a POLL,
// which go-fuse answers ENOSYS, after which the kernel sends none
// (fuse_file_poll(): fc->no_poll). go-fuse's WaitMount does so for the
// mounts it makes; its poll is what the Go runtime's epoll would
// otherwise send on a file of the mount that the daemon itself opens.
const pollHackName = ".go-fuse-epoll-hack"

// stopPolls makes the kernel learn, through go-fuse's own file, that the
// mount answers no POLL. It is also the mount's first request after INIT.
// A go-fuse without the file answers ENOENT from the filesystem: then
// the kernel learns at the first poll(2).
func stopPolls(mnt string) error {
	fd, err := unix.Open(filepath.Join(mnt, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Join(mnt, pollHackName), Err: err}
	}
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	unix.Close(fd)
	return nil
}
