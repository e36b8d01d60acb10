package nodeloss_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/brokerstate/brokerstatetest"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/testbed"
)

// relayBound is how long the power cut waits for an agent to say it
// relayed the primary's snapshot to the standby's node: a relay on the
// LAN takes milliseconds, and the sidecar hands in a changed state every
// second; the cut comes after it even if no line says so (the state check
// then tells whether the snapshot came).
const relayBound = 10 * time.Second

// TestAStatefulPairAcrossNodesCarriesItsState runs the agent DaemonSet of
// manifests/base (--liveness, the state hub) on three real nodes and a
// stateful pair as inject --standby --state-dir writes it, with the
// primary's pod on node 0 and the standby's on node 1 (pinned by
// nodeSelector: testbed.StartStatePairAcross), the standby held out of its
// Services, the primary seeded by real clients with 100 retained messages,
// two MQTT 3.1.1 sessions and one MQTT 5 session, 5 QoS 1 messages queued
// for each. The state has to go from node 0's agent to node 1's:
//
//   - planned switchover: the paper's stress makes the primary anomalous,
//     its agent retires it, and its final state (written as its broker
//     stops) must reach the standby's pod, which serves only once its
//     broker runs on it (a StateCarried decision of kind final);
//   - power cut of node 0 after the primary's sidecar handed in a snapshot
//     of the whole plan: node 1's agent (the guard) declares the node lost
//     and fails over, and the new primary must run on that snapshot (a
//     StateCarried decision of kind snapshot). The plan is seeded before
//     the snapshot, so none of it is lost.
//
// Either way the new primary on node 1 must hold every retained message,
// every session (Session Present 1) and every queued message, none twice.
// The standby held none of it before (StartStatePair checks), so the check
// can fail. Each case logs its timings (from the retirement or the cut to
// the new primary's pod Ready).
func TestAStatefulPairAcrossNodesCarriesItsState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three real nodes")
	}
	brokerstatetest.RequireMosquitto(t)
	sub, err := brokerstate.MosquittoSub()
	if err != nil {
		t.Fatal(err)
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Minute)
	defer cancel()
	cp, cl := kubenodetest.StartCluster(t, 3, kubenodetest.Options{})
	rig, err := nodeloss.StartStateRig(ctx, cp, cl, repo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rig.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			for n, ag := range rig.Agents {
				for _, l := range ag.Lines() {
					if l.Msg != "signal" && l.Msg != "transition" {
						t.Logf("agent on %s: %s", n, l.Raw)
					}
				}
			}
		}
	})
	primaryNode, standbyNode := rig.Nodes[0], rig.Nodes[1]
	plan := brokerstate.Plan{Retained: 100, Sessions: 2, V5Sessions: 1, Queued: 5, MosquittoSub: sub}
	queued := len(plan.SessionIDs()) * plan.Queued

	for _, tc := range []struct {
		name, ns string
		powerCut bool
		kind     string // of the state the new primary must run on
	}{
		{name: "planned switchover", ns: "state-switchover", kind: "final"},
		{name: "power cut of the primary's node", ns: "state-power-cut", powerCut: true, kind: "snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cctx, ccancel := context.WithTimeout(ctx, 6*time.Minute)
			defer ccancel()
			p, err := rig.StartStatePair(cctx, tc.ns, "broker", plan)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := p.Close(); err != nil {
					t.Errorf("removing the pair: %v", err)
				}
			})
			t.Logf("the primary %s on %s serves, the standby %s on %s is held out of its Services; the primary seeded",
				p.Primary.Name, p.Primary.Spec.NodeName, p.Standby.Name, p.Standby.Spec.NodeName)
			if p.Primary.Spec.NodeName != primaryNode.Name || p.Standby.Spec.NodeName != standbyNode.Name {
				t.Fatalf("the pair runs on %s and %s, want %s and %s", p.Primary.Spec.NodeName, p.Standby.Spec.NodeName, primaryNode.Name, standbyNode.Name)
			}
			// Watched from before the event: the moment the new primary's
			// pod turns Ready, however late the agents' lines come in.
			type readyAt struct {
				at  time.Time
				err error
			}
			served := make(chan readyAt, 1)
			go func() {
				at, err := p.AwaitServing(cctx)
				served <- readyAt{at, err}
			}()

			var event time.Time
			if tc.powerCut {
				if err := p.WaitGuarded(cctx); err != nil {
					t.Fatal(err)
				}
				snap, err := p.AwaitSnapshotLine(cctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("the primary's snapshot of the whole plan taken in: %s", snap.Raw)
				if l, by, ok := p.AwaitRelayed(cctx, snap, relayBound); ok {
					t.Logf("relayed %v after it was taken in, by the agent on %s: %s", l.Time.Sub(snap.Time).Round(time.Millisecond), by, l.Raw)
				} else {
					t.Logf("no agent said within %v that it relayed that snapshot; cutting the power anyway", relayBound)
				}
				cut, err := primaryNode.PowerCut(cctx)
				// Registered after Close: runs before it, so that the
				// pods on the node can go.
				t.Cleanup(func() {
					rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer rcancel()
					if err := primaryNode.Restore(rctx); err != nil {
						t.Errorf("restoring %s: %v", primaryNode.Name, err)
						return
					}
					if err := primaryNode.WaitReady(rctx); err != nil {
						t.Errorf("restoring %s: %v", primaryNode.Name, err)
					}
					rig.Agents[primaryNode.Name].Reconnect()
				})
				if err != nil {
					t.Fatal(err)
				}
				event = cut.At
			} else {
				stop, err := p.Stress(cctx)
				if err != nil {
					t.Fatal(err)
				}
				defer stop()
				event = time.Now()
			}

			// Bounded well past the agent's StateWait (10 s), after which
			// it must have carried the state or said it gave it up.
			hctx, hcancel := context.WithTimeout(cctx, 2*time.Minute)
			h, err := p.Handover(hctx)
			hcancel()
			if err != nil {
				t.Fatal(err)
			}
			ready := <-served
			if ready.err != nil {
				t.Fatal(ready.err)
			}
			kctx, kcancel := context.WithTimeout(cctx, 2*time.Minute)
			res, err := p.Check(kctx)
			kcancel()
			if err != nil {
				t.Fatalf("checking the new primary: %v", err)
			}
			t.Logf("the new primary %s on %s holds: %v", p.Standby.Name, standbyNode.Name, res)
			if evs, err := p.StateEvents(cctx); err != nil {
				t.Logf("the Events: %v", err)
			} else {
				for _, e := range evs {
					t.Logf("Event %s", e)
				}
			}
			if h.NotCarried != "" {
				t.Logf("the agent on %s: %s", h.NotCarriedBy, h.NotCarried)
			}
			if h.Line != "" {
				t.Logf("the agent on %s: %s", h.CarriedBy, h.Line)
			}

			// Timings, for the README.
			if tc.powerCut {
				by, lost, err := p.AwaitLine(cctx, "guarded node lost", primaryNode.Name, event, 30*time.Second)
				if err != nil {
					t.Error(err)
				} else if by != standbyNode.Name {
					t.Errorf("%s was declared lost by the agent on %s, want the guard's on %s", primaryNode.Name, by, standbyNode.Name)
				}
				if h.RetiredBy != standbyNode.Name {
					t.Errorf("the primary was retired by the agent on %s, want the guard's on %s", h.RetiredBy, standbyNode.Name)
				}
				t.Logf("power cut of %s: declared lost %.2f s after it, the primary retired %.2f s, the new primary on the state %s, its pod Ready %.2f s",
					primaryNode.Name, lost.Sub(event).Seconds(), h.Retired.Sub(event).Seconds(), since(h.Carried, event), ready.at.Sub(event).Seconds())
			} else {
				t.Logf("planned switchover: retired by the agent on %s %.2f s after the stress began; after the retirement: the new primary on the state %s, its pod Ready %.2f s",
					h.RetiredBy, h.Retired.Sub(event).Seconds(), since(h.Carried, h.Retired), ready.at.Sub(h.Retired).Seconds())
			}

			// The state.
			switch {
			case h.NotCarried != "":
				t.Errorf("the state was not carried across nodes: the agent on %s said StateNotCarried", h.NotCarriedBy)
			case !strings.Contains(h.Line, `"kind":"`+tc.kind+`"`):
				t.Errorf("the new primary runs on a state that is not the %s one: %s", tc.kind, h.Line)
			}
			if !res.Lossless() || res.Duplicates != 0 || res.RetainedFound != plan.Retained || res.QueuedFound != queued {
				t.Errorf("the new primary on %s: %v; want all %d retained, no session lost (Session Present 1), all %d queued, none twice",
					standbyNode.Name, res, plan.Retained, queued)
			}
		})
	}
}

// since says how long after from at came, or that it did not.
func since(at, from time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(from).Round(10 * time.Millisecond).String()
}
