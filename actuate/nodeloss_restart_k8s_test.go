package actuate_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// TestNodeLossFailoverOnTheAPIServerResumesAfterTheGuardStopsAtEachStep is
// the real-API-server side of the fast TestNodeLossFailoverResumesAfterThe
// GuardStopsAtEachStep: a hot pair (both Deployments running on the kwok
// node), the standby's node recorded as node-b and the primary's as node-a.
// The agent of node-b (Config.Node, as a ServiceAccount bound to
// actuate.RulesWithResume()) hears the standby's pod, guards node-a, is
// told node-a is lost, and is stopped right after each write of the
// failover reached the API server (its context cancelled inside its own
// transport, before it sees the response), or with its record writes
// dropped (decided, nothing written). A fresh agent of node-b then hears the
// standby's pod (as its sidecar reconnects), or resumes at start
// (ResumeOnStart); where nothing was recorded, its own guard declares node-a
// lost again. It must finish the failover exactly once: from every request
// both agents sent, the old primary exchanged to standby once, scaled to 0,
// brought back (0 → 1) and never retired again once it came back; the hot
// standby never scaled; at most one RolesExchanged Event; and the new pod of
// the old primary, signalling, starts nothing. A watcher checks the pair's
// Ready replicas never drop to 0.
func TestNodeLossFailoverOnTheAPIServerResumesAfterTheGuardStopsAtEachStep(t *testing.T) {
	ctx, _, admin := startCluster(t, 300*time.Second)
	cfg := agentConfig(ctx, t, admin, actuate.RulesWithResume())
	var w wire
	w.install(cfg)
	agentClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	type pair struct{ p, s string }
	tests := []struct {
		name   string
		stopAt func(pair) func(wireReq) bool // nil: the record writes dropped, the agent stopped at the first
		phase  actuate.Phase                 // recorded when it stopped ("": the roles exchanged)
		resume bool
	}{
		{name: "decided, the record not written", phase: actuate.PhaseIdle},
		{name: "record Retiring written, the primary not scaled yet",
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseRetiring)) }, phase: actuate.PhaseRetiring},
		{name: "record Retiring written, resumed at start", resume: true,
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseRetiring)) }, phase: actuate.PhaseRetiring},
		{name: "primary scaled to 0, roles not exchanged",
			stopAt: func(pr pair) func(wireReq) bool { return scaleTo(pr.p, 0) }, phase: actuate.PhaseRetiring},
		{name: "the new primary written, the old one still a primary",
			stopAt: func(pr pair) func(wireReq) bool { return rolePatch(pr.s, "primary") }, phase: actuate.PhaseRetiring},
		{name: "the new primary written, the old one still a primary, resumed at start", resume: true,
			stopAt: func(pr pair) func(wireReq) bool { return rolePatch(pr.s, "primary") }, phase: actuate.PhaseRetiring},
		{name: "roles exchanged, the old primary not back yet",
			stopAt: func(pr pair) func(wireReq) bool { return rolePatch(pr.p, "standby") }},
		{name: "the old primary back as the hot standby",
			stopAt: func(pr pair) func(wireReq) bool { return scaleTo(pr.p, 1) }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			pr := pair{p: fmt.Sprintf("nodeloss-%d-p", i), s: fmt.Sprintf("nodeloss-%d-s", i)}
			ready := readyLog{a: pr.p, b: pr.s}
			watched := make(chan struct{})
			go func() { defer close(watched); ready.watch(ctx, t, admin) }()
			// The primary's agent recorded its node on the standby
			// already (node-a); the standby's agent records its own.
			mustCreate(t, func() error {
				return createDeployment(ctx, admin, pr.s, 1, map[string]string{contract.AnnPrimary: pr.p, contract.AnnRole: "standby", contract.AnnPrimaryNode: "node-a"})
			})
			mustCreate(t, func() error {
				return createDeployment(ctx, admin, pr.p, 1, map[string]string{contract.AnnStandby: pr.s, contract.AnnRedundancy: string(contract.Hot)})
			})
			for _, n := range []string{pr.p, pr.s} {
				waitDeployment(ctx, t, admin, n, "Ready", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
			}
			podP, podS := onlyPod(ctx, t, admin, pr.p), onlyPod(ctx, t, admin, pr.s)
			w.record()

			// The first agent of node-b, stopped right after the step's
			// write (or at its record, dropped).
			ctx1, stop1 := context.WithCancel(ctx)
			var stopped <-chan wireReq
			undrop := func() {}
			if tt.stopAt == nil {
				ch := make(chan wireReq, 1)
				var once sync.Once
				undrop = w.drop(func(r wireReq) bool {
					if !recordWrite(pr.p, string(actuate.PhaseFailover))(r) && !recordWrite(pr.p, string(actuate.PhaseRetiring))(r) {
						return false
					}
					once.Do(func() { stop1(); ch <- r })
					return true
				})
				stopped = ch
			} else {
				stopped = w.expect(tt.stopAt(pr), stop1)
			}
			g1 := runGuard(ctx1, t, agentClient, admin.ns, "node-b", false)
			g1.send(podS, podsignal.Healthy)
			g1.awaitGuard(ctx, t, "node-a")
			waitDeployment(ctx, t, admin, pr.s, "its node recorded by its agent", func(d *appsv1.Deployment) bool {
				return d.Annotations[contract.AnnStandbyNode] == "node-b" && d.Status.ReadyReplicas == 1
			})
			g1.act.NodeLost(ctx1, "node-a", time.Now())
			awaitWire(ctx, t, stopped, "the step the agent is stopped at")
			g1.done()
			undrop()
			if ph := record(ctx, t, admin, pr.p).Phase; tt.phase != "" && ph != tt.phase {
				t.Fatalf("agent stopped in phase %s, want %s", ph, tt.phase)
			}
			firstExchanged := slices.ContainsFunc(w.sentSoFar(), rolePatch(pr.p, "standby"))

			// The fresh agent of node-b.
			g2 := runGuard(ctx, t, agentClient, admin.ns, "node-b", tt.resume)
			defer g2.done()
			g2.send(podS, podsignal.Healthy)
			if tt.stopAt == nil {
				g2.awaitGuard(ctx, t, "node-a")
				g2.act.NodeLost(ctx, "node-a", time.Now())
			}
			waitDeployment(ctx, t, admin, pr.s, "the one primary, the old one restored", func(d *appsv1.Deployment) bool {
				r := recordOf(d)
				return d.Annotations[contract.AnnRole] == "primary" && d.Annotations[contract.AnnStandby] == pr.p && r.Phase == actuate.PhaseIdle &&
					!r.LastSwitch.IsZero() && !r.Restore && d.Status.ReadyReplicas == 1
			})
			d := waitDeployment(ctx, t, admin, pr.p, "the hot standby (1 Ready)", func(d *appsv1.Deployment) bool {
				return d.Annotations[contract.AnnRole] == "standby" && d.Annotations[contract.AnnPrimary] == pr.s && *d.Spec.Replicas == 1 &&
					d.Status.ReadyReplicas == 1
			})
			for _, k := range []string{contract.AnnStandby, contract.AnnRecord} {
				if v, ok := d.Annotations[k]; ok {
					t.Errorf("the old primary keeps %s=%s: two primaries", k, v)
				}
			}
			// The old primary's new pod signals to the agent of its node.
			newP := onlyPod(ctx, t, admin, pr.p)
			if newP == podP {
				t.Errorf("the hot standby is the retired pod %s, not a fresh one", newP)
			}
			g2.send(newP, podsignal.Healthy)
			g2.act.NodeBack(ctx, "node-x", time.Now()) // a barrier: Run took the signal
			g2.done()

			sent := w.sentSoFar()
			count := func(m func(wireReq) bool) int {
				n := 0
				for _, r := range sent {
					if m(r) {
						n++
					}
				}
				return n
			}
			if n := count(rolePatch(pr.p, "standby")); n != 1 {
				t.Errorf("the old primary exchanged to standby %d times, want 1", n)
			}
			// Brought back once: scaled up, never retired again after it.
			// The scale to 1 may go out more than once (Gate.restore repeats
			// it on each drained observation until the watch shows it
			// scaled; a PUT of 1 onto 1 changes nothing), so the count is
			// not the test, the absence of a later scale to 0 is.
			if n := count(scaleTo(pr.p, 1)); n < 1 {
				t.Errorf("the old primary never brought back")
			}
			if i := slices.IndexFunc(sent, scaleTo(pr.p, 1)); i >= 0 && slices.ContainsFunc(sent[i:], scaleTo(pr.p, 0)) {
				t.Errorf("the old primary retired again after it came back")
			}
			if slices.ContainsFunc(sent, func(r wireReq) bool { return r.method == http.MethodPut && isDeploymentPath(r.path, pr.s, "scale") }) {
				t.Errorf("the hot standby was scaled")
			}
			switch n := count(rolePatch(pr.s, "primary")); {
			case firstExchanged && n != 1:
				t.Errorf("the new primary written %d times, though the first agent had finished the exchange", n)
			case n > 2:
				t.Errorf("the new primary written %d times", n)
			}
			evs, err := admin.EventsV1().Events(admin.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			exchanges := 0
			for _, ev := range evs.Items {
				if ev.Regarding.Name == pr.p && ev.Reason == "RolesExchanged" {
					exchanges++
					if ev.Series != nil {
						exchanges += int(ev.Series.Count) - 1
					}
				}
			}
			if exchanges > 1 {
				t.Errorf("RolesExchanged %d times", exchanges)
			}
			cancel()
			<-watched
			ready.check(t)
		})
	}
}

