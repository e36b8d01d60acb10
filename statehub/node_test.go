package statehub_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
)

// startPair is a stateful pair on a real kubelet and containerd, with the
// agent DaemonSet of manifests/base and the pair as inject --standby
// --state-dir writes it, the primary seeded by real clients: 100 retained
// messages, two MQTT 3.1.1 sessions and one MQTT 5 session, 5 QoS 1
// messages queued for each (testbed.StartStatePair).
func startPair(t *testing.T) (context.Context, *testbed.StatePair) {
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
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mqtt"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := testbed.StartStatePair(ctx, c, n, lines, "mqtt", "broker", brokerstate.Plan{Retained: 100, Sessions: 2, V5Sessions: 1, Queued: 5, MosquittoSub: sub})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, p
}

// carried follows the handover to the new primary serving and checks that
// it holds every retained message, session (Session Present 1) and queued
// message of the plan, none twice.
func carried(t *testing.T, ctx context.Context, p *testbed.StatePair) (testbed.StateHandover, time.Time) {
	t.Helper()
	h, err := p.Handover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.NotCarried != "" {
		t.Fatalf("the agent gave the state up: %s", h.NotCarried)
	}
	t.Logf("the agent: %s", h.Line)
	served, err := p.AwaitServing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after, err := p.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Lossless() || after.Duplicates != 0 || after.RetainedFound != p.Plan.Retained || after.QueuedFound != 3*p.Plan.Queued {
		t.Errorf("the new primary: %v; want all %d retained, %d queued, no session lost, no duplicate", after, p.Plan.Retained, 3*p.Plan.Queued)
	}
	return h, served
}

// TestAPlannedSwitchoverOfAStatefulPairLosesNothing: the standby is held
// out of its Services while it is one; the paper's stress makes the
// primary anomalous; the agent retires it, its final state goes through
// the agent's hub to the standby's pod, whose broker restarts on it, and
// only then does that pod serve, with everything the primary held. The
// standby held none of it before, so the check can fail.
func TestAPlannedSwitchoverOfAStatefulPairLosesNothing(t *testing.T) {
	ctx, p := startPair(t)
	live, err := p.StartLive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := p.Stress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	onset := time.Now()
	h, served := carried(t, ctx, p)
	t.Logf("retired %.2f s after the stress began; after the retirement: the final state handed on %.2f s, the new primary on it %.2f s, Ready %.2f s",
		h.Retired.Sub(onset).Seconds(), h.HandedOn.Sub(h.Retired).Seconds(), h.Carried.Sub(h.Retired).Seconds(), served.Sub(h.Retired).Seconds())
	// The live clients through the Service: every message the broker
	// acknowledged delivered, none given up by the publisher.
	res, err := live.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("live clients: %v", res)
	if res.Lost != 0 || res.Refused != 0 || res.MarkerMissed || res.Acked == 0 {
		t.Errorf("live QoS 1 clients across the switchover: %v; want nothing lost or given up", res)
	}
}

// TestACrashFailoverOfAStatefulPairRestartsTheStandbyOnTheLastSnapshot: a
// crashed broker writes no final state; the standby restarts on the last
// snapshot the primary's sidecar handed in (every second, when it
// changed) and serves only then. None of the seeded state was taken in
// after the snapshot, so none of it is lost.
//
// A retained clock, published to the primary every 100 ms up to the crash,
// is on the new primary afterwards, no newer than what the primary
// acknowledged: the retained set as of the last snapshot, its age logged.
func TestACrashFailoverOfAStatefulPairRestartsTheStandbyOnTheLastSnapshot(t *testing.T) {
	ctx, p := startPair(t)
	clock, err := p.StartClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A snapshot that holds the clock, not only the plan: one queued from
	// before the clock started would let the crash come before any did.
	if _, err := p.AwaitClockSnapshotLine(ctx); err != nil {
		clock.Stop()
		t.Fatal(err)
	}
	crash, err := p.Crash(ctx)
	last := clock.Stop()
	if err != nil {
		t.Fatal(err)
	}
	h, served := carried(t, ctx, p)
	t.Logf("after the crash: retired %.2f s, the snapshot handed on %.2f s, the new primary on it %.2f s, Ready %.2f s",
		h.Retired.Sub(crash).Seconds(), h.HandedOn.Sub(crash).Seconds(), h.Carried.Sub(crash).Seconds(), served.Sub(crash).Seconds())
	at, ok, err := p.ReadClock(ctx)
	switch {
	case err != nil:
		t.Fatal(err)
	case !ok:
		t.Errorf("the new primary holds no retained clock; the primary acknowledged one up to %.2f s before the crash", crash.Sub(last).Seconds())
	case at.After(last):
		t.Errorf("the new primary's retained clock %v is newer than the last the primary acknowledged (%v)", at, last)
	default:
		t.Logf("the new primary's retained set is %.2f s older than the crash (the clock's last acknowledged value %.2f s)", crash.Sub(at).Seconds(), crash.Sub(last).Seconds())
	}
}
