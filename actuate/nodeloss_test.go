package actuate

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// Fast tests of the actuator's part of node loss on fakeCluster: who guards
// whom, and the lost node → failover decision, with the API server there or
// not. The real-node test (lab/nodeloss) runs the agents on three real
// nodes with real faults.

// hotFast is a hot pair's policy with gates that need no waiting.
var hotFast = map[string]string{contract.AnnRedundancy: string(contract.Hot), contract.AnnHold: "0s", contract.AnnCooldown: "0s"}

// addHotPair adds a hot pair: the primary with its pod (addPair) and the
// standby running too, with its own pod (ns/<standby>-rs-0), naming its
// primary; standbyAnn are more annotations of the standby.
func (f *fakeCluster) addHotPair(ns, primary, standby string, standbyAnn map[string]string) (primaryPod, standbyPod string) {
	primaryPod = f.addPair(ns, primary, standby, hotFast)
	f.Lock()
	defer f.Unlock()
	ann := maps.Clone(standbyAnn)
	if ann == nil {
		ann = map[string]string{}
	}
	ann[contract.AnnPrimary] = primary
	f.Deps[key(ns, standby)] = deployment(ns, standby, 1, ann)
	rs := standby + "-rs"
	f.ReplicaSets[key(ns, rs)] = f.rssOwnedBy(ns, rs, "Deployment", standby)
	standbyPod = rs + "-0"
	f.Pods[key(ns, standbyPod)] = f.podOwnedBy(ns, standbyPod, rs)
	return primaryPod, standbyPod
}

// guardRig is an Actuator of node self on f, with what it reported through
// OnGuards.
type guardRig struct {
	*rig
	act    *Actuator
	mu     sync.Mutex
	guards []Guards
}

func startGuard(t *testing.T, f *fakeCluster, self string) *guardRig {
	t.Helper()
	return startGuardOn(t, f, self, nil, false)
}

// startGuardOn is startGuard with the actuator on cluster, a view of f (nil:
// f itself), with Config.ResumeOnStart as resume.
func startGuardOn(t *testing.T, f *fakeCluster, self string, cluster Cluster, resume bool) *guardRig {
	t.Helper()
	g := &guardRig{}
	cfg := Config{Node: self, Instance: self, Cluster: cluster, ResumeOnStart: resume, OnGuards: func(gs Guards) {
		g.mu.Lock()
		g.guards = append(g.guards, gs)
		g.mu.Unlock()
		f.Lock()
		f.ChangedLocked(nil) // wake await
		f.Unlock()
	}}
	g.rig = start(t, f, "", cfg)
	g.act = g.rig.act
	return g
}

// latest returns the Guards last reported (zero if none).
func (g *guardRig) latest() Guards {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.guards) == 0 {
		return Guards{}
	}
	return g.guards[len(g.guards)-1]
}

func TestPairNodesAreRecordedOnTheStandbyAndEachAgentLearnsWhomItGuards(t *testing.T) {
	for _, tc := range []struct {
		name      string
		self      string
		signaller string // "primary" or "standby": whose pod signals here
		have      map[string]string
		wantAnn   string // the annotation this agent writes
		want      Guards
	}{
		{"the primary's agent records its node and is guarded by the standby's", "node-a", "primary",
			map[string]string{contract.AnnStandbyNode: "node-b"}, contract.AnnPrimaryNode, Guards{GuardedBy: []string{"node-b"}}},
		{"the standby's agent records its node and guards the primary's", "node-b", "standby",
			map[string]string{contract.AnnPrimaryNode: "node-a"}, contract.AnnStandbyNode, Guards{Guard: []string{"node-a"}}},
		{"both pods on one node: nobody to guard", "node-a", "standby",
			map[string]string{contract.AnnPrimaryNode: "node-a"}, contract.AnnStandbyNode, Guards{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			pp, sp := f.addHotPair(ns, "primary", "standby", tc.have)
			g := startGuard(t, f, tc.self)
			pod := pp
			if tc.signaller == "standby" {
				pod = sp
			}
			g.send(podsignal.Healthy, pod)
			f.await(t, "own node recorded on the standby", func() bool { return f.depLocked(ns, "standby").Annotations[tc.wantAnn] == tc.self })
			f.await(t, "guards reported", func() bool { return g.latest().equal(tc.want) })
			f.Lock()
			defer f.Unlock()
			if n := *f.depLocked(ns, "primary").Spec.Replicas; n != 1 {
				t.Errorf("primary scaled to %d without any loss", n)
			}
		})
	}
}

