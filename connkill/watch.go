package connkill

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/amf-edge/amf/contract"
)

// Watcher is the agent's half: it watches the cluster's EndpointSlices and,
// when an endpoint of a broker that AMF manages (a pod with the readiness
// gate amf.io/healthy, or in node mode, whose pods inject leaves as they
// are, a pod of a Deployment of a pair annotated amf.io/mode: node) turns
// terminating — the primary a failover or a
// switchover retires, on a lost node or not — asks Kill to end this node's
// connections to it. Every node's agent does so for its own node: the
// clients are wherever their pods or NATs are. Only the endpoint's TCP ports
// are named, and only a managed broker's.
type Watcher struct {
	Client kubernetes.Interface
	// Kill ends the node's flows to dead (Client.Kill of the connkill
	// process beside the agent).
	Kill func(ctx context.Context, dead []netip.AddrPort) (flows, sockets int, err error)
	// Again are the delays after the first Kill at which Kill is asked
	// again for the same endpoint (nil: DefaultAgain()).
	Again []time.Duration
	Log   *slog.Logger
}

// DefaultAgain sweeps an endpoint again for five seconds after it turned
// terminating. The node's Service proxy reads the same EndpointSlice change
// as the Watcher, in no set order, and applies it later: kube-proxy's
// iptables mode at most once a second (--iptables-min-sync-period), longer
// on a busy node. A client whose connection the first Kill ended reconnects
// within that window and may be NATed to the dead endpoint again: its SYN
// goes unanswered until its own connect timeout (seen in the lab: 2.5 s
// lost so). A later sweep finds that flow too and fails the connect at once,
// and by then the proxy sends the retry to the new primary. A sweep that
// finds nothing costs one read of the node's conntrack table.
func DefaultAgain() []time.Duration {
	return []time.Duration{250 * time.Millisecond, 750 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second, 5 * time.Second}
}

// WatchRules are the rights Watcher needs: the EndpointSlices, and a pod,
// its ReplicaSet and its Deployment by name to tell a managed broker (all
// already among the actuator's rights).
func WatchRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"replicasets", "deployments"}, Verbs: []string{"get"}},
	}
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	if w.Log == nil {
		w.Log = slog.New(slog.DiscardHandler)
	}
	f := informers.NewSharedInformerFactory(w.Client, 0)
	inf := f.Discovery().V1().EndpointSlices().Informer()
	todo := make(chan []endpoint, 64)
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*discoveryv1.EndpointSlice)
			n, ok2 := newObj.(*discoveryv1.EndpointSlice)
			if !ok1 || !ok2 {
				return
			}
			if eps := turnedTerminating(o, n); len(eps) > 0 {
				select {
				case todo <- eps:
				case <-ctx.Done():
				}
			}
		},
	}); err != nil {
		return fmt.Errorf("connkill: watch EndpointSlices: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	w.Log.Info("connkill: watching the endpoints of managed brokers")
	var sweeps sync.WaitGroup // the later sweeps, done before Run returns
	defer sweeps.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case eps := <-todo:
			for _, ep := range w.end(ctx, eps) {
				sweeps.Go(func() { w.again(ctx, ep) })
			}
		}
	}
}

// endpoint is one pod's addresses and the slice's TCP ports.
type endpoint struct {
	namespace, pod string
	dead           []netip.AddrPort
}

// turnedTerminating are the endpoints of n that are terminating and were
// not in o (a slice only grows the flag: a pod's deletion is final).
func turnedTerminating(o, n *discoveryv1.EndpointSlice) []endpoint {
	if n.AddressType != discoveryv1.AddressTypeIPv4 {
		return nil
	}
	was := map[string]bool{}
	for _, e := range o.Endpoints {
		if e.TargetRef != nil && terminating(e) {
			was[e.TargetRef.Name] = true
		}
	}
	var ports []uint16
	for _, p := range n.Ports {
		if p.Port != nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
			ports = append(ports, uint16(*p.Port))
		}
	}
	var out []endpoint
	for _, e := range n.Endpoints {
		if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || !terminating(e) || was[e.TargetRef.Name] {
			continue
		}
		ep := endpoint{namespace: n.Namespace, pod: e.TargetRef.Name}
		for _, a := range e.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				continue
			}
			for _, p := range ports {
				ep.dead = append(ep.dead, netip.AddrPortFrom(ip, p))
			}
		}
		if len(ep.dead) > 0 {
			out = append(out, ep)
		}
	}
	return out
}

