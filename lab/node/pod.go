package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// minGrace is the kubelet's minimum grace period when it kills a container.
const minGrace = 2 * time.Second

// stopRequest says how a pod is to be stopped.
type stopRequest struct {
	grace       time.Duration
	deleteAPI   bool // delete the pod from the API once stopped (it has a deletionTimestamp)
	writeStatus bool // keep patching the status (not when the node shuts down)
	reason      string
}

// pod is the worker of one pod: it prepares the pod's cgroups and volumes,
// starts its containers in order, and stops and cleans up when asked.
type pod struct {
	n      *Node
	uid    types.UID
	ns     string
	name   string
	dir    string // <StateDir>/pods/<ns>_<name>_<uid>
	cgroup string // hierarchy path of the pod cgroup
	log    *slog.Logger

	init    []*ctr // spec.initContainers, in order
	regular []*ctr // spec.containers

	mu          sync.Mutex
	api         *corev1.Pod   // the newest version seen (informer or our own patch)
	changed     chan struct{} // closed and replaced at each change of anything below or of api
	startTime   time.Time
	sandbox     bool   // cgroups and volumes are ready
	sandboxMsg  string // why they are not, when they failed
	initialized bool
	volumes     map[string]string // volume name → host directory
	stop        *stopRequest
	stopped     bool            // every container stopped, cgroups removed
	terminal    corev1.PodPhase // Succeeded or Failed once nothing will run again
	lastSent    *corev1.PodStatus
	apiGone     bool // deleted from the API: no more status writes

	tokens volumeState // projected tokens to refresh

	stopCh chan struct{} // closed at the first stop request
	done   chan struct{} // closed when run has returned
}

func newPod(n *Node, api *corev1.Pod) *pod {
	uid := string(api.UID)
	p := &pod{
		n:       n,
		uid:     api.UID,
		ns:      api.Namespace,
		name:    api.Name,
		dir:     filepath.Join(n.cfg.StateDir, "pods", api.Namespace+"_"+api.Name+"_"+uid),
		cgroup:  podCgroupPath(qosClass(api), uid),
		log:     n.log.With("pod", api.Namespace+"/"+api.Name, "uid", uid),
		api:     api,
		changed: make(chan struct{}),
		stopCh:  make(chan struct{}),
		done:    make(chan struct{}),
	}
	for i := range api.Spec.InitContainers {
		c := &api.Spec.InitContainers[i]
		kind := kindInit
		if isSidecar(c) {
			kind = kindSidecar
		}
		p.init = append(p.init, newCtr(p, c, kind))
	}
	for i := range api.Spec.Containers {
		p.regular = append(p.regular, newCtr(p, &api.Spec.Containers[i], kindRegular))
	}
	return p
}

// notifyLocked wakes everyone waiting for a change. p.mu must be held.
func (p *pod) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *pod) notify() {
	p.mu.Lock()
	p.notifyLocked()
	p.mu.Unlock()
}

// update takes a new version of the pod from the informer.
func (p *pod) update(api *corev1.Pod) {
	p.mu.Lock()
	if newer(api, p.api) {
		p.api = api
	}
	p.notifyLocked()
	p.mu.Unlock()
	if api.DeletionTimestamp != nil {
		grace := time.Duration(30) * time.Second
		switch {
		case api.DeletionGracePeriodSeconds != nil:
			grace = time.Duration(*api.DeletionGracePeriodSeconds) * time.Second
		case api.Spec.TerminationGracePeriodSeconds != nil:
			grace = time.Duration(*api.Spec.TerminationGracePeriodSeconds) * time.Second
		}
		p.requestStop(stopRequest{grace: grace, deleteAPI: true, writeStatus: true, reason: "pod deleted"})
	}
}

// newer reports whether a is a later version of the pod than b. Resource
// versions are opaque, but etcd's are increasing integers; when they do not
// parse, the informer's version is taken.
func newer(a, b *corev1.Pod) bool {
	if b == nil {
		return true
	}
	ra, errA := strconv.ParseUint(a.ResourceVersion, 10, 64)
	rb, errB := strconv.ParseUint(b.ResourceVersion, 10, 64)
	if errA != nil || errB != nil {
		return true
	}
	return ra >= rb
}

