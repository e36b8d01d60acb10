package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The container waiting reasons the node reports.
const (
	reasonContainerCreating  = "ContainerCreating"
	reasonPodInitializing    = "PodInitializing"
	reasonCrashLoopBackOff   = "CrashLoopBackOff"
	reasonErrImagePull       = "ErrImagePull"
	reasonCreateConfigError  = "CreateContainerConfigError"
	reasonCreateContainerErr = "CreateContainerError"
)

// The terminated reasons.
const (
	reasonCompleted = "Completed"
	reasonError     = "Error"
	reasonOOMKilled = "OOMKilled"
)

type ctrKind int

const (
	kindRegular ctrKind = iota // spec.containers
	kindSidecar                // initContainers with restartPolicy Always
	kindInit                   // initContainers that run to completion
)

// ctr is one container of a pod and its supervisor: it starts the container's
// process, restarts it by the restart policy with back-off, and stops it.
type ctr struct {
	p    *pod
	name string
	kind ctrKind
	spec corev1.Container

	stopCh       chan struct{}
	stopOnce     sync.Once
	stopDeadline atomic.Pointer[time.Time]
	finished     chan struct{} // closed when the supervisor has returned
	launched     atomic.Bool

	st ctrState // guarded by p.mu
}

// ctrState is what the status reports of a container.
type ctrState struct {
	waiting   *corev1.ContainerStateWaiting // when neither running nor terminated: why
	run       *instance                     // the running process
	term      *termination                  // terminated and not (yet) restarting
	last      *termination                  // the previous termination (lastState)
	restarts  int32
	ready     bool
	started   bool
	succeeded bool // a regular init container that exited 0
	imageID   string
}

// termination is how one run of a container ended.
type termination struct {
	id                    string
	exitCode              int
	signal                syscall.Signal
	reason, message       string
	startedAt, finishedAt time.Time
}

func (t *termination) api() *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{
		ExitCode:    int32(t.exitCode),
		Signal:      int32(t.signal),
		Reason:      t.reason,
		Message:     t.message,
		StartedAt:   metav1.NewTime(t.startedAt),
		FinishedAt:  metav1.NewTime(t.finishedAt),
		ContainerID: "lab://" + t.id,
	}
}

// instance is one run of a container: a process in a fresh cgroup.
type instance struct {
	id        string
	cgroup    string
	cmd       *exec.Cmd
	pid       int
	startedAt time.Time
	env       []string
	vars      []envVar
	dir       string
	cred      *syscall.Credential
	rewrites  []rewrite
	oom       *oomWatch
	oomKilled atomic.Bool

	exited     chan struct{} // closed once the process has been reaped
	waitErr    error
	finishedAt time.Time

	mu         sync.Mutex
	killReason string // why the node killed it, if it did
}

func (in *instance) hasExited() bool {
	select {
	case <-in.exited:
		return true
	default:
		return false
	}
}

func (in *instance) setKillReason(r string) {
	in.mu.Lock()
	if in.killReason == "" {
		in.killReason = r
	}
	in.mu.Unlock()
}

func newCtr(p *pod, spec *corev1.Container, kind ctrKind) *ctr {
	return &ctr{p: p, name: spec.Name, kind: kind, spec: *spec.DeepCopy(), stopCh: make(chan struct{}), finished: make(chan struct{})}
}

// finishedLocked reports whether the supervisor has returned (no more runs).
func (c *ctr) finishedLocked() bool {
	select {
	case <-c.finished:
		return true
	default:
		return false
	}
}

// current is the running instance, or nil.
func (c *ctr) current() *instance {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.st.run
}

// launch starts the supervisor.
func (c *ctr) launch(ctx context.Context) {
	if c.launched.Swap(true) {
		return
	}
	go c.supervise(ctx)
}

