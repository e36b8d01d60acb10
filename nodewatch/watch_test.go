package nodewatch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/cluster/clusterfake"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// The informer logic on fake clients, with a fake pipeline: which pods get
// a pipeline, when it starts, follows a restart and stops. The pipelines
// themselves run on real cgroups in run_test.go and on the real node in
// node_k8s_test.go.

const (
	ns       = "mqtt"
	thisNode = "node-a"
)

// waitFor bounds every wait: events of the fake informers come within
// milliseconds; this is only the bound of a failing test.
const waitFor = 10 * time.Second

type fakeRun struct {
	s       runSpec
	updates chan string
	stopped chan string
	done    chan struct{}
}

func (r *fakeRun) spec() runSpec      { return r.s }
func (r *fakeRun) update(id string)   { r.updates <- id }
func (r *fakeRun) stop(reason string) { r.stopped <- reason; close(r.done) }
func (r *fakeRun) wait()              {}
func (r *fakeRun) String() string     { return r.s.id.String() }
func newFakeRun(s runSpec) *fakeRun {
	return &fakeRun{s: s, updates: make(chan string, 16), stopped: make(chan string, 1), done: make(chan struct{})}
}
func (h *harness) started() *fakeRun    { h.t.Helper(); return recv(h.t, h.starts, "a pipeline start") }
func (h *harness) noStart(after string) { h.t.Helper(); h.settle(after); h.assertNoStart() }

type harness struct {
	t       *testing.T
	client  *fake.Clientset // the pod informer's
	md      *metadatafake.FakeMetadataClient
	cluster *clusterfake.Cluster // ReplicaSets and Events
	starts  chan *fakeRun
	events  int // of cluster.Events, those seen
	ctx     context.Context
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("no %s within %v", what, waitFor)
		var zero T
		return zero
	}
}

var deploymentsGVR = appsv1.SchemeGroupVersion.WithResource("deployments")

// start runs a Watcher on fake clients holding the Deployments given (name
// → annotations) and no pods, and returns once both informers watch.
func start(t *testing.T, deployments map[string]map[string]string) *harness {
	t.Helper()
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for name, ann := range deployments {
		objs = append(objs, deploymentMeta(name, ann))
	}
	h := &harness{t: t, client: fake.NewClientset(), md: metadatafake.NewSimpleMetadataClient(scheme, objs...),
		cluster: clusterfake.New(), starts: make(chan *fakeRun, 16)}
	// The fakes drop what changes between an informer's list and its
	// watch: wait until both watch.
	var watching sync.WaitGroup
	watching.Add(2)
	for _, f := range []*k8stesting.Fake{&h.client.Fake, &h.md.Fake} {
		once := sync.OnceFunc(watching.Done)
		f.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) { once(); return false, nil, nil })
	}
	w, err := New(Config{Client: h.client, Metadata: h.md, Cluster: h.cluster, NodeName: thisNode,
		Begin: func(podsignal.PodID) Session { panic("the fake runs open no session") }})
	if err != nil {
		t.Fatal(err)
	}
	w.start = func(_ context.Context, s runSpec) runner { r := newFakeRun(s); h.starts <- r; return r }
	ctx, cancel := context.WithCancel(context.Background())
	h.ctx = ctx
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	watched := make(chan struct{})
	go func() { watching.Wait(); close(watched) }()
	recv(t, watched, "watch of both informers")
	return h
}

func deploymentMeta(name string, ann map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("dep-" + name), Annotations: ann},
	}
}

// replicaSet creates the ReplicaSet of Deployment dep (none: a bare one).
func (h *harness) replicaSet(name, dep string) *appsv1.ReplicaSet {
	h.t.Helper()
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("rs-" + name)}}
	if dep != "" {
		rs.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: dep, UID: types.UID("dep-" + dep), Controller: ptr.To(true)}}
	}
	h.cluster.Add(rs)
	return rs
}

