package bench

// The build workloads: `podman build --no-cache` of the container tests'
// Containerfile (tests/containers/buildspec) on a private podman store
// per target and round, with the target as the store's overlay: podman's
// own kernel overlay driver (no mount_program) for kernel, fuse-overlayfs
// or the goverlay binary under test as mount_program for the others, a
// goverlay target's -o options as the store's mountopt (goverlay-metacopy:
// mountopt = "metacopy=on"). The rootless targets build as the rootless
// user (rootless.go), whose podman makes its own user namespace from
// /etc/subuid and /etc/subgid. The bench times the whole build and each
// RUN step: podman build prints "STEP n/m: ..." as each step starts, and
// a step lasts from its line to the next one's (its layer's commit
// included), the last one to the build's last line, printed once the
// image is committed and tagged. Each build is checked: the image's
// check script must print what the Containerfile makes, or the sample
// fails. The store is reset and removed after each build, whatever
// happens; the target's own mount (the round's instance) is not used.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/tests/containers/buildspec"
)

const groupBuild = "build"

// The built image's name; buildDeadline bounds a build, podmanDeadline
// any other podman command.
const (
	builtImage     = "localhost/built"
	buildDeadline  = 10 * time.Minute
	podmanDeadline = 2 * time.Minute
)

func init() {
	steps := buildspec.Steps(buildspec.Containerfile)
	ws := []*workloadDef{{name: "build", unit: "s",
		desc: fmt.Sprintf("podman build --no-cache of a %d-step Containerfile FROM a busybox image (2,000 new files, chown -R, chmod -R, mv and rm -rf of image trees, a .deb installed) on a private store with the target as overlay: the whole build's wall time", len(steps)),
		run:  buildWorkload(0)}}
	for _, s := range steps {
		if s.Instruction() != "RUN" {
			continue
		}
		ws = append(ws, &workloadDef{name: fmt.Sprintf("build-step-%d", s.N), unit: "s",
			desc: fmt.Sprintf("the build's STEP %d/%d, %s, with its layer's commit", s.N, len(steps), abbrev(s.Text, 60)),
			run:  buildWorkload(s.N)})
	}
	for _, w := range ws {
		w.group, w.notFor, w.inBench = groupBuild, buildNotFor, true
	}
	allWorkloads = append(allWorkloads, ws...)
	workloadGroups = append(workloadGroups, groupBuild)
}

// abbrev is s cut to n characters with "..." when longer.
func abbrev(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// buildNotFor says why the build workloads do not run on t here, or "".
func buildNotFor(t *targetDef) string {
	if t.kind == kindNative {
		return "not an overlay: podman's store needs an overlay driver"
	}
	for _, tool := range []string{"podman", "runc", "conmon", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not installed (not found in PATH)"
		}
	}
	if why := buildspec.Missing(); why != "" {
		return why
	}
	if t.rootless {
		for _, tool := range []string{"newuidmap", "newgidmap", "usermod"} {
			if _, err := exec.LookPath(tool); err != nil {
				return tool + " is not installed (packages uidmap, passwd): rootless podman needs it"
			}
		}
	} else if os.Geteuid() != 0 {
		return "podman on a private store as root needs root (--rootless builds as an ordinary user)"
	}
	return ""
}

// buildState is what every build of a run shares: the test image as a
// tar archive, the build context, what the check script must print.
type buildState struct {
	image, ctx, want string
	podman           string // podman's version line
}

// setupBuild makes the image and the build context when a build workload
// is selected and can run on a target.
func (b *bencher) setupBuild() error {
	if !b.wantsGroup(groupBuild) {
		return nil
	}
	runs := false
	for _, ts := range b.targets {
		runs = runs || (ts.skip == "" && buildNotFor(ts.def) == "")
	}
	if !runs {
		return nil
	}
	dir := filepath.Join(b.root, "build")
	rootfs := filepath.Join(dir, "rootfs")
	st := &buildState{image: filepath.Join(dir, "image.tar"), ctx: filepath.Join(dir, "ctx"), want: buildspec.WantCheck()}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: the build image: %w", err)
	}
	if err := buildspec.Rootfs(rootfs); err != nil {
		return fmt.Errorf("bench: the build image: %w", err)
	}
	if err := buildspec.Setup(rootfs, st.ctx, dir); err != nil {
		return fmt.Errorf("bench: the build context: %w", err)
	}
	if out, err := exec.Command("tar", "-C", rootfs, "-cf", st.image, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("bench: the build image: tar: %v: %s", err, oneLine(string(out)))
	}
	if err := os.RemoveAll(rootfs); err != nil {
		return err
	}
	out, _ := exec.Command("podman", "--version").CombinedOutput()
	st.podman = strings.TrimSpace(string(out))
	b.build = st
	return nil
}

