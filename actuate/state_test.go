package actuate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
	"github.com/amf-edge/amf/statehub"
)

// podTokens is a fake of the agent's TokenReview: each pod's name is its token.
type podTokens struct{}

func (podTokens) Authenticate(_ context.Context, tok string) (podsignal.PodID, error) {
	if tok == "" {
		return podsignal.PodID{}, errors.New("no token")
	}
	return podsignal.PodID{Namespace: ns, Pod: tok}, nil
}

// finalState is the smallest whole Mosquitto persistence file written as a
// broker stopped: format 6 and a configuration chunk with its shutdown flag
// set (package mosquittodb reads it; the sidecar's tests use real ones).
func finalState() []byte {
	b := []byte{0x00, 0xB5, 0x00, 'm', 'o', 's', 'q', 'u', 'i', 't', 't', 'o', ' ', 'd', 'b'}
	b = binary.BigEndian.AppendUint32(b, 0) // CRC, written as 0
	b = binary.BigEndian.AppendUint32(b, 6)
	cfg := make([]byte, 16)
	cfg[8], cfg[9] = 1, 8 // shutdown, dbid_size
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, uint32(len(cfg)))
	return append(b, cfg...)
}

// statefulPair adds a hot pair as inject --standby --state-dir writes it:
// both templates name the state folder, each Deployment runs one pod of it
// that declares the readiness gate; the standby's pod is not Ready (its
// gate is held), so its Deployment has no Ready replica.
func statefulPair(f *fakeCluster, ann map[string]string) (primaryPod, standbyPod string) {
	ann = maps.Clone(ann)
	ann[contract.AnnRedundancy] = string(contract.Hot)
	primaryPod = f.addPair(ns, "primary", "standby", ann)
	standbyPod = f.addPod(ns, "standby")
	f.Lock()
	defer f.Unlock()
	for _, d := range []string{"primary", "standby"} {
		f.Deps[key(ns, d)].Spec.Template.Annotations = map[string]string{contract.AnnStateDir: "/mosquitto/data"}
	}
	sb := f.Deps[key(ns, "standby")]
	sb.Spec.Replicas = new(int32)
	*sb.Spec.Replicas = 1
	sb.Status.Replicas, sb.Status.ReadyReplicas = 1, 0
	for _, p := range []string{primaryPod, standbyPod} {
		f.Pods[key(ns, p)].Annotations = map[string]string{contract.AnnStateDir: "/mosquitto/data"}
	}
	return primaryPod, standbyPod
}

// switchOver confirms an anomaly of the primary once its standby is seen
// ready: three anomalous samples decide, one more with the Gate in Confirm
// retires (fast gates).
func (r *rig) switchOver() {
	r.t.Helper()
	for range 3 {
		r.send(podsignal.Anomalous)
	}
	r.f.await(r.t, "the switchover decided with the standby ready", func() bool { return r.record("primary").Phase == PhaseConfirm })
	r.send(podsignal.Anomalous)
}

// sendMsg delivers one observation of pod with message m (its state is m's).
func (r *rig) sendMsg(pod string, m podsignal.Message) {
	prev := r.last[pod]
	r.last[pod] = m.State
	r.in <- podsignal.Observation{PodID: podsignal.PodID{Namespace: ns, Pod: pod}, State: m.State, Previous: prev, Transition: m.State != prev,
		Source: podsignal.SourcePublish, Message: &m, Received: time.Now()}
}

// gate is the pod's amf.io/healthy condition (status and reason), called
// with f.mu held.
func (f *fakeCluster) gateLocked(pod string) (corev1.ConditionStatus, string) {
	for _, c := range f.Pods[key(ns, pod)].Status.Conditions {
		if c.Type == contract.ConditionHealthy {
			return c.Status, c.Reason
		}
	}
	return "", ""
}

