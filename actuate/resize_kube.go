package actuate

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/amf-edge/amf/brokerpod"
	"github.com/amf-edge/amf/contract"
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

// brokerOf is the container the pod's sidecar watches, else the one node
// mode would watch.
func (a *Actuator) brokerOf(pod *corev1.Pod, w *workload) (string, error) {
	if name := brokerpod.Watched(pod); name != "" {
		return name, nil
	}
	return brokerpod.Container(pod, w.annotations[contract.AnnContainer])
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