// gone: the pod was removed from the API (force-deleted, or by us).
func (p *pod) gone() {
	p.mu.Lock()
	p.apiGone = true
	p.mu.Unlock()
	p.requestStop(stopRequest{grace: minGrace, reason: "pod removed from the API"})
}

// shutdown: the node is stopping. It does not wait (Node.shutdown does).
func (p *pod) shutdown() {
	grace := 30 * time.Second
	if g := p.apiPod().Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	p.requestStop(stopRequest{grace: grace, reason: "node shutting down"})
}

// requestStop records the first stop request; later ones can only withhold
// the deletion and the status writes.
func (p *pod) requestStop(r stopRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		p.stop.deleteAPI = p.stop.deleteAPI && r.deleteAPI
		p.stop.writeStatus = p.stop.writeStatus && r.writeStatus
		return
	}
	r.grace = max(r.grace, minGrace)
	p.stop = &r
	close(p.stopCh)
	p.notifyLocked()
	p.log.Info("stopping pod", "reason", r.reason, "grace", r.grace)
}

func (p *pod) stopRequested() bool {
	select {
	case <-p.stopCh:
		return true
	default:
		return false
	}
}

func (p *pod) apiPod() *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.api
}

func (p *pod) container(name string) *ctr {
	for _, cs := range [][]*ctr{p.init, p.regular} {
		for _, c := range cs {
			if c.name == name {
				return c
			}
		}
	}
	return nil
}

// waitFor waits until cond (called with p.mu held) is true; it returns false
// if the pod is to stop first.
func (p *pod) waitFor(cond func() bool) bool {
	for {
		p.mu.Lock()
		ok, ch := cond(), p.changed
		p.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-p.stopCh:
			return false
		}
	}
}

// run is the pod's whole life on the node.
func (p *pod) run(ctx context.Context) {
	defer close(p.done)
	p.mu.Lock()
	p.startTime = p.n.clock.Now()
	p.notifyLocked()
	p.mu.Unlock()
	statusCtx, stopStatus := context.WithCancel(ctx)
	var status sync.WaitGroup
	status.Go(func() { p.statusLoop(statusCtx) })

	tokenCtx, stopTokens := context.WithCancel(ctx)
	var tokens sync.WaitGroup
	var terminal corev1.PodPhase
	if !p.stopRequested() && p.setUp(ctx) {
		tokens.Go(func() { p.refreshTokens(tokenCtx) })
		terminal = p.runContainers(ctx)
	}
	p.stopContainers()
	stopTokens()
	tokens.Wait()
	p.cleanUp(terminal)

	// A pod that ended by itself (restartPolicy OnFailure or Never) stays
	// until it is deleted.
	<-p.stopCh
	p.mu.Lock()
	req := *p.stop
	p.notifyLocked()
	p.mu.Unlock()
	if req.writeStatus {
		if err := p.syncStatus(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("final status", "err", err)
		}
	}
	stopStatus()
	status.Wait()
	if req.deleteAPI {
		p.n.deletePod(ctx, p.ns, p.name, p.uid)
	}
	p.log.Info("pod stopped", "reason", req.reason)
}

// setUp makes the pod's directory, cgroup and volumes, retrying with back-off
// (volumes may refer to objects that do not exist yet). It returns false if
// the pod is to stop first.
func (p *pod) setUp(ctx context.Context) bool {
	// A pod cgroup of this UID is a leftover of an earlier run of a node
	// that died (only the node a pod is bound to runs it): its container
	// cgroups would confuse the sidecar's discovery.
	if p.n.cg.exists(p.cgroup) {
		p.log.Warn("removing a leftover pod cgroup", "cgroup", p.cgroup)
		if err := p.n.cg.remove(p.cgroup); err != nil {
			p.log.Error("remove leftover pod cgroup", "err", err)
		}
	}
	loop := newCrashLoop(Backoff{Initial: time.Second, Max: 30 * time.Second})
	for {
		err := p.prepare(ctx)
		p.mu.Lock()
		if err == nil {
			p.sandbox, p.sandboxMsg = true, ""
		} else {
			p.sandboxMsg = err.Error()
		}
		p.notifyLocked()
		p.mu.Unlock()
		if err == nil {
			return true
		}
		p.log.Warn("pod set-up failed, retrying", "err", err)
		if !sleep(ctx, p.n.clock, max(loop.next(time.Time{}, p.n.clock.Now()), 200*time.Millisecond), p.stopCh) {
			return false
		}
	}
}

