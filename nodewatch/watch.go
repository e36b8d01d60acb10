package nodewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/amf-edge/amf/brokerpod"
	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/podsignal"
)

// Session is one pipeline run's record in the agent's tracker
// (*agent.LocalSession): Observe for every message, End once the pod went
// away (after its stopping message).
type Session interface {
	Observe(msg *podsignal.Message, received time.Time)
	End()
}

// Reasons of the Warning Events on pods node mode does not watch.
const (
	ReasonRefused = "NodeModeRefused" // opted in, but carries the sidecar too
	ReasonInvalid = "NodeModeInvalid" // opted in, but the annotations cannot be followed
)

// ReportingController is the Events' reporting controller, the actuator's
// (actuate.Controller, restated so this package does not link the actuator).
const ReportingController = "amf.io/agent"

// Cluster is what nodewatch asks of the API server itself, beside its
// informers: its part of the agent's one seam to the API server (package
// cluster). cluster.NewKube is the real one, clusterfake.Cluster the
// tests'.
type Cluster interface {
	// ReplicaSet gets a pod's ReplicaSet, for its Deployment.
	ReplicaSet(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error)
	// CreateEvent creates a Warning Event about a pod not watched.
	CreateEvent(ctx context.Context, ev *eventsv1.Event) (string, error)
}

var _ Cluster = (*cluster.Kube)(nil)

// Config wires a Watcher. Client, Metadata, NodeName and Begin are
// required.
type Config struct {
	// Client lists and watches the node's pods (field selector
	// spec.nodeName) for the pod informer, which stays on client-go (see
	// package cluster).
	Client kubernetes.Interface
	// Cluster gets ReplicaSets and creates Events; default
	// cluster.NewKube(Client).
	Cluster Cluster
	// Metadata watches the Deployments' metadata.
	Metadata metadata.Interface
	// NodeName is this agent's node: only its pods are watched.
	NodeName string
	// Begin opens a pod's session in the tracker (agent.Tracker.BeginLocal);
	// nil means the agent is shutting down.
	Begin func(podsignal.PodID) Session
	// Interval is the sampling period; default 1 s.
	Interval time.Duration
	// Cgroup locates the host's cgroup and proc trees (cgroup.WithCgroupRoot,
	// cgroup.WithKubeletCgroupRoot, cgroup.WithProcRoot).
	Cgroup []cgroup.Option
	Log    *slog.Logger
}

// Watcher runs one pipeline per watched pod of its node.
type Watcher struct {
	cfg   Config
	log   *slog.Logger
	start func(ctx context.Context, spec runSpec) runner // newPodRun; a fake in the tests

	pods cache.SharedIndexInformer
	deps cache.SharedIndexInformer

	mu    sync.Mutex
	dirty map[string]bool // pod keys to reconcile
	wake  chan struct{}

	// Owned by the reconcile goroutine:
	runs   map[string]runner    // by pod key
	owners map[types.UID]string // ReplicaSet UID → its Deployment's name ("" if none)
	warned map[string]string    // pod key → its UID and the last Warning note sent
	retry  map[string]*time.Timer
}

// maxOwners bounds the cache of ReplicaSet owners; past it the cache starts
// again (one GET per ReplicaSet of the node's pods).
const maxOwners = 4096

// runSpec is what one pod's pipeline needs; a change restarts it.
type runSpec struct {
	id          podsignal.PodID
	uid         types.UID
	container   string // the broker container's name
	modelName   string
	model       *model.Model
	containerID string // of the running broker container, "" when none runs
	// probe is the app-logic probe (amf.io/probe) aimed at podIP; zero
	// without one.
	probe contract.Probe
	podIP string
}

// same reports whether a and b are one pipeline (only the container ID may
// differ: a restarted container is followed by the running pipeline).
func (a runSpec) same(b runSpec) bool {
	return a.id == b.id && a.uid == b.uid && a.container == b.container && a.modelName == b.modelName &&
		a.probe == b.probe && a.podIP == b.podIP
}

