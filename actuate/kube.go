package actuate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// ErrStandbyNotReady is returned when retiring the primary is refused because
// the standby is not Ready right now (the invariant).
var ErrStandbyNotReady = errors.New("standby not Ready: primary kept")

// ErrPrimaryNotReady is returned when scaling a standby back is refused
// because the primary is not Ready right now (the invariant).
var ErrPrimaryNotReady = errors.New("primary not Ready: standby kept")

// primaryReady checks that w's primary is Ready right now, before its
// standby is scaled back.
func (a *Actuator) primaryReady(ctx context.Context, w *workload) error {
	d, err := a.cluster.Deployment(ctx, w.key.ns, w.key.name)
	if err != nil {
		return fmt.Errorf("get primary %s: %w", w.key, err)
	}
	if !deploymentReady(d) {
		return fmt.Errorf("%w (%s: %d ready, generation %d observed %d)", ErrPrimaryNotReady, w.key, d.Status.ReadyReplicas, d.Generation, d.Status.ObservedGeneration)
	}
	return nil
}

// deploymentReady reports readyReplicas >= 1 at the current generation: a
// status written for an older spec (before our scale) does not count.
func deploymentReady(d *appsv1.Deployment) bool {
	return d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1
}

// scale sets k's replicas (Cluster.Scale: the scale subresource, so the
// agent needs no update right on Deployments themselves; idempotent).
func (a *Actuator) scale(ctx context.Context, k podKey, replicas int32) error {
	if err := a.cluster.Scale(ctx, k.ns, k.name, replicas); err != nil {
		return fmt.Errorf("scale %s to %d: %w", k, replicas, err)
	}
	return nil
}

// namedPodGone says why the pod a stateful standby sb names ready
// (contract.AnnStandbyReady) cannot take the primary's place, "" when it
// can or sb is not stateful. The mark is written and cleared by the agent
// of that pod's node; when the node is lost, its agent is too, and the
// mark stands over a pod that is being deleted (evicted from the
// unreachable node, Terminating until the node comes back) or gone, while
// the Deployment still counts a pod (the replacement, Pending). An error
// of the read counts as gone: the primary is kept rather than retired
// onto what cannot be seen.
func (a *Actuator) namedPodGone(ctx context.Context, sb *appsv1.Deployment) string {
	name := sb.Annotations[contract.AnnStandbyReady]
	if !statefulDeployment(sb) || name == "" {
		return ""
	}
	pod, err := a.cluster.Pod(ctx, sb.Namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		return "its pod " + name + ", named ready, is gone"
	case err != nil:
		return "its pod " + name + ", named ready, not read: " + err.Error()
	case pod.DeletionTimestamp != nil:
		return "its pod " + name + ", named ready, is being deleted"
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		return "its pod " + name + ", named ready, has ended (" + string(pod.Status.Phase) + ")"
	}
	return ""
}

