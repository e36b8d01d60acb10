package actuate

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

const mi = 1 << 20

// memSample is a sample of pod broker-0 whose message says its memory:
// percent of a limit of limitMi, climbing growthMi MiB a second
// (memory_growth_rate is in bytes per second).
func memSample(state podsignal.State, pct, growthMi float64, limitMi int64) func(time.Time) Input {
	return memSampleOf("broker-0", state, pct, growthMi, limitMi)
}

func memSampleOf(pod string, state podsignal.State, pct, growthMi float64, limitMi int64) func(time.Time) Input {
	return func(at time.Time) Input {
		p := 0.9
		if state == podsignal.Healthy {
			p = 0.1
		}
		in := Sample(at, state, &p)
		in.Pod, in.MemoryLimit, in.MemoryPercent, in.MemoryGrowth = pod, float64(limitMi*mi), ptr.To(pct), ptr.To(growthMi*mi)
		return in
	}
}

// withSlope adds the sidecar's current slope (Mi/s) to a sample.
func withSlope(smp func(time.Time) Input, slopeMi float64) func(time.Time) Input {
	return func(at time.Time) Input {
		in := smp(at)
		in.MemorySlope = ptr.To(slopeMi * mi)
		return in
	}
}

func applied(at time.Time) Input { return ResizeApplied(at) }
func deferred(at time.Time) Input {
	return ResizeRefused(at, "Deferred: Node didn't have enough capacity")
}