func newStateHub(t *testing.T) (*statehub.Hub, *httptest.Server) {
	t.Helper()
	hub, err := statehub.New(statehub.Config{Authenticator: podTokens{}, Wait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hub.Handler())
	t.Cleanup(srv.Close)
	return hub, srv
}

// statefulRig is an actuator with a hub on a stateful pair whose primary
// serves and whose standby, healthy, is held out of its Services and named
// ready on its Deployment.
type statefulRig struct {
	*rig
	pp, sp string // the primary's and the standby's pods
	hub    *statehub.Hub
	srv    *httptest.Server
}

func startStateful(t *testing.T, wait time.Duration) *statefulRig {
	t.Helper()
	f := newFakeCluster()
	pp, sp := statefulPair(f, fast)
	hub, srv := newStateHub(t)
	r := &statefulRig{rig: start(t, f, pp, Config{States: hub, StateWait: wait}), pp: pp, sp: sp, hub: hub, srv: srv}
	r.send(podsignal.Healthy)
	f.await(t, "the primary's pod serves", func() bool { st, _ := f.gateLocked(pp); return st == corev1.ConditionTrue })
	r.sendMsg(sp, podsignal.Message{State: podsignal.Healthy})
	f.await(t, "the standby held out, and ready for the switchover", func() bool {
		st, reason := f.gateLocked(sp)
		return st == corev1.ConditionFalse && reason == "AwaitingState" && f.depLocked(ns, "standby").Annotations[contract.AnnStandbyReady] == sp
	})
	return r
}

// handFinalOn hands the retired primary's final state in, as its sidecar
// does, and waits until the standby's pod fetched it (handed on to it); it
// returns the state's ID.
func (r *statefulRig) handFinalOn(t *testing.T) string {
	t.Helper()
	id, err := r.client(r.pp).HandIn(t.Context(), statehub.Final, finalState())
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := r.client(r.sp).Fetch(t.Context(), "")
	for err == nil && !ok {
		got, ok, err = r.client(r.sp).Fetch(t.Context(), "")
	}
	if err != nil || got.ID != id {
		t.Fatalf("the standby's pod fetched %q (%v), want the state %s handed on to it", got.ID, err, id)
	}
	return id
}

// client is pod's sidecar's side of the hub.
func (r *statefulRig) client(pod string) *statehub.Client {
	return &statehub.Client{URL: r.srv.URL, Pod: podsignal.PodID{Namespace: ns, Pod: pod}, Token: pod, HTTP: r.srv.Client()}
}

// TestAStatefulPairsSwitchoverHandsTheFinalStateOnBeforeTheStandbyServes is
// the agent's half of a planned switchover that loses nothing: the standby
// of a stateful pair is held out of its Services while it is a standby, yet
// counts as ready for the switchover (its pod's agent says so on its
// Deployment); the primary is retired; the final state its sidecar hands in
// goes on to the standby's pod, which joins its Services only once it says
// it runs on that state.
func TestAStatefulPairsSwitchoverHandsTheFinalStateOnBeforeTheStandbyServes(t *testing.T) {
	r := startStateful(t, time.Minute)
	f, sp := r.f, r.sp
	r.switchOver()
	f.await(t, "roles exchanged", func() bool {
		return slices.Contains(f.Writes, "scale edge/primary 0") && f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary"
	})
	f.await(t, "StateHandover Event", func() bool { return slices.Contains(f.ReasonsLocked(), "StateHandover") })
	f.Lock()
	if st, _ := f.gateLocked(sp); st != corev1.ConditionFalse {
		t.Errorf("the new primary's pod serves (%s) before it holds the state", st)
	}
	if _, ok := f.depLocked(ns, "standby").Annotations[contract.AnnStandbyReady]; ok {
		t.Errorf("the new primary still carries %s", contract.AnnStandbyReady)
	}
	f.Unlock()

	// The retired broker's sidecar hands its final state in.
	id := r.handFinalOn(t)
	// Its sidecar restarts the broker on it: starting, then healthy on it.
	r.sendMsg(sp, podsignal.Message{State: podsignal.Starting, Handover: id})
	r.sendMsg(sp, podsignal.Message{State: podsignal.Healthy})
	r.sendMsg(sp, podsignal.Message{State: podsignal.Starting, Handover: id}) // taken: the one before is done
	f.Lock()
	if st, _ := f.gateLocked(sp); st == corev1.ConditionTrue {
		t.Errorf("the new primary's pod serves on a healthy signal that names no state")
	}
	f.Unlock()
	r.sendMsg(sp, podsignal.Message{State: podsignal.Healthy, Handover: id})
	f.await(t, "the new primary serves on the state", func() bool {
		st, _ := f.gateLocked(sp)
		return st == corev1.ConditionTrue && slices.Contains(f.ReasonsLocked(), "StateCarried")
	})
	if _, ok, _ := r.client(sp).Fetch(t.Context(), ""); ok {
		t.Error("the state is still there to fetch after the pod runs on it")
	}
}

// TestAStatefulPairsStandbyServesAtOnceWhenNoStateCanCome: a failover (a
// crashed broker writes no final state) and a handover whose state never
// comes both end with the new primary serving, said in a Warning Event;
// never with it held for good.
func TestAStatefulPairsStandbyServesAtOnceWhenNoStateCanCome(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault podsignal.State
		why   string
	}{
		{"a crash failover", podsignal.Gone, "wrote no final state"},
		{"a switchover whose state never comes", podsignal.Anomalous, "no final state came"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startStateful(t, 300*time.Millisecond)
			f, sp := r.f, r.sp
			if tc.fault == podsignal.Anomalous {
				r.switchOver()
			} else {
				r.send(tc.fault)
			}
			f.await(t, "the new primary serves, and a Warning says why without its state", func() bool {
				st, _ := f.gateLocked(sp)
				warned := slices.ContainsFunc(f.Events, func(ev *eventsv1.Event) bool {
					return ev.Reason == "StateNotCarried" && ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Note, tc.why)
				})
				return st == corev1.ConditionTrue && f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary" && warned
			})
		})
	}
}

