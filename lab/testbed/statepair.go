package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
)

// StatePair is a stateful pair as inject --standby --state-dir writes it,
// on a real node whose agent DaemonSet runs, its primary seeded by real
// clients with a brokerstate.Plan (DESIGN.md, "Broker state"): what the
// tests and the bench of a switchover's and a failover's state run on.
type StatePair struct {
	C kubernetes.Interface
	// Node runs the primary's pod (Stress, Crash and StartLive act there);
	// StandbyNode the standby's: the same node but for StartStatePairAcross,
	// nil for StartStatePairTo.
	Node, StandbyNode *kubenode.Node
	Namespace         string
	Primary, Standby  *corev1.Pod
	// Deployments are the primary's and the standby's names.
	Deployments [2]string
	Plan        brokerstate.Plan
	lines       <-chan AgentLine
}

// StateGates switch over as soon as the paper's model has said anomalous
// three times, and once more with the standby ready.
var StateGates = map[string]string{contract.AnnDebounce: "3", contract.AnnReconfirm: "1", contract.AnnHold: "0s", contract.AnnReadyTimeout: "60s"}

// StartStatePair deploys the pair name in namespace ns (which must exist)
// with the paper's model and StateGates, waits until the primary serves and
// the standby is held out of its Services, and seeds the primary with plan,
// checking that the standby holds none of it (so that a check after the
// event can fail). lines are the agent's, subscribed before.
func StartStatePair(ctx context.Context, c kubernetes.Interface, node *kubenode.Node, lines <-chan AgentLine, ns, name string, plan brokerstate.Plan) (*StatePair, error) {
	p := &StatePair{Node: node, StandbyNode: node}
	if err := p.start(ctx, c, "", lines, ns, name, plan); err != nil {
		return nil, err
	}
	return p, nil
}

// StartStatePairAcross is StartStatePair on two nodes of a cluster: the
// primary's pod on primary, the standby's on standby, so that the state has
// to go from one node's agent to the other's. Each Deployment's template
// gets a nodeSelector on kubernetes.io/hostname: inject's anti-affinity
// (preferred) keeps the two apart but says not which goes where, and a
// selector rather than spec.nodeName leaves the pods to the scheduler, so
// that the retired primary's next pod (the new standby) comes back to its
// node too. lines are every agent's, subscribed before (merged): which
// agent says what of a handover between nodes is the product's to choose.
func StartStatePairAcross(ctx context.Context, c kubernetes.Interface, primary, standby *kubenode.Node, lines <-chan AgentLine, ns, name string, plan brokerstate.Plan) (*StatePair, error) {
	p := &StatePair{Node: primary, StandbyNode: standby}
	if err := p.start(ctx, c, standby.Name, lines, ns, name, plan); err != nil {
		return nil, err
	}
	return p, nil
}

// StartStatePairTo is StartStatePairAcross with the standby's pod on a node
// of the same cluster that lab/kubenode does not run (lab/vmnode's guest on
// the cluster's LAN), named standbyNode; StandbyNode stays nil.
func StartStatePairTo(ctx context.Context, c kubernetes.Interface, primary *kubenode.Node, standbyNode string, lines <-chan AgentLine, ns, name string, plan brokerstate.Plan) (*StatePair, error) {
	p := &StatePair{Node: primary}
	if err := p.start(ctx, c, standbyNode, lines, ns, name, plan); err != nil {
		return nil, err
	}
	return p, nil
}

// start deploys the pair on p.Node, the standby pinned to standbyNode
// unless it is "" (then the scheduler places it: one node), and seeds it.
func (p *StatePair) start(ctx context.Context, c kubernetes.Interface, standbyNode string, lines <-chan AgentLine, ns, name string, plan brokerstate.Plan) error {
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"mosquitto.conf": brokerstate.Config("")}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	pair, err := brokerstate.InjectedPairWith(ns, name, StateGates, model.PaperName)
	if err != nil {
		return err
	}
	for i, d := range pair {
		if standbyNode != "" {
			d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: [2]string{p.Node.Name, standbyNode}[i]}
		}
		if _, err := c.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	p.C, p.Namespace, p.Plan, p.lines, p.Deployments = c, ns, plan, lines, [2]string{pair[0].Name, pair[1].Name}
	var pods []*corev1.Pod
	for _, d := range pair {
		pod, err := brokerstate.RunningPod(ctx, c, ns, d.Name)
		if err != nil {
			return err
		}
		pods = append(pods, pod)
	}
	p.Primary, p.Standby = pods[0], pods[1]
	if _, err := p.await(ctx, p.Primary.Name, "the primary serves", PodReady); err != nil {
		return err
	}
	if _, err := p.await(ctx, p.Standby.Name, "the standby is held out of its Services", HeldForState); err != nil {
		return err
	}
	if err := brokerstate.Seed(ctx, brokerstate.Addr(p.Primary), plan); err != nil {
		return err
	}
	before, err := brokerstate.Check(ctx, brokerstate.Addr(p.Standby), plan)
	if err != nil {
		return err
	}
	if before.RetainedFound != 0 || len(before.SessionsLost) != len(plan.SessionIDs()) {
		return fmt.Errorf("the standby held state before the event: %v", before)
	}
	// That check left the plan's sessions on the standby, empty: a standby
	// that gets no state would show them after the event (Session Present 1).
	if err := brokerstate.Forget(ctx, brokerstate.Addr(p.Standby), plan); err != nil {
		return fmt.Errorf("the standby: %w", err)
	}
	return nil
}

