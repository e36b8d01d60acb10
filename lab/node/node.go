package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Config configures a Node.
type Config struct {
	// Name is the Node's name (default "amf-lab"). Pods reach it by
	// nodeName or a nodeSelector on kubernetes.io/hostname.
	Name string
	// Client is an admin client of the API server (it creates the Node, its
	// Lease, tokens, and patches pod status).
	Client kubernetes.Interface
	// Images maps image repositories (the image reference without :tag or
	// @digest, e.g. "eclipse-mosquitto" or "ghcr.io/amf-edge/amf-sidecar") to
	// local programs. Docker Hub spellings are equivalent
	// ("docker.io/library/eclipse-mosquitto" finds "eclipse-mosquitto").
	Images map[string]Image
	// StateDir holds each pod's volumes and logs, in
	// <StateDir>/pods/<namespace>_<name>_<uid>/. Required; it and its parents
	// must be traversable by the users the pods run as.
	StateDir string
	// CgroupRoot is where the cgroup v1 hierarchies are mounted (default
	// /sys/fs/cgroup).
	CgroupRoot string
	// HostIP is the Node's InternalIP and every pod's IP (pods share the host
	// network, like hostNetwork; default 127.0.0.1).
	HostIP string
	// Backoff is the crash-loop back-off (default the kubelet's: 10 s, 5 min, 10 min).
	Backoff Backoff
	// Clock times back-offs, probes and leases (default the real clock).
	Clock clock.Clock
	// Log receives the node's log (default slog.Default()). Tokens are never logged.
	Log *slog.Logger
}

// Node is a running lab kubelet. Its methods are safe for concurrent use.
type Node struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
	cg    *cgroupFS
	facts podFacts
	hub   hub
	ready chan struct{}
	lease chan struct{} // closed after the first lease renewal

	mu       sync.Mutex
	started  bool
	stopping bool
	ctx      context.Context // Run's: API calls of the pods
	pods     map[types.UID]*pod
	nodeUID  types.UID
	wg       sync.WaitGroup // pod workers
}

// New checks the configuration and the machine's cgroups; Run starts the node.
func New(cfg Config) (*Node, error) {
	if cfg.Name == "" {
		cfg.Name = "amf-lab"
	}
	if cfg.Client == nil {
		return nil, errors.New("node: Config.Client is required")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("node: Config.StateDir is required")
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("node: StateDir: %w", err)
	}
	cfg.StateDir = abs
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	if cfg.HostIP == "" {
		cfg.HostIP = "127.0.0.1"
	}
	cfg.Backoff = cfg.Backoff.withDefaults()
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("node: the lab node must run as root (it creates cgroups and runs pods as their users)")
	}
	log := cfg.Log.With("node", cfg.Name)
	cg, err := discoverCgroups(cfg.CgroupRoot, log)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "pods"), 0o755); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n := &Node{
		cfg:   cfg,
		log:   log,
		clock: cfg.Clock,
		cg:    cg,
		ready: make(chan struct{}),
		lease: make(chan struct{}),
		pods:  map[types.UID]*pod{},
	}
	n.facts = podFacts{hostIP: cfg.HostIP, allocatable: n.capacity()}
	return n, nil
}

// Ready is closed once the Node is Ready in the API and schedulable (the
// node-lifecycle controller has removed the not-ready taint), and its Lease
// has been renewed once.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Subscribe returns container lifecycle events from now on, and a function
// that ends the subscription (and closes the channel). Events are never
// waited for: a subscriber that falls more than 4096 events behind loses the
// newer ones, counted by EventsDropped.
func (n *Node) Subscribe() (<-chan Event, func()) { return n.hub.subscribe() }

// EventsDropped is how many events subscribers have lost by reading too slowly.
func (n *Node) EventsDropped() uint64 { return n.hub.dropped.Load() }

func (n *Node) emit(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = n.clock.Now()
	}
	n.hub.publish(ev)
}

