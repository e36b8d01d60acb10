package actuate

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
)

// fakeCluster is an in-memory Cluster for the actuator's unit tests: the
// objects it holds, every write in order, and a stand-in for the deployment
// controller (autoReady: a Deployment scaled up is Ready at once, one scaled
// to 0 has no pod left). The real one is NewKubeCluster, tested against a
// real API server in the _k8s tests.
type fakeCluster struct {
	mu        sync.Mutex
	changed   chan struct{} // closed and replaced at every change, for waiters
	deps      map[podKey]*appsv1.Deployment
	pods      map[podKey]*corev1.Pod
	rss       map[podKey]*appsv1.ReplicaSet
	events    []*eventsv1.Event
	writes    []string         // "scale ns/name N", "record ns/name PHASE", "annotations ns/name[ role=ROLE]", "condition ns/pod TYPE=STATUS", "event REASON"
	fail      map[string]error // by operation ("scale", "record", "annotations", …): every such write fails
	watchers  map[podKey][]chan *appsv1.Deployment
	autoReady bool
	rv        int
	// resize is how the kubelet answers a resize: "" applies it at once
	// (spec and status), else a PodResizePending condition of that reason.
	resize string
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{changed: make(chan struct{}), deps: map[podKey]*appsv1.Deployment{}, pods: map[podKey]*corev1.Pod{},
		rss: map[podKey]*appsv1.ReplicaSet{}, fail: map[string]error{}, watchers: map[podKey][]chan *appsv1.Deployment{}, autoReady: true}
}

// addPair adds a primary with one Ready pod (ns/<primary>-rs-0 through a
// ReplicaSet) carrying ann as its policy, and its cold standby at 0.
func (f *fakeCluster) addPair(ns, primary, standby string, ann map[string]string) (pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ann = maps.Clone(ann)
	ann[contract.AnnStandby] = standby
	f.deps[podKey{ns, primary}] = deployment(ns, primary, 1, ann)
	f.deps[podKey{ns, standby}] = deployment(ns, standby, 0, map[string]string{contract.AnnPrimary: primary})
	rs := primary + "-rs"
	f.rss[podKey{ns, rs}] = f.rssOwnedBy(ns, rs, "Deployment", primary)
	pod = rs + "-0"
	f.pods[podKey{ns, pod}] = f.podOwnedBy(ns, pod, rs)
	return pod
}

func (f *fakeCluster) rssOwnedBy(ns, name, kind, owner string) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		OwnerReferences: []metav1.OwnerReference{{Kind: kind, Name: owner, Controller: ptr.To(true)}}}}
}

// podOwnedBy is a pod of ReplicaSet rs that declares AMF's readiness gate.
func (f *fakeCluster) podOwnedBy(ns, name, rs string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: rs, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: contract.ConditionHealthy}}}}
}

func deployment(ns, name string, replicas int32, ann map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Generation: 1, Annotations: ann},
		Spec:   appsv1.DeploymentSpec{Replicas: ptr.To(replicas)},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: replicas, ReadyReplicas: replicas}}
}

// changeLocked records a change of d (or a write) and wakes waiters and d's
// watches.
func (f *fakeCluster) changeLocked(d *appsv1.Deployment) {
	if d != nil {
		f.rv++
		d.ResourceVersion = strconv.Itoa(f.rv)
		for _, ch := range f.watchers[podKey{d.Namespace, d.Name}] {
			ch <- d.DeepCopy() // buffered: a watch that falls this far behind fails the test
		}
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// await waits until cond (called with the lock held) holds, or fails t.
func (f *fakeCluster) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	f.awaitWithin(t, what, 5*time.Second, cond)
}

// awaitWithin is await with a bound of its own.
func (f *fakeCluster) awaitWithin(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(bound)
	for {
		f.mu.Lock()
		ok, ch := cond(), f.changed
		f.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			f.mu.Lock()
			defer f.mu.Unlock()
			t.Fatalf("%s: not within %v; writes: %q", what, bound, f.writes)
		}
	}
}

// dep returns a copy of ns/name (lock held by the caller or not needed).
func (f *fakeCluster) depLocked(ns, name string) *appsv1.Deployment { return f.deps[podKey{ns, name}] }

func (f *fakeCluster) setReady(ns, name string, ready int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.deps[podKey{ns, name}]
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: *d.Spec.Replicas, ReadyReplicas: ready}
	f.changeLocked(d)
}

func (f *fakeCluster) setRecord(ns, name, rec string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.deps[podKey{ns, name}]
	d.Annotations = maps.Clone(d.Annotations)
	d.Annotations[contract.AnnRecord] = rec
	f.changeLocked(d)
}

func notFound(resource, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
}

func (f *fakeCluster) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.pods[podKey{ns, name}]; ok {
		return p.DeepCopy(), nil
	}
	return nil, notFound("pods", name)
}

func (f *fakeCluster) ReplicaSet(_ context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rs, ok := f.rss[podKey{ns, name}]; ok {
		return rs.DeepCopy(), nil
	}
	return nil, notFound("replicasets", name)
}

func (f *fakeCluster) Deployment(_ context.Context, ns, name string) (*appsv1.Deployment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail["get"]; err != nil {
		return nil, err
	}
	if d, ok := f.deps[podKey{ns, name}]; ok {
		return d.DeepCopy(), nil
	}
	return nil, notFound("deployments", name)
}