// retire scales the primary to zero once the standby is Ready right now, then
// exchanges the roles: the standby becomes the primary (with the policy and a
// record carrying the switchover time for the flap guard) and the old primary
// its standby: cold, it stays at 0; hot, the new primary's record says
// Restore, and the new primary's Gate scales it back to 1 once its old pods
// are gone, so the new hot standby is a fresh pod, not the one just retired.
// Each write is idempotent, so a restart in between repeats the phase
// (Retiring) safely.
func (a *Actuator) retire(ctx context.Context, w *workload) error {
	p := w.gate.Policy
	sk := podKey{w.key.ns, p.Standby}
	// The switchover may have been finished without this agent: one that
	// read the record midway (a guard's failover Retiring it, this agent
	// thawed after its node's power cut) resumes a retirement whose role
	// exchange another agent has since done, and would retire the new
	// standby or, for a stateful pair, wait for a mark that never comes,
	// neither guarding nor recording its node meanwhile. The record on the
	// Deployment says: another agent's write means its switchover, not
	// this one's.
	if !a.dryRun {
		d, err := a.cluster.Deployment(ctx, w.key.ns, w.key.name)
		if err != nil {
			return fmt.Errorf("get primary %s: %w", w.key, err)
		}
		if got := d.Annotations[contract.AnnRecord]; got != w.written {
			a.load(ctx, d)
			return fmt.Errorf("%w: its switchover record changed since this agent read it (another agent's step): read again, nothing done", cluster.ErrRecordMoved)
		}
	}
	sb, err := a.cluster.Deployment(ctx, sk.ns, sk.name)
	if err != nil {
		return fmt.Errorf("get standby %s: %w", sk, err)
	}
	// The watch may be ahead of reality (or we resumed); a stateful
	// standby's mark may have outlived its pod, the agent that would clear
	// it gone with the pod's node. Either way: wait for it again.
	var why string
	if standbyReady(sb) {
		why = a.namedPodGone(ctx, sb)
	} else {
		why = fmt.Sprintf("%d ready, generation %d observed %d", sb.Status.ReadyReplicas, sb.Generation, sb.Status.ObservedGeneration)
	}
	if why != "" {
		w.gate.Step(StandbyReadiness(a.now(), false))
		_ = a.writeRecord(ctx, w)
		return fmt.Errorf("%w (%s: %s)", ErrStandbyNotReady, sk, why)
	}
	// Before the scale: the retired broker's final state may come at once.
	handoverAnn, stateWarning, stateReason, stateNote := a.planHandover(w, sb, w.gate.Rec.Failover)
	if err := a.scale(ctx, w.key, 0); err != nil {
		return err
	}
	if size := memorySize(w); size > 0 {
		// At 0 replicas now: its template takes the size the broker
		// needed, rolling nothing. Not worth failing the exchange for.
		if d, err := a.cluster.Deployment(ctx, w.key.ns, w.key.name); err != nil {
			a.log.Warn("retired primary's template not sized", slog.String("deployment", w.key.String()), slog.String("error", err.Error()))
		} else if err := a.sizeTemplate(ctx, d, size); err != nil {
			a.log.Warn("retired primary's template not sized", slog.String("deployment", w.key.String()), slog.String("error", err.Error()))
		}
	}
	now := a.now()
	w.gate.Retired(now)
	rec, err := json.Marshal(Record{Phase: PhaseIdle, Standby: w.key.name, LastSwitch: now, Restore: p.Redundancy == contract.Hot})
	if err != nil {
		return err
	}
	// New primary first: if we stop after it, both carry a policy, the old
	// one in phase Retiring, and a resume repeats the exchange.
	// The pair's nodes (on the standby) are the agents' to write again
	// for the new roles: cleared on both.
	newAnn := map[string]*string{contract.AnnStandby: ptr.To(w.key.name), contract.AnnRole: ptr.To("primary"), contract.AnnPrimary: nil, contract.AnnRecord: ptr.To(string(rec)),
		contract.AnnPrimaryNode: nil, contract.AnnStandbyNode: nil, contract.AnnStandbyReady: nil, contract.AnnStandbyHub: nil, contract.AnnHandover: nil}
	if handoverAnn != "" {
		newAnn[contract.AnnHandover] = ptr.To(handoverAnn)
	}
	oldAnn := map[string]*string{contract.AnnRole: ptr.To("standby"), contract.AnnPrimary: ptr.To(sk.name), contract.AnnRecord: nil,
		contract.AnnPrimaryNode: nil, contract.AnnStandbyNode: nil, contract.AnnStandbyReady: nil, contract.AnnStandbyHub: nil, contract.AnnHandover: nil}
	src := w.annotations
	for _, key := range contract.PolicyKeys() {
		if key == contract.AnnStandby {
			continue
		}
		if v, ok := src[key]; ok {
			newAnn[key] = ptr.To(v)
		} else {
			newAnn[key] = nil
		}
		oldAnn[key] = nil
	}
	oldAnn[contract.AnnStandby] = nil
	if err := a.cluster.PatchAnnotations(ctx, sk.ns, sk.name, newAnn); err != nil {
		return fmt.Errorf("role exchange, new primary %s: %w", sk, err)
	}
	if err := a.cluster.PatchAnnotations(ctx, w.key.ns, w.key.name, oldAnn); err != nil {
		return fmt.Errorf("role exchange, old primary %s: %w", w.key, err)
	}
	a.deleteRetired(ctx, w) // after the exchange, which it must not delay
	note := fmt.Sprintf("%s is now the primary, %s its cold standby", sk.name, w.key.name)
	if p.Redundancy == contract.Hot {
		note = fmt.Sprintf("%s is now the primary; %s, retired, comes back as its hot standby once its old pods are gone", sk.name, w.key.name)
	}
	a.emitKey(w, false, "RolesExchanged", "Switchover", note)
	if stateReason != "" {
		a.emitKey(w, stateWarning, stateReason, "Switchover", stateNote)
		if stateReason == "StateNotCarried" { // a decision line, as every other give-up has
			a.log.Warn("decision", slog.String("deployment", sk.String()), slog.String("action", "StateNotCarried"), slog.String("why", stateNote))
		}
	}
	delete(a.readyMarks, sk)
	delete(a.readyMarks, w.key)
	// The old primary is no longer managed; the new one is loaded on its
	// next signal (or now, so its standby watch starts at once).
	if w.stop != nil {
		w.stop()
	}
	delete(a.workloads, w.key)
	if sw := a.workloads[sk]; sw != nil {
		// Known as an unmanaged standby until now: forget that at once.
		if sw.stop != nil {
			sw.stop()
		}
		delete(a.workloads, sk)
	}
	if _, err := a.workload(ctx, sk); err != nil {
		a.log.Warn("new primary not loaded", slog.String("deployment", sk.String()), slog.String("error", err.Error()))
	}
	// A held pod of the new primary with no state to wait for serves now.
	a.releaseHeld(ctx, sk)
	return nil
}

