package nodeloss

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/probe"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/pause"
)

// BrokerNamespace holds the edge brokers of a Pair unless its PairConfig
// names another.
const BrokerNamespace = "mqtt"

// Pair is the agent DaemonSet (manifests/base, --liveness on; or another
// Pair's) on a cluster of lab nodes, the RDS and OBU brokers on its third
// node, the E2E probe between them, and a hot pair of edge brokers bridging
// them: the primary (testbed.PrimaryName) pinned to node 0, its hot standby
// (testbed.StandbyName) running on node 1, or the other way round
// (PairConfig.Swap).
type Pair struct {
	// Namespace holds the pair's brokers (BrokerNamespace unless the
	// PairConfig named another).
	Namespace string
	Client    kubernetes.Interface
	Nodes     []*kubenode.Node
	Agents    map[string]*testbed.AgentPod // by node
	Probe     *probe.Probe
	// RDS and OBU are the remote brokers' addresses (host:port on node 2).
	RDS, OBU string
	// State says the pair is stateful (PairConfig.State).
	State bool
	stops []func()
}

// PairConfig configures StartPair.
type PairConfig struct {
	ControlPlane *controlplane.ControlPlane
	Cluster      *kubenode.Cluster // three nodes at least
	Repo         string            // the AMF repository (manifests/base)
	Dir          string            // for the RDS and OBU brokers' files (world-readable)
	// Policy is added to the primary's (amf.io/redundancy: hot).
	Policy map[string]string
	// Namespace holds the brokers (default BrokerNamespace); a second pair
	// of the same cluster needs one of its own.
	Namespace string
	// Mode is how the brokers are watched: contract.ModeSidecar (default,
	// the sidecar injected) or contract.ModeNode (the agents sample them).
	Mode contract.Mode
	// Swap puts the primary on node 1 and its standby on node 0.
	Swap bool
	// Agents, when set, are the agents of the cluster already deployed
	// (another Pair's): the pair uses them instead of deploying its own.
	Agents map[string]*testbed.AgentPod
	// AgentLayout is the kustomize layout of manifests/ the agents are
	// deployed from (default "base"; "overlays/node-mode" for node mode).
	AgentLayout string
	// State makes the pair stateful (sidecar mode only): its brokers keep
	// their state in brokerstate.DataDir, injected with --state-dir, so
	// that it is handed over at every switchover and failover, and the
	// standby is held out of its Services until then (never Ready).
	State bool
}

