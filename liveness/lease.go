package liveness

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
)

// LabelNode labels an agent's Lease with its node's name: guards select the
// Leases they watch by it.
const LabelNode = "amf.io/node"

// Cluster is what liveness reads and writes in Kubernetes, the Leases: its
// part of the agent's one seam to the API server (package cluster).
// cluster.NewKube is the real one, clusterfake.Cluster the tests'.
type Cluster interface {
	Lease(ctx context.Context, ns, name string) (*coordinationv1.Lease, error)
	// CreateLease: AlreadyExists if the name is taken.
	CreateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	// UpdateLease: Conflict if l's resourceVersion is not the Lease's.
	UpdateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	// LeaseListWatch lists and watches the Leases of ns that match the
	// label selector (the guard's watch).
	LeaseListWatch(ns, selector string) cache.ListerWatcher
}

// LeaseName is the name of the Lease of node's agent.
func LeaseName(node string) string { return "amf-agent-" + node }

// Heartbeat renews the Lease of one node's agent every Timing.Period: one
// write per period (an update of the object it last wrote; a get only after
// a conflict), each bounded by one period.
type Heartbeat struct {
	Cluster   Cluster
	Namespace string
	Node      string
	Timing    Timing
	// ProbeAddr, if set, is written on the Lease (AnnProbe): where this
	// agent answers its guards' probes (ServeProbes).
	ProbeAddr string
	// OnRenew is called with the send time of every renewal that succeeded
	// (for Fencer.Renewed); OnError with every failed one. Both optional.
	OnRenew func(sent time.Time)
	OnError func(error)
}

// Run renews until ctx ends.
func (h *Heartbeat) Run(ctx context.Context) error {
	if err := h.Timing.Validate(); err != nil {
		return err
	}
	var last *coordinationv1.Lease
	tick := time.NewTicker(h.Timing.Period)
	defer tick.Stop()
	for {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, h.Timing.Period)
		l, err := h.renew(rctx, last, sent)
		cancel()
		switch {
		case err == nil:
			last = l
			if h.OnRenew != nil {
				h.OnRenew(sent)
			}
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				last = nil // read it again next time
			}
			if h.OnError != nil {
				h.OnError(err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (h *Heartbeat) renew(ctx context.Context, last *coordinationv1.Lease, now time.Time) (*coordinationv1.Lease, error) {
	if last == nil {
		l, err := h.Cluster.Lease(ctx, h.Namespace, LeaseName(h.Node))
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(h.Node), Namespace: h.Namespace}}
			h.fill(l, now)
			return h.Cluster.CreateLease(ctx, l)
		}
		if err != nil {
			return nil, fmt.Errorf("liveness: get Lease %s: %w", LeaseName(h.Node), err)
		}
		last = l
	}
	l := last.DeepCopy()
	h.fill(l, now)
	l, err := h.Cluster.UpdateLease(ctx, l)
	if err != nil {
		return nil, fmt.Errorf("liveness: renew Lease %s: %w", LeaseName(h.Node), err)
	}
	return l, nil
}

func (h *Heartbeat) fill(l *coordinationv1.Lease, now time.Time) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelNode] = h.Node
	if h.ProbeAddr != "" {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnProbe] = h.ProbeAddr
	}
	l.Spec.HolderIdentity = ptr.To(h.Node)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(math.Ceil(h.Timing.Lost.Seconds())))
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
}

// GuardConfig configures RunGuard.
type GuardConfig struct {
	Cluster   Cluster
	Namespace string
	// Self is the guard's own node; Nodes the nodes whose primaries it guards.
	Self   string
	Nodes  []string
	Timing Timing
	// Probe says whether node's agent answers directly (over the LAN),
	// within the ctx it is given; nil: no probes.
	Probe func(ctx context.Context, node string) bool
	// ProbeAt, used when Probe is nil, says whether the agent answers at
	// the address its node's Lease advertises (AnnProbe, as last seen
	// through the watch), e.g. Probe with Self; a node whose address is not
	// known yet is not reached.
	ProbeAt func(ctx context.Context, addr string) bool
	// Sights, when set, receives every sight of a guarded node's agent (a
	// heartbeat, an answer), for the probe server's vouching.
	Sights *Sights
	// OnLost is called once per loss, OnBack when a lost node heartbeats
	// again; OnEvent (optional) with every Lease event the watch delivered,
	// naming the node whose Lease it was.
	OnLost, OnBack func(node string, at time.Time)
	OnEvent        func(node string)
}