// runner is one pod's running pipeline.
type runner interface {
	spec() runSpec
	// update hands it the broker container's current ID ("" when none runs).
	update(containerID string)
	// stop ends it with its stopping message and the session's end, and
	// waits until it has.
	stop(reason string)
	// wait waits until it has ended (after its context ended).
	wait()
}

// Validate says what is wrong with c, if anything. It is the one check of
// c's values: New makes it, and the agent calls it before it starts
// anything. A zero value that takes a default is valid.
func (c Config) Validate() error {
	switch {
	case c.Client == nil || c.Metadata == nil:
		return errors.New("nodewatch: the Kubernetes clients are required")
	case c.NodeName == "":
		return errors.New("nodewatch: the node name is required (amf-agent --node-name, from spec.nodeName)")
	case c.Begin == nil:
		return errors.New("nodewatch: Begin (the tracker) is required")
	}
	return nil
}

// New checks cfg (Validate) and builds a Watcher; Run starts it.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Cluster == nil {
		cfg.Cluster = cluster.NewKube(cfg.Client)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		cfg:    cfg,
		log:    cfg.Log,
		dirty:  map[string]bool{},
		wake:   make(chan struct{}, 1),
		runs:   map[string]runner{},
		owners: map[types.UID]string{},
		warned: map[string]string{},
		retry:  map[string]*time.Timer{},
	}
	w.start = w.newPodRun
	onNode := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	w.pods = coreinformers.NewFilteredPodInformer(cfg.Client, metav1.NamespaceAll, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(o *metav1.ListOptions) { o.FieldSelector = onNode })
	// The informer keeps every pod of the node; managed fields are most of a
	// pod's size and never read.
	if err := w.pods.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("nodewatch: %w", err)
	}
	w.deps = metadatainformer.NewFilteredMetadataInformer(cfg.Metadata, appsv1.SchemeGroupVersion.WithResource("deployments"),
		metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	if err := w.deps.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("nodewatch: %w", err)
	}
	podEvents := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.markPod(obj) },
		UpdateFunc: func(_, obj any) { w.markPod(obj) },
		DeleteFunc: func(obj any) { w.markPod(obj) },
	}
	depEvents := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.markNamespaceOf(obj) },
		UpdateFunc: func(_, obj any) { w.markNamespaceOf(obj) },
		DeleteFunc: func(obj any) { w.markNamespaceOf(obj) },
	}
	if _, err := w.pods.AddEventHandler(podEvents); err != nil {
		return nil, fmt.Errorf("nodewatch: %w", err)
	}
	if _, err := w.deps.AddEventHandler(depEvents); err != nil {
		return nil, fmt.Errorf("nodewatch: %w", err)
	}
	return w, nil
}