// rolePatch matches a successful annotation patch of name that sets its role
// (a role exchange's write).
func rolePatch(name, role string) func(wireReq) bool {
	want := []byte(`"` + contract.AnnRole + `":"` + role + `"`)
	return func(r wireReq) bool {
		return r.method == http.MethodPatch && isDeploymentPath(r.path, name, "") && r.status < 300 && bytes.Contains(r.body, want)
	}
}

// guardAgent is an Actuator of a node (Config.Node) run until its context
// ends or done.
type guardAgent struct {
	act  *actuate.Actuator
	send func(pod string, st podsignal.State) bool
	done func()
	mu   sync.Mutex
	last actuate.Guards
	seen chan struct{} // a value when the Guards changed
}

func runGuard(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, node string, resume bool) *guardAgent {
	t.Helper()
	g := &guardAgent{seen: make(chan struct{}, 1)}
	act, err := actuate.New(actuate.Config{Client: cs, Node: node, Instance: node, ResumeOnStart: resume,
		Logger: testLogger(t),
		OnGuards: func(gs actuate.Guards) {
			g.mu.Lock()
			g.last = gs
			g.mu.Unlock()
			select {
			case g.seen <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	g.act = act
	ctx, cancel := context.WithCancel(ctx)
	signals := make(chan podsignal.Observation)
	runDone := make(chan error, 1)
	go func() { runDone <- act.Run(ctx, signals) }()
	g.send = func(pod string, st podsignal.State) bool {
		select {
		case signals <- observation(ns, pod, st, 0.1, true):
			return true
		case <-ctx.Done():
			return false
		}
	}
	var once sync.Once
	g.done = func() {
		once.Do(func() {
			cancel()
			if err := <-runDone; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	return g
}

// awaitGuard waits until the agent reports that it guards node.
func (g *guardAgent) awaitGuard(ctx context.Context, t *testing.T, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		g.mu.Lock()
		ok := slices.Contains(g.last.Guard, node)
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-g.seen:
		case <-ctx.Done():
			t.Fatalf("never guarding %s: %v", node, ctx.Err())
		}
	}
}
