package actuate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/amf-edge/amf/brokerpod"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// resizePollEvery is how often a resize in progress reads its pod until the
// kubelet answers: it does within a pod sync, about a second. Reading the
// one pod by name needs only the get the actuator has (no watch on pods).
const resizePollEvery = 500 * time.Millisecond

// resizePod carries out an ActResize: the broker container of act.Pod gets
// the memory limit act.Memory and its request moves by the same difference,
// so the QoS class stays what it was (Kubernetes refuses a resize that
// changes it) and the node's scheduler and kubelet account for the memory
// given: a node without the room answers Deferred or Infeasible, which is
// the check "the node can hold it" made by the one who knows. refused says
// why the API will not take it (not worth a retry); err is a failure to try
// again.
func (a *Actuator) resizePod(ctx context.Context, w *workload, act Action) (refused string, err error) {
	pod, err := a.cluster.Pod(ctx, w.key.ns, act.Pod)
	if apierrors.IsNotFound(err) {
		return "pod " + act.Pod + " is gone", nil
	}
	if err != nil {
		return "", fmt.Errorf("get pod %s: %w", act.Pod, err)
	}
	name, err := a.brokerOf(pod, w)
	if err != nil {
		return "pod " + act.Pod + ": " + err.Error(), nil
	}
	var c corev1.Container
	for _, have := range pod.Spec.Containers {
		if have.Name == name {
			c = have
		}
	}
	lim, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return fmt.Sprintf("container %s of %s has no memory limit to raise", name, act.Pod), nil
	}
	delta := act.Memory - lim.Value()
	if delta == 0 {
		return "", nil // asked already (a resume, a retry)
	}
	var req int64
	if r, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
		req = max(r.Value()+delta, 1)
	}
	if err := a.cluster.ResizeMemory(ctx, w.key.ns, act.Pod, name, act.Memory, req); err != nil {
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsBadRequest(err) || apierrors.IsMethodNotSupported(err) {
			return fmt.Sprintf("the API server refused to resize %s/%s: %v", act.Pod, name, err), nil
		}
		return "", fmt.Errorf("resize %s/%s: %w", act.Pod, name, err)
	}
	return "", nil
}

// brokerOf is the broker container of a pod of w (brokerIn).
func (a *Actuator) brokerOf(pod *corev1.Pod, w *workload) (string, error) {
	return brokerIn(pod, w.annotations)
}

// brokerIn is the container the pod's sidecar watches, else the one node
// mode would watch (the Deployment's annotations ann may name it).
func brokerIn(pod *corev1.Pod, ann map[string]string) (string, error) {
	if name := brokerpod.Watched(pod); name != "" {
		return name, nil
	}
	return brokerpod.Container(pod, ann[contract.AnnContainer])
}

// pollResize reads the pod of the resize in progress and tells its Gate what
// the kubelet answered, if it has.
func (a *Actuator) pollResize(ctx context.Context, w *workload) {
	now := a.now()
	w.resizePollAt = now.Add(resizePollEvery)
	if why := w.resizeRefused; why != "" {
		w.resizeRefused = ""
		a.step(ctx, w, ResizeRefused(now, why))
		return
	}
	rz := w.gate.Rec.Resize
	if rz.Pod == "" || rz.Kubelet {
		return // the status said so already: the sidecar's samples tell the rest
	}
	pod, err := a.cluster.Pod(ctx, w.key.ns, rz.Pod)
	if apierrors.IsNotFound(err) {
		a.step(ctx, w, ResizeRefused(now, "pod "+rz.Pod+" is gone"))
		return
	}
	if err != nil {
		a.log.Warn("resized pod not read", slog.String("pod", w.key.ns+"/"+rz.Pod), slog.String("error", err.Error()))
		return
	}
	name, err := a.brokerOf(pod, w)
	if err != nil {
		a.step(ctx, w, ResizeRefused(now, "pod "+rz.Pod+": "+err.Error()))
		return
	}
	switch applied, refused := resizeStatus(pod, name, rz.To); {
	case refused != "":
		a.step(ctx, w, ResizeRefused(now, refused))
	case applied:
		a.step(ctx, w, ResizeApplied(now))
	}
}

// resizeStatus reads the kubelet's answer to a resize of container to a
// memory limit of to bytes: applied (its status reports the limit, nothing
// of the resize pending or in progress), or refused: PodResizePending
// (Deferred: no room now; Infeasible: never on this node), or
// PodResizeInProgress with an error.
func resizeStatus(pod *corev1.Pod, container string, to int64) (applied bool, refused string) {
	busy := false
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case corev1.PodResizePending:
			why := "the kubelet says " + c.Reason
			if c.Message != "" {
				why += ": " + c.Message
			}
			return false, why
		case corev1.PodResizeInProgress:
			if c.Reason == corev1.PodReasonError {
				return false, "the kubelet could not apply it: " + c.Message
			}
			busy = true
		}
	}
	if busy {
		return false, ""
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != container || cs.Resources == nil {
			continue
		}
		if l, ok := cs.Resources.Limits[corev1.ResourceMemory]; ok && l.Value() >= to {
			return true, ""
		}
	}
	return false, ""
}

