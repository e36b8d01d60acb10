package actuate

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/signal"
	"github.com/amf-edge/amf/statehub"
)

// Broker state (DESIGN.md, "Broker state"). The pods of a stateful pair
// (their template carries contract.AnnStateDir: inject --state-dir) are held
// out of their Services while they are a standby: a client landing on an
// empty standby reads Session Present 0 and, by MQTT 5, discards its own
// session. At a planned switchover the retired primary's broker writes its
// final state as it stops; its sidecar hands it to this agent's hub, which
// hands it on to the standby's pod; once that pod says it runs on it
// (signal.Message.Handover), its hold ends and the Service sends the clients
// there. The whole handover is one agent's: the pair's two pods signal to
// it (one node). A standby on another node gets no state (the link between
// agents is not built): said in a Warning Event, and it is released at once.

// defaultStateWait bounds a handover (Config.StateWait): a standby whose state has not come within it
// is released as it is, with a Warning Event. A final state is written,
// handed in and put in within about a second (DESIGN.md); ten leaves room
// for a slow kubelet stopping the retired broker.
const defaultStateWait = 10 * time.Second

// heldPod is a pod of a stateful pair whose readiness this agent holds.
type heldPod struct {
	dep   podKey // its Deployment
	state signal.State
	at    time.Time
}

// handover is a state on its way from a retired primary to the pod that
// takes over, keyed by the new primary's Deployment.
type handover struct {
	from     podKey // the retired primary's Deployment
	to       podKey // the new primary's pod
	since    time.Time
	deadline time.Time
	state    statehub.State // handed on (ID set) or not yet
	// snapshotAge, for a failover's snapshot: how old it was at the
	// failover (what came after it is lost).
	snapshotAge time.Duration
}

// statefulPod reports whether pod's broker state is carried (inject --state-dir).
func statefulPod(pod *corev1.Pod) bool { return pod.Annotations[contract.AnnStateDir] != "" }

// statefulDeployment reports it of d's pods.
func statefulDeployment(d *appsv1.Deployment) bool {
	return d.Spec.Template.Annotations[contract.AnnStateDir] != ""
}

// isStandby reports whether w is the standby of a pair: no policy of its
// own and a primary named (inject --standby, every role exchange).
func isStandby(w *workload) bool {
	return !w.managed && w.annotations[contract.AnnPrimary] != "" && w.annotations[contract.AnnPrimary] != w.key.name
}

// gateStateful sets the readiness gate of a stateful pair's pod from its
// signal s: held False while it is a standby or waits for a handed state,
// as for any pod otherwise.
func (a *Actuator) gateStateful(ctx context.Context, w *workload, pod *corev1.Pod, s signal.Observation) {
	pk := podKey{pod.Namespace, pod.Name}
	h := a.handovers[w.key]
	switch {
	case s.State == signal.Stopping || s.State == signal.Gone:
		delete(a.held, pk)
		if isStandby(w) {
			a.markStandbyReady(ctx, w, pk, false)
		}
		a.patchReadinessGate(ctx, pod, s)
	case isStandby(w):
		a.held[pk] = heldPod{dep: w.key, state: s.State, at: s.Received}
		a.hold(ctx, pod, s, "a standby of a stateful pair: out of its Services until it holds the primary's state")
		a.markStandbyReady(ctx, w, pk, s.State == signal.Healthy || s.State == signal.Anomalous)
	case h != nil && h.to == pk:
		a.held[pk] = heldPod{dep: w.key, state: s.State, at: s.Received}
		if s.State == signal.Healthy && s.Message != nil && h.state.ID != "" && s.Message.Handover == h.state.ID {
			a.handedOver(ctx, w, h, pod)
			return
		}
		a.hold(ctx, pod, s, "the new primary of a stateful pair: out of its Services until it runs on the retired primary's state")
	default:
		delete(a.held, pk)
		a.patchReadinessGate(ctx, pod, s)
	}
}

// hold sets pod's amf.io/healthy False with the reason AwaitingState while
// its broker is healthy (else as its state says).
func (a *Actuator) hold(ctx context.Context, pod *corev1.Pod, s signal.Observation, why string) {
	if s.State != signal.Healthy && s.State != signal.Anomalous {
		a.patchReadinessGate(ctx, pod, s)
		return
	}
	a.setGate(ctx, pod, corev1.ConditionFalse, "AwaitingState", why, s.Received)
}

// setGate writes pod's amf.io/healthy condition unless it already says so.
func (a *Actuator) setGate(ctx context.Context, pod *corev1.Pod, status corev1.ConditionStatus, reason, message string, at time.Time) {
	for _, c := range pod.Status.Conditions {
		if c.Type == contract.ConditionHealthy && c.Status == status && c.Reason == reason {
			return
		}
	}
	cond := corev1.PodCondition{Type: contract.ConditionHealthy, Status: status, Reason: reason, Message: message, LastTransitionTime: metav1.NewTime(at)}
	a.log.Info("readiness gate", slog.String("pod", pod.Namespace+"/"+pod.Name), slog.String("status", string(status)), slog.String("reason", reason), slog.Bool("dry_run", a.dryRun))
	if err := a.cluster.SetPodCondition(ctx, pod.Namespace, pod.Name, cond); err != nil {
		a.log.Warn("readiness gate not patched", slog.String("pod", pod.Namespace+"/"+pod.Name), slog.String("error", err.Error()))
	}
}

