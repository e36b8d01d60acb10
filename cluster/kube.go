package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
)

// ErrRecordMoved means someone else changed the switchover record since this
// agent read or wrote it (SwapRecord).
var ErrRecordMoved = errors.New("switchover record changed by someone else")

// FieldManager names the agent's writes in managedFields.
const FieldManager = "amf-agent"

// Kube is the seam on a client-go clientset. The rights each call needs are
// its consumer's (actuate.Rules, nodewatch.Rules, liveness.Rules, the
// agent's tokenreviews create).
type Kube struct{ cs kubernetes.Interface }

// NewKube returns the seam on cs.
func NewKube(cs kubernetes.Interface) *Kube { return &Kube{cs} }

// Pod gets pod ns/name.
func (k *Kube) Pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return k.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// ReplicaSet gets ReplicaSet ns/name.
func (k *Kube) ReplicaSet(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
	return k.cs.AppsV1().ReplicaSets(ns).Get(ctx, name, metav1.GetOptions{})
}

// Deployment gets Deployment ns/name.
func (k *Kube) Deployment(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
	return k.cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
}

// Deployments lists the Deployments of every namespace.
func (k *Kube) Deployments(ctx context.Context) ([]appsv1.Deployment, error) {
	list, err := k.cs.AppsV1().Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// WatchDeployment calls send with ns/name at every change after
// resourceVersion rv (nil once it is deleted) until ctx ends or the stream
// cannot go on; the caller reads the object again and watches from there.
//
// It uses a RetryWatcher, which survives API server restarts and resumes
// from the last resourceVersion; when that is too old it ends, and the
// caller starts again from a fresh read.
func (k *Kube) WatchDeployment(ctx context.Context, ns, name, rv string, send func(*appsv1.Deployment)) error {
	dc := k.cs.AppsV1().Deployments(ns)
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = "metadata.name=" + name
		return dc.Watch(ctx, o)
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
	if err != nil {
		return err
	}
	defer rw.Stop()
	for ev := range rw.ResultChan() {
		if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type != watch.Deleted {
			send(d)
		} else if ev.Type == watch.Deleted {
			send(nil)
		}
	}
	return ctx.Err()
}

// Scale sets the replicas of Deployment ns/name (idempotent). It goes
// through the scale subresource, so the agent needs no update right on
// Deployments themselves: one request, without a resourceVersion, which the
// server applies to the current object (no read, no conflict).
func (k *Kube) Scale(ctx context.Context, ns, name string, replicas int32) error {
	s := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	_, err := k.cs.AppsV1().Deployments(ns).UpdateScale(ctx, name, s, metav1.UpdateOptions{FieldManager: FieldManager})
	return err
}

// recordPointer is the JSON pointer (RFC 6901) of the record annotation.
var recordPointer = "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(contract.AnnRecord, "~", "~0"), "/", "~1")

// SwapRecord replaces the switchover record annotation (contract.AnnRecord)
// of Deployment ns/name with next if it still holds prev ("": absent),
// atomically; ErrRecordMoved if it does not.
//
// The fast path is one round trip: a JSON patch whose test op is the
// compare-and-swap (the server applies it atomically to the current
// object). Any failure (the record moved, the annotation is absent, the API
// unreachable) takes the slow path, which tells them apart: read, compare,
// and write with the resourceVersion read (a conflict reads again).
func (k *Kube) SwapRecord(ctx context.Context, ns, name, prev, next string) error {
	dc := k.cs.AppsV1().Deployments(ns)
	if prev != "" {
		patch, err := json.Marshal([]map[string]string{
			{"op": "test", "path": recordPointer, "value": prev},
			{"op": "replace", "path": recordPointer, "value": next},
		})
		if err != nil {
			return err
		}
		_, err = dc.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		d, err := dc.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if d.Annotations[contract.AnnRecord] != prev {
			return ErrRecordMoved
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": d.ResourceVersion,
			"annotations":     map[string]string{contract.AnnRecord: next},
		}})
		_, err = dc.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		if apierrors.IsConflict(err) && attempt < 5 {
			continue // the deployment controller wrote status meanwhile
		}
		if err != nil {
			return fmt.Errorf("patch: %w", err)
		}
		return nil
	}
}