func (f *fakeCluster) Deployments(context.Context) ([]appsv1.Deployment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []appsv1.Deployment
	for _, d := range f.deps {
		out = append(out, *d.DeepCopy())
	}
	return out, nil
}

// WatchDeployment delivers, like a watch from resourceVersion rv, what
// changed since rv: the object as it is now when it moved on since rv was
// read, then every later change.
func (f *fakeCluster) WatchDeployment(ctx context.Context, ns, name, rv string, send func(*appsv1.Deployment)) error {
	ch := make(chan *appsv1.Deployment, 256)
	k := podKey{ns, name}
	f.mu.Lock()
	f.watchers[k] = append(f.watchers[k], ch)
	if d := f.deps[k]; d != nil && d.ResourceVersion != rv {
		ch <- d.DeepCopy()
	}
	f.changeLocked(nil) // a test may await a watch
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, c := range f.watchers[k] {
			if c == ch {
				f.watchers[k] = append(f.watchers[k][:i], f.watchers[k][i+1:]...)
				break
			}
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
func (f *fakeCluster) writeLocked(op, what string) error {
	if err := f.fail[op]; err != nil {
		return err
	}
	f.writes = append(f.writes, what)
	return nil
}

func (f *fakeCluster) Scale(_ context.Context, ns, name string, replicas int32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.deps[podKey{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	if err := f.writeLocked("scale", fmt.Sprintf("scale %s/%s %d", ns, name, replicas)); err != nil {
		return err
	}
	if *d.Spec.Replicas != replicas {
		d.Spec.Replicas = ptr.To(replicas)
		d.Generation++
		if f.autoReady {
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, ReadyReplicas: replicas}
		}
	}
	f.changeLocked(d)
	return nil
}

func (f *fakeCluster) SwapRecord(_ context.Context, ns, name, prev, next string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.deps[podKey{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	if d.Annotations[contract.AnnRecord] != prev {
		return ErrRecordMoved
	}
	var rec Record
	_ = json.Unmarshal([]byte(next), &rec)
	if err := f.writeLocked("record", fmt.Sprintf("record %s/%s %s", ns, name, rec.Phase)); err != nil {
		return err
	}
	d.Annotations = maps.Clone(d.Annotations)
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[contract.AnnRecord] = next
	f.changeLocked(d)
	return nil
}

func (f *fakeCluster) PatchAnnotations(_ context.Context, ns, name string, ann map[string]*string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.deps[podKey{ns, name}]
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
	f.changeLocked(d)
	return nil
}

func (f *fakeCluster) ResizeMemory(_ context.Context, ns, name, container string, limit, request int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[podKey{ns, name}]
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
		setMemory(&c.Resources, limit, request)
		if f.resize != "" {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: f.resize})
			break
		}
		for j := range p.Status.ContainerStatuses {
			if s := &p.Status.ContainerStatuses[j]; s.Name == container {
				s.Resources = c.Resources.DeepCopy()
			}
		}
	}
	f.changeLocked(nil)
	return nil
}

// setMemory is what a memory patch does to a container's resources.
func setMemory(r *corev1.ResourceRequirements, limit, request int64) {
	r.Limits[corev1.ResourceMemory] = *resource.NewQuantity(limit, resource.BinarySI)
	if request > 0 {
		r.Requests[corev1.ResourceMemory] = *resource.NewQuantity(request, resource.BinarySI)
	}
}

func (f *fakeCluster) SizeTemplate(_ context.Context, ns, name, container string, limit, request int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.deps[podKey{ns, name}]
	if !ok {
		return notFound("deployments", name)
	}
	if err := f.writeLocked("template", fmt.Sprintf("template %s/%s %s %dMi %dMi", ns, name, container, limit>>20, request>>20)); err != nil {
		return err
	}
	for i := range d.Spec.Template.Spec.Containers {
		c := &d.Spec.Template.Spec.Containers[i]
		if c.Name == container {
			setMemory(&c.Resources, limit, request)
		}
	}
	d.Generation++
	f.changeLocked(d)
	return nil
}

func (f *fakeCluster) SetPodCondition(_ context.Context, ns, name string, c corev1.PodCondition) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[podKey{ns, name}]
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
	f.changeLocked(nil)
	return nil
}

func (f *fakeCluster) CreateEvent(_ context.Context, ev *eventsv1.Event) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.writeLocked("event", "event "+ev.Reason); err != nil {
		return "", err
	}
	ev = ev.DeepCopy()
	ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, len(f.events))
	f.events = append(f.events, ev)
	f.changeLocked(nil)
	return ev.Name, nil
}

func (f *fakeCluster) PatchEventSeries(_ context.Context, ns, name string, s *eventsv1.EventSeries) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ev := range f.events {
		if ev.Namespace == ns && ev.Name == name {
			if err := f.writeLocked("event", "series "+ev.Reason); err != nil {
				return err
			}
			ev.Series = s.DeepCopy()
			f.changeLocked(nil)
			return nil
		}
	}
	return notFound("events", name)
}

// reasonsLocked are the reasons of the Events created so far.
func (f *fakeCluster) reasonsLocked() []string {
	var out []string
	for _, ev := range f.events {
		out = append(out, ev.Reason)
	}
	return out
}

var _ Cluster = (*fakeCluster)(nil)