func stripManagedFields(obj any) (any, error) {
	if m, err := meta(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func meta(obj any) (metav1.Object, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T is not an object", obj)
	}
	return m, nil
}

// markPod queues a pod's key for reconciliation.
func (w *Watcher) markPod(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	w.mark(key)
}

// markNamespaceOf queues every pod of the node in a changed Deployment's
// namespace (at most a node's pods): which of them it owns is found out
// when each is reconciled.
func (w *Watcher) markNamespaceOf(obj any) {
	m, err := meta(obj)
	if err != nil {
		return
	}
	keys, err := w.pods.GetIndexer().IndexKeys(cache.NamespaceIndex, m.GetNamespace())
	if err != nil {
		return
	}
	for _, k := range keys {
		w.mark(k)
	}
}

func (w *Watcher) mark(key string) {
	w.mu.Lock()
	w.dirty[key] = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Run watches until ctx ends, then ends every pipeline without a message
// (the agent is stopping, not the pods) and returns. It fails when the
// informers cannot sync (no API server, no rights).
func (w *Watcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.pods.RunWithContext(ctx) })
	wg.Go(func() { w.deps.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), w.pods.HasSynced, w.deps.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("nodewatch: pod and Deployment caches did not sync")
	}
	w.log.Info("node mode watching", slog.String("node", w.cfg.NodeName), slog.String("interval", w.cfg.Interval.String()))
	defer func() {
		cancel()
		for _, t := range w.retry {
			t.Stop()
		}
		for _, r := range w.runs {
			r.wait() // their contexts end with ctx
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
		w.mu.Lock()
		keys := make([]string, 0, len(w.dirty))
		for k := range w.dirty {
			keys = append(keys, k)
		}
		clear(w.dirty)
		w.mu.Unlock()
		slices.Sort(keys)
		for _, k := range keys {
			w.reconcile(ctx, k)
		}
	}
}

// reconcile starts, updates or stops the pipeline of one pod.
func (w *Watcher) reconcile(ctx context.Context, key string) {
	if t := w.retry[key]; t != nil {
		t.Stop()
		delete(w.retry, key)
	}
	cur := w.runs[key]
	obj, exists, err := w.pods.GetIndexer().GetByKey(key)
	var pod *corev1.Pod
	if err == nil && exists {
		pod, _ = obj.(*corev1.Pod)
	}
	if pod == nil {
		delete(w.warned, key)
	}
	if len(w.owners) > maxOwners { // a long-lived agent sees many rollouts
		clear(w.owners)
	}
	spec, why, err := w.desired(ctx, pod)
	if err != nil { // the API server did not answer: try again, keep what runs
		w.log.Warn("node mode: cannot tell whether to watch a pod; trying again", slog.String("pod", key), slog.String("error", err.Error()))
		w.retry[key] = time.AfterFunc(2*time.Second, func() { w.mark(key) })
		return
	}
	switch {
	case spec == nil && cur != nil:
		cur.stop(why)
		delete(w.runs, key)
		w.log.Info("node pipeline stopped", slog.String("pod", key), slog.String("reason", why))
	case spec == nil:
	case cur != nil && cur.spec().same(*spec):
		cur.update(spec.containerID)
	default:
		if cur != nil {
			cur.stop("pod replaced, or its node mode settings changed")
		}
		r := w.start(ctx, *spec)
		w.runs[key] = r
		w.log.Info("node pipeline started", slog.String("pod", key), slog.String("container", spec.container),
			slog.String("container_id", spec.containerID), slog.String("model", spec.modelName))
	}
}

// desired says whether pod is watched and how (nil: not, and why). err is
// set only when the API server must be asked again.
func (w *Watcher) desired(ctx context.Context, pod *corev1.Pod) (*runSpec, string, error) {
	switch {
	case pod == nil:
		return nil, "pod deleted", nil
	case pod.Spec.NodeName != w.cfg.NodeName:
		return nil, "pod not on node " + w.cfg.NodeName, nil
	case pod.DeletionTimestamp != nil:
		return nil, "pod terminating", nil
	case pod.Status.Phase != corev1.PodRunning:
		return nil, "pod " + string(pod.Status.Phase), nil
	}
	dep, err := w.deployment(ctx, pod)
	if err != nil || dep == nil {
		return nil, "not owned by a Deployment", err
	}
	mode, err := contract.ParseMode(dep.GetAnnotations())
	if err != nil {
		w.warn(ctx, pod, ReasonInvalid, fmt.Sprintf("Deployment %s: %v: not watched by the node agent", dep.GetName(), err))
		return nil, err.Error(), nil
	}
	if mode != contract.ModeNode {
		return nil, "Deployment " + dep.GetName() + " not in node mode", nil
	}
	if c := brokerpod.Sidecar(pod); c != "" {
		w.warn(ctx, pod, ReasonRefused, fmt.Sprintf("Deployment %s opts into node mode (%s=node) and the pod carries the AMF sidecar (container %s): refused: the node agent runs no pipeline for it (its sidecar's signals are taken as in sidecar mode), so that it is not watched twice; remove the sidecar or the annotation",
			dep.GetName(), contract.AnnMode, c))
		return nil, "pod carries the sidecar", nil
	}
	ann := dep.GetAnnotations()
	name, err := brokerpod.Container(pod, ann[contract.AnnContainer])
	if err != nil {
		w.warn(ctx, pod, ReasonInvalid, fmt.Sprintf("Deployment %s: %v", dep.GetName(), err))
		return nil, err.Error(), nil
	}
	modelName := ann[contract.AnnModel]
	if modelName == "" {
		modelName = contract.DefaultModel
	}
	m, err := model.Embedded(modelName)
	if err == nil {
		_, err = detect.FeatureConfig(m, w.cfg.Interval)
	}
	if err != nil {
		w.warn(ctx, pod, ReasonInvalid, fmt.Sprintf("Deployment %s: %s=%q: %v", dep.GetName(), contract.AnnModel, modelName, err))
		return nil, err.Error(), nil
	}
	var probe contract.Probe
	if v, ok := ann[contract.AnnProbe]; ok {
		if probe, err = contract.ParseProbe(v); err != nil {
			w.warn(ctx, pod, ReasonInvalid, fmt.Sprintf("Deployment %s: %v", dep.GetName(), err))
			return nil, err.Error(), nil
		}
		if pod.Status.PodIP == "" {
			return nil, "waiting for the pod's IP to probe", nil
		}
	}
	delete(w.warned, pod.Namespace+"/"+pod.Name)
	spec := &runSpec{
		id: podsignal.PodID{Namespace: pod.Namespace, Pod: pod.Name}, uid: pod.UID,
		container: name, modelName: modelName, model: m, containerID: runningID(pod, name), probe: probe,
	}
	if probe.Port != 0 {
		spec.podIP = pod.Status.PodIP
	}
	return spec, "", nil
}

// deployment returns the metadata of the Deployment that controls pod
// through its ReplicaSet; nil when there is none.
func (w *Watcher) deployment(ctx context.Context, pod *corev1.Pod) (metav1.Object, error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "ReplicaSet" || !strings.HasPrefix(ref.APIVersion, "apps/") {
		return nil, nil
	}
	name, ok := w.owners[ref.UID]
	if !ok {
		rs, err := w.cfg.Cluster.ReplicaSet(ctx, pod.Namespace, ref.Name)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil // deleted: the pod goes too
		case err != nil:
			return nil, fmt.Errorf("ReplicaSet %s/%s: %w", pod.Namespace, ref.Name, err)
		case rs.UID != ref.UID:
			return nil, nil // another ReplicaSet of that name
		}
		if d := metav1.GetControllerOf(rs); d != nil && d.Kind == "Deployment" && strings.HasPrefix(d.APIVersion, "apps/") {
			name = d.Name
		}
		w.owners[ref.UID] = name
	}
	if name == "" {
		return nil, nil
	}
	obj, exists, err := w.deps.GetIndexer().GetByKey(pod.Namespace + "/" + name)
	if err != nil || !exists {
		return nil, nil
	}
	m, err := meta(obj)
	if err != nil {
		return nil, nil
	}
	return m, nil
}