// standbysAgent is a hot pair (its primary's node recorded as node-a) and
// the agent of node-b, where the standby's pod runs: it has heard the pod
// and recorded its node.
func standbysAgent(t *testing.T) (*fakeCluster, *guardRig) {
	t.Helper()
	f := newFakeCluster()
	_, sp := f.addHotPair(ns, "primary", "standby", map[string]string{contract.AnnPrimaryNode: "node-a"})
	g := startGuard(t, f, "node-b")
	g.send(podsignal.Healthy, sp)
	f.await(t, "the standby's node recorded", func() bool { return f.depLocked(ns, "standby").Annotations[contract.AnnStandbyNode] == "node-b" })
	return f, g
}

// exchangeWrites are the two annotation patches of a role exchange of
// addHotPair's pair, as retire writes them: the new primary ("standby"),
// then the old one ("primary").
func exchangeWrites() (newPrimary, oldPrimary map[string]*string) {
	newPrimary = map[string]*string{contract.AnnStandby: ptr.To("primary"), contract.AnnRole: ptr.To("primary"), contract.AnnPrimary: nil,
		contract.AnnPrimaryNode: nil, contract.AnnStandbyNode: nil}
	for k, v := range hotFast {
		newPrimary[k] = ptr.To(v)
	}
	oldPrimary = map[string]*string{contract.AnnRole: ptr.To("standby"), contract.AnnPrimary: ptr.To("standby"), contract.AnnStandby: nil,
		contract.AnnRecord: nil, contract.AnnRedundancy: nil, contract.AnnHold: nil, contract.AnnCooldown: nil}
	return newPrimary, oldPrimary
}

// TestTheStandbysAgentLearnsAtOnceThatAnotherAgentMadeItThePrimary: the
// primary's own agent fails it over (a crash, an anomaly: decided on the
// primary's node) and exchanges the roles. The agent of the standby's node
// hears nothing from its pod, healthy before and after, yet must learn at
// once that it holds the primary now: it records its node on the new
// standby, which the guard of the pair needs. Before, it learned it only
// from a signal after unmanagedTTL, and a healthy pod sends none.
func TestTheStandbysAgentLearnsAtOnceThatAnotherAgentMadeItThePrimary(t *testing.T) {
	f, g := standbysAgent(t)
	f.await(t, "guarding the primary's node", func() bool { return g.latest().equal(Guards{Guard: []string{"node-a"}}) })

	// The roles exchanged by the agent of node-a, as retire writes them.
	newPrimary, oldPrimary := exchangeWrites()
	for _, p := range []struct {
		name string
		ann  map[string]*string
	}{{"standby", newPrimary}, {"primary", oldPrimary}} {
		if err := f.PatchAnnotations(context.Background(), ns, p.name, p.ann); err != nil {
			t.Fatal(err)
		}
	}
	f.await(t, "its node recorded on the new standby as the primary's, with no signal", func() bool {
		return f.depLocked(ns, "primary").Annotations[contract.AnnPrimaryNode] == "node-b"
	})
}