// buildRun is one target's build of a round, which every build workload
// of the round reads.
type buildRun struct {
	total time.Duration
	steps map[int]time.Duration
	err   error
}

// buildWorkload is the build workload for step n (0: the whole build).
func buildWorkload(n int) func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
	return func(ctx context.Context, inst *instance, b *bencher) (sample, error) {
		if b.build == nil {
			return sample{}, errors.New("no build image (the bench set none up)")
		}
		if inst.built == nil {
			r := &buildRun{}
			r.total, r.steps, r.err = b.podmanBuild(ctx, inst)
			inst.built = r
		}
		r := inst.built
		switch {
		case r.err != nil && n == 0:
			return sample{}, r.err
		case r.err != nil:
			return sample{}, errors.New("the build failed (see the build row)")
		case n == 0:
			return sample{value: r.total.Seconds()}, nil
		}
		d, ok := r.steps[n]
		if !ok {
			return sample{}, fmt.Errorf("podman build printed no STEP %d", n)
		}
		return sample{value: d.Seconds()}, nil
	}
}

// podmanStore is one private podman store and how podman is run on it.
type podmanStore struct {
	dir   string // graphroot and the configuration files
	short string // runroot and tmpdir: podman wants a short runroot
	env   []string
	flags []string
	// user runs podman rootless: setpriv's arguments, before podman.
	user []string
	name string // the target's, for messages
}

// podmanBuild builds the Containerfile on a new store for inst's target
// and checks the image; it returns the build's wall time and each step's.
// The store is reset and removed before it returns, whatever happened.
func (b *bencher) podmanBuild(ctx context.Context, inst *instance) (total time.Duration, steps map[int]time.Duration, err error) {
	var cl cleanups
	defer func() {
		if cerr := cl.run(); cerr != nil && err == nil {
			err = fmt.Errorf("after the build: %w", cerr)
		}
	}()
	p, err := b.newStore(ctx, inst, &cl)
	if err != nil {
		return 0, nil, err
	}
	if _, err := p.run(ctx, podmanDeadline, "import", b.build.image, buildspec.Image); err != nil {
		return 0, nil, err
	}
	restore := func() {}
	if inst.def.uring {
		if restore, err = offerUring(); err != nil {
			return 0, nil, err
		}
	}
	total, steps, err = p.build(ctx, b.build.ctx)
	restore()
	if err != nil {
		return 0, nil, err
	}
	out, err := p.run(ctx, podmanDeadline, "run", "--rm", "--runtime", "runc", "--network=none", builtImage, "sh", buildspec.CheckScript)
	if err != nil {
		return 0, nil, err
	}
	if out != b.build.want {
		return 0, nil, fmt.Errorf("the built image is not what the Containerfile makes: %s", firstDiff(b.build.want, out))
	}
	return total, steps, nil
}

// firstDiff describes the first line where got differs from want.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d is %q, want %q", i+1, gl, wl)
		}
	}
	return "same lines"
}

