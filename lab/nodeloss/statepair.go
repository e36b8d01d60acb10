package nodeloss

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
)

// StateRig is the agent DaemonSet of manifests/base (--liveness and the
// state hub on, its arguments as they are there) on every node of a lab
// cluster, for stateful pairs whose two pods run on two nodes
// (StartStatePair): a broker's state then has to go from the primary's
// node's agent to the standby's, and the standby's agent guards the
// primary's node.
type StateRig struct {
	Client kubernetes.Interface
	Nodes  []*kubenode.Node
	Agents map[string]*testbed.AgentPod // by node
}

// StartStateRig deploys the agents on cl's nodes and returns once each is
// Ready with its log followed; Stop stops following them (the cluster is
// the caller's, and its teardown takes the pods).
func StartStateRig(ctx context.Context, cp *controlplane.ControlPlane, cl *kubenode.Cluster, repo string) (*StateRig, error) {
	if cl == nil || len(cl.Nodes) < 2 {
		return nil, errors.New("nodeloss: a stateful pair across nodes needs a cluster of two nodes at least")
	}
	r := &StateRig{Client: cp.Client(), Nodes: cl.Nodes, Agents: map[string]*testbed.AgentPod{}}
	var names []string
	for _, n := range cl.Nodes {
		names = append(names, n.Name)
	}
	agents, err := testbed.DeployAgents(ctx, cp, repo, names, nil)
	if err != nil {
		return nil, fmt.Errorf("the agent DaemonSet: %w", err)
	}
	for i, ag := range agents {
		r.Agents[names[i]] = ag
	}
	return r, nil
}

// Stop stops following the agents' logs.
func (r *StateRig) Stop() {
	for _, ag := range r.Agents {
		ag.Stop()
	}
}

// subscribe merges every agent's lines from now on into one channel
// (testbed.SubscribeAll), as testbed.StatePair reads them: which agent
// says what of a handover across nodes is the product's to choose.
func (r *StateRig) subscribe() (<-chan testbed.AgentLine, func()) {
	var agents []*testbed.AgentPod
	for _, ag := range r.Agents {
		agents = append(agents, ag)
	}
	return testbed.SubscribeAll(agents...)
}

// agentOf returns the node whose agent logged a line that matches, and
// the line (the earliest by its time); "" when none did.
func (r *StateRig) agentOf(match func(testbed.AgentLine) bool) (string, testbed.AgentLine) {
	var node string
	var best testbed.AgentLine
	for n, ag := range r.Agents {
		for _, l := range ag.Lines() {
			if match(l) && (node == "" || l.Time.Before(best.Time)) {
				node, best = n, l
			}
		}
	}
	return node, best
}

// StatePair is testbed's stateful pair with its primary's pod on the rig's
// node 0 and its standby's on node 1 (testbed.StartStatePairAcross).
type StatePair struct {
	*testbed.StatePair
	rig   *StateRig
	unsub func()
}

// StartStatePair creates namespace ns and starts the pair name in it:
// returned once the primary serves, the standby is held out of its
// Services, and the primary holds plan, seeded by real clients. Close
// removes it.
func (r *StateRig) StartStatePair(ctx context.Context, ns, name string, plan brokerstate.Plan) (_ *StatePair, err error) {
	if _, err := r.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	lines, unsub := r.subscribe()
	p := &StatePair{rig: r, unsub: unsub, StatePair: &testbed.StatePair{C: r.Client, Namespace: ns}}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	sp, err := testbed.StartStatePairAcross(ctx, r.Client, r.Nodes[0], r.Nodes[1], lines, ns, name, plan)
	if err != nil {
		return nil, err
	}
	p.StatePair = sp
	return p, nil
}