func TestGateResizesInPlaceBeforeSwitchingOver(t *testing.T) {
	sec := time.Second
	withCeiling := func(r contract.Redundancy, ceilingMi uint64) contract.Policy {
		return contract.Policy{Standby: "b", Redundancy: r, Gates: contract.DefaultGates(), MemoryCeiling: ceilingMi * mi}
	}
	cold := withCeiling(contract.Cold, 256)
	hot := withCeiling(contract.Hot, 256)
	noCeiling := withCeiling(contract.Cold, 0)
	// 80 % of 100 Mi, climbing 0.05 Mi/s: the 256 Mi ceiling is room for
	// 3520 s, far beyond the 135 s a switchover may take.
	leak := memSample(podsignal.Anomalous, 80, 0.05, 100)
	after := memSample(podsignal.Healthy, 31.3, 0.01, 256) // the cgroup has the new limit
	debounced := func(last []string, phase Phase) []step {
		return []step{{0, leak, nil, PhaseSuspect}, {sec, leak, nil, PhaseSuspect}, {sec, leak, last, phase}}
	}
	decided := []string{"event:ResizeDecided", "resize:broker-0:256Mi"}
	tests := []struct {
		name   string
		policy contract.Policy
		rec    Record
		steps  []step
	}{
		{"applied by the kubelet and seen by the sidecar: no switchover", cold, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, healthy, nil, PhaseResizing}, // a sample without the new limit: wait
			step{sec, applied, nil, PhaseResizing},
			step{sec, after, []string{"keep:256Mi", "event:Resized"}, PhaseIdle},
		)},
		{"seen by the sidecar before the kubelet's status: done on the status", hot, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, after, nil, PhaseResizing},
			step{sec, applied, []string{"keep:256Mi", "event:Resized"}, PhaseIdle},
		)},
		{"another pod's limit is not this pod's", cold, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, applied, nil, PhaseResizing},
			step{sec, memSampleOf("broker-1", podsignal.Healthy, 10, 0, 256), nil, PhaseResizing},
		)},
		{"the anomaly back after a resize, within the cool-down: switchover", cold, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, applied, nil, PhaseResizing},
			step{sec, after, []string{"keep:256Mi", "event:Resized"}, PhaseIdle},
			step{time.Minute, memSample(podsignal.Anomalous, 90, 0.05, 256), nil, PhaseSuspect},
			step{sec, memSample(podsignal.Anomalous, 90, 0.05, 256), nil, PhaseSuspect},
			step{sec, memSample(podsignal.Anomalous, 90, 0.05, 256), []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		)},
		{"deferred by the kubelet: the old size back and a switchover", cold, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, deferred, []string{"resize:broker-0:100Mi", "event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		)},
		{"not in effect within the resize timeout: the old size back and a switchover", cold, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, applied, nil, PhaseResizing},
			step{10 * sec, tick, nil, PhaseResizing},
			step{10 * sec, tick, []string{"resize:broker-0:100Mi", "event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		)},
		{"a crash during the resize fails over at once", cold, Record{}, append(debounced(decided, PhaseResizing),
			step{sec, gone, []string{"event:Failover", "scale:1"}, PhaseFailover},
			step{sec, applied, nil, PhaseFailover},
		)},
		{"a refusal within the flap guard's cool-down: the old size back, no switchover", cold, Record{LastSwitch: time.Unix(1000, 0)}, append(debounced(decided, PhaseResizing),
			step{sec, deferred, []string{"resize:broker-0:100Mi", "warn:FlapGuard"}, PhaseIdle},
		)},
		{"no ceiling: a switchover as always", noCeiling, Record{}, debounced([]string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady)},
		{"at the ceiling: a switchover", withCeiling(contract.Cold, 100), Record{}, debounced([]string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady)},
		{"a leak that would use the new room up before a switchover completes: a switchover", withCeiling(contract.Cold, 200), Record{}, []step{
			// 90 % of 100 Mi climbing 2 Mi/s: 200 Mi lasts 55 s < 135 s.
			{0, memSample(podsignal.Anomalous, 90, 2, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 90, 2, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 90, 2, 100), []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		}},
		{"a hot standby Ready: a switchover takes the hold only, so the same leak is resized", withCeiling(contract.Hot, 200), Record{}, []step{
			// the 200 Mi ceiling lasts 55 s > the 15 s hold.
			{0, ready, nil, PhaseIdle},
			{sec, memSample(podsignal.Anomalous, 90, 2, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 90, 2, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 90, 2, 100), []string{"event:ResizeDecided", "resize:broker-0:200Mi"}, PhaseResizing},
		}},
		{"memory neither climbing nor above half the limit: a switchover", cold, Record{}, []step{
			{0, memSample(podsignal.Anomalous, 30, -0.01, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 30, -0.01, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 30, -0.01, 100), []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		}},
		{"a step that stopped above half the limit: resized, its room lasts", cold, Record{}, []step{
			{0, memSample(podsignal.Anomalous, 60, 0, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 60, 0, 100), nil, PhaseSuspect},
			{sec, memSample(podsignal.Anomalous, 60, 0, 100), decided, PhaseResizing},
		}},
		{"a sample that says nothing of memory: a switchover", cold, Record{}, []step{
			{0, anom, nil, PhaseSuspect}, {sec, anom, nil, PhaseSuspect},
			{sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, NewGate(tt.policy, tt.rec), tt.steps) })
	}
}

// TestGateSaysWhyItSwitchesOverInsteadOfResizing: with a ceiling set, the
// switchover's Event names the reason no resize answered the anomaly.
func TestGateSaysWhyItSwitchesOverInsteadOfResizing(t *testing.T) {
	p := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates(), MemoryCeiling: 200 * mi}
	for _, tc := range []struct {
		name string
		in   func(time.Time) Input
		want string
	}{
		{"at the ceiling", memSample(podsignal.Anomalous, 80, 0.05, 200), "the limit 200Mi is at the ceiling 200Mi"},
		{"a fast leak", memSample(podsignal.Anomalous, 90, 2, 100), "would be used up in 55s, before a switchover could complete"},
		{"not climbing, below half the limit", memSample(podsignal.Anomalous, 40, 0, 100), "memory is neither climbing (memory_growth_rate 0) nor above half its limit (40.0%)"},
		// The current slope, when sent, judges: memory_growth_rate's ten
		// minutes say 0.05 Mi/s, the last 30 s 2 Mi/s.
		{"a leak that has just begun", withSlope(memSample(podsignal.Anomalous, 90, 0.05, 100), 2), "would be used up in 55s, before a switchover could complete"},
		{"a small leak that has just stopped", withSlope(memSample(podsignal.Anomalous, 30, 0.05, 100), 0), "memory is neither climbing (memory_slope_bytes_per_second 0)"},
		{"no memory in the sample", anom, "says nothing of the container's memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1000, 0)}
			g := NewGate(p, Record{})
			var acts []Action
			for range p.Gates.Debounce {
				acts = g.Step(tc.in(clk.advance(time.Second)))
			}
			if len(acts) == 0 || acts[0].Reason != "SwitchoverDecided" || !strings.Contains(acts[0].Message, tc.want) {
				t.Fatalf("actions %+v, want a SwitchoverDecided saying %q", acts, tc.want)
			}
		})
	}
}

func TestGateResumesAResizeInProgress(t *testing.T) {
	p := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates(), MemoryCeiling: 256 * mi}
	rec := Record{Phase: PhaseResizing, Decision: time.Unix(1000, 0), Resize: Resize{Pod: "broker-0", From: 100 * mi, To: 150 * mi, Kubelet: true}}
	g := NewGate(p, rec)
	if got, want := summary(g.Resume()), []string{"resize:broker-0:150Mi"}; !slices.Equal(got, want) {
		t.Fatalf("Resume = %v, want %v", got, want)
	}
	if d, ok := g.Deadline(); !ok || !d.Equal(time.Unix(1000, 0).Add(p.Gates.ResizeTimeout)) {
		t.Fatalf("deadline %v %v, want the resize timeout after the decision", d, ok)
	}
}

// sendMemory delivers an anomalous or healthy observation of the primary's
// pod whose message says its memory, as a sidecar's does.
func (r *rig) sendMemory(st podsignal.State, pct, growthMi float64, limitMi int64) {
	prev := r.last[r.pod]
	r.last[r.pod] = st
	limit := float64(limitMi * mi)
	m := &podsignal.Message{State: st, MemoryLimitBytes: &limit,
		Features: &podsignal.Features{MemoryPercent: ptr.To(pct), MemoryGrowthRate: ptr.To(growthMi * mi)}}
	r.in <- podsignal.Observation{PodID: podsignal.PodID{Namespace: ns, Pod: r.pod}, State: st, Previous: prev, Transition: st != prev,
		Source: podsignal.SourcePublish, Message: m, Received: time.Now()}
}

// withBroker gives the pod an injected sidecar watching container
// mosquitto, which has memory limit and request limitMi.
func (f *fakeCluster) withBroker(pod string, limitMi int64) {
	f.Lock()
	defer f.Unlock()
	p := f.Pods[key(ns, pod)]
	q := *resource.NewQuantity(limitMi*mi, resource.BinarySI)
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: q}, Requests: corev1.ResourceList{corev1.ResourceMemory: q}}
	p.Spec.InitContainers = []corev1.Container{{Name: contract.SidecarName, Args: []string{"run", "--container=mosquitto"}}}
	p.Spec.Containers = []corev1.Container{{Name: "exporter"}, {Name: "mosquitto", Resources: res}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "mosquitto", Resources: res.DeepCopy()}}
	for _, d := range f.Deps { // the pair's templates: the pod's spec as the ReplicaSet made it
		d.Spec.Template.Spec = *p.Spec.DeepCopy()
	}
}

