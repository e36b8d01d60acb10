package actuate

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// Fast tests of the actuator's own logic (Run, step, do, load, retire,
// resume) on fakeCluster; the _k8s tests run the same against a real API
// server.

const ns = "edge"

// fast are gates that need no waiting: the decision after 3 anomalous
// samples, the retirement after 1 more once the standby is Ready.
var fast = map[string]string{
	contract.AnnRedundancy: string(contract.Cold), contract.AnnDebounce: "3", contract.AnnReconfirm: "1",
	contract.AnnHold: "0s", contract.AnnAbortDelay: "0s", contract.AnnCooldown: "0s",
}

type rig struct {
	t    *testing.T
	act  *Actuator
	f    *fakeCluster
	in   chan podsignal.Observation
	pod  string
	last map[string]podsignal.State
	logs *lineSink
	// cancel ends Run's context (from anywhere, also inside a Cluster call
	// of the actuator); stop does and waits for Run to return. Both may be
	// called more than once.
	cancel context.CancelFunc
	stop   func()
}

// start runs an Actuator on f (or on cfg.Cluster, a view of f) until the
// test ends or r.stop; pod is the primary's.
func start(t *testing.T, f *fakeCluster, pod string, cfg Config) *rig {
	t.Helper()
	r := &rig{t: t, f: f, in: make(chan podsignal.Observation), pod: pod, last: map[string]podsignal.State{}, logs: newLineSink()}
	if cfg.Cluster == nil {
		cfg.Cluster = f
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(r.logs, nil))
	act, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r.act, r.cancel = act, cancel
	go func() { done <- act.Run(ctx, r.in) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			r.logs.dump(t) // the actuator's decisions, for the failure
		}
	})
	return r
}

// send delivers one observation of pod (the primary's unless given).
func (r *rig) send(st podsignal.State, pod ...string) {
	p := r.pod
	if len(pod) > 0 {
		p = pod[0]
	}
	prev := r.last[p]
	r.last[p] = st
	r.in <- podsignal.Observation{PodID: podsignal.PodID{Namespace: ns, Pod: p}, State: st, Previous: prev, Transition: st != prev,
		Source: podsignal.SourcePublish, Message: &podsignal.Message{State: st}, Received: time.Now()}
}

func (r *rig) record(name string) Record {
	var rec Record
	if raw := r.f.depLocked(ns, name).Annotations[contract.AnnRecord]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			r.t.Fatalf("record of %s: %v", name, err)
		}
	}
	return rec
}

func (r *rig) replicas(name string) int32 { return *r.f.depLocked(ns, name).Spec.Replicas }

// before reports whether write a came before write b (both present).
func before(writes []string, a, b string) bool {
	i, j := slices.Index(writes, a), slices.Index(writes, b)
	return i >= 0 && j >= 0 && i < j
}

func TestConfirmedAnomalyRetiresThePrimaryOnlyOnceTheStandbyIsReady(t *testing.T) {
	for _, tc := range []struct {
		name      string
		autoReady bool
	}{
		{"standby Ready at once", true},
		{"standby Ready later", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			f.AutoReady = tc.autoReady
			r := start(t, f, f.addPair(ns, "primary", "standby", fast), Config{Instance: "node-0"})
			r.send(podsignal.Healthy)
			for range 3 {
				r.send(podsignal.Anomalous)
			}
			f.await(t, "standby scaled up, decision recorded", func() bool {
				ph := r.record("primary").Phase
				return r.replicas("standby") == 1 && (ph == PhaseWaitReady || ph == PhaseConfirm && tc.autoReady)
			})
			if !tc.autoReady {
				// Anomalous samples go on; the standby is not Ready.
				for range 5 {
					r.send(podsignal.Anomalous)
				}
				f.await(t, "samples taken", func() bool { return r.record("primary").Phase == PhaseWaitReady })
				f.Lock()
				if n := r.replicas("primary"); n != 1 {
					t.Fatalf("primary at %d replicas while its standby is not Ready", n)
				}
				f.Unlock()
				f.setReady(ns, "standby", 1)
			}
			f.await(t, "standby Ready seen", func() bool { return r.record("primary").Phase == PhaseConfirm })
			r.send(podsignal.Anomalous) // the reconfirmation
			f.await(t, "roles exchanged", func() bool {
				return r.replicas("primary") == 0 && r.f.depLocked(ns, "primary").Annotations[contract.AnnRole] == "standby" &&
					r.f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary"
			})
			f.await(t, "RolesExchanged Event", func() bool { return slices.Contains(f.ReasonsLocked(), "RolesExchanged") })
			f.Lock()
			defer f.Unlock()
			w := f.Writes
			for _, order := range [][2]string{
				{"record edge/primary WaitReady", "scale edge/primary 0"},
				{"record edge/primary Retiring", "scale edge/primary 0"},                           // write-ahead
				{"scale edge/standby 1", "scale edge/primary 0"},                                   // make before break
				{"annotations edge/standby role=primary", "annotations edge/primary role=standby"}, // new primary first
			} {
				if !before(w, order[0], order[1]) {
					t.Errorf("%q not before %q in %q", order[0], order[1], w)
				}
			}
			if rec := r.record("standby"); rec.Phase != PhaseIdle || rec.LastSwitch.IsZero() || rec.Standby != "primary" {
				t.Errorf("new primary's record %+v, want Idle with the switch time and primary as its standby", rec)
			}
			if raw, ok := f.depLocked(ns, "primary").Annotations[contract.AnnRecord]; ok {
				t.Errorf("old primary keeps a record %s", raw)
			}
		})
	}
}