// deleteRetired deletes the pods of a node-mode primary just scaled to 0
// that run on this agent's node (Config.DeleteRetiredOn): those that
// signalled for it, each if it is still the Deployment's (its ReplicaSet's
// owner) and not already being deleted. Nothing here fails the retirement:
// the ReplicaSet controller deletes them anyway, later.
func (a *Actuator) deleteRetired(ctx context.Context, w *workload) {
	if a.deleteRetiredOn == "" || len(w.pods) == 0 {
		return
	}
	if m, err := contract.ParseMode(w.annotations); err != nil || m != contract.ModeNode {
		return
	}
	for _, name := range w.pods {
		pk := podKey{w.key.ns, name}
		pod, err := a.cluster.Pod(ctx, pk.ns, pk.name)
		if err != nil || pod.DeletionTimestamp != nil || pod.Spec.NodeName != a.deleteRetiredOn {
			continue // gone, going, or another node's
		}
		if dep, err := a.owner(ctx, pk, pod); err != nil || dep != w.key.name {
			continue
		}
		err = a.cluster.DeletePod(ctx, pk.ns, pk.name, string(pod.UID))
		switch {
		case err == nil:
			a.log.Info("retired pod deleted", slog.String("deployment", w.key.String()), slog.String("pod", pk.String()), slog.Bool("dry_run", a.dryRun),
				slog.String("why", "node mode: nothing else holds its restarted broker out of its Services until its ReplicaSet deletes it"))
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		case apierrors.IsForbidden(err) && !a.deleteRefused:
			a.deleteRefused = true
			a.log.Warn("retired pod not deleted: its ReplicaSet controller will; apply manifests/overlays/node-mode for the right (delete on pods, on this node only)",
				slog.String("pod", pk.String()), slog.String("error", err.Error()))
		default:
			a.log.Debug("retired pod not deleted", slog.String("pod", pk.String()), slog.String("error", err.Error()))
		}
	}
}

// watchStandby reports the standby's status (Ready, scaled up, drained) to
// Run on every change, from a watch (not polling), starting from initial when
// not nil. When the watch cannot go on (its resourceVersion too old, the API
// server gone for long), the loop reads the object again and watches anew.
func (a *Actuator) watchStandby(ctx context.Context, primary podKey, gen uint64, standby string, initial *appsv1.Deployment) {
	var last *standbyStatus
	var lastNodes [3]string
	a.follow(ctx, podKey{primary.ns, standby}, initial, func(d *appsv1.Deployment) {
		var st standbyStatus
		var ann map[string]string
		if d != nil { // nil: deleted
			st, ann = statusOf(d), d.Annotations
		}
		// The pair's nodes, and the hub of the standby's (where the
		// primary's agent relays its states): changes that matter here.
		nodes := [3]string{ann[contract.AnnPrimaryNode], ann[contract.AnnStandbyNode], ann[contract.AnnStandbyHub]}
		if last != nil && *last == st && nodes == lastNodes {
			return
		}
		last, lastNodes = &st, nodes
		select {
		case a.readyCh <- readiness{primary: primary, gen: gen, status: st, ann: ann, at: a.now()}:
		case <-ctx.Done():
		}
	})
}