// newStore sets up a private store for inst's target: its storage.conf
// (the overlay driver; the mount program and mountopt of the target),
// containers.conf, and for a rootless target the user's home and runtime
// directories. Its undo steps on cl reset the store with podman, end
// what podman left running (the rootless pause process, mount program
// daemons, conmon), detach what is still mounted and remove it.
func (b *bencher) newStore(ctx context.Context, inst *instance, cl *cleanups) (*podmanStore, error) {
	t := inst.def
	p := &podmanStore{dir: filepath.Join(b.root, "podman-"+filepath.Base(inst.dir)), name: t.name}
	// Podman refuses a runroot longer than 50 characters.
	base := b.root
	if len(base) > 30 {
		base = "/tmp"
	}
	if err := os.Mkdir(p.dir, 0o755); err != nil {
		return nil, err
	}
	cl.push(func() error { return removeScratch(p.dir) })
	short, err := os.MkdirTemp(base, "pb-")
	if err != nil {
		return nil, err
	}
	p.short = short
	cl.push(func() error { return removeScratch(short) })
	if err := os.Chmod(short, 0o755); err != nil {
		return nil, err
	}
	prog, opts := "", t.opts
	switch t.kind {
	case kindFuseOverlayfs:
		if prog, err = exec.LookPath("fuse-overlayfs"); err != nil {
			return nil, err
		}
	case kindGoverlay:
		prog = t.binary(b.cfg)
		if t.mountCmd {
			if prog, err = b.mountCopy(prog); err != nil {
				return nil, err
			}
		}
		if t.rootless {
			env, err := b.rootlessSetup()
			if err != nil {
				return nil, err
			}
			prog = env.binary
		}
	}
	graph, run := filepath.Join(p.dir, "storage"), filepath.Join(short, "run")
	conf := fmt.Sprintf("[storage]\ndriver = \"overlay\"\ngraphroot = %q\nrunroot = %q\n", graph, run)
	if t.rootless {
		// Rootless podman takes its runroot from XDG_RUNTIME_DIR
		// and its graphroot from rootless_storage_path only.
		run = filepath.Join(short, "xdg", "containers")
		conf += fmt.Sprintf("rootless_storage_path = %q\n", graph)
	}
	conf += "\n[storage.options.overlay]\n"
	if prog != "" {
		conf += fmt.Sprintf("mount_program = %q\n", prog)
	}
	if len(opts) > 0 {
		conf += fmt.Sprintf("mountopt = %q\n", strings.Join(opts, ","))
	}
	files := map[string]string{
		"storage.conf": conf,
		// Podman's default rlimits for root cannot always be set.
		"containers.conf": "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(p.dir, name), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	// No --root or --runroot: either flag makes podman 4.3 drop the
	// storage.conf's overlay options.
	p.flags = []string{"--tmpdir", filepath.Join(short, "tmp"),
		"--network-config-dir", filepath.Join(p.dir, "net"), "--cgroup-manager=cgroupfs", "--events-backend=file"}
	p.env = []string{"CONTAINERS_STORAGE_CONF=" + filepath.Join(p.dir, "storage.conf"), "CONTAINERS_CONF=" + filepath.Join(p.dir, "containers.conf")}
	if t.rootless {
		if err := b.rootlessStore(p); err != nil {
			return nil, err
		}
	} else {
		p.env = append(p.env, "HOME="+os.Getenv("HOME"))
	}
	cl.push(p.reset)
	// podman info says which storage podman took: containers/storage
	// would take fuse-overlayfs from PATH for a rootless user by itself.
	info, err := p.run(ctx, podmanDeadline, "info", "--format",
		`{{.Store.GraphDriverName}} {{.Store.GraphRoot}} {{.Store.RunRoot}} mount_program={{with index .Store.GraphOptions "overlay.mount_program"}}{{.Executable}}{{end}} mountopt={{with index .Store.GraphOptions "overlay.mountopt"}}{{.}}{{end}}`)
	if err != nil {
		return nil, err
	}
	want := fmt.Sprintf("overlay %s %s mount_program=%s mountopt=%s", graph, run, prog, strings.Join(opts, ","))
	if got := strings.TrimSpace(info); got != want {
		return nil, fmt.Errorf("podman's storage is %q, want %q", got, want)
	}
	return p, nil
}

// rootlessStore makes the store the rootless user's: it gets a home and
// a runtime directory there, subordinate ids if it has none, and runs
// podman through setpriv.
func (b *bencher) rootlessStore(p *podmanStore) error {
	env, err := b.rootlessSetup()
	if err != nil {
		return err
	}
	if err := ensureSubIDs(); err != nil {
		return err
	}
	home, xdg := filepath.Join(p.dir, "home"), filepath.Join(p.short, "xdg")
	for _, d := range []string{home, xdg} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	for _, d := range []string{p.dir, p.short, home, xdg} {
		if err := os.Chown(d, env.uid, env.gid); err != nil {
			return err
		}
	}
	p.env = append(p.env, "HOME="+home, "XDG_RUNTIME_DIR="+xdg)
	p.user = []string{"setpriv", "--reuid=" + strconv.Itoa(env.uid), "--regid=" + strconv.Itoa(env.gid), "--init-groups"}
	return nil
}

// subIDRange is what ensureSubIDs gives the rootless user when it has no
// subordinate ids.
const subIDRange = "165536-231071"

// ensureSubIDs gives the rootless user subordinate uids and gids (usermod)
// unless /etc/subuid and /etc/subgid have some for it.
func ensureSubIDs() error {
	for _, f := range []struct{ file, flag string }{{"/etc/subuid", "--add-subuids"}, {"/etc/subgid", "--add-subgids"}} {
		data, _ := os.ReadFile(f.file)
		found := false
		for _, line := range strings.Split(string(data), "\n") {
			found = found || strings.HasPrefix(line, rootlessUser+":")
		}
		if found {
			continue
		}
		if out, err := exec.Command("usermod", f.flag, subIDRange, rootlessUser).CombinedOutput(); err != nil {
			return fmt.Errorf("%s has no entry for %s, and usermod %s %s failed: %v: %s", f.file, rootlessUser, f.flag, subIDRange, err, oneLine(string(out)))
		}
	}
	return nil
}

// command is podman with the store's flags and args, as the store's user.
func (p *podmanStore) command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(append(append(append([]string{}, p.user...), "podman"), p.flags...), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = p.dir
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "HOME" && !strings.HasPrefix(k, "XDG_") && !strings.HasPrefix(k, "CONTAINERS_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, p.env...)
	// Its own process group: Ctrl-C is the bench's to handle; a
	// cancelled command gets SIGTERM first, so that podman cleans up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	return cmd
}

// run runs podman and returns its stdout; an error has its stderr.
func (p *podmanStore) run(ctx context.Context, limit time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := p.command(ctx, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("podman %s on %s: %v: %s", abbrev(strings.Join(args, " "), 60), p.name, err, abbrev(oneLine(stderr.String()), 600))
	}
	return string(out), nil
}

// build runs podman build --no-cache of ctx and times it and its steps.
func (p *podmanStore) build(ctx context.Context, dir string) (time.Duration, map[int]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, buildDeadline)
	defer cancel()
	cmd := p.command(ctx, "build", "--runtime", "runc", "--network=none", "--no-cache", "-t", builtImage, dir)
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	start := time.Now()
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return 0, nil, fmt.Errorf("podman build: %w", err)
	}
	var events []stepEvent
	var tail []string
	last := start
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			now := time.Now()
			line := sc.Text()
			if n, m, text, ok := parseStepLine(line); ok {
				events = append(events, stepEvent{n: n, m: m, text: text, at: now})
			}
			if strings.TrimSpace(line) != "" {
				last = now
				tail = append(tail, line)
				if len(tail) > 5 {
					tail = tail[1:]
				}
			}
		}
	}()
	err = cmd.Wait()
	total := time.Since(start)
	// A process podman left running (a daemon) may hold the pipe: what
	// it has not written a few seconds after podman's exit is not read.
	select {
	case <-read:
	case <-time.After(5 * time.Second):
	}
	r.Close()
	<-read
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("no end within %v", buildDeadline)
		}
		return 0, nil, fmt.Errorf("podman build on %s: %v: %s", p.name, err, abbrev(strings.Join(tail, " | "), 600))
	}
	steps, err := stepTimes(events, last, buildspec.Steps(buildspec.Containerfile))
	if err != nil {
		return 0, nil, fmt.Errorf("podman build on %s: %w", p.name, err)
	}
	return total, steps, nil
}