func TestCrashFailsOverWithoutReconfirming(t *testing.T) {
	f := newFakeCluster()
	ann := map[string]string{contract.AnnRedundancy: string(contract.Cold), contract.AnnReconfirm: "1000", contract.AnnHold: "1h"}
	r := start(t, f, f.addPair(ns, "primary", "standby", ann), Config{})
	r.send(podsignal.Healthy)
	r.send(podsignal.Gone)
	f.await(t, "failed over", func() bool {
		return r.replicas("primary") == 0 && r.replicas("standby") == 1 && r.f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary"
	})
	f.Lock()
	defer f.Unlock()
	if !slices.Contains(f.Writes, "record edge/primary Failover") {
		t.Errorf("no Failover record written before acting: %q", f.Writes)
	}
	if !slices.Contains(f.Writes, "condition edge/"+r.pod+" amf.io/healthy=False") {
		t.Errorf("readiness gate not set False for a gone pod: %q", f.Writes)
	}
}

// TestASilentSidecarIsFailedOverOnlyAfterItsGrace: a sidecar's Last Will
// (its silence, not its broker's crash) is answered by the failover only
// when the grace passed with no word from its pod, through the driver's own
// deadline.
func TestASilentSidecarIsFailedOverOnlyAfterItsGrace(t *testing.T) {
	f := newFakeCluster()
	const grace = 300 * time.Millisecond
	ann := map[string]string{contract.AnnRedundancy: string(contract.Cold), contract.AnnSidecarGrace: grace.String()}
	r := start(t, f, f.addPair(ns, "primary", "standby", ann), Config{})
	r.send(podsignal.Healthy)
	silent := time.Now()
	r.in <- podsignal.Observation{PodID: podsignal.PodID{Namespace: ns, Pod: r.pod}, State: podsignal.Gone, Previous: podsignal.Healthy, Transition: true,
		Source: podsignal.SourceWill, Message: &podsignal.Message{State: podsignal.Gone}, Received: silent}
	f.await(t, "failed over", func() bool { return r.replicas("standby") == 1 })
	if took := time.Since(silent); took < grace {
		t.Errorf("failed over %v after the silence, within its grace of %v", took, grace)
	}
	f.Lock()
	defer f.Unlock()
	if !before(f.Writes, "event SidecarSilent", "scale edge/standby 1") {
		t.Errorf("want the SidecarSilent event, then the standby scaled up: %q", f.Writes)
	}
}

