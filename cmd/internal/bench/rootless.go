package bench

// Rootless targets: each is mounted by an unprivileged user in a user and
// mount namespace of its own, as rootless podman mounts its storage, and
// every workload runs there too: an agent (this program, `goverlay bench
// --rootless-agent SPEC`) started as that user through `setpriv` and
// `unshare -Urm` mounts the target, runs each workload it is sent on its
// stdin with the same code the other targets run, and answers with the
// sample on its stdout. The bench, as root, sets the user up (creating it
// if needed), gives it its own copy of the lower layer, and makes
// /dev/fuse usable by it (0666, as udev leaves it on desktop
// distributions).
//
// The containers workloads run in the agent too, on the user's own copy of
// the tree's layers (as rootless podman's layers under
// ~/.local/share/containers belong to the user): what needs root stays
// with the bench. It drops the caches before a cold step, and it counts
// the FUSE requests of each timed part on the mount's connection (the
// agent says "begin" and waits for "go" before, "end" and waits for "ok"
// after).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverlay/goverlay/overlay"
)

// AgentFlag, as the first argument of goverlay-bench, runs the rootless
// agent instead of a bench.
const AgentFlag = "--rootless-agent"

// rootlessUser is the user rootless targets run as, created if missing.
const rootlessUser = "goverlaybench"

// agentExecutable is the program that runs the agent: this one (tests
// replace it with a goverlay-bench binary).
var agentExecutable = os.Executable

// rootlessEnv is what every rootless target of a run shares, set up once.
type rootlessEnv struct {
	uid, gid int
	// lower is the user's own copy of the lower layer (a rootless
	// user's layers are its own: containers/storage maps their ids).
	lower string
	// ctLowers are the user's copies of the containers tree's layers,
	// and ctIndex the tree's index, when a containers workload runs.
	ctLowers []string
	ctIndex  string
	// agent and binary are copies of this program and of the goverlay
	// binary that the user may run (the originals may be in a directory
	// it cannot enter).
	agent, binary string
	// notes say what the setup changed on the machine.
	notes []string
	err   error
}

// rootlessSetup sets the rootless environment up on first use.
func (b *bencher) rootlessSetup() (*rootlessEnv, error) {
	if b.rootless != nil {
		return b.rootless, b.rootless.err
	}
	e := &rootlessEnv{}
	b.rootless = e
	e.err = e.setup(b)
	return e, e.err
}

func (e *rootlessEnv) setup(b *bencher) error {
	u, err := user.Lookup(rootlessUser)
	if err != nil {
		out, uerr := exec.Command("useradd", "-M", "-s", "/usr/sbin/nologin", rootlessUser).CombinedOutput()
		if u, err = user.Lookup(rootlessUser); err != nil {
			return fmt.Errorf("create the rootless user %s: %v: %s", rootlessUser, uerr, oneLine(string(out)))
		}
		e.notes = append(e.notes, "created user "+rootlessUser)
	}
	e.uid, _ = strconv.Atoi(u.Uid)
	e.gid, _ = strconv.Atoi(u.Gid)
	var st unix.Stat_t
	if err := unix.Stat("/dev/fuse", &st); err != nil {
		return fmt.Errorf("/dev/fuse: %w", err)
	}
	if st.Mode&0o666 != 0o666 {
		if err := os.Chmod("/dev/fuse", 0o666); err != nil {
			return fmt.Errorf("make /dev/fuse usable by %s: %w", rootlessUser, err)
		}
		e.notes = append(e.notes, fmt.Sprintf("/dev/fuse was %04o: made it 0666 (as udev leaves it on desktop distributions)", st.Mode&0o7777))
	}
	// The user must reach the scratch tree (MkdirTemp made it 0700).
	if err := os.Chmod(b.root, 0o755); err != nil {
		return err
	}
	for d := filepath.Dir(b.root); d != "/"; d = filepath.Dir(d) {
		if err := unix.Stat(d, &st); err == nil && st.Mode&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by other users, so the rootless user cannot reach the scratch tree; choose another --dir", d)
		}
	}
	e.lower = filepath.Join(b.root, "lower-rootless")
	if err := buildLower(e.lower); err != nil {
		return fmt.Errorf("build the rootless lower layer: %w", err)
	}
	if err := e.setupContainers(b); err != nil {
		return err
	}
	if err := chownTree(e.lower, e.uid, e.gid); err != nil {
		return err
	}
	self, err := agentExecutable()
	if err != nil {
		return err
	}
	e.agent, e.binary = filepath.Join(b.root, "agent"), filepath.Join(b.root, "goverlay")
	if err := copyFile(self, e.agent, 0o755); err != nil {
		return fmt.Errorf("copy the bench program for the rootless user: %w", err)
	}
	if b.cfg.Binary != "" {
		if err := copyFile(b.cfg.Binary, e.binary, 0o755); err != nil {
			return fmt.Errorf("copy the goverlay binary for the rootless user: %w", err)
		}
	}
	return nil
}