// Close stops reading the agents' lines, deletes the pair's namespace and
// waits until it is gone with its pods: the next pair starts on quiet
// nodes, each of which has room for a few of the testbed's 500m brokers
// only. A pod on a node that is still cut off keeps it from going: restore
// the node first.
func (p *StatePair) Close() error {
	p.unsub()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := p.rig.Client
	if err := c.CoreV1().Namespaces().Delete(ctx, p.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return eventually(ctx, "namespace "+p.Namespace+" gone", 3*time.Minute, func() (bool, string) {
		_, err := c.CoreV1().Namespaces().Get(ctx, p.Namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// WaitGuarded waits until the standby's agent guards the primary's node:
// both agents have written the pair's nodes on the standby Deployment
// (contract.AnnPrimaryNode, AnnStandbyNode), and the standby's agent's
// last "guarding" line names the primary's node. Before that a power cut
// of the primary's node would fail nothing over.
func (p *StatePair) WaitGuarded(ctx context.Context) error {
	primary, standby := p.Node.Name, p.StandbyNode.Name
	if err := eventually(ctx, "the pair's nodes written on the standby", 2*time.Minute, func() (bool, string) {
		d, err := p.C.AppsV1().Deployments(p.Namespace).Get(ctx, p.Deployments[1], metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		a := d.Annotations
		return a[contract.AnnPrimaryNode] == primary && a[contract.AnnStandbyNode] == standby,
			fmt.Sprintf("primary-node %q standby-node %q", a[contract.AnnPrimaryNode], a[contract.AnnStandbyNode])
	}); err != nil {
		return err
	}
	return eventually(ctx, "the agent on "+standby+" guards "+primary, 90*time.Second, func() (bool, string) {
		var last testbed.AgentLine
		for _, l := range p.rig.Agents[standby].Lines() {
			if l.Msg == "guarding" {
				last = l
			}
		}
		return strings.Contains(last.Raw, strconv.Quote(primary)), "last guarding line: " + last.Raw
	})
}

// AwaitRelayed waits (up to bound) until an agent says it relayed the
// primary's snapshot, or took it in relayed, at or after the hub's line
// snap (AwaitSnapshotLine), and returns that line. A relay sends a pod's
// newest state, so one after snap holds at least what snap held. The
// product's words are matched loosely (an INFO line with "relayed" in its
// message, the pod and the kind in its fields), so false means that no
// such line was seen, not that nothing was relayed.
func (p *StatePair) AwaitRelayed(ctx context.Context, snap testbed.AgentLine, bound time.Duration) (testbed.AgentLine, string, bool) {
	pod := p.Primary.Namespace + "/" + p.Primary.Name + "/"
	match := func(l testbed.AgentLine) bool {
		return l.Level == "INFO" && strings.Contains(l.Msg, "relayed") && !l.Time.Before(snap.Time) &&
			strings.Contains(l.Raw, `"kind":"snapshot"`) && strings.Contains(l.Raw, pod)
	}
	var node string
	var line testbed.AgentLine
	err := eventually(ctx, "the snapshot relayed", bound, func() (bool, string) {
		node, line = p.rig.agentOf(match)
		return node != "", ""
	})
	return line, node, err == nil
}

// Handover is what the agents said of a handover, and which said it.
type Handover struct {
	testbed.StateHandover
	// RetiredBy, NotCarriedBy and CarriedBy are the nodes of the agents
	// that logged the RetirePrimary, StateNotCarried and StateCarried
	// decisions.
	RetiredBy, NotCarriedBy, CarriedBy string
}

// Handover is testbed's, across nodes: the agents' logs come through
// separate streams, so the retirement (the primary's agent's, or its
// guard's) may be read after the state was carried (the standby's agent's);
// it is looked up in every agent's lines (90 s at most).
func (p *StatePair) Handover(ctx context.Context) (Handover, error) {
	th, err := p.StatePair.Handover(ctx)
	h := Handover{StateHandover: th}
	if err != nil {
		return h, err
	}
	dep := p.Namespace + "/" + p.Deployments[0]
	var retired testbed.AgentLine
	err = eventually(ctx, "a RetirePrimary decision on "+dep, 90*time.Second, func() (bool, string) {
		h.RetiredBy, retired = p.rig.agentOf(func(l testbed.AgentLine) bool {
			return l.Msg == "decision" && l.Action == "RetirePrimary" && l.Deployment == dep && l.Error == ""
		})
		return h.RetiredBy != "", "none"
	})
	if err != nil {
		return h, err
	}
	if h.Retired.IsZero() || retired.Time.Before(h.Retired) {
		h.Retired = retired.Time
	}
	if h.HandedOn.IsZero() || h.HandedOn.Before(h.Retired) {
		h.HandedOn = h.Retired
	}
	raw := func(s string) func(testbed.AgentLine) bool {
		return func(l testbed.AgentLine) bool { return s != "" && l.Raw == s }
	}
	h.CarriedBy, _ = p.rig.agentOf(raw(h.Line))
	h.NotCarriedBy, _ = p.rig.agentOf(raw(h.NotCarried))
	return h, nil
}

// AwaitLine waits (up to bound: a log stream through the API server and
// the kubelet lags the API's objects) for the earliest line of msg about
// node about (liveness's "guarded node lost", say) logged after since, and
// returns the node of the agent that logged it and the line's time.
func (p *StatePair) AwaitLine(ctx context.Context, msg, about string, since time.Time, bound time.Duration) (string, time.Time, error) {
	var node string
	var line testbed.AgentLine
	err := eventually(ctx, fmt.Sprintf("an agent logs %q about %s", msg, about), bound, func() (bool, string) {
		node, line = p.rig.agentOf(func(l testbed.AgentLine) bool { return l.Msg == msg && l.Node == about && l.Time.After(since) })
		return node != "", "not yet"
	})
	return node, line.Time, err
}

// StateEvents returns the Events of the pair's namespace whose reason
// begins with "State" (StateHandover, StateFromSnapshot, StateCarried,
// StateNotCarried, ...), oldest first, one line each.
func (p *StatePair) StateEvents(ctx context.Context) ([]string, error) {
	evs, err := p.C.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	type event struct {
		at   time.Time
		line string
	}
	var got []event
	for _, e := range evs.Items {
		if !strings.HasPrefix(e.Reason, "State") {
			continue
		}
		by := e.ReportingInstance
		if by == "" {
			by = e.Source.Host
		}
		at := e.EventTime.Time
		if at.IsZero() {
			at = e.FirstTimestamp.Time
		}
		got = append(got, event{at, fmt.Sprintf("%s %s %s on %s by %s: %s", at.Format("15:04:05.000"), e.Type, e.Reason, e.InvolvedObject.Name, by, e.Message)})
	}
	slices.SortStableFunc(got, func(a, b event) int { return a.at.Compare(b.at) })
	var out []string
	for _, e := range got {
		out = append(out, e.line)
	}
	return out, nil
}
