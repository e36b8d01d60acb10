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
	"github.com/amf-edge/amf/podsignal"
	"github.com/amf-edge/amf/statehub"
)

// Broker state (DESIGN.md, "Broker state"). The pods of a stateful pair
// (their template carries contract.AnnStateDir: inject --state-dir) are held
// out of their Services while they are a standby: a client landing on an
// empty standby reads Session Present 0 and, by MQTT 5, discards its own
// session. The retirement writes on the new primary which state its pod is
// to run on (contract.AnnHandover): at a planned switchover the final state
// its retired broker writes as it stops, at a failover the newest snapshot.
// The agent of that pod's node carries it out: it hands the state on from
// its hub to the pod, and once the pod says it runs on it
// (podsignal.Message.Handover) its hold ends and the Service sends the clients
// there. When the pair spans two nodes, the primary's agent relays each
// state its pod hands in to the hub of the standby's node
// (contract.AnnStandbyHub), so that the standby's node holds it when the
// switchover comes, or the failover, even one that takes the primary's node
// with it.

// defaultStateWait bounds a handover (Config.StateWait): a standby whose state has not come within it
// is released as it is, with a Warning Event. A final state is written,
// handed in and put in within about a second (DESIGN.md); ten leaves room
// for a slow kubelet stopping the retired broker.
const defaultStateWait = 10 * time.Second

// restartingWaits is how many StateWaits in all a handover waits while the
// new primary's broker is still restarting on the state handed on to it
// (its pod Starting): held out of its Services, it could not serve without
// the state either, and its runtime may be slow to start it again (the
// soak: containerd restarted on its node during the handover, 12.2 s).
const restartingWaits = 6

// heldPod is a pod of a stateful pair whose readiness this agent holds.
type heldPod struct {
	dep   podKey // its Deployment
	state podsignal.State
	at    time.Time
}