// TestAReadinessGateRefusedIsWrittenOnceTheAPIServerTakesIt: the gate is
// written at transitions only; one refused (RBAC warming up after an API
// server restart) is tried again until it is written, or the pod stays out
// of its Services with its broker healthy.
func TestAReadinessGateRefusedIsWrittenOnceTheAPIServerTakesIt(t *testing.T) {
	f := newFakeCluster()
	r := start(t, f, f.addPair(ns, "primary", "standby", map[string]string{}), Config{})
	f.Lock()
	f.Fail["condition"] = errors.New(`pods "primary-rs-0" is forbidden: RBAC warming up`)
	f.Unlock()
	r.send(podsignal.Healthy)
	// The record is written after the gate was tried, in the same signal.
	f.await(t, "the signal handled", func() bool { return slices.Contains(f.Writes, "record edge/primary Idle") })
	want := "condition edge/" + r.pod + " amf.io/healthy=True"
	f.Lock()
	if slices.Contains(f.Writes, want) {
		t.Fatalf("the gate was written while refused: %q", f.Writes)
	}
	delete(f.Fail, "condition")
	f.Unlock()
	f.await(t, "the gate written on a retry", func() bool { return slices.Contains(f.Writes, want) })
}

func TestClearedAnomalyScalesAColdStandbyBackOnlyWhilePrimaryIsReady(t *testing.T) {
	f := newFakeCluster()
	f.AutoReady = false
	r := start(t, f, f.addPair(ns, "primary", "standby", fast), Config{})
	r.send(podsignal.Healthy)
	for range 3 {
		r.send(podsignal.Anomalous)
	}
	f.await(t, "standby scaled up", func() bool { return r.replicas("standby") == 1 })
	f.setReady(ns, "primary", 0) // the primary is not Ready now: its standby must stay
	r.send(podsignal.Healthy)    // aborted; with no abort delay, the scale-back is due at once
	r.logs.wait(t, "scale-back refused", func(l map[string]any) bool {
		return l["msg"] == "decision" && l["action"] == string(ActScaleStandby) && strings.Contains(str(l["error"]), ErrPrimaryNotReady.Error())
	})
	f.Lock()
	if n := r.replicas("standby"); n != 1 {
		t.Fatalf("standby scaled back to %d while the primary is not Ready", n)
	}
	f.Unlock()
	f.setReady(ns, "primary", 1) // the retry (2 s later) finds it Ready
	f.await(t, "standby scaled back", func() bool { return r.replicas("standby") == 0 && r.record("primary").Phase == PhaseIdle })
}

func TestRecordMovedByAnotherAgentIsFollowedNotOverwritten(t *testing.T) {
	f := newFakeCluster()
	r := start(t, f, f.addPair(ns, "primary", "standby", fast), Config{})
	r.send(podsignal.Healthy)
	f.await(t, "record initialised", func() bool { return r.record("primary").Phase == PhaseIdle })
	// Another agent decided meanwhile and scaled the standby up.
	theirs := Record{Phase: PhaseWaitReady, Standby: "standby", Decision: time.Now().Add(-time.Second).UTC().Truncate(time.Second)}
	b, _ := json.Marshal(theirs)
	f.setRecord(ns, "primary", string(b))
	for range 3 {
		r.send(podsignal.Anomalous)
	}
	f.await(t, "the other agent's switchover continued", func() bool { return r.record("primary").Phase == PhaseConfirm })
	f.Lock()
	defer f.Unlock()
	if got := r.record("primary").Decision; !got.Equal(theirs.Decision) {
		t.Errorf("decision %v, want the other agent's %v kept", got, theirs.Decision)
	}
	if slices.Contains(f.Writes, "record edge/primary WaitReady") {
		t.Errorf("decided again over another agent's record: %q", f.Writes)
	}
}

