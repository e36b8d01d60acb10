package nodeloss_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/liveness"
)

// cpuThrottling is nodeloss.CPUThrottling for a test.
func cpuThrottling(t *testing.T, n *kubenode.Node) (periods, throttled int64) {
	t.Helper()
	periods, throttled, err := nodeloss.CPUThrottling(n)
	if err != nil {
		t.Fatal(err)
	}
	return periods, throttled
}

// failoverBound bounds a lost node → the standby primary in the test:
// generous (the rules alone take 2.5–3 s; the bench measures the figure).
const failoverBound = 30 * time.Second

// clientBound bounds a power cut → a directly connected client of the lost
// primary served again by the new primary: generous, as failoverBound (the
// bench measures the figure: ≈ 3 s, and a reconnect that races kube-proxy's
// removal of the dead endpoint waits out a 2 s connect timeout), and far
// below the ≈ 40 s paho takes alone to notice a broker that never answers.
const clientBound = 15 * time.Second

// TestHotStandbyTakesOverFromALostNodeAndOnePrimaryRemains runs the agent
// DaemonSet (manifests/base, --liveness on) on three real nodes, a hot pair
// of edge brokers (primary on node 0, standby on node 1) bridging RDS and
// OBU, which run on node 2, with the E2E probe between them. A power cut of
// the primary's node: the standby's agent declares it lost and fails the
// primary over (scaled to 0, roles exchanged, the new primary Ready); after
// the restore the old primary's pod is gone, it is back as the hot standby,
// and one primary remains. Then a partition of the new primary's node: its
// agent fences first (its broker paused by its sidecar, and held paused),
// the standby's agent (now on node 0) fails it over,
// and after the heal one primary remains again. No probe message is lost
// and the standby is Ready throughout: its bridges never depended on the
// primary. Then the primary's node held to 0.7 CPU and saturated for 30 s,
// the API server stopped for 5 s, and the primary's kubelet killed for
// 10 s: nothing lost, nobody fenced, no failover.
// startPair starts three lab nodes and a Pair on them, stopped at cleanup;
// on a failure the agents' lines (but signals and transitions) are logged.
func startPair(ctx context.Context, t *testing.T) (*controlplane.ControlPlane, *kubenode.Cluster, *nodeloss.Pair) {
	t.Helper()
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp, cl := kubenodetest.StartCluster(t, 3, kubenodetest.Options{})
	p, err := nodeloss.StartPair(ctx, nodeloss.PairConfig{ControlPlane: cp, Cluster: cl, Repo: repo, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			for n, ag := range p.Agents {
				for _, l := range ag.Lines() {
					if l.Msg != "signal" && l.Msg != "transition" {
						t.Logf("agent on %s: %+v", n, l)
					}
				}
			}
		}
	})
	return cp, cl, p
}