// reset removes everything podman made in the store (podman system
// reset), ends the processes it left (the rootless user's pause process,
// mount program daemons, conmon), and says what it had to kill.
func (p *podmanStore) reset() error {
	ctx, cancel := context.WithTimeout(context.Background(), podmanDeadline)
	defer cancel()
	var errs []error
	_, err := p.run(ctx, podmanDeadline, "system", "reset", "--force")
	if err != nil {
		// podman 4.3's event logger races the reset that removes its
		// directory ("creating locker directory", "unlinkat
		// .../events: directory not empty"): a second reset finds
		// nothing of it.
		_, err = p.run(ctx, podmanDeadline, "system", "reset", "--force")
	}
	if err != nil {
		errs = append(errs, err)
	}
	if pid := readPid(filepath.Join(p.short, "tmp", "pause.pid")); pid > 0 {
		unix.Kill(pid, unix.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
	if left := endProcesses([]string{p.dir + "/", p.short + "/"}, 20*time.Second); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still running after podman system reset, killed: %s", strings.Join(left, "; ")))
	}
	return errors.Join(errs...)
}

// endProcesses waits up to limit for every process whose command line
// names a path under one of dirs to exit, kills those left, and returns
// their command lines.
func endProcesses(dirs []string, limit time.Duration) []string {
	find := func() map[int]string {
		found := map[int]string{}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || procState(pid) == 'Z' {
				continue
			}
			cmdline := strings.ReplaceAll(string(data), "\x00", " ")
			for _, d := range dirs {
				if strings.Contains(cmdline, d) {
					found[pid] = cmdline
				}
			}
		}
		return found
	}
	var left map[int]string
	for end := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		if left = find(); len(left) == 0 || time.Now().After(end) {
			break
		}
	}
	var out []string
	for pid, cmdline := range left {
		unix.Kill(pid, unix.SIGKILL)
		waitGone(pid, 5*time.Second)
		out = append(out, abbrev(cmdline, 200))
	}
	return out
}