// setupContainers gives the user its own copy of the containers tree's
// layers, the static binary of the exec step in its lower, and the tree's
// index in a file the agent reads.
func (e *rootlessEnv) setupContainers(b *bencher) error {
	ct := b.ct
	if ct == nil {
		return nil
	}
	for i := range ct.lowers {
		e.ctLowers = append(e.ctLowers, filepath.Join(b.root, fmt.Sprintf("lower-ct%d-rootless", i+1)))
	}
	if ct.tree != nil {
		layers := make([]string, len(e.ctLowers))
		for i, l := range e.ctLowers {
			layers[i] = filepath.Join(l, ct.name)
		}
		if err := ct.tree.buildLayers(layers, ""); err != nil {
			return fmt.Errorf("rootless containers tree: %w", err)
		}
	} else {
		for i, l := range ct.lowers {
			if err := os.Mkdir(e.ctLowers[i], 0o755); err != nil {
				return err
			}
			if out, err := exec.Command("cp", "-a", filepath.Join(l, ct.name), e.ctLowers[i]).CombinedOutput(); err != nil {
				return fmt.Errorf("copy --tree for the rootless user: %v: %s", err, oneLine(string(out)))
			}
		}
	}
	for _, l := range e.ctLowers {
		if err := chownTree(l, e.uid, e.gid); err != nil {
			return err
		}
	}
	if ct.static == "" {
		if err := os.MkdirAll(filepath.Join(e.lower, filepath.Dir(ctStatic)), 0o755); err != nil {
			return err
		}
		if err := copyFile(ctBusybox, filepath.Join(e.lower, ctStatic), 0o755); err != nil {
			return fmt.Errorf("copy %s into the rootless lower: %w", ctBusybox, err)
		}
	}
	js, err := json.Marshal(ct.idx)
	if err != nil {
		return err
	}
	e.ctIndex = filepath.Join(b.root, "ct-index.json")
	return os.WriteFile(e.ctIndex, js, 0o644)
}

func chownTree(root string, uid, gid int) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// rootlessPrecheck says why rootless targets cannot run here, or "".
func rootlessPrecheck() string {
	if os.Geteuid() != 0 {
		return "rootless targets are set up by root (a user, its namespace, /dev/fuse)"
	}
	for _, tool := range []string{"setpriv", "unshare", "useradd"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not installed (util-linux, passwd)"
		}
	}
	return ""
}

// agentSpec is what the agent mounts and how it runs workloads.
type agentSpec struct {
	Target  string        `json:"target"`
	Binary  string        `json:"binary"`
	Lowers  string        `json:"lowers"`
	Upper   string        `json:"upper"`
	Work    string        `json:"work"`
	Mnt     string        `json:"mnt"`
	Pidfile string        `json:"pidfile"`
	Config  Config        `json:"config"`
	Wants   []string      `json:"workloads"`
	Timeout time.Duration `json:"timeout"`
	// Containers is the containers workloads' tree, when one runs.
	Containers *agentCt `json:"containers,omitempty"`
}

// agentCt is what the agent needs of the containers tree (ctState): the
// tree's name in the target's root, the files holding its index and the
// untar step's archive, and why the exec step cannot run, if it cannot.
type agentCt struct {
	Name    string `json:"name"`
	Index   string `json:"index"`
	Tarball string `json:"tarball"`
	Static  string `json:"static,omitempty"`
}

// agentResult is one workload's answer.
type agentResult struct {
	Value    float64    `json:"value"`
	Getxattr *float64   `json:"getxattr,omitempty"`
	Reqs     *ReqSample `json:"reqs,omitempty"`
	Err      string     `json:"err,omitempty"`
}

// agent is a running agent, seen from the bench.
type agent struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	errb  *lockedBuffer
	ended chan error
}