// roleChange asks Run to read a standby's Deployment again: its roles
// changed (watchRole).
type roleChange struct {
	key podKey
	gen uint64
}

// watchRole watches the standby k (loaded as gen) until its roles change,
// then tells Run; the load that follows ends this watch.
func (a *Actuator) watchRole(ctx context.Context, k podKey, gen uint64, initial *appsv1.Deployment) {
	roles := func(d *appsv1.Deployment) [3]string {
		return [3]string{d.Annotations[contract.AnnRole], d.Annotations[contract.AnnPrimary], d.Annotations[contract.AnnStandby]}
	}
	was := roles(initial)
	told := false
	a.follow(ctx, k, initial, func(d *appsv1.Deployment) {
		if told || (d != nil && roles(d) == was) {
			return
		}
		if d != nil && d.Annotations[contract.AnnRole] == "primary" {
			// A role exchange writes the new primary first, then the old
			// one. Read between the two, this one would look like an
			// exchange left unfinished, and its load would repeat it
			// beside the agent still doing it (clearing the pair's node
			// annotations once more). Wait for the second write; an
			// exchange whose agent stopped is resumed after the bound.
			a.awaitExchanged(ctx, podKey{k.ns, d.Annotations[contract.AnnStandby]}, k.name)
		}
		select {
		case a.roleCh <- roleChange{key: k, gen: gen}:
			told = true
		case <-ctx.Done():
		}
	})
}

// exchangeSettle bounds awaitExchanged: a role exchange's two writes are
// one agent's two requests, milliseconds apart unless it stopped between.
const exchangeSettle = 10 * time.Second

// awaitExchanged waits (exchangeSettle at most) until old, a role
// exchange's old primary, is the standby of primary.
func (a *Actuator) awaitExchanged(ctx context.Context, old podKey, primary string) {
	if old.name == "" {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, exchangeSettle)
	defer cancel()
	a.follow(wctx, old, nil, func(d *appsv1.Deployment) {
		if d == nil || (d.Annotations[contract.AnnPrimary] == primary && d.Annotations[contract.AnnRole] == "standby") {
			cancel()
		}
	})
}

// follow reads the Deployment k (initial first, if given) and watches it
// until ctx ends, reading it again whenever a watch ends; send gets each
// state seen (nil: deleted), from this goroutine.
func (a *Actuator) follow(ctx context.Context, k podKey, initial *appsv1.Deployment, send func(*appsv1.Deployment)) {
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		d, err := initial, error(nil)
		if d == nil {
			d, err = a.cluster.Deployment(ctx, k.ns, k.name)
		}
		initial = nil
		if err != nil {
			a.log.Warn("deployment not read", slog.String("deployment", k.String()), slog.String("error", err.Error()))
			select { // back-off between failed reads, not a synchronisation
			case <-time.After(backoff):
				backoff = min(2*backoff, 10*time.Second)
				continue
			case <-ctx.Done():
				return
			}
		}
		backoff = 200 * time.Millisecond
		send(d)
		_ = a.cluster.WatchDeployment(ctx, k.ns, k.name, d.ResourceVersion, send)
	}
}

// emitKey emits an Event regarding w's Deployment (by reference).
func (a *Actuator) emitKey(w *workload, warning bool, reason, action, note string) {
	a.emit(corev1.ObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Namespace: w.key.ns, Name: w.key.name, UID: types.UID(w.uid)},
		warning, reason, action, note)
}

// emit records one Event (see recorder), without waiting for the API
// server. Failures are logged: an Event is evidence, never a reason to stop.
func (a *Actuator) emit(regarding corev1.ObjectReference, warning bool, reason, action, note string) {
	a.m.events.WithLabelValues(reason).Inc()
	a.events.record(regarding, warning, reason, action, note)
}

