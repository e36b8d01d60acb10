// Package clusterfake is the in-memory cluster.Kube that the unit tests of
// every consumer of package cluster use (actuate, nodewatch, liveness, the
// agent's TokenReview): one fake with the API server's semantics that the
// consumers rely on, instead of each test reaching past the seam to
// client-go's fake clientset.
//
// What it keeps honest: reads return copies; a missing object is an
// apierrors NotFound, a Lease created twice AlreadyExists and one updated
// from a stale resourceVersion a Conflict; every change bumps one
// cluster-wide resourceVersion; SwapRecord is a compare-and-swap; a watch
// (WatchDeployment, LeaseListWatch) delivers what changed after the
// resourceVersion it starts from. What it stands in for: the deployment
// controller (AutoReady), the kubelet's answer to a resize (Resize), the
// authenticator behind TokenReview (Review).
package clusterfake

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
)

// Key names a namespaced object.
type Key struct{ Namespace, Name string }

// Cluster is an in-memory cluster: the objects it holds, every write in
// order, and stand-ins for the controllers and the kubelet.
//
// The embedded Mutex guards every exported field; the methods take it
// themselves. A test holds it to read or change the fields directly and
// calls ChangedLocked after a change, so that waiters (Await) and watches
// see it.
type Cluster struct {
	sync.Mutex
	// Deps are the Deployments (Deployments is the list call).
	Deps        map[Key]*appsv1.Deployment
	Pods        map[Key]*corev1.Pod
	ReplicaSets map[Key]*appsv1.ReplicaSet
	Leases      map[Key]*coordinationv1.Lease
	Events      []*eventsv1.Event
	// Writes are the writes that went through, in order: "scale ns/name N",
	// "record ns/name PHASE", "annotations ns/name[ role=ROLE]",
	// "resize ns/pod CONTAINER LIMITMi REQUESTMi", "template ns/name
	// CONTAINER LIMITMi REQUESTMi", "condition ns/pod TYPE=STATUS",
	// "event REASON", "series REASON", "lease create|update ns/name",
	// "delete ns/pod".
	Writes []string
	// Fail makes every call of one kind fail with its error, by kind:
	// "get" (Deployment), the writes' first words above ("scale",
	// "record", …; "event" covers series too), "lease" (every Lease call,
	// reads and list+watch included) and "review".
	Fail map[string]error
	// AutoReady stands in for the deployment controller: a Deployment
	// scaled up is Ready at once (status at the new generation); default
	// true.
	AutoReady bool
	// Resize is how the kubelet answers a resize: "" applies it at once
	// (spec and status), else a PodResizePending condition of that reason.
	Resize string
	// Review answers TokenReviews with the status the API server would
	// give the review; nil: every token is unauthenticated.
	Review func(*authnv1.TokenReview) (authnv1.TokenReviewStatus, error)

	changed  chan struct{} // closed and replaced at every change, for Await
	rv       int           // the last resourceVersion given
	watchers map[Key][]chan *appsv1.Deployment
	leaseLog []leaseEvent // every Lease change, for watches from a resourceVersion
	leaseWs  []*leaseWatch
}

// New returns an empty Cluster whose Deployments become Ready when scaled
// up (AutoReady).
func New() *Cluster {
	return &Cluster{changed: make(chan struct{}), Deps: map[Key]*appsv1.Deployment{}, Pods: map[Key]*corev1.Pod{},
		ReplicaSets: map[Key]*appsv1.ReplicaSet{}, Leases: map[Key]*coordinationv1.Lease{}, Fail: map[string]error{},
		watchers: map[Key][]chan *appsv1.Deployment{}, AutoReady: true}
}

