package actuate

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// Fast tests of an agent restarted in the middle of a node-loss failover, on
// fakeCluster: the guard (the standby's agent) is stopped right after each
// write of the failover, and a fresh agent on the same cluster must finish
// it exactly once. restart_k8s_test.go does the same against the real API
// server, lab/nodeloss with the agent's container killed on a real node.

// errHalted is what a stopped agent's calls get: nothing of them reaches
// the cluster.
var errHalted = errors.New("the agent was stopped")

// halting is fakeCluster as one agent sees it, stopped right after the write
// logged as at (clusterfake.Cluster.Writes): that write reaches the cluster, the
// agent's Run is cancelled before it sees the answer, and every later call
// of it fails without reaching the cluster, as a killed process's would.
// The agent's writes are serialised, so none slips past the stop.
type halting struct {
	*fakeCluster
	at     string
	halt   func() // cancels the agent's Run
	mu     sync.Mutex
	halted chan struct{} // closed at the stop
}

func newHalting(f *fakeCluster, at string) *halting {
	return &halting{fakeCluster: f, at: at, halted: make(chan struct{})}
}

func (h *halting) stopped() bool {
	select {
	case <-h.halted:
		return true
	default:
		return false
	}
}

// write runs one write of the agent and stops the agent right after it if
// it is the one to stop at.
func (h *halting) write(do func() error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped() {
		return errHalted
	}
	h.fakeCluster.Lock()
	n := len(h.fakeCluster.Writes)
	h.fakeCluster.Unlock()
	if err := do(); err != nil {
		return err
	}
	h.fakeCluster.Lock()
	hit := slices.Contains(h.fakeCluster.Writes[n:], h.at)
	h.fakeCluster.Unlock()
	if !hit {
		return nil
	}
	close(h.halted)
	h.halt()
	h.fakeCluster.Lock()
	h.fakeCluster.ChangedLocked(nil) // wake await
	h.fakeCluster.Unlock()
	return errHalted
}

func (h *halting) read() error {
	if h.stopped() {
		return errHalted
	}
	return nil
}

func (h *halting) Pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if err := h.read(); err != nil {
		return nil, err
	}
	return h.fakeCluster.Pod(ctx, ns, name)
}

func (h *halting) ReplicaSet(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
	if err := h.read(); err != nil {
		return nil, err
	}
	return h.fakeCluster.ReplicaSet(ctx, ns, name)
}

func (h *halting) Deployment(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
	if err := h.read(); err != nil {
		return nil, err
	}
	return h.fakeCluster.Deployment(ctx, ns, name)
}

func (h *halting) Deployments(ctx context.Context) ([]appsv1.Deployment, error) {
	if err := h.read(); err != nil {
		return nil, err
	}
	return h.fakeCluster.Deployments(ctx)
}

func (h *halting) WatchDeployment(ctx context.Context, ns, name, rv string, send func(*appsv1.Deployment)) error {
	if err := h.read(); err != nil {
		return err
	}
	return h.fakeCluster.WatchDeployment(ctx, ns, name, rv, send) // ends with Run's context, cancelled at the stop
}

func (h *halting) Scale(ctx context.Context, ns, name string, replicas int32) error {
	return h.write(func() error { return h.fakeCluster.Scale(ctx, ns, name, replicas) })
}

func (h *halting) SwapRecord(ctx context.Context, ns, name, prev, next string) error {
	return h.write(func() error { return h.fakeCluster.SwapRecord(ctx, ns, name, prev, next) })
}

func (h *halting) PatchAnnotations(ctx context.Context, ns, name string, ann map[string]*string) error {
	return h.write(func() error { return h.fakeCluster.PatchAnnotations(ctx, ns, name, ann) })
}

func (h *halting) SetPodCondition(ctx context.Context, ns, name string, c corev1.PodCondition) error {
	return h.write(func() error { return h.fakeCluster.SetPodCondition(ctx, ns, name, c) })
}

func (h *halting) CreateEvent(ctx context.Context, ev *eventsv1.Event) (string, error) {
	var name string
	err := h.write(func() (err error) { name, err = h.fakeCluster.CreateEvent(ctx, ev); return err })
	return name, err
}

func (h *halting) PatchEventSeries(ctx context.Context, ns, name string, s *eventsv1.EventSeries) error {
	return h.write(func() error { return h.fakeCluster.PatchEventSeries(ctx, ns, name, s) })
}

var _ Cluster = (*halting)(nil)