// PatchAnnotations sets the annotations of Deployment ns/name given a value
// and removes those given nil, in one write (a merge patch: nil is JSON
// null, which removes).
func (k *Kube) PatchAnnotations(ctx context.Context, ns, name string, ann map[string]*string) error {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	_, err = k.cs.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// ResizeMemory sets, in place (the pod's resize subresource), the memory
// limit of one container of a running pod and, when request is above 0,
// its memory request; nothing else of the pod: a strategic merge patch
// merges containers by name, so only this container's memory is touched.
func (k *Kube) ResizeMemory(ctx context.Context, ns, pod, container string, limit, request int64) error {
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"containers": []map[string]any{{"name": container, "resources": memoryResources(limit, request)}}}})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: FieldManager}, "resize")
	return err
}

// SizeTemplate sets the memory limit (and, when request is above 0, the
// memory request) of one container of the pod template of Deployment
// ns/name; nothing else of it (the same merge by container name).
func (k *Kube) SizeTemplate(ctx context.Context, ns, name, container string, limit, request int64) error {
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []map[string]any{{"name": container, "resources": memoryResources(limit, request)}}}}}})
	if err != nil {
		return err
	}
	_, err = k.cs.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// memoryResources is the resources of a memory patch: the limit, and the
// request when above 0.
func memoryResources(limit, request int64) map[string]any {
	res := map[string]any{"limits": map[string]string{"memory": strconv.FormatInt(limit, 10)}}
	if request > 0 {
		res["requests"] = map[string]string{"memory": strconv.FormatInt(request, 10)}
	}
	return res
}

// SetPodCondition sets one condition of the pod's status, by type, leaving
// every other condition (the kubelet's) as it is: a strategic merge patch
// of status.conditions merges by type.
func (k *Kube) SetPodCondition(ctx context.Context, ns, name string, c corev1.PodCondition) error {
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{c}}})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	return err
}

// DeletePod deletes pod ns/name if it is still the one with uid (a
// precondition: a pod of the same name created since is left alone), with
// the pod's own grace period.
func (k *Kube) DeletePod(ctx context.Context, ns, name, uid string) error {
	return k.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(types.UID(uid))}})
}

// CreateEvent creates ev and returns the name the server gave it.
func (k *Kube) CreateEvent(ctx context.Context, ev *eventsv1.Event) (string, error) {
	created, err := k.cs.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return created.Name, nil
}

// PatchEventSeries writes the series (count, last time) of an Event; a
// NotFound error (apierrors.IsNotFound) says it expired.
func (k *Kube) PatchEventSeries(ctx context.Context, ns, name string, s *eventsv1.EventSeries) error {
	patch, err := json.Marshal(map[string]any{"series": s})
	if err != nil {
		return err
	}
	_, err = k.cs.EventsV1().Events(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// Lease gets Lease ns/name.
func (k *Kube) Lease(ctx context.Context, ns, name string) (*coordinationv1.Lease, error) {
	return k.cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
}

// CreateLease creates l; AlreadyExists if its name is taken.
func (k *Kube) CreateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return k.cs.CoordinationV1().Leases(l.Namespace).Create(ctx, l, metav1.CreateOptions{})
}

// UpdateLease replaces l; Conflict if it changed since l's resourceVersion.
func (k *Kube) UpdateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return k.cs.CoordinationV1().Leases(l.Namespace).Update(ctx, l, metav1.UpdateOptions{})
}

// LeaseListWatch lists and watches the Leases of namespace ns that match
// the label selector, for an informer (watchtools.UntilWithSync).
func (k *Kube) LeaseListWatch(ns, selector string) cache.ListerWatcher {
	return cache.NewFilteredListWatchFromClient(k.cs.CoordinationV1().RESTClient(), "leases", ns, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
}

// ReviewToken creates the TokenReview tr and returns the API server's
// answer (its status says who the token is).
func (k *Kube) ReviewToken(ctx context.Context, tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
	return k.cs.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
}