// markStandbyReady writes (ready) or clears (if it names pod) the standby's
// contract.AnnStandbyReady: what the primary's agent takes for the
// standby's readiness.
func (a *Actuator) markStandbyReady(ctx context.Context, w *workload, pod podKey, ready bool) {
	dep := w.key
	cur, known := a.readyMarks[dep]
	if !known {
		cur = w.annotations[contract.AnnStandbyReady]
	}
	var val *string
	switch {
	case ready && cur == pod.name:
		return
	case ready:
		val = ptr.To(pod.name)
	case cur != pod.name:
		return // names another pod, or none
	}
	if err := a.cluster.PatchAnnotations(ctx, dep.ns, dep.name, map[string]*string{contract.AnnStandbyReady: val}); err != nil {
		a.log.Warn("standby readiness not written", slog.String("deployment", dep.String()), slog.String("error", err.Error()))
		return
	}
	a.readyMarks[dep] = ptr.Deref(val, "")
}

// planHandover is called as a stateful pair's primary w is retired: the
// state is to go to the standby's pod when that pod signals to this agent,
// and a planned switchover (not a failover: a crashed broker writes no
// final state) has one to give. It returns the Event that says so, or why
// not.
func (a *Actuator) planHandover(w *workload, sb *appsv1.Deployment, failover bool) (warning bool, reason, note string) {
	sk := podKey{sb.Namespace, sb.Name}
	if !statefulDeployment(sb) {
		return false, "", ""
	}
	if a.states == nil {
		return true, "StateNotCarried", fmt.Sprintf("this agent runs without its state hub (amf-agent --state-listen): %s serves from its own state", sk.name)
	}
	var to podKey
	for pk, h := range a.held {
		if h.dep == sk && (h.state == signal.Healthy || h.state == signal.Anomalous) {
			to = pk
		}
	}
	if to.name == "" {
		return true, "StateNotCarried", fmt.Sprintf("the pod of %s does not signal to this node's agent (it runs on another node): carrying a state between nodes is not built yet, so it serves from its own", sk.name)
	}
	now := a.now()
	h := &handover{from: w.key, to: to, since: now, deadline: now.Add(a.stateWait)}
	if !failover {
		a.handovers[sk] = h
		return false, "StateHandover", fmt.Sprintf("the final state of %s goes to %s, which joins its Services once it runs on it (%v at most)", w.key.name, to.name, a.stateWait)
	}
	// A crashed broker writes no final state: the last snapshot its sidecar
	// handed in, if the hub holds one, and what came after it is lost.
	snap, from, ok := a.latestState(w.key)
	if !ok {
		return true, "StateNotCarried", fmt.Sprintf("failover: the primary's broker wrote no final state and its sidecar handed in no snapshot (amf-sidecar --state-snapshot-every); %s serves from its own", sk.name)
	}
	handed, err := a.states.HandOn(snap.ID, from, signal.PodID{Namespace: to.ns, Pod: to.name})
	if err != nil {
		return true, "StateNotCarried", fmt.Sprintf("failover: the last snapshot of %s could not be handed on (%v); %s serves from its own", w.key.name, err, sk.name)
	}
	h.state, h.snapshotAge = handed, now.Sub(snap.At)
	a.handovers[sk] = h
	return true, "StateFromSnapshot", fmt.Sprintf("failover: %s restarts on the last snapshot of %s's broker, taken in %v before the failover: what that broker took in after it is lost (%d retained messages, %d persistent sessions, %d queued in the snapshot)",
		to.name, w.key.name, h.snapshotAge.Round(time.Millisecond), snap.Summary.Retained, len(snap.Summary.Sessions), snap.Summary.Queued)
}

// latestState is the newest state the hub holds from a pod of Deployment
// dep (as this agent knows its pods: those that signalled to it).
func (a *Actuator) latestState(dep podKey) (statehub.State, signal.PodID, bool) {
	var best statehub.State
	var from signal.PodID
	for pk, d := range a.owners {
		if pk.ns != dep.ns || d != dep.name {
			continue
		}
		id := signal.PodID{Namespace: pk.ns, Pod: pk.name}
		if s, ok := a.states.Latest(id); ok && s.At.After(best.At) {
			best, from = s, id
		}
	}
	return best, from, best.ID != ""
}