// stopAndWait stops the container (SIGTERM, SIGKILL at deadline or after
// minGrace, whichever is later) and waits until it has stopped.
func (c *ctr) stopAndWait(deadline time.Time) {
	deadline = later(deadline, c.p.n.clock.Now().Add(minGrace))
	c.stopDeadline.Store(&deadline)
	c.stopOnce.Do(func() { close(c.stopCh) })
	if c.launched.Load() {
		<-c.finished
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (c *ctr) stopping() bool {
	select {
	case <-c.stopCh:
		return true
	default:
		return false
	}
}

func (c *ctr) event(t EventType) Event {
	return Event{Type: t, Namespace: c.p.ns, Pod: c.p.name, UID: c.p.uid, Container: c.name}
}

// shouldRestart applies the restart policy (the container's, for native
// sidecars, else the pod's) to an exit. A regular init container that
// succeeded is done.
func (c *ctr) shouldRestart(exitCode int) bool {
	policy := c.p.apiPod().Spec.RestartPolicy
	if c.spec.RestartPolicy != nil {
		policy = corev1.RestartPolicy(*c.spec.RestartPolicy)
	}
	if c.kind == kindInit {
		return exitCode != 0 && policy != corev1.RestartPolicyNever
	}
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	}
	return true
}

// supervise runs the container until it is stopped or, by its restart
// policy, done.
func (c *ctr) supervise(ctx context.Context) {
	defer func() {
		close(c.finished)
		c.p.notify()
	}()
	n := c.p.n
	loop := newCrashLoop(n.cfg.Backoff)
	for {
		if c.stopping() {
			return
		}
		in, reason, err := c.start(ctx)
		if err != nil {
			now := n.clock.Now()
			c.setWaiting(reason, err.Error())
			ev := c.event(EventFailed)
			ev.Time, ev.Reason, ev.Message = now, reason, err.Error()
			n.emit(ev)
			c.p.log.Warn("container not started", "container", c.name, "reason", reason, "err", err)
			if reason == reasonErrImagePull { // the image map does not change
				<-c.stopCh
				return
			}
			// Unlike a crash, a failure to create waits from the first retry.
			if !sleep(context.Background(), n.clock, max(loop.next(time.Time{}, now), n.cfg.Backoff.Initial), c.stopCh) {
				return
			}
			continue
		}
		probes, stopProbes := context.WithCancel(ctx)
		var pw sync.WaitGroup
		pw.Go(func() { c.probe(probes, in) })
		stopped := false
		select {
		case <-in.exited:
		case <-c.stopCh:
			stopped = true
			d := *c.stopDeadline.Load()
			c.kill(in, d.Sub(n.clock.Now()), "stopped")
		}
		stopProbes()
		pw.Wait()
		t := c.exited(in)
		if stopped || c.stopping() {
			ev := c.event(EventStopped)
			ev.ContainerID, ev.RestartCount, ev.ExitCode, ev.Signal, ev.Reason = in.id, c.restartCount(), t.exitCode, t.signal, t.reason
			n.emit(ev)
			return
		}
		if !c.shouldRestart(t.exitCode) {
			return
		}
		if d := loop.next(in.startedAt, t.finishedAt); d > 0 {
			p := c.p
			c.setWaiting(reasonCrashLoopBackOff, fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, c.name, p.name, p.ns, p.uid))
			ev := c.event(EventBackOff)
			ev.ContainerID, ev.RestartCount, ev.Delay = in.id, c.restartCount(), d
			n.emit(ev)
			if !sleep(context.Background(), n.clock, d, c.stopCh) {
				ev := c.event(EventStopped)
				ev.ContainerID, ev.RestartCount = in.id, c.restartCount()
				n.emit(ev)
				return
			}
		}
		c.p.mu.Lock()
		c.st.restarts++
		c.p.mu.Unlock()
	}
}

func (c *ctr) restartCount() int32 {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.st.restarts
}

// setWaiting puts the container in the waiting state; a termination becomes
// the last state.
func (c *ctr) setWaiting(reason, msg string) {
	p := c.p
	p.mu.Lock()
	if c.st.term != nil {
		c.st.last, c.st.term = c.st.term, nil
	}
	c.st.waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: msg}
	p.notifyLocked()
	p.mu.Unlock()
}