// TestAHandoverWaitsWhileTheNewPrimarysBrokerRestartsOnItsState: at its
// deadline a handover whose state was handed on waits on while the new
// primary's broker is still restarting on it (its pod Starting: it could
// not serve without the state either), up to restartingWaits deadlines; a
// broker that comes up on it then is carried, one still restarting at the
// last is released without it.
func TestAHandoverWaitsWhileTheNewPrimarysBrokerRestartsOnItsState(t *testing.T) {
	for _, tc := range []struct {
		name    string
		upOnIt  bool
		outcome string
	}{
		{"the broker up on the state after two deadlines", true, "StateCarried"},
		{"the broker still restarting at the last deadline", false, "StateNotCarried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startStateful(t, 200*time.Millisecond)
			f, sp := r.f, r.sp
			r.switchOver()
			id := r.handFinalOn(t)
			r.sendMsg(sp, podsignal.Message{State: podsignal.Starting, Handover: id}) // its broker killed to restart on it
			waits := map[string]bool{}                                                // by the deadline each one set
			r.logs.wait(t, "two deadlines passed while it restarts", func(l map[string]any) bool {
				if l["msg"] == "handover waits on" {
					waits[str(l["until"])] = true
				}
				return len(waits) >= 2
			})
			f.Lock()
			if slices.Contains(f.ReasonsLocked(), "StateNotCarried") {
				t.Errorf("the state given up while the broker restarts on it: %v", f.ReasonsLocked())
			}
			f.Unlock()
			if tc.upOnIt {
				r.sendMsg(sp, podsignal.Message{State: podsignal.Healthy, Handover: id})
			}
			f.await(t, tc.outcome, func() bool { return slices.Contains(f.ReasonsLocked(), tc.outcome) })
		})
	}
}