// stateTaken hands a final state taken in by the hub on to the pod it is
// for: that of the pending handover from the Deployment of the pod that
// handed it in.
func (a *Actuator) stateTaken(ctx context.Context, st statehub.State) {
	from := podKey{st.From.Namespace, st.From.Pod}
	dep, ok := a.owners[from]
	if !ok || st.Kind != statehub.Final {
		a.log.Info("broker state taken in, for no handover", slog.String("state", st.ID), slog.String("kind", string(st.Kind)))
		return
	}
	for key, h := range a.handovers {
		if h.from != (podKey{from.ns, dep}) || h.state.ID != "" {
			continue
		}
		to := signal.PodID{Namespace: h.to.ns, Pod: h.to.name}
		handed, err := a.states.HandOn(st.ID, st.From, to)
		if err != nil {
			a.log.Warn("broker state not handed on", slog.String("state", st.ID), slog.String("to", h.to.String()), slog.String("error", err.Error()))
			return
		}
		h.state = handed
		a.log.Info("decision", slog.String("deployment", key.String()), slog.String("action", "HandOnState"), slog.String("state", st.ID),
			slog.String("to", h.to.String()), slog.Int("bytes", st.Summary.Bytes), slog.Int("retained", st.Summary.Retained),
			slog.Int("sessions", len(st.Summary.Sessions)), slog.Int("queued", st.Summary.Queued), slog.Duration("after", a.now().Sub(h.since)))
		return
	}
	a.log.Info("broker state taken in, for no handover", slog.String("state", st.ID), slog.String("from", from.String()))
}

// handedOver ends a handover whose pod runs on the state: it joins its
// Services.
func (a *Actuator) handedOver(ctx context.Context, w *workload, h *handover, pod *corev1.Pod) {
	sum := h.state.Summary
	took := a.now().Sub(h.since).Round(time.Millisecond)
	delete(a.handovers, w.key)
	delete(a.held, h.to)
	a.states.Done(signal.PodID{Namespace: h.to.ns, Pod: h.to.name})
	a.setGate(ctx, pod, corev1.ConditionTrue, "Healthy", "runs on the retired primary's state "+h.state.ID, a.now())
	what := "the final state"
	if h.state.Kind == statehub.Snapshot {
		what = fmt.Sprintf("the last snapshot (%v old at the failover: what came after it is lost)", h.snapshotAge.Round(time.Millisecond))
	}
	a.emitKey(w, false, "StateCarried", "Switchover", fmt.Sprintf("%s runs on %s of %s, %v after the retirement: %d retained messages, %d persistent sessions, %d messages queued or in flight, %d bytes",
		h.to.name, what, h.from.name, took, sum.Retained, len(sum.Sessions), sum.Queued, sum.Bytes))
	a.log.Info("decision", slog.String("deployment", w.key.String()), slog.String("action", "StateCarried"), slog.String("state", h.state.ID),
		slog.String("kind", string(h.state.Kind)), slog.Duration("snapshot_age", h.snapshotAge),
		slog.Duration("took", took), slog.Int("retained", sum.Retained), slog.Int("sessions", len(sum.Sessions)), slog.Int("queued", sum.Queued))
}

// releaseHeld re-reads the hold of dep's pods after a change of role or
// the end of a handover: a pod neither a standby nor waiting for a state
// joins its Services if its broker is healthy.
func (a *Actuator) releaseHeld(ctx context.Context, dep podKey) {
	if _, waiting := a.handovers[dep]; waiting {
		return
	}
	w := a.workloads[dep]
	if w != nil && isStandby(w) {
		return
	}
	for pk, h := range a.held {
		if h.dep != dep {
			continue
		}
		delete(a.held, pk)
		if h.state != signal.Healthy && h.state != signal.Anomalous {
			continue
		}
		pod, err := a.cluster.Pod(ctx, pk.ns, pk.name)
		if err != nil {
			a.log.Warn("held pod not read", slog.String("pod", pk.String()), slog.String("error", err.Error()))
			continue
		}
		a.setGate(ctx, pod, corev1.ConditionTrue, "Healthy", "released: no longer a standby, no state to wait for", a.now())
	}
}

// stateDeadlines releases the pods whose state did not come in time.
func (a *Actuator) stateDeadlines(ctx context.Context, now time.Time) {
	for key, h := range a.handovers {
		if now.Before(h.deadline) {
			continue
		}
		delete(a.handovers, key)
		a.states.Done(signal.PodID{Namespace: h.to.ns, Pod: h.to.name})
		why := "no final state came from it"
		if h.state.ID != "" {
			why = "its final state " + h.state.ID + " was handed on, but the pod did not say it runs on it"
		}
		note := fmt.Sprintf("%s joins its Services without the state of %s: %s within %v", h.to.name, h.from.name, why, a.stateWait)
		if w := a.workloads[key]; w != nil {
			a.emitKey(w, true, "StateNotCarried", "Switchover", note)
		}
		a.log.Warn("decision", slog.String("deployment", key.String()), slog.String("action", "StateNotCarried"), slog.String("why", note))
		a.releaseHeld(ctx, key)
	}
}

// nextStateDeadline is the earliest handover deadline, if any.
func (a *Actuator) nextStateDeadline() (time.Time, bool) {
	var next time.Time
	for _, h := range a.handovers {
		if next.IsZero() || h.deadline.Before(next) {
			next = h.deadline
		}
	}
	return next, !next.IsZero()
}