// readinessValue maps a signalled state to the amf.io/healthy condition.
// Anomalous stays True on purpose: an anomaly is a prediction, and taking the
// only primary out of its Services before the standby is Ready would be
// break-before-make; the switchover handles it. Trouble that is here
// (unhealthy, gone) or an orderly stop turns it False at once.
func readinessValue(st podsignal.State) (corev1.ConditionStatus, bool) {
	switch st {
	case podsignal.Healthy, podsignal.Anomalous:
		return corev1.ConditionTrue, true
	case podsignal.Unhealthy, podsignal.Gone, podsignal.Stopping, podsignal.Starting:
		return corev1.ConditionFalse, true
	}
	return "", false
}

// gateRetry is a readiness gate not written: the pod not read or the patch
// refused (the API server away, its RBAC warming up after a restart). The
// gate is written at transitions only, so a pod that went healthy while its
// patch was refused would stay out of its Services for good, and a standby
// never Ready again (the soak found one after an API server restart). It is
// tried again every retryDelay until it is written, the pod is gone, or a
// newer transition of the pod supersedes it.
type gateRetry struct {
	obs podsignal.Observation
	at  time.Time
}

func (a *Actuator) retryGate(pk podKey, s podsignal.Observation) {
	a.gateRetries[pk] = gateRetry{obs: s, at: a.now().Add(retryDelay)}
}

// gateOrRetry patches pod's readiness gate from s, or keeps it to retry.
func (a *Actuator) gateOrRetry(ctx context.Context, pod *corev1.Pod, s podsignal.Observation) {
	if err := a.patchReadinessGate(ctx, pod, s); err != nil {
		a.retryGate(podKey{pod.Namespace, pod.Name}, s)
	}
}

// gateRetriesDue tries again each readiness gate whose retry is due.
func (a *Actuator) gateRetriesDue(ctx context.Context, now time.Time) {
	for pk, g := range a.gateRetries {
		if g.at.After(now) {
			continue
		}
		pod, err := a.cluster.Pod(ctx, pk.ns, pk.name)
		switch {
		case apierrors.IsNotFound(err):
			delete(a.gateRetries, pk)
		case err != nil:
			a.log.Warn("pod not read", slog.String("pod", pk.String()), slog.String("error", err.Error()))
			a.retryGate(pk, g.obs)
		case a.isHeld(pk):
			delete(a.gateRetries, pk) // its stateful pair holds its gate (state.go)
		default:
			if err := a.patchReadinessGate(ctx, pod, g.obs); err != nil {
				a.retryGate(pk, g.obs)
			} else {
				delete(a.gateRetries, pk)
			}
		}
	}
}

func (a *Actuator) isHeld(pk podKey) bool {
	_, ok := a.held[pk]
	return ok
}

// nextGateRetry is when the next readiness gate is tried again (zero: none).
func (a *Actuator) nextGateRetry() time.Time {
	var next time.Time
	for _, g := range a.gateRetries {
		if next.IsZero() || g.at.Before(next) {
			next = g.at
		}
	}
	return next
}

// patchReadinessGate sets the amf.io/healthy condition of a pod that declares
// it as a readiness gate (only this condition: Cluster.SetPodCondition); the
// error is the patch's.
func (a *Actuator) patchReadinessGate(ctx context.Context, pod *corev1.Pod, s podsignal.Observation) error {
	declared := false
	for _, g := range pod.Spec.ReadinessGates {
		declared = declared || g.ConditionType == contract.ConditionHealthy
	}
	status, ok := readinessValue(s.State)
	if !declared || !ok {
		return nil
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == contract.ConditionHealthy && c.Status == status {
			return nil // unchanged: keep lastTransitionTime
		}
	}
	cond := corev1.PodCondition{
		Type: contract.ConditionHealthy, Status: status, Reason: reasonOf(s.State),
		Message: "signalled " + string(s.State), LastTransitionTime: metav1.NewTime(s.Received),
	}
	a.log.Info("readiness gate", slog.String("pod", pod.Namespace+"/"+pod.Name), slog.String("status", string(status)), slog.String("state", string(s.State)), slog.Bool("dry_run", a.dryRun))
	if err := a.cluster.SetPodCondition(ctx, pod.Namespace, pod.Name, cond); err != nil {
		a.log.Warn("readiness gate not patched", slog.String("pod", pod.Namespace+"/"+pod.Name), slog.String("error", err.Error()))
		return err
	}
	return nil
}

func reasonOf(st podsignal.State) string {
	if st == "" {
		return "Unknown"
	}
	return string(st[0]-'a'+'A') + string(st[1:])
}