// The size survives. A resize is not written back to the Deployment by
// Kubernetes, and writing a running Deployment's template would roll its
// pod: the very restart the resize avoided. So the agent records the size
// the broker needed on both Deployments of the pair (contract.AnnMemorySize)
// and gives it
//   - to the pod template of a Deployment that runs no pod (the cold
//     standby now; the old primary once a switchover retires it), where a
//     template change rolls nothing: its next pod starts with the size;
//   - to each running pod of the pair that signals a smaller limit (a hot
//     standby, a primary's pod re-created from its old template), in place,
//     once per pod and size.

// keepSize carries out ActKeepSize.
func (a *Actuator) keepSize(ctx context.Context, w *workload, size int64) error {
	v := strconv.FormatInt(size, 10)
	for _, name := range []string{w.key.name, w.gate.Policy.Standby} {
		k := podKey{w.key.ns, name}
		if err := a.cluster.PatchAnnotations(ctx, k.ns, k.name, map[string]*string{contract.AnnMemorySize: &v}); err != nil {
			return fmt.Errorf("record the size on %s: %w", k, err)
		}
		if l, ok := a.workloads[k]; ok {
			l.annotations = maps.Clone(l.annotations)
			if l.annotations == nil {
				l.annotations = map[string]string{}
			}
			l.annotations[contract.AnnMemorySize] = v
		}
		d, err := a.cluster.Deployment(ctx, k.ns, k.name)
		if err != nil {
			return fmt.Errorf("get %s: %w", k, err)
		}
		if err := a.sizeTemplate(ctx, d, size); err != nil {
			return err
		}
	}
	return nil
}

// sizeTemplate gives the broker container of d's pod template the memory
// limit size (its request moved by as much) if d runs no pod and the
// template is smaller.
func (a *Actuator) sizeTemplate(ctx context.Context, d *appsv1.Deployment, size int64) error {
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
		return nil // it runs a pod: a template change would roll it
	}
	tmpl := &corev1.Pod{ObjectMeta: d.Spec.Template.ObjectMeta, Spec: d.Spec.Template.Spec}
	name, err := brokerIn(tmpl, d.Annotations)
	if err != nil {
		// A shape not foreseen: said, and nothing to retry.
		a.log.Warn("template not sized: no broker container found in it", slog.String("deployment", d.Namespace+"/"+d.Name),
			slog.Int64("memory", size), slog.String("why", err.Error()))
		return nil
	}
	for _, c := range tmpl.Spec.Containers {
		if c.Name != name {
			continue
		}
		lim, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok || lim.Value() >= size {
			return nil // no limit to raise (the broker is not bounded there), or big enough
		}
		var req int64
		if r, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
			req = max(r.Value()+size-lim.Value(), 1)
		}
		if err := a.cluster.SizeTemplate(ctx, d.Namespace, d.Name, name, size, req); err != nil {
			return fmt.Errorf("size %s/%s's template: %w", d.Namespace, d.Name, err)
		}
	}
	return nil
}

// memorySize is the size recorded on w (contract.AnnMemorySize), 0 without.
func memorySize(w *workload) int64 {
	n, err := strconv.ParseInt(w.annotations[contract.AnnMemorySize], 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// keepPodSize resizes in place a pod of w that signals a memory limit below
// the size recorded on w, once per pod and size, while no switchover or
// resize of w is in progress.
func (a *Actuator) keepPodSize(ctx context.Context, w *workload, s podsignal.Observation) {
	size := memorySize(w)
	if size == 0 || s.Message == nil || s.Message.MemoryLimitBytes == nil || *s.Message.MemoryLimitBytes >= float64(size) {
		return
	}
	if w.managed && w.gate.Rec.Phase != PhaseIdle && w.gate.Rec.Phase != PhaseSuspect {
		return
	}
	pk := podKey{s.Namespace, s.Pod}
	if a.sized[pk] == size {
		return
	}
	if len(a.sized) >= a.ownersMax {
		clear(a.sized) // bounded like the owner cache; a pod asked again is asked idempotently
	}
	a.sized[pk] = size
	t0 := a.now()
	refused, err := a.resizePod(ctx, w, Action{Kind: ActResize, Pod: s.Pod, Memory: size})
	if refused != "" {
		err = errors.New(refused)
	}
	a.m.action(string(ActResize), err, a.dryRun, a.now().Sub(t0))
	a.decision(w, string(ActResize), err, slog.String("reason", "SizeKept"), slog.String("pod", s.Pod), slog.Int64("memory", size),
		slog.String("message", fmt.Sprintf("the pod started at %s, below the %s the broker needed (%s)",
			mib(*s.Message.MemoryLimitBytes), mib(float64(size)), contract.AnnMemorySize)))
}