// Add puts copies of objs into the cluster as they are, with a new
// resourceVersion each: Deployments, pods, ReplicaSets and Leases; any
// other kind is a mistake of the test and panics.
func (f *Cluster) Add(objs ...runtime.Object) {
	f.Lock()
	defer f.Unlock()
	for _, o := range objs {
		o = o.DeepCopyObject()
		switch o := o.(type) {
		case *appsv1.Deployment:
			f.Deps[Key{o.Namespace, o.Name}] = o
			f.ChangedLocked(o)
		case *corev1.Pod:
			f.Pods[Key{o.Namespace, o.Name}] = o
			o.ResourceVersion = f.nextRV()
			f.ChangedLocked(nil)
		case *appsv1.ReplicaSet:
			f.ReplicaSets[Key{o.Namespace, o.Name}] = o
			o.ResourceVersion = f.nextRV()
			f.ChangedLocked(nil)
		case *coordinationv1.Lease:
			typ := watch.Added
			if _, ok := f.Leases[Key{o.Namespace, o.Name}]; ok {
				typ = watch.Modified
			}
			f.putLeaseLocked(typ, o)
		default:
			panic(fmt.Sprintf("clusterfake: Add of a %T", o))
		}
	}
}

func (f *Cluster) nextRV() string {
	f.rv++
	return strconv.Itoa(f.rv)
}