// Run registers the Node, serves the pods bound to it until ctx ends, then
// stops every container gracefully and removes their cgroups (the pods stay in
// the API; the Node and its Lease too). It returns nil after a shutdown by ctx,
// or an error when the node could not start. Run can be called once.
func (n *Node) Run(ctx context.Context) error {
	n.mu.Lock()
	if n.started {
		n.mu.Unlock()
		return errors.New("node: Run called twice")
	}
	n.started, n.ctx = true, ctx
	n.mu.Unlock()

	if err := n.register(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var bg sync.WaitGroup
	bg.Go(func() { n.renewLease(ctx) })
	bg.Go(func() { n.waitReady(ctx) })

	factory := informers.NewSharedInformerFactoryWithOptions(n.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.cfg.Name).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.podChanged(obj) },
		UpdateFunc: func(_, obj any) { n.podChanged(obj) },
		DeleteFunc: n.podDeleted,
	}); err != nil {
		return fmt.Errorf("node: pod informer: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	n.shutdown()
	bg.Wait()
	return nil
}

// podChanged starts a worker for a new pod and hands every version to it.
func (n *Node) podChanged(obj any) {
	api, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	p := n.pods[api.UID]
	if p == nil {
		if n.stopping {
			n.mu.Unlock()
			return
		}
		if api.Status.Phase == corev1.PodSucceeded || api.Status.Phase == corev1.PodFailed {
			// Terminal before we saw it (an earlier run of the node): nothing
			// to run; a deleted one is removed as the kubelet would.
			if api.DeletionTimestamp != nil {
				n.wg.Go(func() { n.deletePod(n.ctx, api.Namespace, api.Name, api.UID) })
			}
			n.mu.Unlock()
			return
		}
		// The first version goes in before the worker runs, so a pod that
		// is already being deleted is never started.
		p = newPod(n, api)
		p.update(api)
		n.pods[api.UID] = p
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			p.run(n.ctx)
		}()
		n.mu.Unlock()
		return
	}
	n.mu.Unlock()
	p.update(api)
}

func (n *Node) podDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	api, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	p := n.pods[api.UID]
	delete(n.pods, api.UID)
	n.mu.Unlock()
	if p != nil {
		p.gone()
	}
}

// shutdown stops every pod (without deleting it) and waits for them.
func (n *Node) shutdown() {
	n.mu.Lock()
	n.stopping = true
	ps := make([]*pod, 0, len(n.pods))
	for _, p := range n.pods {
		ps = append(ps, p)
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.shutdown() // all at once: each has its own grace period
	}
	n.wg.Wait()
}

// deletePod deletes a pod from the API as the kubelet does once it has
// stopped it: grace period 0, only that incarnation (UID precondition).
func (n *Node) deletePod(ctx context.Context, ns, name string, uid types.UID) {
	err := n.retry(ctx, "delete pod "+ns+"/"+name, func(ctx context.Context) error {
		err := n.cfg.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &uid},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone, or another incarnation
		}
		return err
	})
	if err != nil && ctx.Err() == nil {
		n.log.Error("delete pod", "pod", ns+"/"+name, "err", err)
	}
}

