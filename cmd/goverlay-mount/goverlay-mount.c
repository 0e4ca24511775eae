/*
 * goverlay-mount mounts through the user's goverlay mount server:
 * `goverlay-mount -o OPTIONS MOUNTPOINT` is `goverlay -o
 * daemon=shared,OPTIONS MOUNTPOINT` for a host that mounts many
 * containers (the man page's SHARED DAEMON section).
 *
 * It sends its arguments to the running server and prints the server's
 * warnings and report. Anything else it leaves to the goverlay beside it,
 * which it executes with -o daemon=shared: a command line other than -o
 * options and a mountpoint, the first mount (which starts the server),
 * and a server it cannot reach, or a directory it does not trust, which
 * goverlay then reports.
 *
 * It is C, not Go, because a mount's time is mostly the mount command's
 * start: a Go program takes 5 ms and two cores' worth of the runtime's
 * threads before main, this one 2 ms (docs/BENCHMARKS.md, "Many mounts of
 * one image"). Its side of the protocol is goverlay's
 * cmd/internal/mountclient, whose tests hold the two to the same wire
 * format; the server's directory and name follow overlay/rundir and
 * mountclient.Name.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* goverlay's exit code when the mount's process could not report
 * (goverlay(1), EXIT STATUS); mountclient.ExitDaemon. */
#define EXIT_DAEMON 5

/* The first field of a request; mountclient.RequestMagic. */
#define REQUEST_MAGIC "goverlay-mount-request-1"

/* The sockets of root's processes; rundir.RootDir. */
#define ROOT_DIR "/run/goverlay"

/* The initial user namespace as /proc/PID/ns/user names it. */
#define INITIAL_USER_NS "user:[4026531837]"

/* A report and its warnings are read up to this size, as mountclient.Ask
 * does. */
#define REPLY_MAX (64 << 10)

extern char **environ;

/* exec_goverlay replaces this process with goverlay -o daemon=shared ARGS. */
static int exec_goverlay(const char *full, int argc, char **argv)
{
	char **args = calloc(argc + 3, sizeof *args);
	if (args == NULL) {
		fprintf(stderr, "goverlay-mount: cannot run %s: out of memory\n", full);
		return EXIT_DAEMON;
	}
	args[0] = (char *)full;
	args[1] = "-o";
	args[2] = "daemon=shared";
	for (int i = 1; i < argc; i++)
		args[i + 2] = argv[i];
	execve(full, args, environ);
	if (errno == ENOENT)
		fprintf(stderr, "goverlay-mount: cannot run %s: %s is gone\n", full, full);
	else
		fprintf(stderr, "goverlay-mount: cannot run %s: %s\n", full, strerror(errno));
	return EXIT_DAEMON;
}

/* plain_mount reports whether the arguments are -o options and one
 * mountpoint, as containers/storage gives a mount program, none choosing
 * the daemon. */
static int plain_mount(int argc, char **argv)
{
	int points = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *opts;
		if (strcmp(a, "-o") == 0 && i + 1 < argc) {
			opts = argv[++i];
		} else if (strncmp(a, "-o", 2) == 0 && a[2] != '\0') {
			opts = a + 2;
		} else if (a[0] != '-' && a[0] != '\0') {
			points++;
			continue;
		} else {
			return 0;
		}
		if (strstr(opts, "daemon=") != NULL)
			return 0;
	}
	return points == 1;
}

/* in_initial_user_ns is rundir.InInitialUserNS. */
static int in_initial_user_ns(void)
{
	char ns[64];
	ssize_t n = readlink("/proc/self/ns/user", ns, sizeof ns - 1);
	if (n < 0)
		return 1;
	ns[n] = '\0';
	return strcmp(ns, INITIAL_USER_NS) == 0;
}

/* owned_dir is rundir's ownedDir: a directory (not a symlink) of uid's
 * that no one else may write. */
static int owned_dir(const char *path, uid_t uid)
{
	struct stat st;
	return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 022) == 0;
}

/* host_uid is rundir's hostUID: uid mapped to the parent user namespace
 * through /proc/self/uid_map, or uid itself where it is not mapped. */
static unsigned long host_uid(uid_t uid)
{
	FILE *f = fopen("/proc/self/uid_map", "re");
	unsigned long in, out, n, mapped = uid;
	if (f == NULL)
		return uid;
	while (fscanf(f, "%lu %lu %lu", &in, &out, &n) == 3) {
		if (uid >= in && uid - in < n) {
			mapped = out + (uid - in);
			break;
		}
	}
	fclose(f);
	return mapped;
}

/* clean_abs reports whether path is absolute and as Go's filepath.Clean
 * leaves it, so that the directory is the one goverlay uses. */