// lockedBuffer is the agent's stderr, written by exec's copier while the
// bench reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// run has the agent run workload w on inst: it drops the caches first
// for a cold step, and counts the FUSE requests of the timed part between
// the agent's "begin" and "end".
func (a *agent) run(inst *instance, w *workloadDef, b *bencher) (sample, error) {
	if w.dropsCaches {
		if err := dropAll(); err != nil {
			return sample{}, err
		}
	}
	if _, err := fmt.Fprintln(a.in, w.name); err != nil {
		return sample{}, fmt.Errorf("rootless agent: %w", err)
	}
	var ctr *reqCounter
	defer func() {
		if ctr != nil {
			ctr.close()
		}
	}()
	var counts map[string]uint64
	var terr error
	for {
		line, err := a.out.ReadString('\n')
		if err != nil {
			return sample{}, fmt.Errorf("rootless agent ended: %v: %s", err, oneLine(a.errb.String()))
		}
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "begin":
			if inst.conn != 0 {
				ctr, terr = b.tracer.start(inst.conn, len(f) > 1 && f[1] == "types")
			}
			if _, err := fmt.Fprintln(a.in, "go"); err != nil {
				return sample{}, fmt.Errorf("rootless agent: %w", err)
			}
			continue
		case len(f) > 0 && f[0] == "end":
			if ctr != nil {
				counts, terr = ctr.stop()
				ctr = nil
			}
			if _, err := fmt.Fprintln(a.in, "ok"); err != nil {
				return sample{}, fmt.Errorf("rootless agent: %w", err)
			}
			continue
		}
		var r agentResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return sample{}, fmt.Errorf("rootless agent: %q: %w", line, err)
		}
		if r.Err != "" {
			return sample{}, errors.New(r.Err)
		}
		if terr != nil {
			b.targetNote(inst.def.name, "FUSE request counter: "+terr.Error())
		} else if counts != nil && r.Reqs != nil {
			r.Reqs.setCounts(counts)
		}
		return sample{value: r.Value, getxattr: r.Getxattr, reqs: r.Reqs}, nil
	}
}

// agentStatsRequest, on the agent's stdin, asks for the daemon's counters.
// They come from the agent: the mount is in its namespaces, and a daemon
// answers root of its user namespace, not the bench's.
const agentStatsRequest = "stats"

// agentStats is the agent's answer to agentStatsRequest.
type agentStats struct {
	Stats *overlay.Stats `json:"stats,omitempty"`
	Err   string         `json:"err,omitempty"`
}

// stats asks the agent for its daemon's counters.
func (a *agent) stats() (overlay.Stats, error) {
	if _, err := fmt.Fprintln(a.in, agentStatsRequest); err != nil {
		return overlay.Stats{}, fmt.Errorf("rootless agent: %w", err)
	}
	line, err := a.out.ReadString('\n')
	if err != nil {
		return overlay.Stats{}, fmt.Errorf("rootless agent ended: %v: %s", err, oneLine(a.errb.String()))
	}
	var r agentStats
	switch err := json.Unmarshal([]byte(line), &r); {
	case err != nil:
		return overlay.Stats{}, fmt.Errorf("rootless agent: %q: %w", line, err)
	case r.Err != "":
		return overlay.Stats{}, errors.New(r.Err)
	case r.Stats == nil:
		return overlay.Stats{}, fmt.Errorf("rootless agent: %q: no counters", line)
	}
	return *r.Stats, nil
}

// stats reads the counters of a goverlay instance's daemon: here, or
// through its agent.
func (inst *instance) stats() (overlay.Stats, error) {
	if inst.agent != nil {
		return inst.agent.stats()
	}
	return readStats(inst.root)
}

// run runs workload w on the instance: here, or in its agent.
func (inst *instance) run(ctx context.Context, w *workloadDef, b *bencher) (sample, error) {
	if inst.agent != nil && !w.inBench {
		return inst.agent.run(inst, w, b)
	}
	return w.run(ctx, inst, b)
}

// agentLink is the agent's side of the request count: the bench, as
// root, counts the requests of the timed part between begin and end.
type agentLink struct {
	in  *bufio.Scanner
	out io.Writer
}

// begin says a timed part starts (byType: count requests by type) and
// waits for the bench's counter.
func (l *agentLink) begin(byType bool) error {
	say := "begin"
	if byType {
		say += " types"
	}
	return l.exchange(say, "go")
}

// end says the timed part is over and waits for the bench to read its
// counter.
func (l *agentLink) end() error { return l.exchange("end", "ok") }