// stepEvent is a "STEP n/m: text" line of podman build and when it came.
type stepEvent struct {
	n, m int
	text string
	at   time.Time
}

// parseStepLine reads podman build's "STEP n/m: text" line.
func parseStepLine(line string) (n, m int, text string, ok bool) {
	rest, found := strings.CutPrefix(line, "STEP ")
	if !found {
		return 0, 0, "", false
	}
	count, text, found := strings.Cut(rest, ": ")
	if !found {
		return 0, 0, "", false
	}
	ns, ms, found := strings.Cut(count, "/")
	if !found {
		return 0, 0, "", false
	}
	n, err1 := strconv.Atoi(ns)
	m, err2 := strconv.Atoi(ms)
	if err1 != nil || err2 != nil || n < 1 || m < n || strings.TrimSpace(text) == "" {
		return 0, 0, "", false
	}
	return n, m, text, true
}

// stepTimes is each step's time: from its STEP line to the next one's,
// the last one's to end. The lines must be every step of want, in order,
// each naming its instruction (whitespace aside).
func stepTimes(events []stepEvent, end time.Time, want []buildspec.Step) (map[int]time.Duration, error) {
	if len(events) != len(want) {
		return nil, fmt.Errorf("%d STEP lines, want %d", len(events), len(want))
	}
	times := map[int]time.Duration{}
	for i, e := range events {
		if e.n != want[i].N || e.m != len(want) {
			return nil, fmt.Errorf("STEP %d/%d where STEP %d/%d was due", e.n, e.m, want[i].N, len(want))
		}
		if strings.Join(strings.Fields(e.text), " ") != strings.Join(strings.Fields(want[i].Text), " ") {
			return nil, fmt.Errorf("STEP %d is %q, want %q", e.n, e.text, want[i].Text)
		}
		next := end
		if i+1 < len(events) {
			next = events[i+1].at
		}
		if next.Before(e.at) {
			return nil, fmt.Errorf("STEP %d ends before it starts", e.n)
		}
		times[e.n] = next.Sub(e.at)
	}
	return times, nil
}

// buildLine is the build workloads' line above the table.
func (s *buildState) line() string {
	return fmt.Sprintf("build workloads: %s, podman build --no-cache on a private store per target and round; each RUN step's time runs to the next STEP line (its layer's commit included)", s.podman)
}