// TestRefusedStepIsTakenOnceTheAPIIsBackWithoutAnotherInput: a step whose
// record the API refuses is kept, not forgotten, and nothing of it is done
// before its record is written; once the API is back the record and the
// actions follow without another input. A standby's readiness is seen once
// and a crashed primary sends nothing more, so waiting for the next input
// would wait for good.
func TestRefusedStepIsTakenOnceTheAPIIsBackWithoutAnotherInput(t *testing.T) {
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name    string
		manual  bool                      // the standby Ready only by setReady
		refuse  []string                  // the fake's operations refused during the step
		before  func(*rig)                // brings the pair to the step (the API up)
		step    func(*rig)                // the one input whose step is refused
		was     Phase                     // the record while refused
		outcome func(*rig) (string, bool) // what must follow once the API is back
	}{
		{name: "the decision (record and scale-up refused)", refuse: []string{"record", "scale"},
			step: func(r *rig) {
				for range 3 {
					r.send(podsignal.Anomalous)
				}
			},
			was: PhaseIdle,
			outcome: func(r *rig) (string, bool) {
				return "standby scaled up, decision recorded", r.replicas("standby") == 1 && r.record("primary").Active()
			}},
		{name: "the standby's readiness (record refused)", manual: true, refuse: []string{"record"},
			before: func(r *rig) {
				for range 3 {
					r.send(podsignal.Anomalous)
				}
				r.f.await(r.t, "standby scaled up", func() bool { return r.replicas("standby") == 1 && r.record("primary").Phase == PhaseWaitReady })
			},
			step: func(r *rig) { r.f.setReady(ns, "standby", 1) },
			was:  PhaseWaitReady,
			outcome: func(r *rig) (string, bool) {
				return "record Confirm", r.record("primary").Phase == PhaseConfirm
			}},
		{name: "a crash (record and scale-up refused)", refuse: []string{"record", "scale"},
			step: func(r *rig) { r.send(podsignal.Gone) },
			was:  PhaseIdle,
			outcome: func(r *rig) (string, bool) {
				return "failed over", r.replicas("primary") == 0 && r.replicas("standby") == 1 &&
					r.f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary"
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			f.AutoReady = !tc.manual
			r := start(t, f, f.addPair(ns, "primary", "standby", fast), Config{})
			r.send(podsignal.Healthy)
			f.await(t, "record initialised", func() bool { return r.record("primary").Phase == PhaseIdle })
			if tc.before != nil {
				tc.before(r)
			}
			f.Lock()
			standby := r.replicas("standby")
			for _, op := range tc.refuse {
				f.Fail[op] = down
			}
			f.Unlock()
			tc.step(r)
			r.logs.wait(t, "record write refused", func(l map[string]any) bool { return l["msg"] == "switchover record not written" })
			f.Lock()
			if ph := r.record("primary").Phase; ph != tc.was {
				t.Errorf("record %v while the API refuses it, want %v", ph, tc.was)
			}
			if n := r.replicas("standby"); n != standby {
				t.Errorf("standby scaled %d → %d before its record was written", standby, n)
			}
			for _, op := range tc.refuse {
				delete(f.Fail, op)
			}
			f.Unlock()
			what, _ := tc.outcome(r)
			f.await(t, what+", with no input since", func() bool { _, ok := tc.outcome(r); return ok })
		})
	}
}

func TestInterruptedRetirementResumesOnTheStandbysSignal(t *testing.T) {
	f := newFakeCluster()
	f.addPair(ns, "primary", "standby", fast)
	// Stopped after the primary went to 0, before the role exchange: the
	// primary has no pod left to signal; the standby serves.
	f.Lock()
	rec, _ := json.Marshal(Record{Phase: PhaseRetiring, Standby: "standby", Decision: time.Now().Add(-time.Minute)})
	p := f.depLocked(ns, "primary")
	p.Spec.Replicas, p.Status.ReadyReplicas, p.Status.Replicas = new(int32), 0, 0
	p.Annotations[contract.AnnRecord] = string(rec)
	sb := f.depLocked(ns, "standby")
	*sb.Spec.Replicas, sb.Status.ReadyReplicas, sb.Status.Replicas = 1, 1, 1
	f.Unlock()
	standbyPod := f.addPod(ns, "standby")
	r := start(t, f, standbyPod, Config{})
	r.send(podsignal.Healthy)
	f.await(t, "roles exchanged", func() bool {
		return r.f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary" &&
			r.f.depLocked(ns, "primary").Annotations[contract.AnnRole] == "standby"
	})
	f.Lock()
	defer f.Unlock()
	if n := r.replicas("standby"); n != 1 {
		t.Errorf("new primary at %d replicas, want 1", n)
	}
}

func TestDryRunDecidesAndWritesNothing(t *testing.T) {
	f := newFakeCluster()
	r := start(t, f, f.addPair(ns, "primary", "standby", fast), Config{DryRun: true})
	r.send(podsignal.Healthy)
	for range 3 {
		r.send(podsignal.Anomalous)
	}
	r.logs.wait(t, "dry-run decision", func(l map[string]any) bool {
		return l["msg"] == "decision" && l["action"] == string(ActScaleStandby) && l["dry_run"] == true
	})
	f.Lock()
	defer f.Unlock()
	if len(f.Writes) > 0 {
		t.Errorf("dry run wrote %q", f.Writes)
	}
}