// StartLive puts live traffic through the pair's Service (its NodePort on
// the node's address, a QoS 1 publisher and subscriber in the node's
// network, 20 messages a second): what its clients see of the event. Not
// the ClusterIP: the node's network has a dead-end default route, and a
// ClusterIP has no route of its own there before kube-proxy's DNAT.
func (p *StatePair) StartLive(ctx context.Context) (*brokerstate.Live, error) {
	name := p.Deployments[0]
	svc, err := p.C.CoreV1().Services(p.Namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app.kubernetes.io/name": name},
			Ports: []corev1.ServicePort{{Name: "mqtt", Port: 1883, TargetPort: intstr.FromInt32(1883)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("the pair's Service: %w", err)
	}
	netns := p.Node.NetNS
	dial := func(ctx context.Context, addr string) (net.Conn, error) { return kubenode.DialIn(ctx, netns, addr) }
	// Until kube-proxy has the Service, a connect is refused: the client retries.
	addr := net.JoinHostPort(p.Node.IP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	return brokerstate.StartLive(ctx, addr, name, 50*time.Millisecond, dial)
}

// Stress runs the paper's stress in the primary's broker container (its
// model says anomalous within a second) until stop.
func (p *StatePair) Stress(ctx context.Context) (stop func(), err error) {
	cmd, err := p.Node.Exec(ctx, p.Namespace, p.Primary.Name, brokerstate.BrokerContainer, []string{images.LabBinary, "stress", "--memory-file", "--profile", "120s:mem=60Mi,cpu=0.4"}, io.Discard, io.Discard)
	if err != nil {
		return nil, err
	}
	return func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }, nil
}

// AwaitSnapshot waits until the agent's hub took in a snapshot of the
// primary holding the whole plan: every retained message, session and
// queued message (Seed publishes the retained messages before the queued
// ones, and a snapshot taken in between holds the one but not the other).
func (p *StatePair) AwaitSnapshot(ctx context.Context) error {
	_, err := p.AwaitSnapshotLine(ctx)
	return err
}

// AwaitSnapshotLine is AwaitSnapshot, and returns the hub's line (its
// state field names the snapshot).
func (p *StatePair) AwaitSnapshotLine(ctx context.Context) (AgentLine, error) {
	return p.awaitSnapshotOf(ctx, p.Plan, "the seeded state")
}

// AwaitClockSnapshotLine is AwaitSnapshotLine for a snapshot that also
// holds the pair's clock (StartClock), one retained message beyond the
// plan's: the snapshot a failover hands on then carries a clock value, so
// the retained age it is read by is defined. A line from before the clock
// started (still queued, or a snapshot taken before its first value) is
// passed over: without this a crash soon after it left the new primary
// with the plan and no clock.
func (p *StatePair) AwaitClockSnapshotLine(ctx context.Context) (AgentLine, error) {
	return p.awaitSnapshotOf(ctx, p.Plan.WithClock(), "the seeded state and the clock")
}

// awaitSnapshotOf waits for the hub's line of a snapshot of the primary
// that holds plan.
func (p *StatePair) awaitSnapshotOf(ctx context.Context, plan brokerstate.Plan, what string) (AgentLine, error) {
	for {
		select {
		case l := <-p.lines:
			if l.Msg == "broker state taken in" && SnapshotHolds(l, p.Primary.Name, plan) {
				return l, nil
			}
		case <-ctx.Done():
			return AgentLine{}, fmt.Errorf("no snapshot of %s handed in: %w", what, ctx.Err())
		}
	}
}

// SnapshotOfPlan says whether agent line l (any message) speaks of a
// snapshot of the primary's broker that holds the whole plan, by the
// counts the line carries (mosquittodb's: retained, sessions, queued).
func (p *StatePair) SnapshotOfPlan(l AgentLine) bool { return SnapshotHolds(l, p.Primary.Name, p.Plan) }

// SnapshotHolds says whether agent line l (any message) speaks of a
// snapshot of pod's broker that holds the whole of plan, by the counts the
// line carries (mosquittodb's: retained, sessions, queued).
func SnapshotHolds(l AgentLine, pod string, plan brokerstate.Plan) bool {
	if !strings.Contains(l.Raw, `"kind":"snapshot"`) || !strings.Contains(l.Raw, pod) {
		return false
	}
	var n struct{ Retained, Sessions, Queued *int }
	if json.Unmarshal([]byte(l.Raw), &n) != nil || n.Retained == nil || n.Sessions == nil || n.Queued == nil {
		return false
	}
	ids := len(plan.SessionIDs())
	return *n.Retained >= plan.Retained && *n.Sessions >= ids && *n.Queued >= ids*plan.Queued
}

// Crash SIGKILLs the primary's broker and returns when.
func (p *StatePair) Crash(ctx context.Context) (time.Time, error) {
	pid, err := p.Node.ContainerPID(ctx, p.Namespace, p.Primary.Name, brokerstate.BrokerContainer)
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	return at, syscall.Kill(pid, syscall.SIGKILL)
}

// StateHandover is what the agent said of a handover.
type StateHandover struct {
	// Retired, HandedOn and Carried are when the agent retired the
	// primary, handed its state on (a failover's snapshot goes as it
	// retires) and saw the new primary run on it.
	Retired, HandedOn, Carried time.Time
	// NotCarried is the agent's line when it gave the state up.
	NotCarried string
	Line       string // the StateCarried line
}

// Handover follows the agent's lines until the state is carried or given up.
// A give-up is taken from a decision line (action StateNotCarried) or from
// the line the agent logs with each Event it records: the agent says some
// (that a standby on another node gets no state, say) only as an Event.
func (p *StatePair) Handover(ctx context.Context) (StateHandover, error) {
	var h StateHandover
	for h.Carried.IsZero() && h.NotCarried == "" {
		select {
		case l := <-p.lines:
			switch {
			case !strings.HasPrefix(l.Deployment, p.Namespace+"/"):
			case l.Msg == "event" && l.Reason == "StateNotCarried":
				h.NotCarried = l.Raw
			case l.Msg != "decision":
			case l.Action == "RetirePrimary" && l.Error == "":
				h.Retired = l.Time
			case l.Action == "StateNotCarried":
				h.NotCarried = l.Raw
			case l.Action == "HandOnState":
				h.HandedOn = l.Time
			case l.Action == "StateCarried":
				h.Carried, h.Line = l.Time, l.Raw
			}
		case <-ctx.Done():
			return h, fmt.Errorf("the agent neither carried the state nor gave it up: %w", ctx.Err())
		}
	}
	if h.HandedOn.IsZero() {
		h.HandedOn = h.Retired
	}
	return h, nil
}

// AwaitServing returns when the new primary's (the standby's) pod is Ready.
func (p *StatePair) AwaitServing(ctx context.Context) (time.Time, error) {
	return p.await(ctx, p.Standby.Name, "the new primary serves", PodReady)
}

// ClockTopic is the topic of the pair's brokerstate.Clock.
func (p *StatePair) ClockTopic() string { return p.Plan.Topic("clock") }

// StartClock publishes the time as a retained message to the primary every
// 100 ms (brokerstate.Clock): read from the new primary after a failover
// (ReadClock), it says how old the retained set carried over is.
func (p *StatePair) StartClock(ctx context.Context) (*brokerstate.Clock, error) {
	return brokerstate.StartClock(ctx, brokerstate.Addr(p.Primary), p.ClockTopic(), 100*time.Millisecond)
}

// ReadClock is brokerstate.ReadClock on the new primary.
func (p *StatePair) ReadClock(ctx context.Context) (time.Time, bool, error) {
	return brokerstate.ReadClock(ctx, brokerstate.Addr(p.Standby), p.ClockTopic())
}

// Check is brokerstate.Check on the new primary.
func (p *StatePair) Check(ctx context.Context) (brokerstate.Result, error) {
	return brokerstate.Check(ctx, brokerstate.Addr(p.Standby), p.Plan)
}

// PodReady reports the pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	return podCondition(p, string(corev1.PodReady)) == corev1.ConditionTrue
}

// HeldForState: every container ready, the pod not Ready, its gate held by
// the agent until it holds the primary's state.
func HeldForState(p *corev1.Pod) bool {
	if podCondition(p, string(corev1.ContainersReady)) != corev1.ConditionTrue || PodReady(p) {
		return false
	}
	for _, c := range p.Status.Conditions {
		if string(c.Type) == contract.ConditionHealthy {
			return c.Status == corev1.ConditionFalse && c.Reason == "AwaitingState"
		}
	}
	return false
}

func podCondition(p *corev1.Pod, typ string) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}

// await watches pod name until ok holds and returns when it was seen.
func (p *StatePair) await(ctx context.Context, name, what string, ok func(*corev1.Pod) bool) (time.Time, error) {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		l, err := p.C.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", what, err)
		}
		if len(l.Items) == 1 && ok(&l.Items[0]) {
			return time.Now(), nil
		}
		w, err := p.C.CoreV1().Pods(p.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: l.ResourceVersion})
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", what, err)
		}
		for ev := range w.ResultChan() {
			if pod, isPod := ev.Object.(*corev1.Pod); isPod && ok(pod) {
				w.Stop()
				return time.Now(), nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
}