// Validate says what is wrong with c, if anything: the timing must be safe
// (Timing.Validate), and the cluster, the Leases' namespace, the guard's own
// node and the nodes to guard given. It is the one check
// of c's values, which RunGuard makes.
func (c GuardConfig) Validate() error {
	if err := c.Timing.Validate(); err != nil {
		return err
	}
	var missing []string
	if c.Cluster == nil {
		missing = append(missing, "Cluster (the API server)")
	}
	if c.Namespace == "" {
		missing = append(missing, "Namespace (of the agents' Leases)")
	}
	if c.Self == "" {
		missing = append(missing, "Self (the guard's own node)")
	}
	if len(c.Nodes) == 0 {
		missing = append(missing, "Nodes to guard")
	}
	if len(missing) > 0 {
		return fmt.Errorf("liveness: RunGuard needs %s", strings.Join(missing, ", "))
	}
	return nil
}

// RunGuard watches the Leases of cfg.Nodes and of cfg.Self only (one watch,
// selected by LabelNode), probes the guarded agents every period, and calls
// OnLost when Guard declares a node lost, until ctx ends. To guard other
// nodes, end it and run it again.
func RunGuard(ctx context.Context, cfg GuardConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	g, err := NewGuard(cfg.Timing, cfg.Self)
	if err != nil {
		return err
	}
	r := &guardRun{cfg: cfg, g: g, addrs: map[string]string{}}
	if r.cfg.Probe == nil && r.cfg.ProbeAt != nil {
		r.cfg.Probe = r.probeAt
	}
	now := time.Now()
	for _, n := range cfg.Nodes {
		g.Watch(n, now)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.checkEvery(ctx, cfg.Timing.Period/5) })
	if r.cfg.Probe != nil {
		for _, n := range cfg.Nodes {
			wg.Go(func() { r.probeEvery(ctx, n) })
		}
	}
	nodes := append([]string{cfg.Self}, cfg.Nodes...)
	sort.Strings(nodes)
	sel := LabelNode + " in (" + strings.Join(nodes, ",") + ")"
	_, err = watchtools.UntilWithSync(ctx, cfg.Cluster.LeaseListWatch(cfg.Namespace, sel), &coordinationv1.Lease{}, nil, r.lease)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("liveness: watch of the guarded Leases: %w", err)
}

// guardRun is one RunGuard: its three roles (the loss check, the probes,
// the Lease watch) share the Guard and the probe addresses under mu.
type guardRun struct {
	cfg   GuardConfig
	mu    sync.Mutex
	g     *Guard
	addrs map[string]string // node → AnnProbe
}

// checkEvery declares the nodes lost that the Guard says are, every
// interval, until ctx ends.
func (r *guardRun) checkEvery(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			r.mu.Lock()
			lost := r.g.Lost(now)
			r.mu.Unlock()
			for _, n := range lost {
				if r.cfg.OnLost != nil {
					r.cfg.OnLost(n, now)
				}
			}
		}
	}
}

// probeEvery probes node once a period (each probe bounded by it) until
// ctx ends; an answer is a sight of the node.
func (r *guardRun) probeEvery(ctx context.Context, node string) {
	tick := time.NewTicker(r.cfg.Timing.Period)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, r.cfg.Timing.Period)
		ok := r.cfg.Probe(pctx, node)
		pcancel()
		if ok {
			at := time.Now()
			r.mu.Lock()
			r.g.Reached(node, at)
			r.mu.Unlock()
			r.cfg.Sights.Saw(node, at)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probeAt probes node at the address its Lease last advertised.
func (r *guardRun) probeAt(ctx context.Context, node string) bool {
	r.mu.Lock()
	a := r.addrs[node]
	r.mu.Unlock()
	return a != "" && r.cfg.ProbeAt(ctx, a)
}

// lease takes one event of the guarded Leases' watch: a renewal is a
// heartbeat of its node, and may bring it back.
func (r *guardRun) lease(ev watch.Event) (bool, error) {
	l, ok := ev.Object.(*coordinationv1.Lease)
	if !ok || ev.Type == watch.Deleted || l.Spec.RenewTime == nil {
		return false, nil
	}
	at := time.Now()
	node := l.Labels[LabelNode]
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(node)
	}
	r.mu.Lock()
	if a := l.Annotations[AnnProbe]; a != "" {
		r.addrs[node] = a
	}
	beat, back := r.g.heartbeat(node, l.Spec.RenewTime.Time, at)
	r.mu.Unlock()
	if beat && node != r.cfg.Self && slices.Contains(r.cfg.Nodes, node) {
		r.cfg.Sights.Saw(node, at)
	}
	if back && r.cfg.OnBack != nil {
		r.cfg.OnBack(node, at)
	}
	return false, nil
}

// ProbeAddrOf returns the probe address node's agent advertises on its
// Lease (AnnProbe), read once; "" if it advertises none.
func ProbeAddrOf(ctx context.Context, c Cluster, namespace, node string) (string, error) {
	l, err := c.Lease(ctx, namespace, LeaseName(node))
	if err != nil {
		return "", fmt.Errorf("liveness: get Lease %s: %w", LeaseName(node), err)
	}
	return l.Annotations[AnnProbe], nil
}