// TestNodeLossFailoverResumesAfterTheGuardStopsAtEachStep: the primary's
// node (node-a) is lost and the agent of the hot standby's node (node-b)
// fails it over; that agent is stopped right after each write of the
// failover (or with its record refused: decided, nothing written), and a
// fresh agent of node-b starts on the cluster as the stop left it. It hears
// the standby's pod (its sidecar reconnects) and, in the "lost again" runs,
// its own guard declares node-a lost once more (a fresh guard sees the
// silence anew); in the others node-a is never declared lost to it (it came
// back meanwhile, or the fresh guard has not waited a full Lost yet): what is
// recorded must be finished from the record alone, found through the
// standby (manifests/base's agent) or by ResumeOnStart. The failover must
// complete exactly once: the standby the one primary, the old primary its
// standby, retired once (never scaled down after it came back) and brought
// back once, the roles exchanged once; and the hot standby is never scaled.
// After the restore, the old primary's new pod signals, as it would from
// wherever it was scheduled: it must not start a second retirement.
func TestNodeLossFailoverResumesAfterTheGuardStopsAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stopAt   string // the write the first agent is stopped right after; "": its record refused
		notReady bool   // the standby not Ready at the loss: the failover waits for it
		phase    Phase  // recorded when it stopped ("": the roles exchanged)
		// fresh: how the fresh agent comes to the failover. The standby's
		// signal always; its guard declaring node-a lost again only where
		// it guards node-a again before the record finishes the failover
		// (else that is done on the standby's first signal, before there
		// is anything to guard); ResumeOnStart where there is a record.
		fresh []freshStart
	}{
		{"decided, the record not written", "", false, PhaseIdle, []freshStart{lostAgain}},
		{"record Failover written, the standby not Ready yet", "record edge/primary Failover", true, PhaseFailover, []freshStart{fromRecord, lostAgain, resumeOnStart}},
		{"record Retiring written, the primary not scaled yet", "record edge/primary Retiring", false, PhaseRetiring, []freshStart{fromRecord, resumeOnStart}},
		{"primary scaled to 0, roles not exchanged", "scale edge/primary 0", false, PhaseRetiring, []freshStart{fromRecord, resumeOnStart}},
		{"the new primary written, the old one still a primary", "annotations edge/standby role=primary", false, PhaseRetiring, []freshStart{fromRecord, resumeOnStart}},
		{"the new primary written, the old one still a primary, the new one not Ready at the restart", "annotations edge/standby role=primary", false, PhaseRetiring, []freshStart{fromRecord, resumeOnStart}},
		{"roles exchanged, the old primary not back yet", "annotations edge/primary role=standby", false, "", []freshStart{fromRecord, resumeOnStart}},
		{"the old primary back as the hot standby", "scale edge/primary 1", false, "", []freshStart{fromRecord, resumeOnStart}},
	} {
		for _, fresh := range tc.fresh {
			t.Run(tc.name+"/"+fresh.String(), func(t *testing.T) {
				nodeLossRestart(t, tc.stopAt, tc.notReady, strings.HasSuffix(tc.name, "not Ready at the restart"), tc.phase, fresh)
			})
		}
	}
}

// freshStart is how a restarted agent comes to a failover in progress.
type freshStart int

const (
	fromRecord    freshStart = iota // the standby's signal loads the primary and its record
	lostAgain                       // also, its guard declares the node lost again
	resumeOnStart                   // Config.ResumeOnStart, then the standby's signal
)

func (f freshStart) String() string {
	return [...]string{"from the record on the standby's signal", "lost again to the fresh guard", "resumed at start"}[f]
}