// event is the next Event created, or fails the test.
func (h *harness) event() *eventsv1.Event {
	h.t.Helper()
	var ev *eventsv1.Event
	if !h.cluster.Await(waitFor, func() bool {
		if len(h.cluster.Events) > h.events {
			ev = h.cluster.Events[h.events]
			h.events++
		}
		return ev != nil
	}) {
		h.t.Fatalf("no Event within %v", waitFor)
	}
	return ev
}

// noEvent fails the test if an Event was created since the last one seen.
func (h *harness) noEvent() {
	h.t.Helper()
	h.cluster.Lock()
	defer h.cluster.Unlock()
	if len(h.cluster.Events) > h.events {
		ev := h.cluster.Events[h.events]
		h.t.Errorf("a second Event: %s %q", ev.Reason, ev.Note)
	}
}

type podOpt func(*corev1.Pod)

func running(id string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = "10.214.0.5"
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, ContainerID: id,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	}
}
func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func withSidecar(p *corev1.Pod) {
	p.Spec.InitContainers = []corev1.Container{{Name: "amf-sidecar", Image: "ghcr.io/amf-edge/amf-sidecar:v0.1.0", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
}
func withContainers(names ...string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers = nil
		for _, n := range names {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n, Image: "eclipse-mosquitto:2"})
		}
	}
}