static int clean_abs(const char *path)
{
	size_t n = strlen(path);
	if (path[0] != '/' || (n > 1 && path[n - 1] == '/'))
		return 0;
	for (const char *p = path; (p = strchr(p, '/')) != NULL; p++) {
		const char *c = p + 1;
		size_t len = strcspn(c, "/");
		if (len == 0 && c[0] == '/')
			return 0;
		if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
	}
	return 1;
}

/* runtime_dir is rundir.Own and rundir.Open: the directory where this
 * user's servers keep their sockets, made if missing, opened, and checked
 * to be the user's and closed to others. It returns the directory's fd,
 * and its path in path, or -1 when goverlay should decide. */
static int runtime_dir(char *path, size_t size)
{
	uid_t uid = geteuid();
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int shared = 0;
	if (uid == 0 && in_initial_user_ns()) {
		snprintf(path, size, "%s", ROOT_DIR);
		shared = 1;
	} else if (xdg != NULL && xdg[0] == '/' && owned_dir(xdg, uid)) {
		if (!clean_abs(xdg) || strcmp(xdg, "/") == 0)
			return -1;
		if (snprintf(path, size, "%s/goverlay", xdg) >= (int)size)
			return -1;
	} else {
		snprintf(path, size, "/tmp/goverlay-%lu", host_uid(uid));
	}
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -1;
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) < 0 || st.st_uid != uid || (st.st_mode & (shared ? 022 : 077)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* server_name is mountclient.Name: the server of the goverlay binary full
 * in this process's user and mount namespaces. */
static int server_name(const char *full, char *name, size_t size)
{
	struct stat user, mnt, bin;
	if (stat("/proc/self/ns/user", &user) < 0 || stat("/proc/self/ns/mnt", &mnt) < 0 || stat(full, &bin) < 0)
		return -1;
	int n = snprintf(name, size, "server-%llu-%llu-%llx-%llx", (unsigned long long)user.st_ino,
			 (unsigned long long)mnt.st_ino, (unsigned long long)bin.st_dev, (unsigned long long)bin.st_ino);
	return n > 0 && (size_t)n < size ? 0 : -1;
}

/* dial connects to the server of full under its lock, as goverlay does;
 * it puts the path of the server's log in log. It returns the socket, or
 * -1 when goverlay should mount (no server yet, or one it cannot reach). */
static int dial(const char *full, char *log, size_t size)
{
	char dir[PATH_MAX], name[128], entry[160];
	int dirfd = runtime_dir(dir, sizeof dir);
	if (dirfd < 0)
		return -1;
	int conn = -1, lock = -1;
	if (server_name(full, name, sizeof name) < 0)
		goto out;
	snprintf(entry, sizeof entry, "%s.lock", name);
	lock = openat(dirfd, entry, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (lock < 0)
		goto out;
	while (flock(lock, LOCK_EX) < 0)
		if (errno != EINTR)
			goto out;
	/* rundir.Path: the socket is reached through the directory
	 * checked, in a path short enough for sun_path. */
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int n = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s.sock", dirfd, name);
	if (n < 0 || (size_t)n >= sizeof addr.sun_path)
		goto out;
	conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (conn < 0)
		goto out;
	if (connect(conn, (struct sockaddr *)&addr, sizeof addr) < 0) {
		close(conn);
		conn = -1;
		goto out;
	}
	if (snprintf(log, size, "%s/%s.log", dir, name) >= (int)size)
		log[0] = '\0';
out:
	if (lock >= 0)
		close(lock);
	close(dirfd);
	return conn;
}

/* put appends s and its NUL to the request in buf. */
static int put(char **buf, size_t *len, size_t *cap, const char *s)
{
	size_t n = strlen(s) + 1;
	if (*len + n > *cap) {
		size_t c = (*cap + n) * 2;
		char *b = realloc(*buf, c);
		if (b == NULL)
			return -1;
		*buf = b;
		*cap = c;
	}
	memcpy(*buf + *len, s, n);
	*len += n;
	return 0;
}

/* send_request sends the request (mountclient.Request.Encode): the
 * magic, "warn" (the server sends the arguments' warnings back, since
 * this program does not parse them), the working directory against which
 * relative paths resolve ("" if unknown, which makes them an error), the
 * number of arguments and the arguments, each ended by a NUL. */
static int send_request(int conn, int argc, char **argv)
{
	char cwd[PATH_MAX], count[16];
	if (getcwd(cwd, sizeof cwd) == NULL)
		cwd[0] = '\0';
	snprintf(count, sizeof count, "%d", argc - 1);
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int err = put(&buf, &len, &cap, REQUEST_MAGIC) || put(&buf, &len, &cap, "warn") ||
		  put(&buf, &len, &cap, cwd) || put(&buf, &len, &cap, count);
	for (int i = 1; i < argc && !err; i++)
		err = put(&buf, &len, &cap, argv[i]);
	if (err) {
		free(buf);
		errno = ENOMEM;
		return -1;
	}
	for (size_t off = 0; off < len;) {
		ssize_t n = send(conn, buf + off, len - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			free(buf);
			errno = e;
			return -1;
		}
		off += n;
	}
	free(buf);
	return 0;
}

/* report is mountclient.ParseReport: "ok\n" is 0; "fail CODE\nMESSAGE"
 * is CODE (1-255), with MESSAGE in text; -1 for anything else. */
static int report(const char *msg, size_t len, const char **text, size_t *text_len)
{
	if (len == 3 && memcmp(msg, "ok\n", 3) == 0)
		return 0;
	if (len < 5 || memcmp(msg, "fail ", 5) != 0)
		return -1;
	const char *p = msg + 5, *end = msg + len;
	int code = 0, digits = 0;
	for (; p < end && *p >= '0' && *p <= '9' && digits < 4; p++, digits++)
		code = code * 10 + (*p - '0');
	if (digits == 0 || p == end || *p != '\n' || code < 1 || code > 255)
		return -1;
	*text = p + 1;
	*text_len = end - (p + 1);
	return code;
}

/* ask sends the request and prints what goverlay prints: the warnings,
 * and the failure, "goverlay: MESSAGE". It returns the exit code. */
static int ask(int conn, int argc, char **argv, const char *log)
{
	if (send_request(conn, argc, argv) < 0) {
		fprintf(stderr, "goverlay: daemon=shared: cannot send the mount to the server: %s; nothing is mounted\n",
			strerror(errno));
		return EXIT_DAEMON;
	}
	char *msg = malloc(REPLY_MAX);
	if (msg == NULL) {
		fprintf(stderr, "goverlay: daemon=shared: cannot read the server's answer: out of memory\n");
		return EXIT_DAEMON;
	}
	size_t len = 0;
	for (;;) {
		ssize_t n = read(conn, msg + len, REPLY_MAX - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += n;
		if (len == REPLY_MAX)
			break;
	}
	const char *p = msg, *end = msg + len;
	for (;;) {
		const char *nl = memchr(p, '\n', end - p);
		if (nl == NULL || nl - p < 5 || memcmp(p, "warn ", 5) != 0)
			break;
		fprintf(stderr, "goverlay: %.*s\n", (int)(nl - p - 5), p + 5);
		p = nl + 1;
	}
	const char *text = NULL;
	size_t text_len = 0;
	int code = report(p, end - p, &text, &text_len);
	if (code < 0) {
		fprintf(stderr,
			"goverlay: daemon=shared: the mount server ended before the mount was live; see %s, or mount with goverlay -f to see why\n",
			log);
		code = EXIT_DAEMON;
	} else if (code > 0) {
		fputs("goverlay: ", stderr);
		fwrite(text, 1, text_len, stderr);
		fputc('\n', stderr);
	}
	free(msg);
	return code;
}

int main(int argc, char **argv)
{
	/* The goverlay beside this program, symlinks to it resolved: the
	 * kernel's /proc/self/exe is the file's own path. */
	char full[PATH_MAX], log[PATH_MAX + 200];
	ssize_t n = readlink("/proc/self/exe", full, sizeof full - 1);
	if (n < 0) {
		fprintf(stderr, "goverlay-mount: cannot find this program's path: readlink /proc/self/exe: %s; it runs the goverlay installed beside it\n",
			strerror(errno));
		return EXIT_DAEMON;
	}
	full[n] = '\0';
	char *slash = strrchr(full, '/');
	if (slash == NULL || (size_t)(slash - full) + sizeof "/goverlay" > sizeof full) {
		fprintf(stderr, "goverlay-mount: cannot find this program's path (%s); it runs the goverlay installed beside it\n", full);
		return EXIT_DAEMON;
	}
	strcpy(slash, "/goverlay");
	if (access(full, X_OK) < 0) {
		fprintf(stderr, "goverlay-mount: access %s: %s; it runs the goverlay installed beside it\n", full, strerror(errno));
		return EXIT_DAEMON;
	}
	if (!plain_mount(argc, argv))
		return exec_goverlay(full, argc, argv);
	int conn = dial(full, log, sizeof log);
	if (conn < 0)
		/* No server (the first mount), or none that answers: goverlay
		 * starts one, or says what is wrong. */
		return exec_goverlay(full, argc, argv);
	int code = ask(conn, argc, argv, log);
	close(conn);
	return code;
}
