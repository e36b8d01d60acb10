package actuate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/signal"
)

// TestSwitchoverResumesAfterAgentStopsAtEachStep stops the agent at every
// step of a switchover, right after that step's write reached the API server
// and before anything else (the agent's context is cancelled inside its own
// transport, before it sees the response), then starts a fresh agent
// (ResumeOnStart, as a ServiceAccount bound to actuate.RulesWithResume()) and
// checks it completes: the switchover, the failover, or the scale-back of an
// aborted one. For each, a watcher records every change of the Ready
// replicas of primary + standby and checks the sum never drops to 0.
func TestSwitchoverResumesAfterAgentStopsAtEachStep(t *testing.T) {
	ctx, _, cp, admin := startCluster(t, 100*time.Second)
	cfg := agentConfig(ctx, t, cp, actuate.RulesWithResume())
	var w wire
	w.install(cfg)
	agentClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// A pair: primary p (1 replica, cold standby s, hold 1 s, abort delay
	// 1 s). drive feeds the first agent until it is stopped; the outcome
	// is a completed switchover unless aborted.
	type pair struct{ p, s, pod string }
	confirmThenReconfirm := func(ctx context.Context, t *testing.T, pr pair, send func(signal.State) bool) {
		for range 3 {
			if !send(signal.Anomalous) {
				return
			}
		}
		waitDeployment(ctx, t, admin, pr.p, "record Confirm", func(d *appsv1.Deployment) bool { return recordOf(d).Phase == actuate.PhaseConfirm })
		for range 3 {
			if !send(signal.Anomalous) {
				return
			}
		}
	}
	decide := func(_ context.Context, _ *testing.T, _ pair, send func(signal.State) bool) {
		for range 3 {
			if !send(signal.Anomalous) {
				return
			}
		}
	}
	tests := []struct {
		name    string
		stopAt  func(pair) func(wireReq) bool
		phase   actuate.Phase // recorded when the agent stopped
		drive   func(context.Context, *testing.T, pair, func(signal.State) bool)
		aborted bool
	}{
		{"record WaitReady written, standby not scaled yet",
			func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseWaitReady)) }, actuate.PhaseWaitReady, decide, false},
		{"standby scaled up, not Ready yet",
			func(pr pair) func(wireReq) bool { return scaleTo(pr.s, 1) }, actuate.PhaseWaitReady, decide, false},
		{"record Confirm written, standby Ready",
			func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseConfirm)) }, actuate.PhaseConfirm, decide, false},
		{"record Retiring written, primary still up",
			func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseRetiring)) }, actuate.PhaseRetiring, confirmThenReconfirm, false},
		{"primary scaled to 0, roles not exchanged yet",
			func(pr pair) func(wireReq) bool { return scaleTo(pr.p, 0) }, actuate.PhaseRetiring, confirmThenReconfirm, false},
		{"record Failover written after a crash",
			func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseFailover)) }, actuate.PhaseFailover,
			func(_ context.Context, _ *testing.T, _ pair, send func(signal.State) bool) { send(signal.Gone) }, false},
		{"record Aborted written after the anomaly cleared",
			func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseAborted)) }, actuate.PhaseAborted,
			func(ctx context.Context, t *testing.T, pr pair, send func(signal.State) bool) {
				decide(ctx, t, pr, send)
				waitDeployment(ctx, t, admin, pr.s, "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
				send(signal.Healthy)
			}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			pr := pair{p: fmt.Sprintf("restart-%d-p", i), s: fmt.Sprintf("restart-%d-s", i)}
			ready := readyLog{a: pr.p, b: pr.s}
			watched := make(chan struct{})
			go func() { defer close(watched); ready.watch(ctx, t, admin) }()
			mustCreate(t, func() error { return createDeployment(ctx, admin, pr.s, 0, nil) })
			mustCreate(t, func() error {
				return createDeployment(ctx, admin, pr.p, 1, map[string]string{
					actuate.AnnStandby: pr.s, actuate.AnnHold: "1s", actuate.AnnAbortDelay: "1s",
				})
			})
			pr.pod = onlyPod(ctx, t, admin, pr.p)
			waitDeployment(ctx, t, admin, pr.p, "Ready", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })

			// The first agent, stopped right after the step's write.
			ctx1, stop1 := context.WithCancel(ctx)
			stopped := w.expect(tt.stopAt(pr), stop1)
			send1, done1 := runActuator(ctx1, t, agentClient, false)
			tt.drive(ctx1, t, pr, func(st signal.State) bool { return send1(pr.pod, st) })
			awaitWire(ctx, t, stopped, "the step the agent is stopped at")
			done1()
			if ph := record(ctx, t, admin, pr.p).Phase; ph != tt.phase {
				t.Fatalf("agent stopped in phase %s, want %s", ph, tt.phase)
			}

			// A fresh agent resumes from the record.
			send2, done2 := runActuator(ctx, t, agentClient, true)
			defer done2()
			if tt.aborted {
				waitDeployment(ctx, t, admin, pr.s, "scaled back to 0", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 0 })
				waitDeployment(ctx, t, admin, pr.p, "kept, record Idle", func(d *appsv1.Deployment) bool {
					return *d.Spec.Replicas == 1 && d.Status.ReadyReplicas == 1 && recordOf(d).Phase == actuate.PhaseIdle
				})
			} else {
				// Once the record is past the standby's wait, three samples
				// re-confirm (as a live sidecar would send them; a resumed
				// Retiring or Failover needs none and ignores them).
				waitDeployment(ctx, t, admin, pr.p, "record Confirm or later", func(d *appsv1.Deployment) bool {
					ph := recordOf(d).Phase
					return ph != actuate.PhaseWaitReady && ph != actuate.PhaseFailover
				})
				for range 3 {
					send2(pr.pod, signal.Anomalous)
				}
				waitDeployment(ctx, t, admin, pr.p, "retired and standby", func(d *appsv1.Deployment) bool {
					return *d.Spec.Replicas == 0 && d.Status.ReadyReplicas == 0 && d.Annotations[actuate.AnnRole] == "standby"
				})
				waitDeployment(ctx, t, admin, pr.s, "the new primary", func(d *appsv1.Deployment) bool {
					return d.Status.ReadyReplicas == 1 && d.Annotations[actuate.AnnStandby] == pr.p &&
						d.Annotations[actuate.AnnRole] == "primary" && !recordOf(d).LastSwitch.IsZero()
				})
			}
			done2()
			cancel()
			<-watched
			if tt.aborted {
				ready.invariant(t)
			} else {
				ready.check(t)
			}
		})
	}
}