// StartPair starts it all and returns once the agents run; Stop ends what
// it started (the cluster is the caller's).
func StartPair(ctx context.Context, cfg PairConfig) (_ *Pair, err error) {
	if cfg.Cluster == nil || len(cfg.Cluster.Nodes) < 3 {
		return nil, errors.New("nodeloss: a Pair needs a cluster of three nodes")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = BrokerNamespace
	}
	if cfg.State && cfg.Mode == contract.ModeNode {
		return nil, errors.New("nodeloss: a stateful pair is handed over by its sidecars: node mode has none")
	}
	nodes := cfg.Cluster.Nodes
	p := &Pair{Namespace: cfg.Namespace, Client: cfg.ControlPlane.Client(), Nodes: nodes, Agents: map[string]*testbed.AgentPod{}, State: cfg.State}
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()
	if err := os.Chmod(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	site := testbed.Site{NetNS: nodes[2].NetNS, IP: nodes[2].IP}
	var brokers []*testbed.Broker
	for _, name := range []string{"rds-broker", "obu-broker"} {
		br, err := testbed.StartMosquittoAt(ctx, cfg.Dir, name, "", site)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		p.stops = append(p.stops, br.Stop)
		brokers = append(brokers, br)
	}
	rds, obu := brokers[0], brokers[1]
	p.RDS, p.OBU = rds.Addr, obu.Addr
	if p.Probe, err = probe.Start(ctx, probe.Config{PublishURL: rds.URL(), SubscribeURL: obu.URL()}); err != nil {
		return nil, fmt.Errorf("the E2E probe between RDS and OBU: %w", err)
	}
	p.stops = append(p.stops, func() { p.Probe.Stop() })
	if cfg.Agents != nil {
		maps.Copy(p.Agents, cfg.Agents)
	} else {
		var names []string
		for _, n := range nodes {
			names = append(names, n.Name)
		}
		agents, err := testbed.DeployAgentsLayout(ctx, cfg.ControlPlane, cfg.Repo, cmp.Or(cfg.AgentLayout, "base"), names, nil)
		if err != nil {
			return nil, fmt.Errorf("the agent DaemonSet: %w", err)
		}
		for i, ag := range agents {
			p.Agents[names[i]] = ag
			p.stops = append(p.stops, ag.Stop)
		}
	}
	policy := map[string]string{contract.AnnRedundancy: string(contract.Hot)}
	for k, v := range cfg.Policy {
		policy[k] = v
	}
	ed := testbed.Edge{Namespace: p.Namespace, RDS: rds.Addr, OBU: obu.Addr, Bridge: testbed.DefaultBridge,
		BrokerPortA: 1883, BrokerPortB: 1883, BrokerImage: images.MosquittoRef, Policy: policy}
	if cfg.State {
		ed.StateDir = brokerstate.DataDir
	}
	objs, err := ed.AMF()
	if cfg.Mode == contract.ModeNode {
		objs, err = ed.NodeMode()
	}
	if err != nil {
		return nil, fmt.Errorf("the edge brokers' objects: %w", err)
	}
	if _, err := p.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	for _, cm := range objs.ConfigMaps {
		if _, err := p.Client.CoreV1().ConfigMaps(p.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	for i, d := range objs.Deployments {
		// The primary on node 0, its hot standby running on node 1 (or
		// the other way round).
		n := nodes[i]
		if cfg.Swap {
			n = nodes[1-i]
		}
		d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Name}
		if d.Name == testbed.StandbyName {
			d.Spec.Replicas = ptr.To[int32](1)
		}
		if _, err := p.Client.AppsV1().Deployments(p.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Stop stops the probe, the brokers and following the agents' logs.
func (p *Pair) Stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
	p.stops = nil
}

// Node returns the node named name.
func (p *Pair) Node(name string) *kubenode.Node {
	for _, n := range p.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// eventually polls cond (the API, every 100 ms) until it holds or timeout
// passes; the error says what was last seen.
func eventually(ctx context.Context, what string, timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: not within %v; last seen: %s", what, timeout, state)
		}
		select { // polling the API with a deadline
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func (p *Pair) dep(ctx context.Context, name string) *appsv1.Deployment {
	d, err := p.Client.AppsV1().Deployments(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return d
}

func ready(d *appsv1.Deployment) bool {
	return d != nil && d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1
}

func describe(d *appsv1.Deployment) string {
	if d == nil {
		return "not read"
	}
	return fmt.Sprintf("%s replicas %d ready %d role %q primary-node %q standby-node %q", d.Name, ptr.Deref(d.Spec.Replicas, 1),
		d.Status.ReadyReplicas, d.Annotations[contract.AnnRole], d.Annotations[contract.AnnPrimaryNode], d.Annotations[contract.AnnStandbyNode])
}

// WaitPair waits until primary and standby are Ready (a stateful pair's
// standby: ready but for the state, amf.io/standby-ready naming its pod),
// the agents have written the pair's nodes on the standby, and the probe's
// messages flow.
func (p *Pair) WaitPair(ctx context.Context, primary, standby, primaryNode, standbyNode string) error {
	if err := eventually(ctx, "the hot pair Ready with its nodes recorded", 3*time.Minute, func() (bool, string) {
		pd, sd := p.dep(ctx, primary), p.dep(ctx, standby)
		standbyReady := ready(sd)
		if p.State {
			standbyReady = p.holdsReady(ctx, sd)
		}
		ok := ready(pd) && standbyReady && sd.Annotations[contract.AnnPrimaryNode] == primaryNode && sd.Annotations[contract.AnnStandbyNode] == standbyNode &&
			sd.Annotations[contract.AnnPrimary] == primary
		return ok, describe(pd) + "; " + describe(sd)
	}); err != nil {
		return err
	}
	if err := p.Probe.WaitReceived(ctx, p.Probe.Received()+10); err != nil {
		return fmt.Errorf("no messages from RDS to OBU through the edge brokers: %w", err)
	}
	return nil
}

// holdsReady says whether d, a stateful pair's standby, has a pod ready
// but for the state: the one its agent names in amf.io/standby-ready, not
// being deleted.
func (p *Pair) holdsReady(ctx context.Context, d *appsv1.Deployment) bool {
	if d == nil || d.Annotations[contract.AnnStandbyReady] == "" {
		return false
	}
	name := d.Annotations[contract.AnnStandbyReady]
	pod, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	return err == nil && pod.DeletionTimestamp == nil && testbed.HeldForState(pod)
}

// PodOf returns the name of dep's one pod.
func (p *Pair) PodOf(ctx context.Context, dep string) (string, error) {
	pods, err := p.Client.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + dep})
	if err != nil {
		return "", err
	}
	if len(pods.Items) != 1 {
		return "", fmt.Errorf("%s has %d pods, want 1", dep, len(pods.Items))
	}
	return pods.Items[0].Name, nil
}

// WaitLine waits for the agent on node to log msg (about node about) after
// since, and returns the line's time.
func (p *Pair) WaitLine(ctx context.Context, node, msg string, since time.Time, about string) (time.Time, error) {
	return p.waitLine(ctx, node, fmt.Sprintf("%q about %s", msg, about), func(l testbed.AgentLine) bool {
		return l.Msg == msg && l.Node == about && l.Time.After(since)
	})
}

// waitLine waits (90 s at most: a log stream through the API server and
// the kubelet lags the API's objects) for a line of node's agent that
// matches, and returns its time.
func (p *Pair) waitLine(ctx context.Context, node, what string, match func(testbed.AgentLine) bool) (time.Time, error) {
	var at time.Time
	err := eventually(ctx, fmt.Sprintf("agent on %s logs %s", node, what), 90*time.Second, func() (bool, string) {
		for _, l := range p.Agents[node].Lines() {
			if match(l) {
				at = l.Time
				return true, ""
			}
		}
		return false, "not yet"
	})
	return at, err
}

// Failover is what WaitFailover saw.
type Failover struct {
	Lost    time.Time // the guard declared the node lost (its log)
	Retired time.Time // the guard's RetirePrimary decision (its log)
	Seen    time.Time // the test saw the roles exchanged (the API)
	// MaxGap is the probe's longest interval between fresh messages from
	// the fault to Seen; LostMessages those sent meanwhile and never
	// received; Duplicates receipts twice (both brokers forward).
	MaxGap       time.Duration
	LostMessages int
	Duplicates   int
	// StandbyUnready says how the standby was seen not Ready meanwhile
	// ("": always Ready).
	StandbyUnready string
}

// WaitFailover waits (up to timeout) until the standby is the primary: the
// old primary's pod oldPod marked for deletion (its Deployment scaled to 0;
// it may be back at 1 already, the new hot standby to be), the roles
// exchanged, the new primary Ready.
func (p *Pair) WaitFailover(ctx context.Context, primary, standby, oldPod string, faultAt time.Time, lostNode, guardNode string, timeout time.Duration) (Failover, error) {
	f, err := p.WaitExchanged(ctx, primary, standby, oldPod, faultAt, timeout)
	if err != nil {
		return f, err
	}
	if f.Lost, err = p.WaitLine(ctx, guardNode, "guarded node lost", faultAt, lostNode); err != nil {
		return f, err
	}
	if f.Retired, err = p.waitLine(ctx, guardNode, "the RetirePrimary decision", func(l testbed.AgentLine) bool {
		return l.Msg == "decision" && l.Action == "RetirePrimary" && l.Deployment == p.Namespace+"/"+primary && l.Time.After(faultAt) && l.Error == ""
	}); err != nil {
		return f, err
	}
	return f, nil
}

// WaitExchanged is WaitFailover as the API and the probe show it: the
// roles exchanged, the new primary Ready, the old pod marked for deletion,
// and the probe's figures from the fault until then.
func (p *Pair) WaitExchanged(ctx context.Context, primary, standby, oldPod string, faultAt time.Time, timeout time.Duration) (Failover, error) {
	var f Failover
	if err := eventually(ctx, "the standby becomes the primary", timeout, func() (bool, string) {
		pd, sd := p.dep(ctx, primary), p.dep(ctx, standby)
		if pd == nil || sd == nil {
			return false, "not read"
		}
		// Its pods' readiness: an annotation write bumps a Deployment's
		// generation, and ready() waits for the controller to observe it.
		if sd.Status.ReadyReplicas < 1 && f.StandbyUnready == "" {
			f.StandbyUnready = describe(sd)
		}
		f.Seen = time.Now()
		pod, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, oldPod, metav1.GetOptions{})
		deleted := apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil)
		ok := deleted && sd.Annotations[contract.AnnRole] == "primary" && pd.Annotations[contract.AnnRole] == "standby" && ready(sd)
		return ok, fmt.Sprintf("old pod %s deleted %v (%v); %s; %s", oldPod, deleted, err, describe(pd), describe(sd))
	}); err != nil {
		return f, err
	}
	rec := p.Probe.Snapshot()
	gap, _ := rec.MaxGap(faultAt, f.Seen)
	f.MaxGap = gap.Duration()
	// A second's margin at the end: messages on their way are not lost.
	f.LostMessages = len(rec.Lost(faultAt.Add(-time.Second), f.Seen.Add(-time.Second)))
	f.Duplicates = rec.Duplicates(faultAt, f.Seen)
	return f, nil
}

// Restore brings n back and waits until it is Ready; the log of its agent
// is then read from a new stream (testbed.Agent.Reconnect: the one open
// across the fault hangs).
func (p *Pair) Restore(ctx context.Context, n *kubenode.Node) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := n.Restore(rctx); err != nil {
		return err
	}
	if err := n.WaitReady(rctx); err != nil {
		return err
	}
	if ag := p.Agents[n.Name]; ag != nil {
		ag.Reconnect()
	}
	return nil
}

// WaitOnePrimary waits until the old primary's pod is gone, the old primary
// is back as the hot standby (Ready), and exactly one primary remains: one
// Deployment with the policy and role primary, one pod each.
func (p *Pair) WaitOnePrimary(ctx context.Context, primary, standby, oldPod string) error {
	if err := eventually(ctx, "the old primary's pod gone, one primary", 3*time.Minute, func() (bool, string) {
		_, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, oldPod, metav1.GetOptions{})
		pd, sd := p.dep(ctx, primary), p.dep(ctx, standby)
		if pd == nil || sd == nil {
			return false, "not read"
		}
		_, pPolicy := pd.Annotations[contract.AnnStandby]
		_, sPolicy := sd.Annotations[contract.AnnStandby]
		ok := apierrors.IsNotFound(err) && pPolicy && !sPolicy &&
			pd.Annotations[contract.AnnRole] == "primary" && sd.Annotations[contract.AnnRole] == "standby" && ready(pd) && ready(sd)
		return ok, fmt.Sprintf("old pod %s: %v; %s; %s", oldPod, err, describe(pd), describe(sd))
	}); err != nil {
		return err
	}
	var errs []string
	for _, dep := range []string{primary, standby} {
		if _, err := p.PodOf(ctx, dep); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// BrokerPaused reports whether every process of pod's broker container
// (testbed's, "mosquitto") is stopped, as the fence leaves it, read from
// the host's /proc: the container's ID is its cgroup's last element. It
// names what it saw.
func (p *Pair) BrokerPaused(ctx context.Context, pod string) (bool, string, error) {
	pd, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return false, "", err
	}
	pids, err := BrokerPIDs(pd)
	if err != nil {
		return false, "", err
	}
	if len(pids) == 0 {
		return false, "no process of its broker container", nil
	}
	var states []string
	all := true
	for _, pid := range pids {
		stopped, err := pause.Stopped("", pid)
		if err != nil {
			continue // ended meanwhile
		}
		all = all && stopped
		states = append(states, fmt.Sprintf("%d stopped=%v", pid, stopped))
	}
	return all, strings.Join(states, ", "), nil
}

// BrokerPIDs lists the host PIDs of pod's broker container (testbed's,
// "mosquitto"), found by its container ID, its cgroup's last element.
func BrokerPIDs(pod *corev1.Pod) ([]int, error) {
	var id string
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == testbed.BrokerContainer {
			_, id, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if id == "" {
		return nil, fmt.Errorf("pod %s: no %s container ID in its status", pod.Name, testbed.BrokerContainer)
	}
	return pause.Container{Leaf: id}.PIDs()
}

// CrashBroker kills (SIGKILL) the main process of pod's broker container
// on node n, as a crash of the broker does, and returns when.
func (p *Pair) CrashBroker(ctx context.Context, n *kubenode.Node, pod string) (time.Time, error) {
	pid, err := n.ContainerPID(ctx, p.Namespace, pod, testbed.BrokerContainer)
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return at, fmt.Errorf("pod %s: kill its broker (%d): %w", pod, pid, err)
	}
	return at, nil
}

// WaitBrokerPaused waits until every process of pod's broker is stopped.
func (p *Pair) WaitBrokerPaused(ctx context.Context, pod string, timeout time.Duration) error {
	return eventually(ctx, "the broker of "+pod+" paused by the fence", timeout, func() (bool, string) {
		ok, saw, err := p.BrokerPaused(ctx, pod)
		if err != nil {
			return false, err.Error()
		}
		return ok, saw
	})
}

// Acted says whether an agent's line is a node-loss action: a guarded node
// declared lost, a fence, or a primary retired. What a slow node, a dead
// kubelet or an API server away must not bring.
func Acted(l testbed.AgentLine) bool {
	return l.Msg == "guarded node lost" || l.Msg == "fence" || (l.Msg == "decision" && l.Action == "RetirePrimary")
}

// ActedSince returns every node-loss action (Acted) the agents logged after
// since, with the node of the agent.
func (p *Pair) ActedSince(since time.Time) map[string][]testbed.AgentLine {
	out := map[string][]testbed.AgentLine{}
	for n, ag := range p.Agents {
		for _, l := range ag.Lines() {
			if l.Time.After(since) && Acted(l) {
				out[n] = append(out[n], l)
			}
		}
	}
	return out
}
