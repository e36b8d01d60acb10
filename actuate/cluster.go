package actuate

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"

	"github.com/amf-edge/amf/cluster"
)

// Cluster is everything the actuator reads and writes in Kubernetes: its
// part of the agent's one seam to the API server (package cluster), between
// the switchover logic (step, do, load, retire) and client-go.
// cluster.NewKube is the real one, clusterfake.Cluster the tests', and
// DryRun wraps any Cluster so that nothing is written.
//
// Errors of the real one are client-go's (apierrors applies); SwapRecord's
// cluster.ErrRecordMoved and PatchEventSeries' NotFound are part of the
// contract.
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
	// next if it still holds prev ("": absent), atomically;
	// cluster.ErrRecordMoved if it does not.
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
	// DeletePod deletes pod ns/name if its UID is still uid, with its own
	// grace period.
	DeletePod(ctx context.Context, ns, name, uid string) error
	// CreateEvent creates ev and returns the name the server gave it.
	CreateEvent(ctx context.Context, ev *eventsv1.Event) (string, error)
	// PatchEventSeries writes the series (count, last time) of an Event;
	// a NotFound error (apierrors.IsNotFound) says it expired.
	PatchEventSeries(ctx context.Context, ns, name string, s *eventsv1.EventSeries) error
}

// The real Cluster; the fake is clusterfake.Cluster (asserted in the
// tests).
var _ Cluster = (*cluster.Kube)(nil)

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
func (dryRun) DeletePod(context.Context, string, string, string) error      { return nil }
func (dryRun) CreateEvent(context.Context, *eventsv1.Event) (string, error) { return "", nil }
func (dryRun) PatchEventSeries(context.Context, string, string, *eventsv1.EventSeries) error {
	return nil
}