func (p *pod) prepare(ctx context.Context) error {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(p.dir, 0o755); err != nil {
		return err
	}
	api := p.apiPod()
	if err := p.n.cg.create(p.cgroup, podLimits(api)); err != nil {
		return fmt.Errorf("pod cgroup: %w", err)
	}
	vols, err := p.prepareVolumes(ctx, api)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.volumes = vols
	p.mu.Unlock()
	return nil
}

// runContainers starts the init containers in order (a native sidecar once it
// has started, a regular one once it has succeeded), then the containers, and
// returns when the pod is to stop (with "") or nothing will run again (with
// the terminal phase).
func (p *pod) runContainers(ctx context.Context) corev1.PodPhase {
	for _, c := range p.init {
		if p.stopRequested() {
			return ""
		}
		c.launch(ctx)
		ok := p.waitFor(func() bool {
			if c.kind == kindSidecar {
				return c.st.started
			}
			return c.st.succeeded || c.finishedLocked()
		})
		if !ok {
			return ""
		}
		p.mu.Lock()
		failed := c.kind == kindInit && !c.st.succeeded
		p.mu.Unlock()
		if failed {
			return corev1.PodFailed // an init container failed for good (restartPolicy Never)
		}
	}
	p.mu.Lock()
	p.initialized = true
	p.notifyLocked()
	p.mu.Unlock()
	if p.stopRequested() {
		return ""
	}
	for _, c := range p.regular {
		c.launch(ctx)
	}
	ok := p.waitFor(func() bool {
		for _, c := range p.regular {
			if !c.finishedLocked() {
				return false
			}
		}
		return true
	})
	if !ok {
		return ""
	}
	// Every container has ended for good: the pod is terminal.
	p.mu.Lock()
	phase := terminalPhase(p)
	p.mu.Unlock()
	p.log.Info("pod terminal", "phase", phase)
	return phase
}

// stopContainers stops the containers (in parallel, within the grace period),
// then the init containers and native sidecars in reverse order, each with
// what is left of the grace period but at least minGrace.
func (p *pod) stopContainers() {
	p.mu.Lock()
	grace := minGrace
	if p.stop != nil {
		grace = p.stop.grace
	}
	p.mu.Unlock()
	deadline := p.n.clock.Now().Add(grace)
	var wg sync.WaitGroup
	for _, c := range p.regular {
		wg.Go(func() { c.stopAndWait(deadline) })
	}
	wg.Wait()
	for i := len(p.init) - 1; i >= 0; i-- {
		p.init[i].stopAndWait(deadline)
	}
}

// cleanUp removes the pod's cgroups (killing what is left, such as Exec'd
// processes) and its volumes; the logs stay. The pod is then terminal: with
// the given phase if it ended by itself, else (deleted) by its containers'
// exits; after a node shutdown it is left as it was.
func (p *pod) cleanUp(terminal corev1.PodPhase) {
	if err := p.n.cg.remove(p.cgroup); err != nil {
		p.log.Error("remove pod cgroup", "cgroup", p.cgroup, "err", err)
	}
	if err := os.RemoveAll(filepath.Join(p.dir, "volumes")); err != nil {
		p.log.Warn("remove volumes", "err", err)
	}
	p.mu.Lock()
	p.stopped = true
	p.terminal = terminal
	if p.terminal == "" && p.stop != nil && p.stop.deleteAPI {
		p.terminal = terminalPhase(p)
	}
	p.notifyLocked()
	p.mu.Unlock()
}

// terminalPhase is the phase of a pod whose containers were all stopped on
// deletion, as the kubelet reports it: Succeeded if every container exited 0.
// p.mu must be held.
func terminalPhase(p *pod) corev1.PodPhase {
	for _, c := range p.regular {
		if c.st.term == nil || c.st.term.exitCode != 0 {
			return corev1.PodFailed
		}
	}
	return corev1.PodSucceeded
}