func TestActuatorResizesTheBrokerInPlace(t *testing.T) {
	policy := maps.Clone(fast)
	policy[contract.AnnMemoryCeiling] = "256Mi"
	policy[contract.AnnCooldown] = "5m"
	t.Run("applied and seen by the sidecar: no switchover, the standby never started", func(t *testing.T) {
		f := newFakeCluster()
		pod := f.addPair(ns, "primary", "standby", policy)
		f.withBroker(pod, 100)
		r := start(t, f, pod, Config{Instance: "node-0"})
		for range 3 {
			r.sendMemory(podsignal.Anomalous, 80, 0.05, 100)
		}
		f.await(t, "the broker container resized, its request by as much", func() bool {
			return slices.Contains(f.Writes, "resize edge/"+pod+" mosquitto 256Mi 256Mi")
		})
		f.await(t, "the kubelet's status read", func() bool {
			return r.record("primary").Resize.Kubelet
		})
		r.sendMemory(podsignal.Healthy, 31, 0.01, 256) // the sidecar reads the new limit
		f.await(t, "Resized Event", func() bool { return slices.Contains(f.ReasonsLocked(), "Resized") })
		f.Lock()
		defer f.Unlock()
		if rec := r.record("primary"); rec.Phase != PhaseIdle || rec.LastResize.IsZero() {
			t.Errorf("record %+v, want Idle with the resize's time", rec)
		}
		if n := r.replicas("standby"); n != 0 || slices.ContainsFunc(f.Writes, func(w string) bool { return strings.HasPrefix(w, "scale ") }) {
			t.Errorf("standby at %d; writes %q: a resize that took needs no standby", n, f.Writes)
		}
		// The size survives: recorded on both, the template of the standby
		// (at 0) given it, the running primary's left alone (it would roll).
		for _, d := range []string{"primary", "standby"} {
			if got := f.depLocked(ns, d).Annotations[contract.AnnMemorySize]; got != "268435456" {
				t.Errorf("%s's %s = %q, want 256Mi in bytes", d, contract.AnnMemorySize, got)
			}
		}
		if !slices.Contains(f.Writes, "template edge/standby mosquitto 256Mi 256Mi") || slices.ContainsFunc(f.Writes, func(w string) bool { return strings.HasPrefix(w, "template edge/primary ") }) {
			t.Errorf("writes %q: want the standby's template sized and the primary's not", f.Writes)
		}
	})
	t.Run("deferred by the kubelet: the old size back, then the switchover", func(t *testing.T) {
		f := newFakeCluster()
		f.Resize = corev1.PodReasonDeferred
		pod := f.addPair(ns, "primary", "standby", policy)
		f.withBroker(pod, 100)
		r := start(t, f, pod, Config{Instance: "node-0"})
		for range 3 {
			r.sendMemory(podsignal.Anomalous, 80, 0.05, 100)
		}
		f.await(t, "the old size back and the standby scaled up", func() bool {
			return r.replicas("standby") == 1 && slices.Contains(f.Writes, "resize edge/"+pod+" mosquitto 100Mi 100Mi")
		})
		f.Lock()
		defer f.Unlock()
		// The scale-up goes out with the switchover's record (early), the
		// undoing after it: their order does not matter, both follow the try.
		if !before(f.Writes, "resize edge/"+pod+" mosquitto 256Mi 256Mi", "resize edge/"+pod+" mosquitto 100Mi 100Mi") ||
			!before(f.Writes, "resize edge/"+pod+" mosquitto 256Mi 256Mi", "scale edge/standby 1") {
			t.Errorf("writes %q: want the resize, then its undoing and the standby", f.Writes)
		}
	})
	t.Run("a pod whose broker has no memory limit: refused, switchover", func(t *testing.T) {
		f := newFakeCluster()
		pod := f.addPair(ns, "primary", "standby", policy)
		f.withBroker(pod, 100)
		f.Lock()
		delete(f.Pods[key(ns, pod)].Spec.Containers[1].Resources.Limits, corev1.ResourceMemory)
		f.Unlock()
		r := start(t, f, pod, Config{Instance: "node-0"})
		for range 3 {
			r.sendMemory(podsignal.Anomalous, 80, 0.05, 100)
		}
		f.await(t, "standby scaled up", func() bool { return r.replicas("standby") == 1 })
		r.logs.wait(t, "the refusal logged", func(m map[string]any) bool {
			return str(m["msg"]) == "resize in place refused" && strings.Contains(str(m["why"]), "has no memory limit")
		})
	})
}