func TestSwitchoverSaysWhatDroveItInTheEventTheRecordAndTheDecisionLines(t *testing.T) {
	const why = "memory_growth_rate +2.31, memory_percent +0.842"
	f := newFakeCluster()
	f.AutoReady = true
	r := start(t, f, f.addPair(ns, "primary", "standby", fast), Config{})
	r.send(podsignal.Healthy)
	for range 3 {
		r.in <- podsignal.Observation{PodID: podsignal.PodID{Namespace: ns, Pod: r.pod}, State: podsignal.Anomalous, Previous: podsignal.Healthy,
			Source: podsignal.SourcePublish, Message: &podsignal.Message{State: podsignal.Anomalous, Explanation: why}, Received: time.Now()}
	}
	f.await(t, "SwitchoverDecided Event", func() bool { return slices.Contains(f.ReasonsLocked(), "SwitchoverDecided") })
	if got := r.record("primary").Why; got != why {
		t.Errorf("record's why %q, want %q", got, why)
	}
	f.Lock()
	for _, ev := range f.Events {
		if ev.Reason == "SwitchoverDecided" && !strings.Contains(ev.Note, "driven by "+why) {
			t.Errorf("SwitchoverDecided note %q does not say %q", ev.Note, why)
		}
	}
	f.Unlock()
	r.logs.wait(t, "scale-up decision with the explanation", func(l map[string]any) bool {
		return l["msg"] == "decision" && l["action"] == string(ActScaleStandby) && l["explanation"] == why
	})
}

// addPod adds a pod of Deployment dep (through a ReplicaSet) and returns its name.
func (f *fakeCluster) addPod(ns, dep string) string {
	f.Lock()
	defer f.Unlock()
	rs := dep + "-rs"
	f.ReplicaSets[key(ns, rs)] = f.rssOwnedBy(ns, rs, "Deployment", dep)
	pod := rs + "-0"
	f.Pods[key(ns, pod)] = f.podOwnedBy(ns, pod, rs)
	return pod
}

func str(v any) string { s, _ := v.(string); return s }

// lineSink collects JSON log lines for waits on them.
type lineSink struct {
	mu      sync.Mutex
	lines   []map[string]any
	changed chan struct{}
}

func newLineSink() *lineSink { return &lineSink{changed: make(chan struct{})} }

func (s *lineSink) Write(p []byte) (int, error) {
	var l map[string]any
	if json.Unmarshal(p, &l) == nil {
		s.mu.Lock()
		s.lines = append(s.lines, l)
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
	return len(p), nil
}

func (s *lineSink) wait(t *testing.T, what string, match func(map[string]any) bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		s.mu.Lock()
		lines, ch := slices.Clone(s.lines), s.changed
		s.mu.Unlock()
		if slices.ContainsFunc(lines, match) {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: no such log line within 5 s", what)
		}
	}
}

func (s *lineSink) dump(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		t.Log(l)
	}
}