func terminating(e discoveryv1.Endpoint) bool {
	return e.Conditions.Terminating != nil && *e.Conditions.Terminating
}

// end asks Kill for each endpoint of a managed broker, and returns those
// endpoints.
func (w *Watcher) end(ctx context.Context, eps []endpoint) (managed []endpoint) {
	for _, ep := range eps {
		log := w.Log.With(slog.String("pod", ep.namespace+"/"+ep.pod), slog.Any("endpoints", ep.dead))
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ours, err := w.managed(gctx, ep)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			continue // gone already: not one to tell
		case err != nil:
			log.Warn("connkill: cannot tell whether a terminating endpoint is a managed broker's", slog.String("error", err.Error()))
			continue
		case !ours:
			continue // not AMF's: its clients are not ours to move
		}
		managed = append(managed, ep)
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		flows, sockets, err := w.Kill(kctx, ep.dead)
		cancel()
		if err != nil {
			log.Error("connkill: the node's connections to a retired broker not ended", slog.String("error", err.Error()))
			continue
		}
		log.Info("connkill: the node's connections to a retired broker ended", slog.Int("flows", flows), slog.Int("sockets", sockets), slog.Duration("took", time.Since(start)))
	}
	return managed
}

// managed says whether ep's pod is a broker AMF manages: it has the
// readiness gate amf.io/healthy (the sidecar's, written by inject), or its
// Deployment, found through the ReplicaSet that controls it, is a pair's
// member in node mode (amf.io/mode: node, with amf.io/standby on the
// primary or amf.io/primary on the standby), whose pods carry nothing of
// AMF's. A pod gone is NotFound; a ReplicaSet or Deployment gone says no.
func (w *Watcher) managed(ctx context.Context, ep endpoint) (bool, error) {
	p, err := w.Client.CoreV1().Pods(ep.namespace).Get(ctx, ep.pod, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	if slices.ContainsFunc(p.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool { return g.ConditionType == contract.ConditionHealthy }) {
		return true, nil
	}
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "ReplicaSet" {
		return false, nil
	}
	rs, err := w.Client.AppsV1().ReplicaSets(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("the ReplicaSet of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if ref = metav1.GetControllerOf(rs); ref == nil || ref.Kind != "Deployment" {
		return false, nil
	}
	d, err := w.Client.AppsV1().Deployments(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("the Deployment of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	_, primary := d.Annotations[contract.AnnStandby]
	_, standby := d.Annotations[contract.AnnPrimary]
	return d.Annotations[contract.AnnMode] == string(contract.ModeNode) && (primary || standby), nil
}

// again sweeps ep at each of the Again delays after now (see DefaultAgain),
// saying only what it found.
func (w *Watcher) again(ctx context.Context, ep endpoint) {
	delays := w.Again
	if delays == nil {
		delays = DefaultAgain()
	}
	log := w.Log.With(slog.String("pod", ep.namespace+"/"+ep.pod), slog.Any("endpoints", ep.dead))
	t0 := time.Now()
	for _, d := range delays {
		t := time.NewTimer(time.Until(t0.Add(d)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		flows, sockets, err := w.Kill(kctx, ep.dead)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("connkill: a later sweep of a retired broker's connections failed", slog.Duration("after", d), slog.String("error", err.Error()))
		case flows > 0:
			log.Info("connkill: connections made to a retired broker after its end, ended", slog.Duration("after", d), slog.Int("flows", flows), slog.Int("sockets", sockets))
		}
	}
}