// permanentError is an error that retrying cannot fix.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// retry calls f until it succeeds, fails with a permanentError, or ctx ends,
// with a back-off from 200 ms to 10 s, logging each failure.
func (n *Node) retry(ctx context.Context, what string, f func(context.Context) error) error {
	delay := 200 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		var perm permanentError
		if ctx.Err() != nil || errors.As(err, &perm) {
			return fmt.Errorf("%s: %w", what, err)
		}
		n.log.Warn("API call failed, retrying", "what", what, "err", err, "in", delay)
		if !sleep(ctx, n.clock, delay, nil) {
			return fmt.Errorf("%s: %w", what, err)
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// capacity is the node's capacity: CPUs, memory and 110 pods.
func (n *Node) capacity() corev1.ResourceList {
	var si syscall.Sysinfo_t
	mem := int64(0)
	if err := syscall.Sysinfo(&si); err == nil {
		mem = int64(si.Totalram) * int64(si.Unit)
	}
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
}

// register creates or updates the Node and sets its status Ready.
func (n *Node) register(ctx context.Context) error {
	nodes := n.cfg.Client.CoreV1().Nodes()
	labels := map[string]string{
		"kubernetes.io/hostname": n.cfg.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     runtime.GOARCH,
	}
	return n.retry(ctx, "register node", func(ctx context.Context) error {
		cur, err := nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cur = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Labels: labels}}
			cur.Status = n.nodeStatus(nil)
			if cur, err = nodes.Create(ctx, cur, metav1.CreateOptions{}); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			if _, fake := cur.Annotations["kwok.x-k8s.io/node"]; fake {
				return permanentError{fmt.Errorf("node %s is a kwok node (annotation kwok.x-k8s.io/node): choose another name", n.cfg.Name)}
			}
			changed := false
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			for k, v := range labels {
				if cur.Labels[k] != v {
					cur.Labels[k], changed = v, true
				}
			}
			if changed {
				if cur, err = nodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
		}
		cur.Status = n.nodeStatus(&cur.Status)
		upd, err := nodes.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		n.mu.Lock()
		n.nodeUID = upd.UID
		n.mu.Unlock()
		return nil
	})
}

// nodeStatus is the Node's status: capacity, conditions (Ready, no pressure),
// address and system info. Transition times are kept from old when unchanged.
func (n *Node) nodeStatus(old *corev1.NodeStatus) corev1.NodeStatus {
	now := metav1.NewTime(n.clock.Now())
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		c := corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
		if old != nil {
			for _, o := range old.Conditions {
				if o.Type == t && o.Status == s {
					c.LastTransitionTime = o.LastTransitionTime
				}
			}
		}
		return c
	}
	var uts syscall.Utsname
	kernel := ""
	if syscall.Uname(&uts) == nil {
		kernel = utsString(uts.Release[:])
	}
	return corev1.NodeStatus{
		Capacity:    n.facts.allocatable,
		Allocatable: n.facts.allocatable,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "lab node"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "lab node"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "lab node"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "lab node (github.com/amf-edge/amf/lab/node) is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.cfg.HostIP},
			{Type: corev1.NodeHostName, Address: n.cfg.Name},
		},
		NodeInfo: corev1.NodeSystemInfo{
			KernelVersion:           kernel,
			OSImage:                 "amf lab node",
			ContainerRuntimeVersion: "lab://0.1.0",
			KubeletVersion:          "v0.0.0-lab",
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}
}

func utsString[T int8 | uint8](b []T) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// leaseDuration and leaseRenew are the kubelet's defaults.
const (
	leaseDuration = 40 * time.Second
	leaseRenew    = 10 * time.Second
)

// renewLease keeps the Node's Lease in kube-node-lease fresh, so the
// node-lifecycle controller keeps the Node Ready.
func (n *Node) renewLease(ctx context.Context) {
	leases := n.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	first := true
	for {
		err := func() error {
			now := metav1.NewMicroTime(n.clock.Now())
			cur, err := leases.Get(ctx, n.cfg.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				n.mu.Lock()
				uid := n.nodeUID
				n.mu.Unlock()
				l := &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Namespace: corev1.NamespaceNodeLease},
					Spec: coordinationv1.LeaseSpec{
						HolderIdentity:       ptr.To(n.cfg.Name),
						LeaseDurationSeconds: ptr.To(int32(leaseDuration / time.Second)),
						RenewTime:            &now,
					},
				}
				if uid != "" {
					l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.cfg.Name, UID: uid}}
				}
				_, err = leases.Create(ctx, l, metav1.CreateOptions{})
				return err
			}
			if err != nil {
				return err
			}
			cur.Spec.HolderIdentity = ptr.To(n.cfg.Name)
			cur.Spec.LeaseDurationSeconds = ptr.To(int32(leaseDuration / time.Second))
			cur.Spec.RenewTime = &now
			_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		}()
		delay := leaseRenew
		if err != nil && ctx.Err() == nil {
			n.log.Warn("renew lease", "err", err)
			delay = time.Second
		}
		if err == nil && first {
			close(n.lease)
			first = false
		}
		if !sleep(ctx, n.clock, delay, nil) {
			return
		}
	}
}