// A node-mode primary retired by this agent has its pods on this node
// deleted at once (Config.DeleteRetiredOn), not when its ReplicaSet gets to
// them; a sidecar pair's pod (its readiness gate holds it out), a pod on
// another node, and an agent not told its node leave it to the ReplicaSet;
// a refused delete does not hold the failover up.
func TestNodeModeRetirementDeletesTheRetiredPodOnItsNode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     contract.Mode
		on       string // Config.DeleteRetiredOn
		podNode  string
		fail     error
		deleted  bool
		refusals int // "retired pod not deleted" Warn lines
	}{
		{name: "node mode, the pod on this node", mode: contract.ModeNode, on: "n1", podNode: "n1", deleted: true},
		{name: "node mode, the pod on another node", mode: contract.ModeNode, on: "n1", podNode: "n2"},
		{name: "node mode, the agent not told its node", mode: contract.ModeNode, podNode: "n1"},
		{name: "sidecar mode", mode: contract.ModeSidecar, on: "n1", podNode: "n1"},
		{name: "node mode, the delete forbidden", mode: contract.ModeNode, on: "n1", podNode: "n1",
			fail: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "x", errors.New("denied by ValidatingAdmissionPolicy")), refusals: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			ann := map[string]string{contract.AnnRedundancy: string(contract.Cold), contract.AnnMode: string(tc.mode)}
			pod := f.addPair(ns, "primary", "standby", ann)
			f.Lock()
			f.Pods[key(ns, pod)].Spec.NodeName = tc.podNode
			f.Pods[key(ns, pod)].UID = "uid-pod"
			if tc.fail != nil {
				f.Fail = map[string]error{"delete": tc.fail}
			}
			f.Unlock()
			r := start(t, f, pod, Config{DeleteRetiredOn: tc.on})
			r.send(podsignal.Healthy)
			r.send(podsignal.Gone)
			f.await(t, "failed over", func() bool {
				return r.replicas("primary") == 0 && r.f.depLocked(ns, "standby").Annotations[contract.AnnRole] == "primary"
			})
			r.stop()
			f.Lock()
			defer f.Unlock()
			_, left := f.Pods[key(ns, pod)]
			if deleted := slices.Contains(f.Writes, "delete edge/"+pod); deleted != tc.deleted || left == tc.deleted {
				t.Errorf("pod deleted %t (still there %t), want %t: %q", deleted, left, tc.deleted, f.Writes)
			}
			if tc.deleted && !before(f.Writes, "annotations edge/primary role=standby", "delete edge/"+pod) {
				t.Errorf("want the roles exchanged before the delete: %q", f.Writes)
			}
			r.logs.mu.Lock()
			refusals := 0
			for _, l := range r.logs.lines {
				if strings.HasPrefix(str(l["msg"]), "retired pod not deleted") && l["level"] == "WARN" {
					refusals++
				}
			}
			r.logs.mu.Unlock()
			if refusals != tc.refusals {
				t.Errorf("%d refusals said, want %d", refusals, tc.refusals)
			}
		})
	}
}

// An agent that read a pair's record midway through another agent's
// failover (Retiring, written by a guard, while this agent's node was cut)
// resumes that retirement and, its standby not Ready in its eyes, tries it
// again every retryDelay; when the other agent has meanwhile exchanged the
// roles, the next try reads the record again and does nothing more. It
// tried for ever before: a failed try's own record write was refused (the
// record moved) and nothing said so, and the agent neither guarded the new
// primary nor recorded its node for the pair (the soak's seed 7, a power
// cut of a stateful pair's primary's node).
func TestAResumedRetirementThatAnotherAgentFinishedIsReadAgainNotRedone(t *testing.T) {
	f := newFakeCluster()
	pod := f.addPair(ns, "primary", "standby", fast)
	rec, _ := json.Marshal(Record{Phase: PhaseRetiring, Standby: "standby", Decision: time.Now().Add(-time.Second), Failover: true})
	f.setRecord(ns, "primary", string(rec))
	f.Lock()
	*f.depLocked(ns, "standby").Spec.Replicas = 1 // scaled up, not Ready in this agent's eyes
	f.Unlock()
	r := start(t, f, pod, Config{})
	r.send(podsignal.Healthy) // the primary's pod, thawed, signals: its Deployment is read, Retiring
	r.logs.wait(t, "the retirement resumed and refused", func(l map[string]any) bool {
		return l["action"] == string(ActRetirePrimary) && strings.Contains(str(l["error"]), "standby not Ready")
	})

	// The other agent finishes it on the old primary: at 0, its roles
	// exchanged, its record gone.
	f.Lock()
	before := len(f.Writes)
	p := f.depLocked(ns, "primary")
	p.Annotations = map[string]string{contract.AnnRole: "standby", contract.AnnPrimary: "standby"}
	*p.Spec.Replicas, p.Generation = 0, p.Generation+1
	p.Status = appsv1.DeploymentStatus{ObservedGeneration: p.Generation}
	f.ChangedLocked(p)
	f.Unlock()

	r.logs.wait(t, "the next try read the record again", func(l map[string]any) bool {
		return l["action"] == string(ActRetirePrimary) && strings.Contains(str(l["error"]), "switchover record changed")
	})
	f.Lock()
	defer f.Unlock()
	if after := f.Writes[before:]; len(after) > 0 {
		t.Errorf("wrote %q after the other agent's exchange; want nothing", after)
	}
}
