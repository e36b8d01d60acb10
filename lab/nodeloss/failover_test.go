package nodeloss_test

import (
	"context"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/testbed"
)

// failoverBound bounds a lost node → the standby primary in the test:
// generous (the rules alone take 2.5–3 s; the bench measures the figure).
const failoverBound = 30 * time.Second

// TestHotStandbyTakesOverFromALostNodeAndOnePrimaryRemains runs the agent
// DaemonSet (manifests/base, --liveness on) on three real nodes, a hot pair
// of edge brokers (primary on node 0, standby on node 1) bridging RDS and
// OBU, which run on node 2, with the E2E probe between them. A power cut of
// the primary's node: the standby's agent declares it lost and fails the
// primary over (scaled to 0, roles exchanged, the new primary Ready); after
// the restore the old primary's pod is gone, it is back as the hot standby,
// and one primary remains. Then a partition of the new primary's node: its
// agent fences first, the standby's agent (now on node 0) fails it over,
// and after the heal one primary remains again. No probe message is lost
// and the standby is Ready throughout: its bridges never depended on the
// primary.
func TestHotStandbyTakesOverFromALostNodeAndOnePrimaryRemains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
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

	// A power cut of the primary's node.
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatal(err)
	}
	oldPod, err := p.PodOf(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	cut, err := nA.PowerCut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.WaitFailover(ctx, a, b, oldPod, cut.At, nA.Name, nB.Name, failoverBound)
	if err != nil {
		t.Fatalf("power cut: %v", err)
	}
	check("power cut", cut.At, f, nA.Name, nB.Name)
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
	f, err = p.WaitFailover(ctx, b, a, oldPod, part, nB.Name, nA.Name, failoverBound)
	if err != nil {
		t.Fatalf("partition: %v", err)
	}
	check("partition", part, f, nB.Name, nA.Name)
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
	if err := p.WaitOnePrimary(ctx, a, b, oldPod); err != nil {
		t.Fatalf("after the partition: %v", err)
	}
}