// newContainerID is a random 64-hex-digit ID, like a container runtime's.
func newContainerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// start creates a run of the container: it resolves the image, the
// environment, the command and the volumes' paths, creates the container's
// cgroup with its OOM watch, and starts the process in it. On error it
// returns the waiting reason.
func (c *ctr) start(ctx context.Context) (*instance, string, error) {
	p, n := c.p, c.p.n
	api := p.apiPod()
	img, repo, ok := lookupImage(n.cfg.Images, c.spec.Image)
	if !ok {
		return nil, reasonErrImagePull, fmt.Errorf("image %q: repository %q is not mapped to a program: the lab node runs the images of node.Config.Images, keyed by repository", c.spec.Image, repo)
	}
	cred, err := credential(api, &c.spec)
	if err != nil {
		return nil, reasonCreateConfigError, err
	}
	vars, err := containerEnv(api, &c.spec, n.facts, &apiObjects{ctx: ctx, n: n, ns: p.ns})
	if err != nil {
		return nil, reasonCreateConfigError, err
	}
	rs, err := p.rewrites(&c.spec)
	if err != nil {
		return nil, reasonCreateConfigError, err
	}
	argv := commandLine(img, &c.spec, lookupIn(vars))
	if len(argv) == 0 {
		return nil, reasonCreateContainerErr, fmt.Errorf("no command: the mapping of %s has no Entrypoint and the container no command", repo)
	}
	for i := range argv {
		argv[i] = rewritePaths(argv[i], rs)
	}
	env := processEnv(img, api.Name, vars, rs)
	exe, err := lookPath(argv[0], env)
	if err != nil {
		return nil, reasonCreateContainerErr, err
	}
	dir := c.spec.WorkingDir
	if dir == "" {
		dir = img.WorkingDir
	}
	if dir == "" {
		dir = "/"
	}
	dir = rewritePaths(dir, rs)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, reasonCreateContainerErr, fmt.Errorf("working directory %s does not exist on the host", dir)
	}

	p.mu.Lock()
	restarts := c.st.restarts
	p.mu.Unlock()
	logDir := filepath.Join(p.dir, c.name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, reasonCreateContainerErr, err
	}
	logf, err := os.OpenFile(filepath.Join(logDir, strconv.Itoa(int(restarts))+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, reasonCreateContainerErr, err
	}
	defer logf.Close() // the child has its own descriptor

	id := newContainerID()
	cg := p.cgroup + "/" + id
	fail := func(err error) (*instance, string, error) {
		if rerr := n.cg.remove(cg); rerr != nil {
			p.log.Warn("remove container cgroup", "cgroup", cg, "err", rerr)
		}
		return nil, reasonCreateContainerErr, err
	}
	if err := n.cg.create(cg, containerLimits(&c.spec)); err != nil {
		return fail(err)
	}
	oom, err := n.cg.watchOOM(cg)
	if err != nil {
		return fail(err)
	}
	cmd := &exec.Cmd{
		Path: exe, Args: argv, Env: env, Dir: dir, Stdout: logf, Stderr: logf,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred},
	}
	if err := n.cg.spawn(cmd, cg); err != nil {
		oom.close()
		return fail(fmt.Errorf("start %s: %w", exe, err))
	}
	in := &instance{
		id: id, cgroup: cg, cmd: cmd, pid: cmd.Process.Pid, startedAt: n.clock.Now(),
		env: env, vars: vars, dir: dir, cred: cred, rewrites: rs, oom: oom,
		exited: make(chan struct{}),
	}
	go func() {
		in.waitErr = cmd.Wait()
		in.finishedAt = n.clock.Now()
		close(in.exited)
	}()
	go c.watchOOM(in)

	// Running: a started container without a startup probe is started, and
	// ready without a readiness probe (a regular init container is ready
	// only once it has succeeded).
	p.mu.Lock()
	if c.st.term != nil {
		c.st.last = c.st.term
	}
	c.st.term, c.st.waiting, c.st.run = nil, nil, in
	c.st.imageID = "lab://" + exe
	c.st.started = c.spec.StartupProbe == nil
	c.st.ready = c.st.started && c.spec.ReadinessProbe == nil && c.kind != kindInit
	ready := c.st.ready
	p.notifyLocked()
	p.mu.Unlock()
	ev := c.event(EventStarted)
	if restarts > 0 {
		ev.Type = EventRestarted
	}
	ev.Time, ev.ContainerID, ev.PID, ev.RestartCount = in.startedAt, id, in.pid, restarts
	n.emit(ev)
	p.log.Info("container started", "container", c.name, "id", id[:12], "pid", in.pid, "restarts", restarts)
	p.log.Debug("container command", "container", c.name, "argv", argv) // may hold secrets from $(VAR)
	if ready {
		ev := c.event(EventReady)
		ev.Time, ev.ContainerID, ev.PID, ev.RestartCount = in.startedAt, id, in.pid, restarts
		n.emit(ev)
	}
	return in, "", nil
}

// watchOOM emulates memory.oom.group: when the kernel OOM-kills a process of
// the container, every other process of it is killed too, and the container
// ends OOMKilled.
func (c *ctr) watchOOM(in *instance) {
	n := c.p.n
	for {
		if err := in.oom.wait(); err != nil || in.hasExited() {
			return
		}
		at := n.clock.Now()
		kills, err := in.oom.kills()
		// The notification is sent when the OOM starts; the kill (and its
		// counter) follows within moments, or never if the OOM resolves
		// because a task was exiting anyway.
		for i := 0; err == nil && kills == 0 && i < 20 && !in.hasExited(); i++ {
			time.Sleep(5 * time.Millisecond)
			kills, err = in.oom.kills()
		}
		if err != nil || kills == 0 || in.oomKilled.Swap(true) {
			continue
		}
		in.setKillReason(reasonOOMKilled)
		ev := c.event(EventOOMKilled)
		ev.Time, ev.ContainerID, ev.PID, ev.RestartCount = at, in.id, in.pid, c.restartCount()
		n.emit(ev)
		c.p.log.Info("container OOM-killed", "container", c.name, "id", in.id[:12])
		if err := n.cg.killAll(in.cgroup, 10*time.Second); err != nil {
			c.p.log.Warn("kill OOM-killed container", "container", c.name, "err", err)
		}
	}
}