// waitReady closes n.ready once the Node is Ready without the not-ready or
// unreachable taints.
func (n *Node) waitReady(ctx context.Context) {
	lw := cache.NewListWatchFromClient(n.cfg.Client.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", n.cfg.Name))
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		nd, ok := ev.Object.(*corev1.Node)
		return ok && ev.Type != watch.Deleted && nodeReady(nd), nil
	})
	if err != nil {
		if ctx.Err() == nil {
			n.log.Error("waiting for the Node to be Ready", "err", err)
		}
		return
	}
	select {
	case <-n.lease:
	case <-ctx.Done():
		return
	}
	n.log.Info("node ready")
	close(n.ready)
}

func nodeReady(nd *corev1.Node) bool {
	for _, t := range nd.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	for _, c := range nd.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// findPod returns the pod worker of namespace/name, preferring one that is not
// stopping when a replacement with the same name exists.
func (n *Node) findPod(namespace, name string) (*pod, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var best *pod
	for _, p := range n.pods {
		if p.ns != namespace || p.name != name {
			continue
		}
		if best == nil || best.stopRequested() && !p.stopRequested() {
			best = p
		}
	}
	if best == nil {
		return nil, fmt.Errorf("node %s: no pod %s/%s", n.cfg.Name, namespace, name)
	}
	return best, nil
}

// running returns the running instance of a container.
func (n *Node) running(namespace, podName, container string) (*pod, *instance, error) {
	p, err := n.findPod(namespace, podName)
	if err != nil {
		return nil, nil, err
	}
	c := p.container(container)
	if c == nil {
		return nil, nil, fmt.Errorf("pod %s/%s has no container %q", namespace, podName, container)
	}
	in := c.current()
	if in == nil {
		return nil, nil, fmt.Errorf("pod %s/%s: container %s is not running", namespace, podName, container)
	}
	return p, in, nil
}

// ContainerCgroup returns the cgroup hierarchy path of a running container,
// e.g. /kubepods/burstable/pod<uid>/<id>: the same in every hierarchy, so the
// memory cgroup is /sys/fs/cgroup/memory plus that. It changes at every restart.
func (n *Node) ContainerCgroup(namespace, pod, container string) (string, error) {
	_, in, err := n.running(namespace, pod, container)
	if err != nil {
		return "", err
	}
	return in.cgroup, nil
}

// Exec starts argv in a running container, like kubectl exec: in the
// container's cgroups from its first instruction, with the container's
// environment, working directory and user, in a process group of its own,
// argv[0] looked up in the container's PATH and argv path-rewritten like the
// container's args. The caller must Wait for the returned command. The process
// is killed when ctx ends, and with everything else in the container's cgroups
// when the container exits, restarts or is stopped (it does not get the
// container's SIGTERM). stdout and stderr may be nil (discarded).
func (n *Node) Exec(ctx context.Context, namespace, pod, container string, argv []string, stdout, stderr io.Writer) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("node: exec: empty argv")
	}
	p, in, err := n.running(namespace, pod, container)
	if err != nil {
		return nil, fmt.Errorf("node: exec: %w", err)
	}
	args := make([]string, len(argv))
	for i, a := range argv {
		args[i] = rewritePaths(a, in.rewrites)
	}
	exe, err := lookPath(args[0], in.env)
	if err != nil {
		return nil, fmt.Errorf("node: exec in %s/%s %s: %w", namespace, pod, container, err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Args = args
	cmd.Env, cmd.Dir = in.env, in.dir
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: in.cred}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := n.cg.spawn(cmd, in.cgroup); err != nil {
		return nil, fmt.Errorf("node: exec in %s/%s %s: %w", namespace, pod, container, err)
	}
	if in.hasExited() {
		// The container ended while we joined it: its cleanup may have run
		// before our process arrived.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, fmt.Errorf("node: exec in %s/%s %s: the container exited", namespace, pod, container)
	}
	p.log.Debug("exec", "container", container, "pid", cmd.Process.Pid, "argv", args)
	return cmd, nil
}
