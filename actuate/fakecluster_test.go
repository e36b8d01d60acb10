package actuate

import (
	"maps"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/cluster/clusterfake"
	"github.com/amf-edge/amf/contract"
)

// fakeCluster is the agent's fake cluster (clusterfake.Cluster, which every
// consumer of package cluster tests on) with what the actuator's tests add
// on top: a primary and its standby as inject writes them, and waits that
// fail the test. The real Cluster is cluster.Kube, tested against a real
// API server in the _k8s tests.
type fakeCluster struct{ *clusterfake.Cluster }

var _ Cluster = (*clusterfake.Cluster)(nil)

func newFakeCluster() *fakeCluster { return &fakeCluster{clusterfake.New()} }

// key is the fake's key of ns/name.
func key(ns, name string) clusterfake.Key { return clusterfake.Key{Namespace: ns, Name: name} }

// addPair adds a primary with one Ready pod (ns/<primary>-rs-0 through a
// ReplicaSet) carrying ann as its policy, and its cold standby at 0.
func (f *fakeCluster) addPair(ns, primary, standby string, ann map[string]string) (pod string) {
	f.Lock()
	defer f.Unlock()
	ann = maps.Clone(ann)
	ann[contract.AnnStandby] = standby
	f.Deps[key(ns, primary)] = deployment(ns, primary, 1, ann)
	f.Deps[key(ns, standby)] = deployment(ns, standby, 0, map[string]string{contract.AnnPrimary: primary})
	rs := primary + "-rs"
	f.ReplicaSets[key(ns, rs)] = f.rssOwnedBy(ns, rs, "Deployment", primary)
	pod = rs + "-0"
	f.Pods[key(ns, pod)] = f.podOwnedBy(ns, pod, rs)
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

// await waits until cond (called with the lock held) holds, or fails t.
func (f *fakeCluster) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	f.awaitWithin(t, what, 5*time.Second, cond)
}

// awaitWithin is await with a bound of its own.
func (f *fakeCluster) awaitWithin(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	if !f.Await(bound, cond) {
		f.Lock()
		defer f.Unlock()
		t.Fatalf("%s: not within %v; writes: %q", what, bound, f.Writes)
	}
}

// depLocked is ns/name itself (the caller holds the lock).
func (f *fakeCluster) depLocked(ns, name string) *appsv1.Deployment { return f.Deps[key(ns, name)] }

func (f *fakeCluster) setReady(ns, name string, ready int32) {
	f.Lock()
	defer f.Unlock()
	d := f.Deps[key(ns, name)]
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: *d.Spec.Replicas, ReadyReplicas: ready}
	f.ChangedLocked(d)
}

func (f *fakeCluster) setRecord(ns, name, rec string) {
	f.Lock()
	defer f.Unlock()
	d := f.Deps[key(ns, name)]
	d.Annotations = maps.Clone(d.Annotations)
	d.Annotations[contract.AnnRecord] = rec
	f.ChangedLocked(d)
}