// kill ends a run: SIGTERM to the container's process group, SIGKILL to
// everything in its cgroup after grace; it returns once the process exited.
func (c *ctr) kill(in *instance, grace time.Duration, reason string) {
	in.setKillReason(reason)
	_ = syscall.Kill(-in.pid, syscall.SIGTERM)
	t := c.p.n.clock.NewTimer(max(grace, 0))
	defer t.Stop()
	select {
	case <-in.exited:
		return
	case <-t.C():
	}
	_ = syscall.Kill(-in.pid, syscall.SIGKILL)
	if err := c.p.n.cg.killAll(in.cgroup, 10*time.Second); err != nil {
		c.p.log.Warn("kill container", "container", c.name, "err", err)
	}
	<-in.exited
}

// exited records the end of a run: it kills what is left in the container's
// cgroup (the runtime does when a container's first process ends), tells an
// OOM kill from other ends, removes the cgroup and reports the termination.
func (c *ctr) exited(in *instance) *termination {
	p, n := c.p, c.p.n
	<-in.exited
	kills, _ := in.oom.kills()
	if err := n.cg.killAll(in.cgroup, 10*time.Second); err != nil {
		p.log.Warn("kill container leftovers", "container", c.name, "err", err)
	}
	in.oom.close()
	if err := n.cg.remove(in.cgroup); err != nil {
		p.log.Warn("remove container cgroup", "container", c.name, "err", err)
	}
	t := &termination{id: in.id, startedAt: in.startedAt, finishedAt: in.finishedAt}
	if ws, ok := in.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.signal = ws.Signal()
		t.exitCode = 128 + int(t.signal)
	} else {
		t.exitCode = in.cmd.ProcessState.ExitCode()
	}
	in.mu.Lock()
	killReason := in.killReason
	in.mu.Unlock()
	switch {
	case kills > 0 || in.oomKilled.Load():
		t.reason, t.exitCode = reasonOOMKilled, 137
	case t.exitCode == 0:
		t.reason = reasonCompleted
	default:
		t.reason = reasonError
	}
	if killReason != "" && killReason != reasonOOMKilled {
		t.message = killReason
	}
	p.mu.Lock()
	c.st.run, c.st.term, c.st.ready, c.st.started = nil, t, false, false
	if c.kind == kindInit && t.exitCode == 0 {
		c.st.succeeded, c.st.ready = true, true
	}
	restarts := c.st.restarts
	p.notifyLocked()
	p.mu.Unlock()
	ev := c.event(EventExited)
	ev.Time, ev.ContainerID, ev.PID, ev.RestartCount = in.finishedAt, in.id, in.pid, restarts
	ev.ExitCode, ev.Signal, ev.Reason, ev.Message = t.exitCode, t.signal, t.reason, t.message
	n.emit(ev)
	p.log.Info("container exited", "container", c.name, "id", in.id[:12], "exit", t.exitCode, "signal", int(t.signal), "reason", t.reason, "why", t.message)
	return t
}

// credential is the user a container runs as, from its securityContext or
// the pod's; nil keeps the node's (root). runAsNonRoot without a non-zero
// runAsUser is refused: the lab has no image user to check.
func credential(pod *corev1.Pod, c *corev1.Container) (*syscall.Credential, error) {
	var uid, gid *int64
	var nonRoot *bool
	var groups []uint32
	if sc := pod.Spec.SecurityContext; sc != nil {
		uid, gid, nonRoot = sc.RunAsUser, sc.RunAsGroup, sc.RunAsNonRoot
		for _, g := range sc.SupplementalGroups {
			groups = append(groups, uint32(g))
		}
		if sc.FSGroup != nil {
			groups = append(groups, uint32(*sc.FSGroup))
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
	}
	if nonRoot != nil && *nonRoot && (uid == nil || *uid == 0) {
		return nil, errors.New("container has runAsNonRoot and image will run as root (the lab node knows no image user: set runAsUser)")
	}
	if uid == nil && gid == nil && len(groups) == 0 {
		return nil, nil
	}
	cred := &syscall.Credential{Groups: groups}
	if uid != nil {
		cred.Uid = uint32(*uid)
	}
	if gid != nil {
		cred.Gid = uint32(*gid)
	}
	if cred.Groups == nil {
		cred.Groups = []uint32{}
	}
	return cred, nil
}

// apiObjects reads ConfigMaps and Secrets of a namespace from the API.
type apiObjects struct {
	ctx context.Context
	n   *Node
	ns  string
}

func (o *apiObjects) configMap(name string) (*corev1.ConfigMap, error) {
	return o.n.cfg.Client.CoreV1().ConfigMaps(o.ns).Get(o.ctx, name, metav1.GetOptions{})
}

func (o *apiObjects) secret(name string) (*corev1.Secret, error) {
	return o.n.cfg.Client.CoreV1().Secrets(o.ns).Get(o.ctx, name, metav1.GetOptions{})
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