func TestHotStandbyTakesOverFromALostNodeAndOnePrimaryRemains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cp, cl, p := startPair(ctx, t)
	nA, nB := cl.Nodes[0], cl.Nodes[1]
	a, b := testbed.PrimaryName, testbed.StandbyName
	check := func(fault string, faultAt time.Time, f nodeloss.Failover, lostNode, guardNode string) {
		t.Helper()
		t.Logf("%s of %s: declared lost by %s's agent after %v, primary retired and roles exchanged after %v (seen after %v); "+
			"the probe's longest interval between fresh messages meanwhile %v, %d duplicates", fault, lostNode, guardNode,
			f.Lost.Sub(faultAt).Round(time.Millisecond), f.Retired.Sub(faultAt).Round(time.Millisecond), f.Seen.Sub(faultAt).Round(time.Millisecond),
			f.MaxGap.Round(time.Millisecond), f.Duplicates)
		if f.StandbyUnready != "" {
			t.Errorf("%s: the standby was not Ready while its primary's node was lost: %s", fault, f.StandbyUnready)
		}
		if f.LostMessages > 0 {
			t.Errorf("%s: %d probe messages lost: the hot standby's path should carry them all", fault, f.LostMessages)
		}
		if !f.Lost.Before(f.Retired) {
			t.Errorf("%s: retired at %v, before the node was declared lost at %v", fault, f.Retired, f.Lost)
		}
	}

	// A power cut of the primary's node, with the primary's clients
	// connected directly: one in a pod on node 2 through the Service's
	// ClusterIP, one in the LAN through node 2's NodePort.
	clients, err := p.StartClients(ctx, cl.Nodes[2], cl.LAN, []time.Duration{30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer clients.Stop()
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatal(err)
	}
	oldPod, err := p.PodOf(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if err := clients.OntoPrimary(ctx, oldPod); err != nil {
		t.Fatal(err)
	}
	marks := clients.Marks()
	cut, err := nA.PowerCut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.WaitFailover(ctx, a, b, oldPod, cut.At, nA.Name, nB.Name, failoverBound)
	if err != nil {
		t.Fatalf("power cut: %v", err)
	}
	check("power cut", cut.At, f, nA.Name, nB.Name)
	// paho alone would notice the dead broker ≈ 40 s after its last answer.
	newPod, err := p.PodOf(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, cc := range clients.Served(ctx, marks, cut.At, 30*time.Second, newPod) {
		t.Logf("power cut: client %s (%s) lost its connection after %.2f s, served again by the new primary after %.2f s", cc.Client, cc.Kind, cc.LostS, cc.ServedS)
		if cc.ServedS < 0 || cc.ServedS > clientBound.Seconds() {
			t.Errorf("power cut: client %s served again after %.2f s (-1: not within 30 s), want within %v", cc.Client, cc.ServedS, clientBound)
		}
	}
	if err := p.Restore(ctx, nA); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitOnePrimary(ctx, b, a, oldPod); err != nil {
		t.Fatalf("after the power cut: %v", err)
	}

	// A partition of the new primary's node (node 1); its standby is on node 0.
	if err := p.WaitPair(ctx, b, a, nB.Name, nA.Name); err != nil {
		t.Fatal(err)
	}
	if oldPod, err = p.PodOf(ctx, b); err != nil {
		t.Fatal(err)
	}
	part := time.Now()
	if err := nB.Partition(ctx); err != nil {
		t.Fatal(err)
	}
	// The fence carried out: the old primary's broker on the partitioned
	// node is paused by its sidecar, told by its own agent, before the guard
	// takes over, and stays so while the partition lasts.
	if err := p.WaitBrokerPaused(ctx, oldPod, failoverBound); err != nil {
		t.Errorf("partition: %v", err)
	} else {
		t.Logf("partition → the old primary's broker on %s seen paused %v after the cut", nB.Name, time.Since(part).Round(time.Millisecond))
	}
	f, err = p.WaitFailover(ctx, b, a, oldPod, part, nB.Name, nA.Name, failoverBound)
	if err != nil {
		t.Fatalf("partition: %v", err)
	}
	check("partition", part, f, nB.Name, nA.Name)
	if paused, saw, err := p.BrokerPaused(ctx, oldPod); err != nil || !paused {
		t.Errorf("partition: after the failover the old primary's broker is not paused (%s, %v)", saw, err)
	}
	if err := p.Restore(ctx, nB); err != nil {
		t.Fatal(err)
	}
	fence, err := p.WaitLine(ctx, nB.Name, "fence", part, nB.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("partition → %s's agent fenced after %v, %v before its guard declared it lost", nB.Name,
		fence.Sub(part).Round(time.Millisecond), f.Lost.Sub(fence).Round(time.Millisecond))
	if !fence.Before(f.Lost) {
		t.Errorf("the partitioned node fenced at %v, its guard declared it lost at %v: the fence must come first", fence, f.Lost)
	}
	healed := time.Now()
	if err := p.WaitOnePrimary(ctx, a, b, oldPod); err != nil {
		t.Fatalf("after the partition: %v", err)
	}
	t.Logf("healed → the paused old primary's pod gone and one primary %v after the heal was seen", time.Since(healed).Round(time.Millisecond))

	// A slow node is not a lost one: the primary's node (node 0 again) held
	// to 0.7 CPU and saturated by a busy pod for 12 Lost. (Not less: on
	// cgroup v1 a node's quota may not be below a pod's, and the broker's
	// pod may use 0.6.)
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatal(err)
	}
	busy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "busy", Namespace: nodeloss.BrokerNamespace},
		Spec: corev1.PodSpec{
			NodeName: nA.Name, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "busy", Image: images.LabRef, ImagePullPolicy: corev1.PullNever, Args: []string{"stress", "--profile", "10m:cpu=2"}}},
		},
	}
	if _, err := cp.Client().CoreV1().Pods(nodeloss.BrokerNamespace).Create(ctx, busy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nA.Starve(ctx, 0.7); err != nil {
		t.Fatal(err)
	}
	slow := time.Now()
	periods0, throttled0 := cpuThrottling(t, nA)
	time.Sleep(12 * liveness.DefaultTiming.Lost) // a window in which nothing may happen
	used := nodeUsage(t, nA, 2*time.Second)
	periods, throttled := cpuThrottling(t, nA)
	periods, throttled = periods-periods0, throttled-throttled0
	for n, ls := range p.ActedSince(slow) {
		t.Errorf("slow node: the agent on %s logged %+v", n, ls)
	}
	t.Logf("slow node: %s at %.2f of its 0.7 CPU, held at its quota in %d of %d periods, for %v: neither lost nor fenced, no failover",
		nA.Name, used, throttled, periods, time.Since(slow).Round(time.Second))
	// The premise: the node wanted more than its quota (what it got also
	// depends on the rest of this machine's load).
	if throttled*10 < periods {
		t.Errorf("the slow node was held at its quota in %d of %d periods only: not starved", throttled, periods)
	}
	if err := cp.Client().CoreV1().Pods(nodeloss.BrokerNamespace).Delete(ctx, busy.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Restore(ctx, nA); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatalf("after the slow spell: %v", err)
	}

	// The API server away for two Lost: every agent's view is stale, the
	// guards still answer their probes, so nothing is declared, nobody
	// fences, nothing fails over, then or after it is back.
	away := time.Now()
	cp.StopAPIServer()
	time.Sleep(2 * liveness.DefaultTiming.Lost) // the outage
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * liveness.DefaultTiming.Lost) // a window in which nothing may happen
	back := time.Now()
	for _, ag := range p.Agents {
		ag.Reconnect() // the streams broke with the API server
	}
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatalf("after the API server came back: %v", err)
	}
	for n, ls := range p.ActedSince(away) {
		for _, l := range ls {
			if l.Time.Before(back) {
				t.Errorf("API server away: the agent on %s logged %+v", n, l)
			} else {
				// Later than the outage and its window: the rule's
				// budgets on an overloaded machine, which the report
				// states; not what this phase checks.
				t.Logf("after the API server's outage and its window: the agent on %s logged %s at %v", n, l.Msg, l.Time)
			}
		}
	}
	t.Logf("API server away for %v: nothing declared, nobody fenced, no failover", 2*liveness.DefaultTiming.Lost)

	// The kubelet of the primary's node dead: its pods run on and serve,
	// its agent renews its Lease, so nothing is declared, nobody fences,
	// nothing fails over; the kubelet restarted, the pair is as it was.
	dead := time.Now()
	if err := nA.StopDaemon(ctx, kubenode.Kubelet, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * liveness.DefaultTiming.Lost) // a window in which nothing may happen
	for n, ls := range p.ActedSince(dead) {
		t.Errorf("kubelet dead: the agent on %s logged %+v", n, ls)
	}
	if err := p.Restore(ctx, nA); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatalf("after the kubelet's restart: %v", err)
	}
	t.Logf("kubelet of %s dead for %v: nothing declared, nobody fenced, no failover", nA.Name, 4*liveness.DefaultTiming.Lost)
}