func (l *agentLink) exchange(say, want string) error {
	if _, err := fmt.Fprintln(l.out, say); err != nil {
		return err
	}
	if !l.in.Scan() {
		return fmt.Errorf("the bench went away before %q", want)
	}
	if got := strings.TrimSpace(l.in.Text()); got != want {
		return fmt.Errorf("the bench said %q, want %q", got, want)
	}
	return nil
}

// setupRootless starts the agent that mounts rootless target t over fresh
// directories under dir. Undo steps go on cl.
func (t *targetDef) setupRootless(ctx context.Context, b *bencher, dir string, cl *cleanups) (*instance, error) {
	env, err := b.rootlessSetup()
	if err != nil {
		return nil, err
	}
	for _, n := range env.notes {
		b.targetNote(t.name, n)
	}
	inst := &instance{def: t, dir: dir}
	upperDir, work, mnt := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
	cl.push(func() error { return os.RemoveAll(dir) })
	for _, d := range []string{dir, upperDir, work, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chown(d, env.uid, env.gid); err != nil {
			return nil, err
		}
	}
	if b.wants("readdir-100k") {
		if err := buildDCLayer(upperDir, b.dc, -1, false, true); err != nil {
			return nil, fmt.Errorf("fill the upper layer: %w", err)
		}
		if err := chownTree(upperDir, env.uid, env.gid); err != nil {
			return nil, err
		}
	}
	spec := agentSpec{
		Target: t.name, Binary: env.binary,
		Lowers: strings.Join(append(append([]string{env.lower}, b.dcLowers...), env.ctLowers...), ":"),
		Upper:  upperDir, Work: work, Mnt: mnt, Pidfile: filepath.Join(dir, "pid"),
		Config: Config{Duration: b.cfg.Duration, Scale: b.cfg.Scale, Runs: 1},
	}
	for _, w := range b.workloads {
		spec.Wants = append(spec.Wants, w.name)
	}
	if b.ct != nil {
		spec.Containers = &agentCt{Name: b.ct.name, Index: env.ctIndex, Tarball: b.ct.tarball, Static: b.ct.static}
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(env.uid), "--regid="+strconv.Itoa(env.gid), "--clear-groups",
		"unshare", "-Urm", "--", env.agent, AgentFlag, string(js))
	// Its own process group: Ctrl-C is the bench's to handle, which
	// closes the agent's stdin so that it unmounts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Dir = "/"
	a := &agent{cmd: cmd, errb: &lockedBuffer{}, ended: make(chan error, 1)}
	cmd.Stderr = a.errb
	if a.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	a.out = bufio.NewReader(out)
	restore := func() {}
	if t.uring {
		if restore, err = offerUring(); err != nil {
			return nil, err
		}
	}
	// Offered until the agent has mounted (or failed to).
	defer func() { restore() }()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the rootless agent: %w", err)
	}
	go func() { a.ended <- cmd.Wait() }()
	cl.push(func() error { return a.stop(spec.Pidfile) })
	ready := make(chan string, 1)
	go func() {
		line, _ := a.out.ReadString('\n')
		ready <- strings.TrimSpace(line)
	}()
	select {
	case line := <-ready:
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "ready" {
			return nil, fmt.Errorf("rootless mount failed: %s", oneLine(a.errb.String()+" "+line))
		}
		// A FUSE mount's connection, which the agent sees in its
		// mount namespace: the bench counts its requests.
		if len(f) > 1 && b.tracer != nil && b.tracer.err == nil {
			inst.conn, _ = strconv.ParseUint(f[1], 10, 64)
		}
	case <-time.After(time.Minute):
		return nil, fmt.Errorf("rootless agent: not mounted after a minute: %s", oneLine(a.errb.String()))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for _, line := range strings.Split(a.errb.String(), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.Contains(line, "NOSEC ") {
			b.targetNote(t.name, line)
		}
	}
	inst.agent, inst.root = a, mnt
	inst.pid = readPid(spec.Pidfile)
	return inst, nil
}

// stop closes the agent's stdin, which makes it unmount and exit, and
// waits; an agent or daemon still there after 30 s is killed.
func (a *agent) stop(pidfile string) error {
	a.in.Close()
	daemon := readPid(pidfile)
	select {
	case <-a.ended:
	case <-time.After(30 * time.Second):
		unix.Kill(-a.cmd.Process.Pid, unix.SIGKILL)
		if daemon > 0 {
			unix.Kill(daemon, unix.SIGKILL)
		}
		<-a.ended
		return fmt.Errorf("rootless agent did not stop: killed it: %s", oneLine(a.errb.String()))
	}
	waitGone(daemon, 5*time.Second)
	return nil
}

