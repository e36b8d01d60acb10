package statehub_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
)

const nodeNS = "mqtt"

// fastGates switch over as soon as the paper's model has said anomalous
// three times and once more with the standby ready.
var fastGates = map[string]string{contract.AnnDebounce: "3", contract.AnnReconfirm: "1", contract.AnnHold: "0s", contract.AnnReadyTimeout: "60s"}

// TestAPlannedSwitchoverOfAStatefulPairLosesNothing is the whole of a
// planned switchover of a stateful pair on a real kubelet and containerd,
// with the agent DaemonSet of manifests/base and a pair as inject --standby
// --state-dir writes it: the standby is held out of its Services while it
// is one; real clients give the primary retained messages, MQTT 3.1.1 and
// MQTT 5 persistent sessions and QoS 1 messages queued for them; the
// paper's stress makes the primary anomalous; the agent retires it, its
// final state goes through the agent's hub to the standby's pod, whose
// broker restarts on it, and only then does that pod serve. Real clients
// then find every retained message, their sessions (Session Present 1) and
// every queued message, none twice. The standby held none of it before, so
// the check can fail.
func TestAPlannedSwitchoverOfAStatefulPairLosesNothing(t *testing.T) {
	r := startPair(t)
	ctx := r.ctx
	stress, err := r.node.Exec(ctx, nodeNS, r.primary.Name, brokerstate.BrokerContainer, []string{images.LabBinary, "stress", "--memory-file", "--profile", "120s:mem=60Mi,cpu=0.4"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stress.Process.Kill(); _ = stress.Wait() }()
	onset := time.Now()
	retired, handedOn, carried := r.handover(t)
	served, err := awaitPod(ctx, r.c, r.standby.Name, "the new primary serves", ready)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("retired %.2f s after the stress began; after the retirement: the final state handed on %.2f s, the new primary on it %.2f s, Ready %.2f s",
		retired.Sub(onset).Seconds(), handedOn.Sub(retired).Seconds(), carried.Sub(retired).Seconds(), served.Sub(retired).Seconds())
	r.lossless(t)
}

// TestACrashFailoverOfAStatefulPairRestartsTheStandbyOnTheLastSnapshot: a
// crashed broker writes no final state; the standby restarts on the last
// snapshot the primary's sidecar handed in (every 5 s, when it changed)
// and serves only then. Nothing was taken in after the snapshot here, so
// nothing is lost; the time it costs is measured.
func TestACrashFailoverOfAStatefulPairRestartsTheStandbyOnTheLastSnapshot(t *testing.T) {
	r := startPair(t)
	ctx := r.ctx
	// The snapshot that holds the seeded state, from the hub's own line.
	for taken := false; !taken; {
		select {
		case l := <-r.lines:
			taken = l.Msg == "broker state taken in" && strings.Contains(l.Raw, `"kind":"snapshot"`) && strings.Contains(l.Raw, `"retained":100`)
		case <-ctx.Done():
			t.Fatal("no snapshot of the seeded state handed in")
		}
	}
	pid, err := r.node.ContainerPID(ctx, nodeNS, r.primary.Name, brokerstate.BrokerContainer)
	if err != nil {
		t.Fatal(err)
	}
	crash := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	retired, handedOn, carried := r.handover(t)
	served, err := awaitPod(ctx, r.c, r.standby.Name, "the new primary serves", ready)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the crash: retired %.2f s, the snapshot handed on %.2f s, the new primary on it %.2f s, Ready %.2f s",
		retired.Sub(crash).Seconds(), handedOn.Sub(crash).Seconds(), carried.Sub(crash).Seconds(), served.Sub(crash).Seconds())
	r.lossless(t)
}

// pairRig is a stateful pair on a real node with the agent DaemonSet, the
// primary seeded by real clients.
type pairRig struct {
	ctx              context.Context
	node             *kubenode.Node
	c                kubernetes.Interface
	lines            <-chan testbed.AgentLine
	primary, standby *corev1.Pod
	plan             brokerstate.Plan
}