// runActuator runs an Actuator until ctx ends or done is called (which waits
// for Run to return). send hands it a sample and reports false once it
// stopped.
func runActuator(ctx context.Context, t *testing.T, cs kubernetes.Interface, resume bool) (send func(pod string, st signal.State) bool, done func()) {
	t.Helper()
	act, err := actuate.New(actuate.Config{Client: cs, ResumeOnStart: resume, Logger: slog.New(slog.NewJSONHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	signals := make(chan actuate.Signal)
	runDone := make(chan error, 1)
	go func() { runDone <- act.Run(ctx, signals) }()
	send = func(pod string, st signal.State) bool {
		select {
		case signals <- actuate.Signal{Namespace: testNS, Pod: pod, State: st, Probability: ptr.To(0.93), At: time.Now()}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	finished := false
	done = func() {
		if finished {
			return
		}
		finished = true
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	return send, done
}

// TestRecordChangedByAnotherAgentIsNotOverwritten: the record is a
// compare-and-swap. An agent whose debounce is under way while another agent
// records a completed switchover (Idle, last switch now) does not overwrite
// it with its own decision: it reloads, continues from that record, and the
// flap guard then refuses the switchover (Warning Event, standby untouched).
func TestRecordChangedByAnotherAgentIsNotOverwritten(t *testing.T) {
	ctx, _, cp, admin := startCluster(t, 60*time.Second)
	agentClient := agentClientset(ctx, t, cp, actuate.Rules())
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-b", 0, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-a", 1, map[string]string{actuate.AnnStandby: "broker-b"})
	})
	pod := onlyPod(ctx, t, admin, "broker-a")
	send, done := runActuator(ctx, t, agentClient, false)
	defer done()

	send(pod, signal.Anomalous) // loads broker-a: its Idle record is written
	waitDeployment(ctx, t, admin, "broker-a", "record Idle", func(d *appsv1.Deployment) bool { return recordOf(d).Phase == actuate.PhaseIdle })
	otherRec := actuate.Record{Phase: actuate.PhaseIdle, Standby: "broker-b", LastSwitch: time.Now()}
	other, err := json.Marshal(otherRec)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{actuate.AnnRecord: string(other)}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AppsV1().Deployments(testNS).Patch(ctx, "broker-a", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	send(pod, signal.Anomalous)
	send(pod, signal.Anomalous) // the decision: its write is refused, the record reloaded
	for range 3 {
		send(pod, signal.Anomalous)
	}
	waitEvent(ctx, t, admin, "broker-a", "FlapGuard")
	done()
	// The agent's own later write (the flap guard's warning, once) builds on
	// the other's record instead of replacing it.
	if rec := record(ctx, t, admin, "broker-a"); rec.Active() || !rec.LastSwitch.Equal(otherRec.LastSwitch) {
		t.Errorf("record overwritten: %+v, want one continuing %s", rec, other)
	}
	if n := replicasOf(ctx, t, admin, "broker-b"); n != 0 {
		t.Errorf("standby scaled to %d by an agent whose record moved", n)
	}
}