// runningID is the runtime ID of the named container while it runs.
func runningID(pod *corev1.Pod, name string) string {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == name && s.State.Running != nil {
			return s.ContainerID
		}
	}
	return ""
}

// warn sends a Warning Event about pod, once per pod and note.
func (w *Watcher) warn(ctx context.Context, pod *corev1.Pod, reason, note string) {
	key, seen := pod.Namespace+"/"+pod.Name, string(pod.UID)+"\x00"+note
	if w.warned[key] == seen {
		return
	}
	w.warned[key] = seen
	w.log.Warn("node mode: pod not watched", slog.String("pod", pod.Namespace+"/"+pod.Name), slog.String("reason", reason), slog.String("note", note))
	now := time.Now()
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: pod.Name + ".amf-", Namespace: pod.Namespace},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: ReportingController,
		ReportingInstance:   w.cfg.NodeName,
		Action:              "Watch",
		Reason:              reason,
		Regarding: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
			UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Note: truncateNote(note),
		Type: corev1.EventTypeWarning,
	}
	if _, err := w.cfg.Cluster.CreateEvent(ctx, ev); err != nil {
		w.log.Warn("event not created", slog.String("reason", reason), slog.String("error", err.Error()))
		delete(w.warned, key) // the next reconciliation tries again
	}
}

// truncateNote keeps an Event's note within the API's 1 kB.
func truncateNote(s string) string {
	const max = 1024
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max-3], "") + "..."
}