func startPair(t *testing.T) *pairRig {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real node")
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	sub, err := brokerstate.MosquittoSub()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	agent, err := testbed.DeployAgent(ctx, cp, repo, n.Name, []string{"--log-level=debug"})
	if err != nil {
		t.Fatalf("the agent DaemonSet: %v", err)
	}
	t.Cleanup(agent.Stop)
	lines, unsub := agent.Subscribe()
	t.Cleanup(unsub)

	c := cp.Client()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodeNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(nodeNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "broker"}, Data: map[string]string{"mosquitto.conf": brokerstate.Config("")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pair, err := brokerstate.InjectedPairWith(nodeNS, "broker", fastGates, model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range pair {
		if _, err := c.AppsV1().Deployments(nodeNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var pods []*corev1.Pod
	for _, d := range pair {
		p, err := brokerstate.RunningPod(ctx, c, nodeNS, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	r := &pairRig{ctx: ctx, node: n, c: c, lines: lines, primary: pods[0], standby: pods[1],
		plan: brokerstate.Plan{Retained: 100, Sessions: 2, V5Sessions: 1, Queued: 5, MosquittoSub: sub}}
	if _, err := awaitPod(ctx, c, r.primary.Name, "the primary serves", ready); err != nil {
		t.Fatal(err)
	}
	if _, err := awaitPod(ctx, c, r.standby.Name, "the standby is held out of its Services", heldForState); err != nil {
		t.Fatal(err)
	}
	if err := brokerstate.Seed(ctx, brokerstate.Addr(r.primary), r.plan); err != nil {
		t.Fatal(err)
	}
	before, err := brokerstate.Check(ctx, brokerstate.Addr(r.standby), r.plan)
	if err != nil {
		t.Fatal(err)
	}
	if before.RetainedFound != 0 || len(before.SessionsLost) != len(r.plan.SessionIDs()) {
		t.Fatalf("the standby held state before the switchover: %v", before)
	}
	return r
}

// handover follows the agent's lines until the state is carried and
// returns when it retired the primary, handed the state on and saw the
// new primary run on it.
func (r *pairRig) handover(t *testing.T) (retired, handedOn, carried time.Time) {
	t.Helper()
	for carried.IsZero() {
		select {
		case l := <-r.lines:
			switch {
			case l.Msg != "decision":
			case l.Action == "RetirePrimary" && l.Error == "":
				retired = l.Time
			case l.Action == "StateNotCarried":
				t.Fatalf("the agent gave the state up: %s", l.Raw)
			case l.Action == "HandOnState":
				handedOn = l.Time
			case l.Action == "StateCarried":
				carried = l.Time
				t.Logf("the agent: %s", l.Raw)
			}
		case <-r.ctx.Done():
			t.Fatal("no state carried")
		}
	}
	if handedOn.IsZero() {
		handedOn = retired // a failover's snapshot is handed on as the primary is retired
	}
	return retired, handedOn, carried
}

// lossless checks the new primary holds every retained message, session
// and queued message of the plan, none twice.
func (r *pairRig) lossless(t *testing.T) {
	t.Helper()
	after, err := brokerstate.Check(r.ctx, brokerstate.Addr(r.standby), r.plan)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Lossless() || after.Duplicates != 0 || after.RetainedFound != r.plan.Retained || after.QueuedFound != 3*r.plan.Queued {
		t.Errorf("the new primary: %v; want all %d retained, %d queued, no session lost, no duplicate", after, r.plan.Retained, 3*r.plan.Queued)
	}
}

func ready(p *corev1.Pod) bool { return condition(p, string(corev1.PodReady)) == corev1.ConditionTrue }

// heldForState: every container ready, the pod not Ready, its gate held by
// the agent for the state.
func heldForState(p *corev1.Pod) bool {
	if condition(p, string(corev1.ContainersReady)) != corev1.ConditionTrue || ready(p) {
		return false
	}
	for _, c := range p.Status.Conditions {
		if string(c.Type) == contract.ConditionHealthy {
			return c.Status == corev1.ConditionFalse && c.Reason == "AwaitingState"
		}
	}
	return false
}

func condition(p *corev1.Pod, typ string) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}

// awaitPod watches pod name until ok holds and returns when it was seen.
func awaitPod(ctx context.Context, c kubernetes.Interface, name, what string, ok func(*corev1.Pod) bool) (time.Time, error) {
	for {
		l, err := c.CoreV1().Pods(nodeNS).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			return time.Time{}, err
		}
		if len(l.Items) == 1 && ok(&l.Items[0]) {
			return time.Now(), nil
		}
		w, err := c.CoreV1().Pods(nodeNS).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: l.ResourceVersion})
		if err != nil {
			return time.Time{}, err
		}
		for ev := range w.ResultChan() {
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ok(p) {
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