// nodeLossRestart runs one case: notReady, the standby is not Ready at the
// loss (Ready once the fresh agent runs); unreadyLater, it is not Ready while
// the fresh agent starts (Ready after its first signal).
func nodeLossRestart(t *testing.T, stopAt string, notReady, unreadyLater bool, phase Phase, fresh freshStart) {
	f := newFakeCluster()
	pp, sp := f.addHotPair(ns, "primary", "standby", map[string]string{contract.AnnPrimaryNode: "node-a"})
	if notReady {
		f.setReady(ns, "standby", 0)
	}
	h := newHalting(f, stopAt)
	g1 := startGuardOn(t, f, "node-b", h, false)
	h.halt = g1.cancel
	g1.send(podsignal.Healthy, sp)
	f.await(t, "guarding node-a", func() bool { return slices.Equal(g1.latest().Guard, []string{"node-a"}) })
	f.await(t, "the standby seen", func() bool {
		return g1.record("primary").Phase == PhaseIdle && f.depLocked(ns, "standby").Annotations[contract.AnnStandbyNode] == "node-b"
	})
	if stopAt == "" {
		f.Lock()
		f.Fail["record"] = errors.New("connection refused")
		f.Unlock()
	}
	g1.act.NodeLost(context.Background(), "node-a", g1.act.now())
	if stopAt == "" {
		g1.logs.wait(t, "the failover's record refused", func(l map[string]any) bool { return l["msg"] == "switchover record not written" })
	} else {
		f.await(t, "stopped", h.stopped)
	}
	g1.stop()
	f.Lock()
	delete(f.Fail, "record")
	f.Unlock()
	f.Lock()
	if got := g1.record("primary").Phase; phase != "" && got != phase {
		f.Unlock()
		t.Fatalf("stopped in phase %s, want %s; writes %q", got, phase, f.Writes)
	}
	stoppedWrites := len(f.Writes)
	f.Unlock()

	// The fresh agent of node-b: the standby's sidecar reconnects and
	// signals; the standby becomes Ready if it was not.
	if unreadyLater {
		f.setReady(ns, "standby", 0)
	}
	g2 := startGuardOn(t, f, "node-b", nil, fresh == resumeOnStart)
	g2.send(podsignal.Healthy, sp)
	if unreadyLater {
		g2.act.NodeBack(context.Background(), "node-x", g2.act.now()) // a barrier: Run took the signal
		f.Lock()
		if n := *f.depLocked(ns, "primary").Spec.Replicas; n != 0 || f.depLocked(ns, "primary").Annotations[contract.AnnRole] == "standby" {
			t.Errorf("with the new primary not Ready: the old one at %d replicas, annotations %v; want it left retired, its exchange waiting", n, f.depLocked(ns, "primary").Annotations)
		}
		f.Unlock()
		f.setReady(ns, "standby", 1)
	}
	if fresh == lostAgain {
		f.await(t, "guarding node-a again", func() bool { return slices.Equal(g2.latest().Guard, []string{"node-a"}) })
		g2.act.NodeLost(context.Background(), "node-a", g2.act.now())
	}
	if notReady {
		f.setReady(ns, "standby", 1)
	}
	f.await(t, "roles exchanged and the old primary back", func() bool {
		s, p := f.depLocked(ns, "standby").Annotations, f.depLocked(ns, "primary").Annotations
		return s[contract.AnnRole] == "primary" && s[contract.AnnStandby] == "primary" && p[contract.AnnRole] == "standby" &&
			p[contract.AnnPrimary] == "standby" && slices.Contains(f.Writes, "scale edge/primary 1") && !g2.record("standby").Restore
	})
	// The old primary's new pod signals: it is the standby now.
	g2.send(podsignal.Healthy, pp)
	g2.act.NodeBack(context.Background(), "node-x", g2.act.now()) // a barrier: Run took the signal
	g2.stop()

	f.Lock()
	defer f.Unlock()
	w := f.Writes
	count := func(what string) int {
		n := 0
		for _, x := range w {
			if x == what {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		write string
		want  int
	}{
		{"scale edge/primary 1", 1},                  // brought back once
		{"annotations edge/primary role=standby", 1}, // the old primary exchanged once
	} {
		if n := count(c.write); n != c.want {
			t.Errorf("%q %d times, want %d; writes %q", c.write, n, c.want, w)
		}
	}
	if i := slices.Index(w, "scale edge/primary 1"); slices.Contains(w[i:], "scale edge/primary 0") {
		t.Errorf("the old primary retired again after it came back: %q", w)
	}
	for _, x := range w {
		if x == "scale edge/standby 0" || x == "scale edge/standby 1" {
			t.Errorf("the hot standby scaled (%s): %q", x, w)
		}
	}
	switch n := count("annotations edge/standby role=primary"); {
	case slices.Contains(w[:stoppedWrites], "annotations edge/primary role=standby") && n != 1:
		t.Errorf("the fresh agent exchanged the roles again after the first had finished: %q", w)
	case n > 2:
		t.Errorf("the new primary written %d times: %q", n, w)
	}
	s, p := f.depLocked(ns, "standby"), f.depLocked(ns, "primary")
	if _, ok := p.Annotations[contract.AnnStandby]; ok {
		t.Errorf("two primaries: the old one still names a standby, %v", p.Annotations)
	}
	if raw, ok := p.Annotations[contract.AnnRecord]; ok {
		t.Errorf("the old primary keeps a record %s", raw)
	}
	if *s.Spec.Replicas != 1 || *p.Spec.Replicas != 1 {
		t.Errorf("replicas: new primary %d, new standby %d; want 1 and 1", *s.Spec.Replicas, *p.Spec.Replicas)
	}
	rec := g2.record("standby")
	if rec.Phase != PhaseIdle || rec.LastSwitch.IsZero() || rec.Restore {
		t.Errorf("the new primary's record %+v, want Idle, the switch's time, restored", rec)
	}
	if n := slices.Index(f.ReasonsLocked(), "RolesExchanged"); n >= 0 && slices.Contains(f.ReasonsLocked()[n+1:], "RolesExchanged") {
		t.Errorf("RolesExchanged twice: %q", f.ReasonsLocked())
	}
}
