package actuate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// TestSwitchoverResumesAfterAgentStopsAtEachStep stops the agent at every
// write point of a switchover, right after that write reached the API server
// and before anything else (the agent's context is cancelled inside its own
// transport, before it sees the response), then starts a fresh agent
// (ResumeOnStart, as a ServiceAccount bound to actuate.RulesWithResume()) and
// checks it completes: the switchover, the failover, or the scale-back of an
// aborted one. The write order is the Actuator's: the standby's scale-up goes
// out while the decision's record is written, so the agent is also stopped
// after both, and after the scale-up with its record lost (dropped before it
// reached the API server): the orphaned standby that the fresh agent adopts,
// then uses if the anomaly persists or the primary is gone, or scales back
// after the abort delay. For each, a watcher records every change of the
// Ready replicas of primary + standby and checks the sum never drops to 0.
func TestSwitchoverResumesAfterAgentStopsAtEachStep(t *testing.T) {
	ctx, _, admin := startCluster(t, 240*time.Second)
	cfg := agentConfig(ctx, t, admin, actuate.RulesWithResume())
	var w wire
	w.install(cfg)
	agentClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// A pair: primary p (1 replica, cold standby s, hold 1 s, abort delay
	// 1 s unless the case says otherwise). drive feeds the first agent until
	// it is stopped; resume feeds the second (nil: three anomalous samples
	// once the record is past the standby's wait). The outcome is a completed
	// switchover unless aborted.
	type pair struct{ p, s, pod string }
	type feed func(context.Context, *testing.T, pair, func(podsignal.State) bool)
	confirmThenReconfirm := func(ctx context.Context, t *testing.T, pr pair, send func(podsignal.State) bool) {
		for range 3 {
			if !send(podsignal.Anomalous) {
				return
			}
		}
		waitDeployment(ctx, t, admin, pr.p, "record Confirm", func(d *appsv1.Deployment) bool { return recordOf(d).Phase == actuate.PhaseConfirm })
		for range 3 {
			if !send(podsignal.Anomalous) {
				return
			}
		}
	}
	decide := func(_ context.Context, _ *testing.T, _ pair, send func(podsignal.State) bool) {
		for range 3 {
			if !send(podsignal.Anomalous) {
				return
			}
		}
	}
	crash := func(_ context.Context, _ *testing.T, _ pair, send func(podsignal.State) bool) { send(podsignal.Gone) }
	// abort decides, waits for the standby's scale-up and clears the anomaly.
	abort := func(ctx context.Context, t *testing.T, pr pair, send func(podsignal.State) bool) {
		decide(ctx, t, pr, send)
		waitDeployment(ctx, t, admin, pr.s, "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
		send(podsignal.Healthy)
	}
	waitAdopted := func(ctx context.Context, t *testing.T, pr pair) {
		waitDeployment(ctx, t, admin, pr.p, "orphaned standby adopted (record Aborted)", func(d *appsv1.Deployment) bool {
			return recordOf(d).Phase == actuate.PhaseAborted
		})
	}
	scaleUp := func(pr pair) func(wireReq) bool { return scaleTo(pr.s, 1) }
	const longAbort = "60s" // the adopted standby must still be up when the anomaly is confirmed again
	tests := []struct {
		name    string
		ann     map[string]string
		drop    func(pair) func(wireReq) bool // writes that never reach the API server
		stopAt  func(pair) func(wireReq) bool
		phase   actuate.Phase // recorded when the agent stopped
		drive   feed
		resume  feed
		aborted bool
	}{
		{name: "record WaitReady written, the scale-up beside it maybe not",
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseWaitReady)) },
			phase:  actuate.PhaseWaitReady, drive: decide},
		{name: "standby scaled up and record WaitReady written",
			stopAt: func(pr pair) func(wireReq) bool {
				return allOf(scaleTo(pr.s, 1), recordPhase(pr.p, string(actuate.PhaseWaitReady)))
			},
			phase: actuate.PhaseWaitReady, drive: decide},
		{name: "standby scaled up, record WaitReady lost: the orphan is used as the anomaly persists",
			ann:    map[string]string{contract.AnnAbortDelay: longAbort},
			drop:   func(pr pair) func(wireReq) bool { return recordWrite(pr.p, string(actuate.PhaseWaitReady)) },
			stopAt: scaleUp, phase: actuate.PhaseIdle, drive: decide,
			resume: func(ctx context.Context, t *testing.T, pr pair, send func(podsignal.State) bool) {
				waitAdopted(ctx, t, pr)
				confirmThenReconfirm(ctx, t, pr, send)
			}},
		{name: "standby scaled up, record WaitReady lost: the orphan is scaled back as the anomaly is gone",
			drop:   func(pr pair) func(wireReq) bool { return recordWrite(pr.p, string(actuate.PhaseWaitReady)) },
			stopAt: scaleUp, phase: actuate.PhaseIdle, drive: decide, aborted: true},
		{name: "record Confirm written, standby Ready",
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseConfirm)) },
			phase:  actuate.PhaseConfirm, drive: decide},
		{name: "record Retiring written, primary still up",
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseRetiring)) },
			phase:  actuate.PhaseRetiring, drive: confirmThenReconfirm},
		{name: "primary scaled to 0, roles not exchanged yet",
			stopAt: func(pr pair) func(wireReq) bool { return scaleTo(pr.p, 0) },
			phase:  actuate.PhaseRetiring, drive: confirmThenReconfirm},
		{name: "record Failover written after a crash, the scale-up beside it maybe not",
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseFailover)) },
			phase:  actuate.PhaseFailover, drive: crash},
		{name: "standby scaled up after a crash, record Failover lost: the orphan takes over the primary still gone",
			ann:    map[string]string{contract.AnnAbortDelay: longAbort},
			drop:   func(pr pair) func(wireReq) bool { return recordWrite(pr.p, string(actuate.PhaseFailover)) },
			stopAt: scaleUp, phase: actuate.PhaseIdle, drive: crash,
			resume: func(ctx context.Context, t *testing.T, pr pair, send func(podsignal.State) bool) {
				waitAdopted(ctx, t, pr)
				send(podsignal.Gone)
			}},
		{name: "record Aborted written after the anomaly cleared",
			stopAt: func(pr pair) func(wireReq) bool { return recordPhase(pr.p, string(actuate.PhaseAborted)) },
			phase:  actuate.PhaseAborted, drive: abort, aborted: true},
		{name: "record Idle written after the abort delay, standby not scaled back yet",
			stopAt: func(pr pair) func(wireReq) bool {
				return recordMove(pr.p, string(actuate.PhaseAborted), string(actuate.PhaseIdle))
			},
			phase: actuate.PhaseIdle, drive: abort, aborted: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			pr := pair{p: fmt.Sprintf("restart-%d-p", i), s: fmt.Sprintf("restart-%d-s", i)}
			ready := readyLog{a: pr.p, b: pr.s}
			watched := make(chan struct{})
			go func() { defer close(watched); ready.watch(ctx, t, admin) }()
			ann := map[string]string{contract.AnnStandby: pr.s, contract.AnnHold: "1s", contract.AnnAbortDelay: "1s"}
			maps.Copy(ann, tt.ann)
			mustCreate(t, func() error { return createDeployment(ctx, admin, pr.s, 0, nil) })
			mustCreate(t, func() error { return createDeployment(ctx, admin, pr.p, 1, ann) })
			pr.pod = onlyPod(ctx, t, admin, pr.p)
			waitDeployment(ctx, t, admin, pr.p, "Ready", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })

			// The first agent, stopped right after the step's write.
			undrop := func() {}
			if tt.drop != nil {
				undrop = w.drop(tt.drop(pr))
			}
			ctx1, stop1 := context.WithCancel(ctx)
			stopped := w.expect(tt.stopAt(pr), stop1)
			send1, done1 := runActuator(ctx1, t, agentClient, admin.ns, false)
			tt.drive(ctx1, t, pr, func(st podsignal.State) bool { return send1(pr.pod, st) })
			awaitWire(ctx, t, stopped, "the step the agent is stopped at")
			done1()
			undrop() // the fresh agent's writes of that phase reach the server
			if ph := record(ctx, t, admin, pr.p).Phase; ph != tt.phase {
				t.Fatalf("agent stopped in phase %s, want %s", ph, tt.phase)
			}

			// A fresh agent resumes from the record and the replicas.
			send2, done2 := runActuator(ctx, t, agentClient, admin.ns, true)
			defer done2()
			send := func(st podsignal.State) bool { return send2(pr.pod, st) }
			switch {
			case tt.aborted:
				waitDeployment(ctx, t, admin, pr.s, "scaled back to 0", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 0 })
				waitDeployment(ctx, t, admin, pr.p, "kept, record Idle", func(d *appsv1.Deployment) bool {
					return *d.Spec.Replicas == 1 && d.Status.ReadyReplicas == 1 && recordOf(d).Phase == actuate.PhaseIdle
				})
			case tt.resume != nil:
				tt.resume(ctx, t, pr, send)
			default:
				// Once the record is past the standby's wait, three samples
				// re-confirm (as a live sidecar would send them; a resumed
				// Retiring or Failover needs none and ignores them).
				waitDeployment(ctx, t, admin, pr.p, "record Confirm or later", func(d *appsv1.Deployment) bool {
					ph := recordOf(d).Phase
					return ph != actuate.PhaseWaitReady && ph != actuate.PhaseFailover
				})
				for range 3 {
					send(podsignal.Anomalous)
				}
			}
			if !tt.aborted {
				waitDeployment(ctx, t, admin, pr.p, "retired and standby", func(d *appsv1.Deployment) bool {
					return *d.Spec.Replicas == 0 && d.Status.ReadyReplicas == 0 && d.Annotations[contract.AnnRole] == "standby"
				})
				waitDeployment(ctx, t, admin, pr.s, "the new primary", func(d *appsv1.Deployment) bool {
					return d.Status.ReadyReplicas == 1 && d.Annotations[contract.AnnStandby] == pr.p &&
						d.Annotations[contract.AnnRole] == "primary" && !recordOf(d).LastSwitch.IsZero()
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

// TestSwitchoverStoppedAfterTheRetirementResumesFromTheStandbysSignal: an
// agent stopped right after it scaled the primary to 0 and before it
// exchanged the roles leaves a primary with no pod to signal, and a standby
// that now serves without a policy. A fresh agent without ResumeOnStart
// (manifests/base's agent: no list on Deployments) hears only the standby's
// pod, whose sidecar re-sends its state when it reconnects; the standby
// names its primary (amf.io/primary, as inject --standby writes it), so that
// signal resumes the primary's record: the roles are exchanged and the
// standby is the primary, protected again. Found on a real node, with the
// agent's container killed at that moment (lab/faults).
func TestSwitchoverStoppedAfterTheRetirementResumesFromTheStandbysSignal(t *testing.T) {
	t.Parallel()
	ctx, _, admin := startCluster(t, 120*time.Second)
	cfg := agentConfig(ctx, t, admin, actuate.Rules())
	var w wire
	w.install(cfg)
	agentClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const p, s = "stopped-retired-p", "stopped-retired-s"
	ready := readyLog{a: p, b: s}
	watched := make(chan struct{})
	wctx, stopWatch := context.WithCancel(ctx)
	go func() { defer close(watched); ready.watch(wctx, t, admin) }()
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, s, 0, map[string]string{contract.AnnRole: "standby", contract.AnnPrimary: p})
	})
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, p, 1, map[string]string{contract.AnnStandby: s, contract.AnnHold: "1s"})
	})
	pod := onlyPod(ctx, t, admin, p)
	waitDeployment(ctx, t, admin, p, "Ready", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })

	ctx1, stop1 := context.WithCancel(ctx)
	stopped := w.expect(scaleTo(p, 0), stop1)
	send1, done1 := runActuator(ctx1, t, agentClient, admin.ns, false)
	for range 3 {
		send1(pod, podsignal.Anomalous)
	}
	waitDeployment(ctx, t, admin, p, "record Confirm", func(d *appsv1.Deployment) bool { return recordOf(d).Phase == actuate.PhaseConfirm })
	for range 3 {
		send1(pod, podsignal.Anomalous)
	}
	awaitWire(ctx, t, stopped, "the primary's scale to 0")
	done1()
	if d := getDeployment(ctx, t, admin, s); d.Annotations[contract.AnnRole] != "standby" || recordOf(getDeployment(ctx, t, admin, p)).Phase != actuate.PhaseRetiring {
		t.Fatalf("the agent did not stop between the retirement and the role exchange: standby's annotations %v", d.Annotations)
	}
	waitDeployment(ctx, t, admin, p, "without a pod", func(d *appsv1.Deployment) bool { return d.Status.Replicas == 0 })

	send2, done2 := runActuator(ctx, t, agentClient, admin.ns, false)
	defer done2()
	send2(onlyPod(ctx, t, admin, s), podsignal.Healthy)
	waitDeployment(ctx, t, admin, s, "the new primary", func(d *appsv1.Deployment) bool {
		return d.Annotations[contract.AnnRole] == "primary" && d.Annotations[contract.AnnStandby] == p && !recordOf(d).LastSwitch.IsZero()
	})
	waitDeployment(ctx, t, admin, p, "its standby", func(d *appsv1.Deployment) bool {
		_, rec := d.Annotations[contract.AnnRecord]
		return d.Annotations[contract.AnnRole] == "standby" && d.Annotations[contract.AnnPrimary] == s && !rec && *d.Spec.Replicas == 0
	})
	done2()
	stopWatch()
	<-watched
	ready.check(t)
}