// handover is a state on its way from a retired primary to the pod that
// takes over, keyed by the new primary's Deployment; this agent's when
// that pod runs on its node.
type handover struct {
	from     podKey // the retired primary's Deployment
	to       podKey // the new primary's pod
	kind     string // contract.StateFinal or StateSnapshot
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
func (a *Actuator) gateStateful(ctx context.Context, w *workload, pod *corev1.Pod, s podsignal.Observation) {
	pk := podKey{pod.Namespace, pod.Name}
	h := a.handovers[w.key]
	if h == nil && s.State != podsignal.Stopping && s.State != podsignal.Gone {
		h = a.beginHandover(ctx, w, pk)
	}
	switch {
	case s.State == podsignal.Stopping || s.State == podsignal.Gone:
		delete(a.held, pk)
		if isStandby(w) {
			a.markStandbyReady(ctx, w, pk, false)
		}
		a.gateOrRetry(ctx, pod, s)
	case isStandby(w):
		a.held[pk] = heldPod{dep: w.key, state: s.State, at: s.Received}
		a.hold(ctx, pod, s, "a standby of a stateful pair: out of its Services until it holds the primary's state")
		a.markStandbyReady(ctx, w, pk, s.State == podsignal.Healthy || s.State == podsignal.Anomalous)
	case h != nil && h.to == pk:
		a.held[pk] = heldPod{dep: w.key, state: s.State, at: s.Received}
		if s.State == podsignal.Healthy && s.Message != nil && h.state.ID != "" && s.Message.Handover == h.state.ID {
			a.handedOver(ctx, w, h, pod)
			return
		}
		a.hold(ctx, pod, s, "the new primary of a stateful pair: out of its Services until it runs on the retired primary's state")
	default:
		delete(a.held, pk)
		a.gateOrRetry(ctx, pod, s)
	}
}

// hold sets pod's amf.io/healthy False with the reason AwaitingState while
// its broker is healthy (else as its state says).
func (a *Actuator) hold(ctx context.Context, pod *corev1.Pod, s podsignal.Observation, why string) {
	if s.State != podsignal.Healthy && s.State != podsignal.Anomalous {
		_ = a.patchReadinessGate(ctx, pod, s) // held: its pair writes it again
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

// relayRoute is where the states of a primary's pods go: the hub of its
// standby's node. until, when set, ends it: a retired primary's final
// state is still to come.
type relayRoute struct {
	hub, node string
	until     time.Time
}

// planHandover is called as a stateful pair's primary w is retired onto
// standby sb: it returns the handover to write on sb (empty: none) and the
// Event that says what happens to the state, or why nothing does.
func (a *Actuator) planHandover(w *workload, sb *appsv1.Deployment, failover bool) (ann string, warning bool, reason, note string) {
	sk := podKey{sb.Namespace, sb.Name}
	if !statefulDeployment(sb) {
		return "", false, "", ""
	}
	to := sb.Annotations[contract.AnnStandbyReady]
	node := sb.Annotations[contract.AnnStandbyNode]
	elsewhere := node != "" && node != a.nl.self
	switch {
	case a.states == nil:
		return "", true, "StateNotCarried", fmt.Sprintf("this agent runs without its state hub (amf-agent --state-listen): %s serves from its own state", sk.name)
	case to == "":
		return "", true, "StateNotCarried", fmt.Sprintf("no pod of %s is named ready for a state (%s): it serves from its own", sk.name, contract.AnnStandbyReady)
	case elsewhere && !failover && (a.relay == nil || sb.Annotations[contract.AnnStandbyHub] == ""):
		// A failover's snapshots are already where they are, or not:
		// the standby's agent says which.
		return "", true, "StateNotCarried", fmt.Sprintf("the pod of %s runs on node %s, and the state cannot be relayed there (%s): it serves from its own",
			sk.name, node, a.relayGap(sb))
	}
	now := a.now()
	kind := contract.StateFinal
	if failover {
		// A crashed or lost broker writes no final state: the last
		// snapshot its sidecar handed in, which the agent of the
		// standby's node chooses from what its hub holds.
		kind = contract.StateSnapshot
	}
	if hub := sb.Annotations[contract.AnnStandbyHub]; elsewhere && hub != "" {
		// The final state is still to come: relayed to the standby's node
		// as read right now (not as last seen by the watch, which a
		// reload may have restarted a moment ago).
		a.relays[w.key] = relayRoute{hub: hub, node: node, until: now.Add(a.stateWait)}
	}
	ann = contract.Handover{From: w.key.name, Pod: to, Kind: kind, At: now}.String()
	where := ""
	if elsewhere {
		where = " on node " + node
	}
	if failover {
		return ann, false, "StateHandover", fmt.Sprintf("failover: %s%s restarts on the last snapshot of %s's broker before it serves (%v at most)", to, where, w.key.name, a.stateWait)
	}
	return ann, false, "StateHandover", fmt.Sprintf("the final state of %s goes to %s%s, which joins its Services once it runs on it (%v at most)", w.key.name, to, where, a.stateWait)
}

// relayGap says why a state cannot go to sb's node.
func (a *Actuator) relayGap(sb *appsv1.Deployment) string {
	if a.relay == nil {
		return "this agent has no token for its peers: amf-agent --state-peer-token"
	}
	return "that node's agent advertises no state hub on " + sb.Name + " (" + contract.AnnStandbyHub + ")"
}

// beginHandover starts the handover that the new primary w names for its
// pod pk (contract.AnnHandover), if pk runs here (this agent holds it) and
// none is under way. A snapshot is handed on at once; a final state when
// it comes (stateTaken), or now if it came first.
func (a *Actuator) beginHandover(ctx context.Context, w *workload, pk podKey) *handover {
	raw := w.annotations[contract.AnnHandover]
	if raw == "" || isStandby(w) {
		return nil
	}
	hv, err := contract.ParseHandover(raw)
	if err != nil {
		a.log.Warn("handover not read", slog.String("deployment", w.key.String()), slog.String("error", err.Error()))
		a.clearHandover(ctx, w.key)
		return nil
	}
	if hv.Pod != pk.name {
		return nil
	}
	now := a.now()
	h := &handover{from: podKey{w.key.ns, hv.From}, to: pk, kind: hv.Kind, since: hv.At, deadline: now.Add(a.stateWait)}
	if now.Sub(hv.At) > 2*a.stateWait {
		// Written long ago (this agent was restarted, or the pod came
		// late): its state, in the hub's memory, is gone or stale.
		a.clearHandover(ctx, w.key)
		a.emitKey(w, true, "StateNotCarried", "Switchover", fmt.Sprintf("%s serves from its own state: its handover from %s, written %v ago, is past its time", pk.name, hv.From, now.Sub(hv.At).Round(time.Second)))
		return nil
	}
	if a.states == nil {
		a.clearHandover(ctx, w.key)
		a.emitKey(w, true, "StateNotCarried", "Switchover", fmt.Sprintf("this agent runs without its state hub (amf-agent --state-listen): %s serves from its own state", pk.name))
		return nil
	}
	a.handovers[w.key] = h
	a.log.Info("decision", slog.String("deployment", w.key.String()), slog.String("action", "BeginHandover"), slog.String("kind", hv.Kind),
		slog.String("from", hv.From), slog.String("to", pk.String()))
	// A failover's snapshot is one of the retired primary's pods: the hub
	// held that pod's states before the retirement. The Deployment's next
	// pod (it comes back as the hot standby, its broker empty) hands its
	// own snapshots in within seconds; in the soak, with this node's hub
	// emptied by its agent's restart, the handover took one of those and
	// said the state carried.
	// A switchover's final state may have come before this handover
	// began (relayed from the primary's node while this agent, on a slow
	// node, had not yet read the new roles), and by then that comeback's
	// first snapshots, newer and empty, may have come too: the newest
	// final state is the one, never a newer snapshot.
	var heldBy time.Time
	kind := statehub.Final
	if hv.Kind == contract.StateSnapshot {
		heldBy, kind = hv.At, ""
	}
	st, from, ok := a.latestState(h.from, heldBy, kind)
	switch {
	case hv.Kind == contract.StateSnapshot && !ok:
		a.giveUp(ctx, w, h, fmt.Sprintf("failover: the primary's broker wrote no final state, and this node's hub holds no snapshot of it (amf-sidecar --state-snapshot-every; for a pair across nodes, amf-agent --state-peer-token on both); %s serves from its own", pk.name))
		return nil
	case hv.Kind == contract.StateSnapshot:
		if !a.handOn(ctx, w.key, h, st, from) {
			return nil
		}
		h.snapshotAge = max(0, hv.At.Sub(st.At))
		a.emitKey(w, true, "StateFromSnapshot", "Switchover", fmt.Sprintf("failover: %s restarts on the last snapshot of %s's broker, taken in %v before the failover: what that broker took in after it is lost (%d retained messages, %d persistent sessions, %d queued in the snapshot)",
			pk.name, hv.From, h.snapshotAge.Round(time.Millisecond), st.Summary.Retained, len(st.Summary.Sessions), st.Summary.Queued))
	case ok && st.Kind == statehub.Final && !st.At.Before(hv.At.Add(-a.stateWait)):
		a.handOn(ctx, w.key, h, st, from) // the final state came first
	}
	return a.handovers[w.key]
}

// handOn hands st (from pod from) on to h's pod; on failure the handover
// is given up.
func (a *Actuator) handOn(ctx context.Context, key podKey, h *handover, st statehub.State, from podsignal.PodID) bool {
	handed, err := a.states.HandOn(st.ID, from, podsignal.PodID{Namespace: h.to.ns, Pod: h.to.name})
	if err != nil {
		if w := a.workloads[key]; w != nil {
			a.giveUp(ctx, w, h, fmt.Sprintf("the state %s could not be handed on (%v); %s serves from its own", st.ID, err, h.to.name))
		}
		return false
	}
	h.state = handed
	a.log.Info("decision", slog.String("deployment", key.String()), slog.String("action", "HandOnState"), slog.String("state", st.ID),
		slog.String("kind", string(st.Kind)), slog.String("via", st.Via), slog.String("to", h.to.String()), slog.Int("bytes", st.Summary.Bytes),
		slog.Int("retained", st.Summary.Retained), slog.Int("sessions", len(st.Summary.Sessions)), slog.Int("queued", st.Summary.Queued),
		slog.Duration("after", a.now().Sub(h.since)))
	return true
}

// giveUp ends a handover without its state: the pod serves from its own.
func (a *Actuator) giveUp(ctx context.Context, w *workload, h *handover, note string) {
	delete(a.handovers, w.key)
	a.states.Done(podsignal.PodID{Namespace: h.to.ns, Pod: h.to.name})
	a.clearHandover(ctx, w.key)
	a.emitKey(w, true, "StateNotCarried", "Switchover", note)
	a.log.Warn("decision", slog.String("deployment", w.key.String()), slog.String("action", "StateNotCarried"), slog.String("why", note))
	a.releaseHeld(ctx, w.key)
}

// clearHandover removes contract.AnnHandover from dep once its handover
// ended, so that a reload does not begin it again.
func (a *Actuator) clearHandover(ctx context.Context, dep podKey) {
	if err := a.cluster.PatchAnnotations(ctx, dep.ns, dep.name, map[string]*string{contract.AnnHandover: nil}); err != nil {
		a.log.Warn("handover not cleared", slog.String("deployment", dep.String()), slog.String("error", err.Error()))
	}
	if w := a.workloads[dep]; w != nil {
		delete(w.annotations, contract.AnnHandover)
	}
}

// latestState is the newest state the hub holds from a pod of Deployment
// dep: handed in here (its pods that signalled to this agent) or relayed
// from another node; if heldBy is not zero, only from a pod whose states
// the hub held by then; if kind is not "", only of that kind.
func (a *Actuator) latestState(dep podKey, heldBy time.Time, kind statehub.Kind) (statehub.State, podsignal.PodID, bool) {
	best, ok := a.states.LatestOwned(dep.ns, dep.name, heldBy, kind)
	from := best.From
	for pk, d := range a.owners {
		if pk.ns != dep.ns || d != dep.name {
			continue
		}
		id := podsignal.PodID{Namespace: pk.ns, Pod: pk.name}
		if s, held := a.states.Latest(id); held && s.Owner == "" && (heldBy.IsZero() || !s.Since.After(heldBy)) && (kind == "" || s.Kind == kind) && (!ok || s.At.After(best.At)) {
			best, from, ok = s, id, true
		}
	}
	return best, from, ok
}

// stateTaken relays a state handed in here to the standby's node when the
// pair spans two, and hands a final state on to the pod it is for: that of
// the handover under way from the Deployment of the pod that handed it in.
func (a *Actuator) stateTaken(ctx context.Context, st statehub.State) {
	from := podKey{st.From.Namespace, st.From.Pod}
	dep := st.Owner
	if dep == "" {
		dep = a.owners[from]
	}
	if dep == "" {
		a.log.Info("broker state taken in from a pod of no known Deployment", slog.String("state", st.ID))
		return
	}
	if st.Via == "" {
		a.relayOn(podKey{from.ns, dep}, st)
	} else {
		a.log.Info("broker state relayed here", slog.String("state", st.ID), slog.String("kind", string(st.Kind)), slog.String("deployment", from.ns+"/"+dep), slog.String("via", st.Via))
	}
	if st.Kind != statehub.Final {
		return
	}
	for key, h := range a.handovers {
		if h.from != (podKey{from.ns, dep}) || h.state.ID != "" || h.kind != contract.StateFinal {
			continue
		}
		a.handOn(ctx, key, h, st, st.From)
		return
	}
	a.log.Info("broker state taken in, for no handover here", slog.String("state", st.ID), slog.String("from", from.String()))
}

// relayOn sends st, handed in by a pod of dep, to the hub of dep's
// standby's node, if that is another.
func (a *Actuator) relayOn(dep podKey, st statehub.State) {
	r, ok := a.relays[dep]
	if !ok || a.relay == nil {
		return
	}
	if !r.until.IsZero() && a.now().After(r.until) {
		delete(a.relays, dep)
		return
	}
	if w := a.workloads[dep]; r.until.IsZero() && (w == nil || !w.managed) {
		// No longer a primary here (failed over by another agent, its
		// node lost for a while): its pod's states are nobody's to take.
		delete(a.relays, dep)
		return
	}
	full, ok := a.states.Copy(st.From, st.ID)
	if !ok {
		return // replaced already: its successor is relayed instead
	}
	full.Owner = dep.name
	a.relay.Forward(r.hub, full)
	a.log.Debug("broker state relayed on", slog.String("state", st.ID), slog.String("node", r.node))
}

// syncRelay keeps w's relay route from what its standby says (the node and
// hub of its pod), for a primary whose pod pod runs on this node. A route
// new or changed takes the newest state held of the pod at once: the
// next may be long in coming (a snapshot is handed in only when the state
// changed).
func (a *Actuator) syncRelay(w *workload, pod string) {
	if a.relay == nil || w.standbyAnn == nil {
		return
	}
	node, hub := w.standbyAnn[contract.AnnStandbyNode], w.standbyAnn[contract.AnnStandbyHub]
	if node == "" || node == a.nl.self || hub == "" {
		if r, ok := a.relays[w.key]; ok && r.until.IsZero() {
			delete(a.relays, w.key)
		}
		return
	}
	r := relayRoute{hub: hub, node: node}
	if a.relays[w.key] == r {
		return
	}
	a.relays[w.key] = r
	if st, ok := a.states.Latest(podsignal.PodID{Namespace: w.key.ns, Pod: pod}); ok {
		a.relayOn(w.key, st)
	}
}

// handedOver ends a handover whose pod runs on the state: it joins its
// Services.
func (a *Actuator) handedOver(ctx context.Context, w *workload, h *handover, pod *corev1.Pod) {
	sum := h.state.Summary
	took := a.now().Sub(h.since).Round(time.Millisecond)
	delete(a.handovers, w.key)
	delete(a.held, h.to)
	a.states.Done(podsignal.PodID{Namespace: h.to.ns, Pod: h.to.name})
	a.clearHandover(ctx, w.key)
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
	if w != nil {
		// A new primary whose handover names a pod held here: its
		// handover begins instead.
		for pk, h := range a.held {
			if h.dep == dep && a.beginHandover(ctx, w, pk) != nil {
				return
			}
		}
	}
	for pk, h := range a.held {
		if h.dep != dep {
			continue
		}
		delete(a.held, pk)
		if h.state != podsignal.Healthy && h.state != podsignal.Anomalous {
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
		last := h.since.Add(restartingWaits * a.stateWait)
		if hp, ok := a.held[h.to]; ok && h.state.ID != "" && hp.state == podsignal.Starting && now.Before(last) {
			h.deadline = now.Add(a.stateWait)
			if h.deadline.After(last) {
				h.deadline = last
			}
			a.log.Info("handover waits on", slog.String("deployment", key.String()), slog.String("pod", h.to.String()), slog.String("state", h.state.ID),
				slog.Time("until", h.deadline), slog.String("why", "its broker is still restarting on the state: it could not serve without it either"))
			continue
		}
		delete(a.handovers, key)
		a.states.Done(podsignal.PodID{Namespace: h.to.ns, Pod: h.to.name})
		a.clearHandover(ctx, key)
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