// Agent is `goverlay bench --rootless-agent SPEC`, run by the bench as the
// rootless user in its namespace: it mounts the target SPEC describes,
// says "ready" (with the FUSE connection's number), then runs each
// workload named on stdin, or reads the daemon's counters
// (agentStatsRequest), and answers with a JSON line; at EOF it unmounts.
func Agent(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(stderr, "usage: goverlay-bench %s SPEC (run by goverlay bench itself)\n", AgentFlag)
		return 2
	}
	var spec agentSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		fmt.Fprintf(stderr, "rootless agent: bad spec: %v\n", err)
		return 2
	}
	t := findTarget(spec.Target)
	if t == nil || !t.rootless {
		fmt.Fprintf(stderr, "rootless agent: %q is not a rootless target\n", spec.Target)
		return 2
	}
	ctx := context.Background()
	layers := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", spec.Lowers, spec.Upper, spec.Work)
	inst := &instance{def: t, root: spec.Mnt, dir: filepath.Dir(spec.Mnt)}
	var err error
	var out string
	switch t.kind {
	case kindKernel:
		err = unix.Mount("overlay", spec.Mnt, "overlay", 0, layers+",userxattr")
		if err != nil {
			err = fmt.Errorf("mount -t overlay -o userxattr: %w", err)
		}
	case kindFuseOverlayfs:
		out, err = runMount(ctx, "fuse-overlayfs", "-o", layers, spec.Mnt)
	case kindGoverlay:
		opts := strings.Join(append([]string{layers, "userxattr"}, t.opts...), ",")
		out, err = runMount(ctx, spec.Binary, "-o", opts, "--pidfile", spec.Pidfile, spec.Mnt)
		inst.pid = readPid(spec.Pidfile)
	default:
		err = fmt.Errorf("no rootless mount for %s", t.name)
	}
	if out != "" {
		fmt.Fprintln(stderr, out)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	defer func() {
		unmountAll(spec.Mnt)
		waitGone(inst.pid, 5*time.Second)
	}()
	if err := prepareTarget(inst); err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	sc := bufio.NewScanner(stdin)
	b := &bencher{ctx: ctx, cfg: spec.Config, lower: strings.Split(spec.Lowers, ":")[0], results: map[[2]string]*Result{},
		link: &agentLink{in: sc, out: stdout}}
	if c := spec.Containers; c != nil {
		idx := &ctIndex{}
		data, err := os.ReadFile(c.Index)
		if err == nil {
			err = json.Unmarshal(data, idx)
		}
		if err != nil {
			fmt.Fprintf(stderr, "rootless agent: the containers tree's index: %v\n", err)
			return 1
		}
		b.ct = &ctState{name: c.Name, idx: idx, tarball: c.Tarball, static: c.Static}
	}
	for _, name := range spec.Wants {
		if w := findWorkload(name); w != nil {
			b.workloads = append(b.workloads, w)
			if w.group == groupDircache {
				b.dc = newDCLayout(spec.Config.Scale)
			}
		}
	}
	if b.wants("untar") {
		if b.tarball, err = buildTarball(); err != nil {
			fmt.Fprintf(stderr, "%v\n", err)
			return 1
		}
	}
	ready := "ready"
	if t.kind != kindKernel {
		if conn, err := fuseConnection(spec.Mnt); err == nil {
			ready += " " + strconv.FormatUint(conn, 10)
		}
	}
	fmt.Fprintln(stdout, ready)
	enc := json.NewEncoder(stdout)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == agentStatsRequest {
			var r agentStats
			if st, err := readStats(spec.Mnt); err != nil {
				r.Err = err.Error()
			} else {
				r.Stats = &st
			}
			if err := enc.Encode(r); err != nil {
				return 1
			}
			continue
		}
		var r agentResult
		if w := findWorkload(strings.TrimSpace(sc.Text())); w == nil {
			r.Err = "unknown workload " + sc.Text()
		} else if s, err := w.run(ctx, inst, b); err != nil {
			r.Err = err.Error()
		} else {
			r.Value, r.Getxattr, r.Reqs = s.value, s.getxattr, s.reqs
		}
		if err := enc.Encode(r); err != nil {
			return 1
		}
	}
	return 0
}