// runActuator runs an Actuator until ctx ends or done is called (which waits
// for Run to return). send hands it a sample and reports false once it
// stopped.
func runActuator(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string, resume bool) (send func(pod string, st podsignal.State) bool, done func()) {
	t.Helper()
	act, err := actuate.New(actuate.Config{Client: cs, ResumeOnStart: resume, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	signals := make(chan podsignal.Observation)
	runDone := make(chan error, 1)
	go func() { runDone <- act.Run(ctx, signals) }()
	send = func(pod string, st podsignal.State) bool {
		select {
		case signals <- observation(ns, pod, st, 0.93, false):
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
// it with its own decision: it reloads and continues from that record. The
// standby's scale-up, sent beside the refused record, is found by the reload
// as an orphan: adopted (record Aborted, still the other's last switch), the
// flap guard then refuses the switchover (Warning Event), and the standby is
// scaled back after the abort delay.
func TestRecordChangedByAnotherAgentIsNotOverwritten(t *testing.T) {
	t.Parallel()
	ctx, _, admin := startCluster(t, 60*time.Second)
	agentClient := agentClientset(ctx, t, admin, actuate.Rules())
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-b", 0, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-a", 1, map[string]string{contract.AnnStandby: "broker-b", contract.AnnAbortDelay: "2s"})
	})
	pod := onlyPod(ctx, t, admin, "broker-a")
	send, done := runActuator(ctx, t, agentClient, admin.ns, false)
	defer done()

	send(pod, podsignal.Anomalous) // loads broker-a: its Idle record is written
	waitDeployment(ctx, t, admin, "broker-a", "record Idle", func(d *appsv1.Deployment) bool { return recordOf(d).Phase == actuate.PhaseIdle })
	otherRec := actuate.Record{Phase: actuate.PhaseIdle, Standby: "broker-b", LastSwitch: time.Now()}
	other, err := json.Marshal(otherRec)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{contract.AnnRecord: string(other)}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AppsV1().Deployments(admin.ns).Patch(ctx, "broker-a", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	send(pod, podsignal.Anomalous)
	send(pod, podsignal.Anomalous) // the decision: its write is refused, the record reloaded
	waitEvent(ctx, t, admin, "broker-a", "OrphanedStandby")
	if rec := record(ctx, t, admin, "broker-a"); rec.Phase != actuate.PhaseAborted || !rec.LastSwitch.Equal(otherRec.LastSwitch) {
		t.Fatalf("record after the refused decision: %+v, want Aborted continuing %s", rec, other)
	}
	for range 3 {
		send(pod, podsignal.Anomalous)
	}
	waitEvent(ctx, t, admin, "broker-a", "FlapGuard")
	waitDeployment(ctx, t, admin, "broker-b", "scaled back to 0 after the abort delay", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 0 })
	done()
	// The agent's own later writes build on the other's record instead of
	// replacing it.
	if rec := record(ctx, t, admin, "broker-a"); rec.Active() || !rec.LastSwitch.Equal(otherRec.LastSwitch) {
		t.Errorf("record overwritten: %+v, want one continuing %s", rec, other)
	}
	if d := getDeployment(ctx, t, admin, "broker-a"); *d.Spec.Replicas != 1 {
		t.Errorf("primary scaled to %d", *d.Spec.Replicas)
	}
}