// TestAStatefulPairsCrashFailoverRestartsTheStandbyOnTheLastSnapshot: a
// crashed broker writes no final state; the last snapshot its sidecar
// handed in goes to the standby's pod, which serves once it runs on it, and
// the Events say how old it was.
func TestAStatefulPairsCrashFailoverRestartsTheStandbyOnTheLastSnapshot(t *testing.T) {
	r := startStateful(t, time.Minute)
	f, pp, sp := r.f, r.pp, r.sp
	id, err := r.client(pp).HandIn(t.Context(), statehub.Snapshot, finalState())
	if err != nil {
		t.Fatal(err)
	}
	r.send(podsignal.Gone)
	f.await(t, "failed over, the standby held for the snapshot", func() bool {
		st, _ := f.gateLocked(sp)
		return f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary" && st == corev1.ConditionFalse &&
			slices.Contains(f.ReasonsLocked(), "StateFromSnapshot")
	})
	fetched, ok, err := r.client(sp).Fetch(t.Context(), "")
	if err != nil || !ok || fetched.ID != id || fetched.Kind != statehub.Snapshot {
		t.Fatalf("the standby's pod fetched %q %s (%v, %v), want the snapshot %s", fetched.ID, fetched.Kind, ok, err, id)
	}
	r.sendMsg(sp, podsignal.Message{State: podsignal.Starting, Handover: id})
	r.sendMsg(sp, podsignal.Message{State: podsignal.Healthy, Handover: id})
	f.await(t, "the new primary serves on the snapshot, its age said", func() bool {
		st, _ := f.gateLocked(sp)
		return st == corev1.ConditionTrue && slices.ContainsFunc(f.Events, func(ev *eventsv1.Event) bool {
			return ev.Reason == "StateCarried" && strings.Contains(ev.Note, "the last snapshot") && strings.Contains(ev.Note, "lost")
		})
	})
}

// twoNodes is a stateful pair across two nodes: the primary's pod signals
// to the agent of node-a, the standby's to that of node-b; each agent has
// its hub and relays to the other's over HTTP (statehub.Relay).
type twoNodes struct {
	a, b           *rig
	f              *fakeCluster
	pp, sp         string
	hubA, hubB     *statehub.Hub
	srvA, srvB     *httptest.Server
	relayA, relayB *statehub.Relay
}

