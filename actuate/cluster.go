package actuate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/amf-edge/amf/contract"
)

// Cluster is everything the actuator reads and writes in Kubernetes, named by
// what the actuator means rather than by API verbs: the seam between the
// switchover logic (step, do, load, retire) and client-go. NewKubeCluster is
// the real one, DryRun wraps any Cluster so that nothing is written, and the
// tests' fakeCluster sits beside them.
//
// Errors of the real one are client-go's (apierrors applies); SwapRecord's
// ErrRecordMoved and PatchEventSeries' NotFound are part of the contract.
type Cluster interface {
	Pod(ctx context.Context, ns, name string) (*corev1.Pod, error)
	ReplicaSet(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error)
	Deployment(ctx context.Context, ns, name string) (*appsv1.Deployment, error)
	// Deployments lists the Deployments of every namespace (ResumeOnStart).
	Deployments(ctx context.Context) ([]appsv1.Deployment, error)
	// WatchDeployment calls send with ns/name at every change after
	// resourceVersion rv (nil once it is deleted) until ctx ends or the
	// stream cannot go on; the caller reads the object again and watches
	// from there.
	WatchDeployment(ctx context.Context, ns, name, rv string, send func(*appsv1.Deployment)) error

	// Scale sets the replicas of ns/name (idempotent).
	Scale(ctx context.Context, ns, name string, replicas int32) error
	// SwapRecord replaces the switchover record annotation of ns/name with
	// next if it still holds prev ("": absent), atomically; ErrRecordMoved
	// if it does not.
	SwapRecord(ctx context.Context, ns, name, prev, next string) error
	// PatchAnnotations sets the annotations of ns/name given a value and
	// removes those given nil, in one write.
	PatchAnnotations(ctx context.Context, ns, name string, ann map[string]*string) error
	// ResizeMemory sets, in place (the pod's resize subresource), the
	// memory limit of one container of a running pod and, when request is
	// above 0, its memory request; nothing else of the pod.
	ResizeMemory(ctx context.Context, ns, pod, container string, limit, request int64) error
	// SizeTemplate sets the memory limit (and, when request is above 0,
	// the memory request) of one container of the pod template of
	// Deployment ns/name; nothing else of it.
	SizeTemplate(ctx context.Context, ns, name, container string, limit, request int64) error
	// SetPodCondition sets one condition of the pod's status, by type,
	// leaving every other condition (the kubelet's) as it is.
	SetPodCondition(ctx context.Context, ns, name string, c corev1.PodCondition) error
	// CreateEvent creates ev and returns the name the server gave it.
	CreateEvent(ctx context.Context, ev *eventsv1.Event) (string, error)
	// PatchEventSeries writes the series (count, last time) of an Event;
	// a NotFound error (apierrors.IsNotFound) says it expired.
	PatchEventSeries(ctx context.Context, ns, name string, s *eventsv1.EventSeries) error
}

// ErrRecordMoved means someone else changed the switchover record since this
// agent read or wrote it.
var ErrRecordMoved = errors.New("switchover record changed by someone else")

// NewKubeCluster is the Cluster of a client-go clientset; it needs exactly
// Rules() (RulesWithResume for Deployments).
func NewKubeCluster(cs kubernetes.Interface) Cluster { return kubeCluster{cs} }

type kubeCluster struct{ cs kubernetes.Interface }

func (k kubeCluster) Pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return k.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

func (k kubeCluster) ReplicaSet(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
	return k.cs.AppsV1().ReplicaSets(ns).Get(ctx, name, metav1.GetOptions{})
}

func (k kubeCluster) Deployment(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
	return k.cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
}