func TestTheSizeTheBrokerNeededSurvives(t *testing.T) {
	sized := maps.Clone(fast)
	sized[contract.AnnMemorySize] = strconv.Itoa(150 * mi)
	t.Run("a pod of the pair that starts smaller is resized in place, once", func(t *testing.T) {
		f := newFakeCluster()
		pod := f.addPair(ns, "primary", "standby", sized)
		f.withBroker(pod, 100)
		r := start(t, f, pod, Config{Instance: "node-0"})
		// Run takes one signal at a time: once the third is taken, the
		// second has been handled.
		for range 3 {
			r.sendMemory(podsignal.Healthy, 10, 0, 100)
		}
		f.Lock()
		defer f.Unlock()
		n := 0
		for _, w := range f.Writes {
			if strings.HasPrefix(w, "resize ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("writes %q: want one resize for one pod and size", f.Writes)
		}
	})
	t.Run("the retired primary's template takes the size, once it runs no pod", func(t *testing.T) {
		f := newFakeCluster()
		pod := f.addPair(ns, "primary", "standby", sized)
		f.withBroker(pod, 150) // resized already: nothing to do in place
		f.Lock()
		for _, d := range f.Deps {
			d.Spec.Template.Spec.Containers[1].Resources = corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(100*mi, resource.BinarySI)},
				Requests: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(50*mi, resource.BinarySI)},
			}
		}
		f.Unlock()
		r := start(t, f, pod, Config{Instance: "node-0"})
		r.send(podsignal.Healthy)
		for range 3 {
			r.send(podsignal.Anomalous)
		}
		f.await(t, "standby Ready seen", func() bool { return r.record("primary").Phase == PhaseConfirm })
		r.send(podsignal.Anomalous)
		f.await(t, "the retired primary's template sized", func() bool {
			return slices.Contains(f.Writes, "template edge/primary mosquitto 150Mi 100Mi")
		})
		f.Lock()
		defer f.Unlock()
		if !before(f.Writes, "scale edge/primary 0", "template edge/primary mosquitto 150Mi 100Mi") {
			t.Errorf("writes %q: the template is written only once the primary runs no pod", f.Writes)
		}
	})
}