func startTwoNodes(t *testing.T) *twoNodes {
	t.Helper()
	f := newFakeCluster()
	pp, sp := statefulPair(f, fast)
	n := &twoNodes{f: f, pp: pp, sp: sp}
	hub := func(peer, node string) (*statehub.Hub, *httptest.Server, *statehub.Relay) {
		h, err := statehub.New(statehub.Config{Authenticator: podTokens{}, Peers: statehub.FakePeers{"agent-" + peer: "node-" + peer}, Wait: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h.Handler())
		t.Cleanup(srv.Close)
		tok := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tok, []byte("agent-"+node), 0o600); err != nil {
			t.Fatal(err)
		}
		relay, err := statehub.NewRelay(h, statehub.RelayConfig{TokenFile: tok, Retry: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- relay.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return h, srv, relay
	}
	n.hubA, n.srvA, n.relayA = hub("b", "a")
	n.hubB, n.srvB, n.relayB = hub("a", "b")
	cfg := func(node string, h *statehub.Hub, srv *httptest.Server, relay *statehub.Relay) Config {
		return Config{Node: node, Instance: node, States: h, StateAddr: srv.URL, StateRelay: relay, StateWait: time.Minute}
	}
	n.a = start(t, f, pp, cfg("node-a", n.hubA, n.srvA, n.relayA))
	n.b = start(t, f, sp, cfg("node-b", n.hubB, n.srvB, n.relayB))
	n.a.send(podsignal.Healthy)
	n.b.sendMsg(sp, podsignal.Message{State: podsignal.Healthy})
	f.await(t, "the standby held out on node-b, its node, hub and readiness written for node-a's agent", func() bool {
		st, reason := f.gateLocked(sp)
		ann := f.depLocked(ns, "standby").Annotations
		return st == corev1.ConditionFalse && reason == "AwaitingState" && ann[contract.AnnStandbyReady] == sp &&
			ann[contract.AnnStandbyNode] == "node-b" && ann[contract.AnnPrimaryNode] == "node-a" && ann[contract.AnnStandbyHub] == n.srvB.URL
	})
	return n
}

// snapshotOnB hands a snapshot in from the primary's pod on node-a and
// waits until node-a's agent has relayed it to node-b's hub.
func (n *twoNodes) snapshotOnB(t *testing.T) {
	t.Helper()
	c := &statehub.Client{URL: n.srvA.URL, Pod: podsignal.PodID{Namespace: ns, Pod: n.pp}, Token: n.pp, HTTP: n.srvA.Client()}
	if _, err := c.HandIn(t.Context(), statehub.Snapshot, finalState()); err != nil {
		t.Fatal(err)
	}
	n.b.logs.wait(t, "the snapshot relayed to node-b's hub", func(l map[string]any) bool {
		return l["msg"] == "broker state relayed here" && l["kind"] == string(statehub.Snapshot) && l["via"] == "node-a"
	})
}

// TestAStatefulPairAcrossTwoNodesCarriesItsState: the agent that retires
// the primary and the one whose node runs the standby's pod are two. The
// states the primary's pod hands in on node-a are relayed to node-b's hub;
// the retirement names the state on the new primary (contract.AnnHandover);
// node-b's agent hands it on and lets its pod serve once it runs on it. So
// it holds for a planned switchover (the final state, relayed as it comes),
// a crash failover (decided on node-a) and the loss of node-a (decided on
// node-b, from the snapshot relayed before the loss).
func TestAStatefulPairAcrossTwoNodesCarriesItsState(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  statehub.Kind
		fault func(t *testing.T, n *twoNodes)
	}{
		{"a planned switchover", statehub.Final, func(t *testing.T, n *twoNodes) {
			n.a.switchOver()
			n.f.await(t, "roles exchanged, the handover named on the new primary", func() bool {
				return n.f.depLocked(ns, "standby").Annotations[contract.AnnHandover] != ""
			})
			// The retired broker's sidecar hands its final state in to its own node.
			c := &statehub.Client{URL: n.srvA.URL, Pod: podsignal.PodID{Namespace: ns, Pod: n.pp}, Token: n.pp, HTTP: n.srvA.Client()}
			if _, err := c.HandIn(t.Context(), statehub.Final, finalState()); err != nil {
				t.Fatal(err)
			}
		}},
		{"a planned switchover whose final state, and its comeback's first snapshot, came before node-b read the handover", statehub.Final, func(t *testing.T, n *twoNodes) {
			// On a slow node the relayed final state, and then the first
			// snapshot of the retired Deployment's next pod (its comeback
			// as the standby, empty), can both be in the hub before its
			// agent reads the new roles: the handover must take the
			// final state, not the newer snapshot, and not wait for a
			// final state that already came (found on a cgroup v2 guest
			// under emulation: StateNotCarried after 10 s).
			comeback := podsignal.PodID{Namespace: ns, Pod: "primary-comeback"}
			n.relayA.Forward(n.srvB.URL, statehub.State{ID: ns + "/" + n.pp + "/1", From: podsignal.PodID{Namespace: ns, Pod: n.pp}, Owner: "primary", Kind: statehub.Final, Data: finalState()})
			n.b.logs.wait(t, "the final state relayed to node-b's hub", func(l map[string]any) bool {
				return l["msg"] == "broker state relayed here" && l["kind"] == string(statehub.Final)
			})
			n.relayA.Forward(n.srvB.URL, statehub.State{ID: ns + "/" + comeback.Pod + "/2", From: comeback, Owner: "primary", Kind: statehub.Snapshot, Data: finalState()})
			n.b.logs.wait(t, "the comeback's snapshot relayed to node-b's hub after it", func(l map[string]any) bool {
				return l["msg"] == "broker state relayed here" && l["kind"] == string(statehub.Snapshot) && strings.Contains(fmt.Sprint(l["state"]), comeback.Pod)
			})
			n.a.switchOver()
		}},
		{"a crash failover", statehub.Snapshot, func(t *testing.T, n *twoNodes) {
			n.snapshotOnB(t)
			n.a.send(podsignal.Gone)
		}},
		{"the primary's node lost", statehub.Snapshot, func(t *testing.T, n *twoNodes) {
			n.snapshotOnB(t)
			// Liveness says a node is lost only once it guards it.
			n.b.logs.wait(t, "node-b guarding node-a", func(l map[string]any) bool {
				g, _ := l["guard"].([]any)
				return l["msg"] == "guards" && slices.Contains(g, any("node-a"))
			})
			n.b.act.NodeLost(t.Context(), "node-a", time.Now())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTwoNodes(t)
			tc.fault(t, n)
			sc := &statehub.Client{URL: n.srvB.URL, Pod: podsignal.PodID{Namespace: ns, Pod: n.sp}, Token: n.sp, HTTP: n.srvB.Client()}
			fctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			got, ok, err := sc.Fetch(fctx, "")
			for err == nil && !ok {
				got, ok, err = sc.Fetch(fctx, "")
			}
			if err != nil || got.Kind != tc.kind || got.From.Pod != n.pp {
				t.Fatalf("the standby's pod fetched %q, %s from %s (%v); want a %s of %s", got.ID, got.Kind, got.From, err, tc.kind, n.pp)
			}
			n.f.Lock()
			if st, _ := n.f.gateLocked(n.sp); st == corev1.ConditionTrue {
				t.Errorf("the new primary's pod serves before it runs on the state")
			}
			n.f.Unlock()
			n.b.sendMsg(n.sp, podsignal.Message{State: podsignal.Starting, Handover: got.ID})
			n.b.sendMsg(n.sp, podsignal.Message{State: podsignal.Healthy, Handover: got.ID})
			n.f.await(t, "the new primary serves on the state, the handover cleared", func() bool {
				st, _ := n.f.gateLocked(n.sp)
				_, named := n.f.depLocked(ns, "standby").Annotations[contract.AnnHandover]
				return st == corev1.ConditionTrue && !named && slices.Contains(n.f.ReasonsLocked(), "StateCarried")
			})
			n.f.Lock()
			defer n.f.Unlock()
			if slices.Contains(n.f.ReasonsLocked(), "StateNotCarried") {
				t.Errorf("a StateNotCarried Event beside the state carried: %v", n.f.ReasonsLocked())
			}
		})
	}
}

// TestAStatefulPairIsRetiredWithoutTheHold: its clients cannot move before
// the retirement, so the Gate's hold (15 s by default) would only wait; a
// stateful pair with no amf.io/hold of its own is retired once the
// anomaly is confirmed with the standby ready.
func TestAStatefulPairIsRetiredWithoutTheHold(t *testing.T) {
	f := newFakeCluster()
	gates := maps.Clone(fast)
	delete(gates, contract.AnnHold)
	pp, sp := statefulPair(f, gates)
	hub, _ := newStateHub(t)
	r := start(t, f, pp, Config{States: hub, StateWait: time.Minute})
	r.send(podsignal.Healthy)
	r.sendMsg(sp, podsignal.Message{State: podsignal.Healthy})
	f.await(t, "the standby named ready", func() bool { return f.depLocked(ns, "standby").Annotations[contract.AnnStandbyReady] == sp })
	r.switchOver()
	f.await(t, "retired at once, not after the default hold of 15 s", func() bool { return slices.Contains(f.Writes, "scale edge/primary 0") })
}

// TestAStandbyNamedReadyByAnAgentGoneWithItsNodeIsNotRetiredOnto: the
// agent of the standby's node writes and clears amf.io/standby-ready; when
// that node is lost its agent goes with it, and the mark stands over a pod
// evicted from the node (Terminating while the node is unreachable) or
// deleted, while the Deployment still counts a pod (its replacement,
// Pending). A switchover then keeps the primary.
func TestAStandbyNamedReadyByAnAgentGoneWithItsNodeIsNotRetiredOnto(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(p *corev1.Pod, f *fakeCluster)
		why  string
	}{
		{"its pod evicted, Terminating on the lost node", func(p *corev1.Pod, _ *fakeCluster) {
			p.DeletionTimestamp = ptr.To(metav1.Now())
		}, "is being deleted"},
		{"its pod deleted", func(p *corev1.Pod, f *fakeCluster) { delete(f.Pods, key(ns, p.Name)) }, "is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startStateful(t, time.Minute)
			f := r.f
			f.Lock()
			tc.lose(f.Pods[key(ns, r.sp)], f)
			f.Unlock()
			r.switchOver()
			r.logs.wait(t, "the retirement refused", func(l map[string]any) bool {
				e, _ := l["error"].(string)
				return l["msg"] == "decision" && strings.Contains(e, tc.why)
			})
			f.Lock()
			defer f.Unlock()
			if slices.Contains(f.Writes, "scale edge/primary 0") || f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary" {
				t.Errorf("the primary retired onto a standby whose pod %s: %q", tc.why, f.Writes)
			}
		})
	}
}