// pod creates a pod of ReplicaSet rs (nil: no owner) on this node.
func (h *harness) pod(name string, rs *appsv1.ReplicaSet, opts ...podOpt) *corev1.Pod {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("pod-" + name)},
		Spec:       corev1.PodSpec{NodeName: thisNode, Containers: []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	if rs != nil {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}
	}
	for _, o := range opts {
		o(p)
	}
	p, err := h.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *harness) updatePod(p *corev1.Pod, opts ...podOpt) *corev1.Pod {
	h.t.Helper()
	p = p.DeepCopy()
	for _, o := range opts {
		o(p)
	}
	p, err := h.client.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *harness) annotate(dep string, ann map[string]string) {
	h.t.Helper()
	if _, err := h.md.Resource(deploymentsGVR).Namespace(ns).(metadatafake.MetadataClient).UpdateFake(deploymentMeta(dep, ann), metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// settle makes sure every pod event before it has been reconciled: pods
// are reconciled in the order their events came, so once a watched pod
// created after them has started, they have been seen.
func (h *harness) settle(label string) {
	h.t.Helper()
	rs := h.replicaSet("marker-rs-"+label, "marker")
	h.pod("marker-"+label, rs, running("containerd://"+strings.Repeat("f", 64)))
	if r := h.started(); r.s.id.Pod != "marker-"+label {
		h.t.Fatalf("started %s, want only the marker pod", r.s.id)
	}
}

func (h *harness) assertNoStart() {
	h.t.Helper()
	select {
	case r := <-h.starts:
		h.t.Fatalf("a pipeline started for %s", r.s.id)
	default:
	}
}

var nodeMode = map[string]string{contract.AnnMode: "node"}

func TestOptedInRunningPodOfThisNodeGetsAPipeline(t *testing.T) {
	h := start(t, map[string]map[string]string{"broker": nodeMode, "marker": nodeMode})
	rs := h.replicaSet("broker-5d4f", "broker")
	p := h.pod("broker-5d4f-x", rs)
	h.noStart("pending") // Pending: not yet

	id := "containerd://" + strings.Repeat("a", 64)
	h.updatePod(p, running(id))
	r := h.started()
	want := runSpec{id: podsignal.PodID{Namespace: ns, Pod: p.Name}, uid: p.UID, container: "mosquitto", modelName: contract.DefaultModel, containerID: id}
	if !r.s.same(want) || r.s.containerID != id || r.s.model == nil {
		t.Fatalf("spec %+v, want %+v with a model", r.s, want)
	}
}

func TestPipelineFollowsTheContainerAndStopsWithThePod(t *testing.T) {
	for _, end := range []struct {
		name   string
		do     func(h *harness, p *corev1.Pod)
		reason string
	}{
		{"deleted", func(h *harness, p *corev1.Pod) {
			if err := h.client.CoreV1().Pods(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, "pod deleted"},
		{"terminating", func(h *harness, p *corev1.Pod) {
			h.updatePod(p, func(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.Now()) })
		}, "pod terminating"},
		{"failed", func(h *harness, p *corev1.Pod) {
			h.updatePod(p, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })
		}, "pod Failed"},
		{"opted out", func(h *harness, _ *corev1.Pod) { h.annotate("broker", nil) }, "Deployment broker not in node mode"},
		{"mode set back to sidecar", func(h *harness, _ *corev1.Pod) {
			h.annotate("broker", map[string]string{contract.AnnMode: "sidecar"})
		}, "Deployment broker not in node mode"},
	} {
		t.Run(end.name, func(t *testing.T) {
			h := start(t, map[string]map[string]string{"broker": nodeMode, "marker": nodeMode})
			p := h.pod("broker-5d4f-x", h.replicaSet("broker-5d4f", "broker"), running("containerd://"+strings.Repeat("a", 64)))
			r := h.started()
			restarted := "containerd://" + strings.Repeat("b", 64)
			p = h.updatePod(p, running(restarted))
			if got := recv(t, r.updates, "an update"); got != restarted {
				t.Fatalf("update %q, want the restarted container %q", got, restarted)
			}
			end.do(h, p)
			if got := recv(t, r.stopped, "a stop"); got != end.reason {
				t.Errorf("stopped because %q, want %q", got, end.reason)
			}
			h.assertNoStart()
		})
	}
}

func TestOptingInStartsPipelinesWithoutAPodChange(t *testing.T) {
	h := start(t, map[string]map[string]string{"broker": nil, "marker": nodeMode})
	p := h.pod("broker-5d4f-x", h.replicaSet("broker-5d4f", "broker"), running("containerd://"+strings.Repeat("a", 64)))
	h.noStart("before")
	h.annotate("broker", map[string]string{contract.AnnMode: "node", contract.AnnModel: "leadtime"})
	r := h.started()
	if r.s.id.Pod != p.Name || r.s.modelName != "leadtime" {
		t.Fatalf("started %s with model %s, want %s with leadtime", r.s.id, r.s.modelName, p.Name)
	}
}

// TestPodsNotWatched: each kind of pod that must get no pipeline, with the
// Warning Event where the user must act.
func TestPodsNotWatched(t *testing.T) {
	id := running("containerd://" + strings.Repeat("a", 64))
	for _, tt := range []struct {
		name      string
		dep       map[string]string
		bare      bool // a ReplicaSet of no Deployment
		noOwner   bool
		opts      []podOpt
		wantEvent string // reason; "" = none
		wantNote  string
	}{
		{name: "another node's pod", dep: nodeMode, opts: []podOpt{id, onNode("node-b")}},
		{name: "not opted in", dep: map[string]string{contract.AnnStandby: "b"}, opts: []podOpt{id}},
		{name: "a bare ReplicaSet's pod", dep: nodeMode, bare: true, opts: []podOpt{id}},
		{name: "a pod of no controller", dep: nodeMode, noOwner: true, opts: []podOpt{id}},
		{name: "node mode and the sidecar", dep: nodeMode, opts: []podOpt{id, withSidecar},
			wantEvent: ReasonRefused, wantNote: "carries the AMF sidecar (container amf-sidecar): refused"},
		{name: "an unknown mode", dep: map[string]string{contract.AnnMode: "daemon"}, opts: []podOpt{id},
			wantEvent: ReasonInvalid, wantNote: `amf.io/mode="daemon": want sidecar or node`},
		{name: "an unknown model", dep: map[string]string{contract.AnnMode: "node", contract.AnnModel: "p9"}, opts: []podOpt{id},
			wantEvent: ReasonInvalid, wantNote: `amf.io/model="p9"`},
		{name: "a broker that cannot be told", dep: nodeMode, opts: []podOpt{withContainers("mosquitto", "exporter"), id},
			wantEvent: ReasonInvalid, wantNote: "name the broker with amf.io/container"},
		{name: "a probe aimed at another host", dep: map[string]string{contract.AnnMode: "node", contract.AnnProbe: "mqtt://192.0.2.2:1883"}, opts: []podOpt{id},
			wantEvent: ReasonInvalid, wantNote: "no host: the probe goes to the pod's IP"},
		{name: "a named container the pod lacks", dep: map[string]string{contract.AnnMode: "node", contract.AnnContainer: "broker"}, opts: []podOpt{id},
			wantEvent: ReasonInvalid, wantNote: "amf.io/container=broker: the pod has no such container"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, map[string]map[string]string{"broker": tt.dep, "marker": nodeMode})
			var rs *appsv1.ReplicaSet
			switch {
			case tt.bare:
				rs = h.replicaSet("broker-5d4f", "")
			case !tt.noOwner:
				rs = h.replicaSet("broker-5d4f", "broker")
			}
			p := h.pod("broker-5d4f-x", rs, tt.opts...)
			if tt.wantEvent != "" {
				ev := h.event()
				if ev.Reason != tt.wantEvent || ev.Type != corev1.EventTypeWarning || ev.Regarding.UID != p.UID ||
					ev.ReportingController != ReportingController || !strings.Contains(ev.Note, tt.wantNote) {
					t.Errorf("event %s %s about %s by %s: %q; want %s about the pod saying %q",
						ev.Type, ev.Reason, ev.Regarding.Name, ev.ReportingController, ev.Note, tt.wantEvent, tt.wantNote)
				}
			}
			// A later change of the pod neither starts it nor repeats the Event.
			h.updatePod(p, func(p *corev1.Pod) { p.Labels = map[string]string{"touched": "1"} })
			h.noStart("after")
			h.noEvent()
		})
	}
}