// ChangedLocked records a change of d (nil: of anything else, or a write
// that changed nothing) and wakes the waiters and d's watches. The caller
// holds the lock.
func (f *Cluster) ChangedLocked(d *appsv1.Deployment) {
	if d != nil {
		d.ResourceVersion = f.nextRV()
		for _, ch := range f.watchers[Key{d.Namespace, d.Name}] {
			ch <- d.DeepCopy() // buffered: a watch that falls this far behind fails the test
		}
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// Await waits until cond, called with the lock held, holds (true), or bound
// has passed (false).
func (f *Cluster) Await(bound time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		f.Lock()
		ok, ch := cond(), f.changed
		f.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// WatchingLocked is the number of watches of Deployment ns/name open now.
// The caller holds the lock.
func (f *Cluster) WatchingLocked(ns, name string) int { return len(f.watchers[Key{ns, name}]) }

// ReasonsLocked are the reasons of the Events created so far. The caller
// holds the lock.
func (f *Cluster) ReasonsLocked() []string {
	var out []string
	for _, ev := range f.Events {
		out = append(out, ev.Reason)
	}
	return out
}

func notFound(resource, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
}

// Pod gets pod ns/name.
func (f *Cluster) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	f.Lock()
	defer f.Unlock()
	if p, ok := f.Pods[Key{ns, name}]; ok {
		return p.DeepCopy(), nil
	}
	return nil, notFound("pods", name)
}

// ReplicaSet gets ReplicaSet ns/name.
func (f *Cluster) ReplicaSet(_ context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
	f.Lock()
	defer f.Unlock()
	if rs, ok := f.ReplicaSets[Key{ns, name}]; ok {
		return rs.DeepCopy(), nil
	}
	return nil, notFound("replicasets", name)
}

// Deployment gets Deployment ns/name.
func (f *Cluster) Deployment(_ context.Context, ns, name string) (*appsv1.Deployment, error) {
	f.Lock()
	defer f.Unlock()
	if err := f.Fail["get"]; err != nil {
		return nil, err
	}
	if d, ok := f.Deps[Key{ns, name}]; ok {
		return d.DeepCopy(), nil
	}
	return nil, notFound("deployments", name)
}

// Deployments lists the Deployments of every namespace.
func (f *Cluster) Deployments(context.Context) ([]appsv1.Deployment, error) {
	f.Lock()
	defer f.Unlock()
	var out []appsv1.Deployment
	for _, d := range f.Deps {
		out = append(out, *d.DeepCopy())
	}
	return out, nil
}

// WatchDeployment delivers, like a watch from resourceVersion rv, what
// changed since rv: the object as it is now when it moved on since rv was
// read, then every later change, until ctx ends.
func (f *Cluster) WatchDeployment(ctx context.Context, ns, name, rv string, send func(*appsv1.Deployment)) error {
	ch := make(chan *appsv1.Deployment, 256)
	k := Key{ns, name}
	f.Lock()
	f.watchers[k] = append(f.watchers[k], ch)
	if d := f.Deps[k]; d != nil && d.ResourceVersion != rv {
		ch <- d.DeepCopy()
	}
	f.ChangedLocked(nil) // a test may await a watch
	f.Unlock()
	defer func() {
		f.Lock()
		defer f.Unlock()
		if i := slices.Index(f.watchers[k], ch); i >= 0 {
			f.watchers[k] = slices.Delete(f.watchers[k], i, i+1)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d := <-ch:
			send(d)
		}
	}
}

// writeLocked logs a write, or returns the failure set for op.
func (f *Cluster) writeLocked(op, what string) error {
	if err := f.Fail[op]; err != nil {
		return err
	}
	f.Writes = append(f.Writes, what)
	return nil
}

// Scale sets the replicas of Deployment ns/name; a change is a new
// generation (Ready at once with AutoReady).
func (f *Cluster) Scale(_ context.Context, ns, name string, replicas int32) error {
	f.Lock()
	defer f.Unlock()
	d, ok := f.Deps[Key{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	if err := f.writeLocked("scale", fmt.Sprintf("scale %s/%s %d", ns, name, replicas)); err != nil {
		return err
	}
	if *d.Spec.Replicas != replicas {
		d.Spec.Replicas = ptr.To(replicas)
		d.Generation++
		if f.AutoReady {
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, ReadyReplicas: replicas}
		}
	}
	f.ChangedLocked(d)
	return nil
}

// SwapRecord replaces the record annotation of Deployment ns/name with next
// if it holds prev ("": absent), else cluster.ErrRecordMoved.
func (f *Cluster) SwapRecord(_ context.Context, ns, name, prev, next string) error {
	f.Lock()
	defer f.Unlock()
	d, ok := f.Deps[Key{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	if d.Annotations[contract.AnnRecord] != prev {
		return cluster.ErrRecordMoved
	}
	var rec struct {
		Phase string `json:"phase"`
	}
	_ = json.Unmarshal([]byte(next), &rec) // the phase only names the write in Writes
	if err := f.writeLocked("record", fmt.Sprintf("record %s/%s %s", ns, name, rec.Phase)); err != nil {
		return err
	}
	d.Annotations = maps.Clone(d.Annotations)
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[contract.AnnRecord] = next
	f.ChangedLocked(d)
	return nil
}

// PatchAnnotations sets the annotations of Deployment ns/name given a value
// and removes those given nil.
func (f *Cluster) PatchAnnotations(_ context.Context, ns, name string, ann map[string]*string) error {
	f.Lock()
	defer f.Unlock()
	d, ok := f.Deps[Key{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	what := fmt.Sprintf("annotations %s/%s", ns, name)
	if role := ann[contract.AnnRole]; role != nil {
		what += " role=" + *role // a role exchange's write
	}
	if err := f.writeLocked("annotations", what); err != nil {
		return err
	}
	d.Annotations = maps.Clone(d.Annotations)
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	for k, v := range ann {
		if v == nil {
			delete(d.Annotations, k)
		} else {
			d.Annotations[k] = *v
		}
	}
	f.ChangedLocked(d)
	return nil
}

// ResizeMemory resizes one container's memory of a pod in place, and
// answers as the kubelet would (Resize).
func (f *Cluster) ResizeMemory(_ context.Context, ns, name, container string, limit, request int64) error {
	f.Lock()
	defer f.Unlock()
	p, ok := f.Pods[Key{ns, name}]
	if !ok {
		return notFound("pods", name)
	}
	if err := f.writeLocked("resize", fmt.Sprintf("resize %s/%s %s %dMi %dMi", ns, name, container, limit>>20, request>>20)); err != nil {
		return err
	}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		if c.Name != container {
			continue
		}
		SetMemory(&c.Resources, limit, request)
		if f.Resize != "" {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: f.Resize})
			break
		}
		for j := range p.Status.ContainerStatuses {
			if s := &p.Status.ContainerStatuses[j]; s.Name == container {
				s.Resources = c.Resources.DeepCopy()
			}
		}
	}
	f.ChangedLocked(nil)
	return nil
}

// SetMemory is what a memory patch does to a container's resources (whose
// Limits and, when request is above 0, Requests are not nil).
func SetMemory(r *corev1.ResourceRequirements, limit, request int64) {
	r.Limits[corev1.ResourceMemory] = *resource.NewQuantity(limit, resource.BinarySI)
	if request > 0 {
		r.Requests[corev1.ResourceMemory] = *resource.NewQuantity(request, resource.BinarySI)
	}
}

// SizeTemplate sets one container's memory in the pod template of
// Deployment ns/name: a new generation.
func (f *Cluster) SizeTemplate(_ context.Context, ns, name, container string, limit, request int64) error {
	f.Lock()
	defer f.Unlock()
	d, ok := f.Deps[Key{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	if err := f.writeLocked("template", fmt.Sprintf("template %s/%s %s %dMi %dMi", ns, name, container, limit>>20, request>>20)); err != nil {
		return err
	}
	for i := range d.Spec.Template.Spec.Containers {
		c := &d.Spec.Template.Spec.Containers[i]
		if c.Name == container {
			SetMemory(&c.Resources, limit, request)
		}
	}
	d.Generation++
	f.ChangedLocked(d)
	return nil
}

// SetPodCondition sets one condition of pod ns/name by type, keeping the
// others.
func (f *Cluster) SetPodCondition(_ context.Context, ns, name string, c corev1.PodCondition) error {
	f.Lock()
	defer f.Unlock()
	p, ok := f.Pods[Key{ns, name}]
	if !ok {
		return notFound("pods", name)
	}
	if err := f.writeLocked("condition", fmt.Sprintf("condition %s/%s %s=%s", ns, name, c.Type, c.Status)); err != nil {
		return err
	}
	conds := []corev1.PodCondition{c}
	for _, have := range p.Status.Conditions {
		if have.Type != c.Type {
			conds = append(conds, have)
		}
	}
	p.Status.Conditions = conds
	f.ChangedLocked(nil)
	return nil
}

// DeletePod removes pod ns/name if its UID is uid (the server's
// precondition: a Conflict otherwise).
func (f *Cluster) DeletePod(_ context.Context, ns, name, uid string) error {
	f.Lock()
	defer f.Unlock()
	p, ok := f.Pods[Key{ns, name}]
	if !ok {
		return notFound("pods", name)
	}
	if string(p.UID) != uid {
		return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, name, fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", uid, p.UID))
	}
	if err := f.writeLocked("delete", fmt.Sprintf("delete %s/%s", ns, name)); err != nil {
		return err
	}
	delete(f.Pods, Key{ns, name})
	f.ChangedLocked(nil)
	return nil
}

// CreateEvent keeps a copy of ev, named as the server would from its
// GenerateName.
func (f *Cluster) CreateEvent(_ context.Context, ev *eventsv1.Event) (string, error) {
	f.Lock()
	defer f.Unlock()
	if err := f.writeLocked("event", "event "+ev.Reason); err != nil {
		return "", err
	}
	ev = ev.DeepCopy()
	if ev.Name == "" {
		ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, len(f.Events))
	}
	ev.ResourceVersion = f.nextRV()
	f.Events = append(f.Events, ev)
	f.ChangedLocked(nil)
	return ev.Name, nil
}

// PatchEventSeries sets the series of Event ns/name; NotFound once it is
// gone (a test deletes it from Events to expire it).
func (f *Cluster) PatchEventSeries(_ context.Context, ns, name string, s *eventsv1.EventSeries) error {
	f.Lock()
	defer f.Unlock()
	for _, ev := range f.Events {
		if ev.Namespace == ns && ev.Name == name {
			if err := f.writeLocked("event", "series "+ev.Reason); err != nil {
				return err
			}
			ev.Series = s.DeepCopy()
			ev.ResourceVersion = f.nextRV()
			f.ChangedLocked(nil)
			return nil
		}
	}
	return notFound("events", name)
}

// ReviewToken answers with Review's status.
func (f *Cluster) ReviewToken(_ context.Context, tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
	f.Lock()
	review, err := f.Review, f.Fail["review"]
	f.Unlock()
	if err != nil {
		return nil, err
	}
	out := tr.DeepCopy()
	if review == nil {
		out.Status = authnv1.TokenReviewStatus{Error: "clusterfake: no Review set"}
		return out, nil
	}
	// Outside the lock: Review is the test's, and may block or call back.
	st, err := review(tr.DeepCopy())
	if err != nil {
		return nil, err
	}
	out.Status = st
	return out, nil
}