// TestTheStandbysAgentWaitsForBothWritesOfAnotherAgentsRoleExchange: read
// between a role exchange's two writes (the new primary first), the pair
// looks like an exchange left unfinished, and loading it resumes the
// exchange beside the agent still doing it, clearing the node annotations
// again. The standby's agent waits for the second write, does not touch the
// old primary meanwhile, and then records its node.
func TestTheStandbysAgentWaitsForBothWritesOfAnotherAgentsRoleExchange(t *testing.T) {
	f, g := standbysAgent(t)
	ctx := context.Background()

	// The exchanging agent of node-a: the primary Retiring and scaled to
	// 0, then the new primary written; the old one not yet.
	rec, err := json.Marshal(Record{Phase: PhaseRetiring, Standby: "standby"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.PatchAnnotations(ctx, ns, "primary", map[string]*string{contract.AnnRecord: ptr.To(string(rec))}); err != nil {
		t.Fatal(err)
	}
	if err := f.Scale(ctx, ns, "primary", 0); err != nil {
		t.Fatal(err)
	}
	newPrimary, oldPrimary := exchangeWrites()
	f.Lock()
	before := len(f.Writes)
	f.Unlock()
	if err := f.PatchAnnotations(ctx, ns, "standby", newPrimary); err != nil {
		t.Fatal(err)
	}
	// The agent's wait for the second write is a watch of the old primary
	// (the first it holds on it).
	f.await(t, "the old primary watched", func() bool { return f.WatchingLocked(ns, "primary") > 0 })
	f.Lock()
	between := slices.Clone(f.Writes[before:])
	f.Unlock()
	if len(between) != 1 {
		t.Errorf("writes between the exchange's two: %q, want only the test's own", between)
	}

	if err := f.PatchAnnotations(ctx, ns, "primary", oldPrimary); err != nil {
		t.Fatal(err)
	}
	f.await(t, "its node recorded on the new standby", func() bool {
		return f.depLocked(ns, "primary").Annotations[contract.AnnPrimaryNode] == "node-b"
	})
	g.logs.mu.Lock()
	resumed := slices.ContainsFunc(g.logs.lines, func(l map[string]any) bool { return str(l["msg"]) == "resuming an unfinished role exchange" })
	g.logs.mu.Unlock()
	if resumed {
		g.logs.dump(t)
		t.Errorf("the exchange was resumed beside the agent doing it")
	}
}

// TestANodeAnnotationClearedRightAfterItsWriteIsWrittenAgainWithoutAnInput:
// an agent writes each node annotation at most once per nodeAnnEvery. One
// cleared within that bound (a role exchange right after the write) is
// written again when the bound has passed, though no input comes: a
// healthy pod sends none, and the guard of the pair needs the annotation.
func TestANodeAnnotationClearedRightAfterItsWriteIsWrittenAgainWithoutAnInput(t *testing.T) {
	f, _ := standbysAgent(t)
	if err := f.PatchAnnotations(context.Background(), ns, "standby", map[string]*string{contract.AnnStandbyNode: nil}); err != nil {
		t.Fatal(err)
	}
	f.awaitWithin(t, "the cleared annotation written again", nodeAnnEvery+5*time.Second, func() bool {
		return f.depLocked(ns, "standby").Annotations[contract.AnnStandbyNode] == "node-b"
	})
}

func TestLostNodeFailsItsHotPrimaryOverOnlyOnFreshData(t *testing.T) {
	unreachable := errors.New("dial tcp 10.0.0.1:6443: i/o timeout")
	for _, tc := range []struct {
		name    string
		lost    string // the node declared lost
		retired bool   // the primary is at 0 replicas already
		apiDown bool   // the fresh read fails, then the API server comes back
		want    bool   // a failover: primary at 0, roles exchanged
	}{
		{"the primary's node lost: failover to the hot standby", "node-a", false, false, true},
		{"another node lost: nothing", "node-c", false, false, false},
		{"the primary retired already: nothing more", "node-a", true, false, false},
		{"the API server unreachable: no action on what may be stale, failover once it is back", "node-a", false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			_, sp := f.addHotPair(ns, "primary", "standby", map[string]string{contract.AnnPrimaryNode: "node-a"})
			if tc.retired {
				f.Lock()
				d := f.depLocked(ns, "primary")
				*d.Spec.Replicas, d.Status.ReadyReplicas, d.Status.Replicas = 0, 0, 0
				f.Unlock()
			}
			g := startGuard(t, f, "node-b")
			g.send(podsignal.Healthy, sp)
			f.await(t, "guarding node-a", func() bool { return slices.Equal(g.latest().Guard, []string{"node-a"}) })
			f.await(t, "standby Ready seen", func() bool {
				return g.record("primary").Phase == PhaseIdle && f.depLocked(ns, "standby").Annotations[contract.AnnStandbyNode] == "node-b"
			})
			if tc.apiDown {
				f.Lock()
				f.Fail["get"] = unreachable
				f.Unlock()
			}
			g.act.NodeLost(context.Background(), tc.lost, g.act.now())
			if tc.apiDown {
				// Nothing happens while the read fails: the record stays
				// Idle and the primary at 1 (a full retry period of it).
				g.act.NodeBack(context.Background(), "node-x", g.act.now()) // a barrier: Run took NodeLost
				f.Lock()
				writes := slices.Clone(f.Writes)
				ph, n := g.record("primary").Phase, *f.depLocked(ns, "primary").Spec.Replicas
				delete(f.Fail, "get")
				f.Unlock()
				if ph != PhaseIdle || n != 1 {
					t.Fatalf("acted while the API server was unreachable: phase %s, primary at %d; writes %q", ph, n, writes)
				}
			}
			if tc.want {
				// The retired primary comes back as the hot standby at once
				// here (the fake has no pod to wait for): its scale to 0 is
				// read from the writes.
				f.await(t, "primary retired, roles exchanged", func() bool {
					return slices.Contains(f.Writes, "scale edge/primary 0") && f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary" &&
						f.depLocked(ns, "primary").Annotations[contract.AnnRole] == "standby"
				})
				f.await(t, "Failover Event", func() bool { return slices.Contains(f.ReasonsLocked(), "Failover") })
				f.Lock()
				defer f.Unlock()
				if !before(f.Writes, "record edge/primary Failover", "scale edge/primary 0") && !before(f.Writes, "record edge/primary Retiring", "scale edge/primary 0") {
					t.Errorf("primary scaled to 0 before its record: %q", f.Writes)
				}
				if n := *f.depLocked(ns, "standby").Spec.Replicas; n != 1 {
					t.Errorf("the hot standby, now primary, at %d replicas", n)
				}
				for _, k := range []string{contract.AnnPrimaryNode, contract.AnnStandbyNode} {
					if v, ok := f.depLocked(ns, "standby").Annotations[k]; ok {
						t.Errorf("the new primary still carries %s=%s from its standby days", k, v)
					}
				}
				return
			}
			g.act.NodeBack(context.Background(), "node-x", g.act.now()) // a barrier: Run took NodeLost
			f.Lock()
			defer f.Unlock()
			for _, w := range f.Writes {
				if w == "scale edge/primary 0" || w == "record edge/primary Failover" {
					t.Errorf("acted: %q", f.Writes)
				}
			}
		})
	}
}

// TestAnOldPodsLastSignalsKeepTheNewPodOfItsDeploymentHere: after a power
// cut and its restore, a Deployment's old pod (thawed, about to be deleted)
// and its replacement signal to the same agent. The lab's node-loss test
// saw the old pod's last healthy signal make it the current pod again and
// its stop then take the Deployment off the node while the new pod ran
// there, so the pair lost its guard, and a partition right after was not
// failed over.
func TestAnOldPodsLastSignalsKeepTheNewPodOfItsDeploymentHere(t *testing.T) {
	dep := podKey{"mqtt", "edge-broker-a"}
	for _, tt := range []struct {
		name  string
		steps []struct {
			pod string
			st  podsignal.State
		}
		want    string // the current pod; "" none
		newPods int    // signals that reported a pod new here
	}{
		{"old, new, the old's last signals, its stop", []struct {
			pod string
			st  podsignal.State
		}{{"old", podsignal.Healthy}, {"new", podsignal.Starting}, {"old", podsignal.Healthy}, {"new", podsignal.Healthy}, {"old", podsignal.Stopping}, {"old", podsignal.Gone}}, "new", 2},
		{"the new pod's stop leaves the old one current", []struct {
			pod string
			st  podsignal.State
		}{{"old", podsignal.Healthy}, {"new", podsignal.Healthy}, {"new", podsignal.Gone}}, "old", 2},
		{"both gone", []struct {
			pod string
			st  podsignal.State
		}{{"old", podsignal.Healthy}, {"new", podsignal.Healthy}, {"new", podsignal.Gone}, {"old", podsignal.Stopping}}, "", 2},
		{"a stopped pod that signals again is new here", []struct {
			pod string
			st  podsignal.State
		}{{"p", podsignal.Healthy}, {"p", podsignal.Stopping}, {"p", podsignal.Starting}}, "p", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newNodeLoss("node-1", nil)
			fresh := 0
			for _, s := range tt.steps {
				if n.signalled(dep, s.pod, s.st) {
					fresh++
				}
			}
			got, ok := n.pod(dep)
			if got != tt.want || ok != (tt.want != "") || fresh != tt.newPods {
				t.Errorf("current pod %q (%v), %d new; want %q, %d", got, ok, fresh, tt.want, tt.newPods)
			}
		})
	}
}