func (k kubeCluster) Deployments(ctx context.Context) ([]appsv1.Deployment, error) {
	list, err := k.cs.AppsV1().Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// WatchDeployment uses a RetryWatcher, which survives API server restarts
// and resumes from the last resourceVersion; when that is too old it ends,
// and the caller starts again from a fresh read.
func (k kubeCluster) WatchDeployment(ctx context.Context, ns, name, rv string, send func(*appsv1.Deployment)) error {
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

// Scale goes through the scale subresource, so the agent needs no update
// right on Deployments themselves: one request, without a resourceVersion,
// which the server applies to the current object (no read, no conflict).
func (k kubeCluster) Scale(ctx context.Context, ns, name string, replicas int32) error {
	s := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	_, err := k.cs.AppsV1().Deployments(ns).UpdateScale(ctx, name, s, metav1.UpdateOptions{FieldManager: fieldManager})
	return err
}

// recordPointer is the JSON pointer (RFC 6901) of the record annotation.
var recordPointer = "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(contract.AnnRecord, "~", "~0"), "/", "~1")

// SwapRecord's fast path is one round trip: a JSON patch whose test op is
// the compare-and-swap (the server applies it atomically to the current
// object). Any failure (the record moved, the annotation is absent, the API
// unreachable) takes the slow path, which tells them apart: read, compare,
// and write with the resourceVersion read (a conflict reads again).
func (k kubeCluster) SwapRecord(ctx context.Context, ns, name, prev, next string) error {
	dc := k.cs.AppsV1().Deployments(ns)
	if prev != "" {
		patch, err := json.Marshal([]map[string]string{
			{"op": "test", "path": recordPointer, "value": prev},
			{"op": "replace", "path": recordPointer, "value": next},
		})
		if err != nil {
			return err
		}
		_, err = dc.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
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
		_, err = dc.Patch(ctx, name, mergePatch, patch, metav1.PatchOptions{FieldManager: fieldManager})
		if apierrors.IsConflict(err) && attempt < 5 {
			continue // the deployment controller wrote status meanwhile
		}
		if err != nil {
			return fmt.Errorf("patch: %w", err)
		}
		return nil
	}
}

func (k kubeCluster) PatchAnnotations(ctx context.Context, ns, name string, ann map[string]*string) error {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}}) // nil → JSON null: removed
	if err != nil {
		return err
	}
	_, err = k.cs.AppsV1().Deployments(ns).Patch(ctx, name, mergePatch, b, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

// ResizeMemory: a strategic merge patch of the resize subresource merges
// containers by name, so only this container's memory is touched.
func (k kubeCluster) ResizeMemory(ctx context.Context, ns, pod, container string, limit, request int64) error {
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"containers": []map[string]any{{"name": container, "resources": memoryResources(limit, request)}}}})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: fieldManager}, "resize")
	return err
}

// SizeTemplate: the same merge by container name, on the Deployment's
// pod template.
func (k kubeCluster) SizeTemplate(ctx context.Context, ns, name, container string, limit, request int64) error {
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []map[string]any{{"name": container, "resources": memoryResources(limit, request)}}}}}})
	if err != nil {
		return err
	}
	_, err = k.cs.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: fieldManager})
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

// SetPodCondition: a strategic merge patch of status.conditions merges by
// type, so only this condition is touched, never the kubelet's.
func (k kubeCluster) SetPodCondition(ctx context.Context, ns, name string, c corev1.PodCondition) error {
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{c}}})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	return err
}

func (k kubeCluster) CreateEvent(ctx context.Context, ev *eventsv1.Event) (string, error) {
	created, err := k.cs.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return created.Name, nil
}

func (k kubeCluster) PatchEventSeries(ctx context.Context, ns, name string, s *eventsv1.EventSeries) error {
	patch, err := json.Marshal(map[string]any{"series": s})
	if err != nil {
		return err
	}
	_, err = k.cs.EventsV1().Events(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// DryRun wraps c so that every write succeeds without reaching the cluster
// (the agent's --observe-only): the actuator runs exactly as it would, on
// what the cluster really holds, and its decision log says what it would
// have done. Reads go to c.
func DryRun(c Cluster) Cluster { return dryRun{c} }

type dryRun struct{ Cluster }

func (dryRun) Scale(context.Context, string, string, int32) error               { return nil }
func (dryRun) SwapRecord(context.Context, string, string, string, string) error { return nil }
func (dryRun) PatchAnnotations(context.Context, string, string, map[string]*string) error {
	return nil
}
func (dryRun) ResizeMemory(context.Context, string, string, string, int64, int64) error { return nil }
func (dryRun) SizeTemplate(context.Context, string, string, string, int64, int64) error { return nil }
func (dryRun) SetPodCondition(context.Context, string, string, corev1.PodCondition) error {
	return nil
}
func (dryRun) CreateEvent(context.Context, *eventsv1.Event) (string, error) { return "", nil }
func (dryRun) PatchEventSeries(context.Context, string, string, *eventsv1.EventSeries) error {
	return nil
}