func TestProbeIsAimedAtThePodsIP(t *testing.T) {
	h := start(t, map[string]map[string]string{"broker": {contract.AnnMode: "node", contract.AnnProbe: "mqtt://:1883"}, "marker": nodeMode})
	h.pod("broker-5d4f-x", h.replicaSet("broker-5d4f", "broker"), running("containerd://"+strings.Repeat("a", 64)))
	r := h.started()
	if r.s.probe != (contract.Probe{Scheme: "mqtt", Port: 1883}) || r.s.podIP != "10.214.0.5" {
		t.Fatalf("probe %+v at %q, want mqtt :1883 at the pod's IP", r.s.probe, r.s.podIP)
	}
}

func TestAReplacedPodIsANewPipeline(t *testing.T) {
	h := start(t, map[string]map[string]string{"broker": nodeMode, "marker": nodeMode})
	rs := h.replicaSet("broker-5d4f", "broker")
	p := h.pod("broker-5d4f-x", rs, running("containerd://"+strings.Repeat("a", 64)))
	first := h.started()
	// The same name, a new UID (a StatefulSet-like replacement, or a test):
	// the old pipeline stops, a new one starts.
	if err := h.client.CoreV1().Pods(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	recv(t, first.stopped, "the first pipeline's stop")
	q := h.pod("broker-5d4f-x", rs, running("containerd://"+strings.Repeat("c", 64)), func(p *corev1.Pod) { p.UID = "pod-second" })
	if second := h.started(); second.s.uid != q.UID {
		t.Fatalf("started UID %s, want %s", second.s.uid, q.UID)
	}
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	begin := func(podsignal.PodID) Session { return nil }
	md := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Metadata: md, NodeName: "n", Begin: begin}, "clients are required"},
		{Config{Client: fake.NewClientset(), Metadata: md, Begin: begin}, "node name is required"},
		{Config{Client: fake.NewClientset(), Metadata: md, NodeName: "n"}, "Begin"},
	} {
		if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%s) error %v, want %q", fmt.Sprint(tt.want), err, tt.want)
		}
	}
}