// TestALossHoldsOnlyWhileItsNodeIsGuarded: liveness says a node is lost
// once, and only of a node it was given to guard; it stops watching a node
// dropped from the guards, so no NodeBack comes for it. A loss is
// therefore acted on only while its node is guarded since: a loss of a
// node not guarded, or guarded once and dropped since, must not fail over
// a primary guarded there later (stale, it did so back and forth on the
// lab's three nodes), while a primary newly guarded on a node lost and
// guarded all along is failed over (the loss comes once).
func TestALossHoldsOnlyWhileItsNodeIsGuarded(t *testing.T) {
	unreachable := errors.New("dial tcp 10.0.0.1:6443: i/o timeout")
	barrier := func(g *guardRig) { g.act.NodeBack(context.Background(), "node-x", g.act.now()) } // Run took what came before
	guarding := func(g *guardRig, nodes ...string) func() bool {
		return func() bool { return slices.Equal(g.latest().Guard, nodes) }
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, f *fakeCluster, g *guardRig, sp string)
		want string // the write of a failover that must come, "" for none
	}{
		{"a loss said before its node was guarded: ignored", func(t *testing.T, f *fakeCluster, g *guardRig, sp string) {
			g.act.NodeLost(context.Background(), "node-a", g.act.now())
			g.send(podsignal.Healthy, sp)
			f.await(t, "guarding node-a", guarding(g, "node-a"))
		}, ""},
		{"a loss whose node was dropped from the guards since: forgotten", func(t *testing.T, f *fakeCluster, g *guardRig, sp string) {
			g.send(podsignal.Healthy, sp)
			f.await(t, "guarding node-a", guarding(g, "node-a"))
			f.Lock()
			f.Fail["get"] = unreachable // the failover's fresh read fails: the loss stays pending
			f.Unlock()
			g.act.NodeLost(context.Background(), "node-a", g.act.now())
			g.send(podsignal.Gone, sp)
			f.await(t, "node-a no longer guarded", guarding(g))
			f.Lock()
			delete(f.Fail, "get")
			f.Unlock()
			g.send(podsignal.Healthy, sp)
			f.await(t, "guarding node-a again", guarding(g, "node-a"))
		}, ""},
		{"a primary newly guarded on a node lost and guarded since: failed over", func(t *testing.T, f *fakeCluster, g *guardRig, sp string) {
			// The first pair keeps node-a guarded; its primary is
			// retired already, so the loss retires nothing of it.
			_, sp1 := f.addHotPair(ns, "primary1", "standby1", map[string]string{contract.AnnPrimaryNode: "node-a"})
			f.Lock()
			d := f.depLocked(ns, "primary1")
			*d.Spec.Replicas, d.Status.ReadyReplicas, d.Status.Replicas = 0, 0, 0
			f.Unlock()
			g.send(podsignal.Healthy, sp1)
			g.send(podsignal.Healthy, sp)
			f.await(t, "guarding node-a", guarding(g, "node-a"))
			g.act.NodeLost(context.Background(), "node-a", g.act.now())
			barrier(g)
			f.Lock()
			d = f.depLocked(ns, "standby")
			d.Annotations[contract.AnnPrimaryNode] = "node-a" // the second pair's primary's agent, late
			f.ChangedLocked(d)
			f.Unlock()
		}, "scale edge/primary 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			ann := map[string]string{contract.AnnPrimaryNode: "node-a"}
			if tc.want != "" {
				ann = nil // learnt late, in run
			}
			_, sp := f.addHotPair(ns, "primary", "standby", ann)
			g := startGuard(t, f, "node-b")
			tc.run(t, f, g, sp)
			if tc.want != "" {
				f.await(t, "failed over", func() bool { return slices.Contains(f.Writes, tc.want) })
				return
			}
			barrier(g)
			f.Lock()
			defer f.Unlock()
			for _, w := range f.Writes {
				if strings.HasPrefix(w, "scale edge/primary") || strings.HasPrefix(w, "record edge/primary Failover") {
					t.Errorf("acted on a stale loss: %q", f.Writes)
				}
			}
		})
	}
}
