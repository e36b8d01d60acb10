package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/testbed"
)

// observer watches the edge brokers' pods and Deployments of one namespace
// (informers: list once, then watch) and keeps what the assertions need,
// each change stamped with the time the watch delivered it: which pods each
// Deployment had, when the service had no Ready broker, the phases the
// switchover record went through.
type observer struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change, for wait
	pods    map[types.UID]*podSeen
	deps    map[string]*appsv1.Deployment
	// No Ready broker: the intervals, from the first Ready broker on.
	everReady bool
	noneSince time.Time
	noneWhy   string
	noReady   []interval
	phases    []phaseSeen // the records' phases as they changed
	// retiring is when the primary's record first said Retiring;
	// oldPrimaryGone when the last pod of the primary was gone after it.
	retiring, oldPrimaryGone time.Time
	// scaledDown is when the primary was first seen at 0 replicas.
	scaledDown time.Time
	active     bool // a record was seen in a switchover's phase
	stop       context.CancelFunc
	done       chan struct{}
}

type podSeen struct {
	name, deployment string
	// sandboxed: its sandbox is up (PodReadyToStartContainers), so the
	// kubelet is creating and starting its containers; ready: Ready as an
	// endpoint.
	sandboxed, ready bool
	restarts         int32
	// readyRestarts is restarts when it first became Ready; restarted
	// names the containers restarted and how their last run ended.
	readyRestarts int32
	everReady     bool
	restarted     []string
	gone          bool
	lost          string // why it last stopped being Ready
}

// interval is a time without a Ready broker; why says which pods lost
// readiness then and what their Ready condition said.
type interval struct {
	from, to time.Time
	why      string
}

func (iv interval) length() time.Duration { return iv.to.Sub(iv.from) }

type phaseSeen struct {
	at         time.Time
	deployment string
	rec        actuate.Record
}

func observe(ctx context.Context, c kubernetes.Interface, ns string) *observer {
	ctx, cancel := context.WithCancel(ctx)
	o := &observer{changed: make(chan struct{}), pods: map[types.UID]*podSeen{}, deps: map[string]*appsv1.Deployment{}, stop: cancel, done: make(chan struct{})}
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	pods, deps := f.Core().V1().Pods().Informer(), f.Apps().V1().Deployments().Informer()
	_, _ = pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.pod(obj, false) },
		UpdateFunc: func(_, obj any) { o.pod(obj, false) },
		DeleteFunc: func(obj any) { o.pod(obj, true) },
	})
	_, _ = deps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    o.deployment,
		UpdateFunc: func(_, obj any) { o.deployment(obj) },
	})
	go func() {
		defer close(o.done)
		f.Start(ctx.Done())
		f.WaitForCacheSync(ctx.Done())
		<-ctx.Done()
		f.Shutdown()
	}()
	return o
}

// close stops the watches and closes the last interval without a Ready broker.
func (o *observer) close() {
	o.stop()
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.noneSince.IsZero() {
		o.noReady = append(o.noReady, interval{o.noneSince, time.Now(), o.noneWhy})
		o.noneSince = time.Time{}
	}
}

func (o *observer) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *observer) pod(obj any, deleted bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.pods[p.UID]
	if s == nil {
		s = &podSeen{name: p.Name, deployment: p.Labels["app.kubernetes.io/instance"]}
		o.pods[p.UID] = s
	}
	s.gone = deleted
	s.sandboxed = podCondition(p, corev1.PodReadyToStartContainers)
	// Ready as an endpoint is: the Ready condition, and not terminating.
	was := s.ready
	s.ready = !deleted && p.DeletionTimestamp == nil && podReady(p)
	if was && !s.ready {
		s.lost = fmt.Sprintf("%s: %s", p.Name, readyCondition(p, deleted))
	}
	s.restarts, s.restarted = 0, nil
	for _, cs := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		s.restarts += cs.RestartCount
		if cs.RestartCount > 0 {
			how := "?"
			if t := cs.LastTerminationState.Terminated; t != nil {
				how = fmt.Sprintf("exit %d, %s: %s", t.ExitCode, t.Reason, t.Message)
			}
			s.restarted = append(s.restarted, fmt.Sprintf("%s ×%d (last run: %s)", cs.Name, cs.RestartCount, how))
		}
	}
	if s.ready && !s.everReady {
		s.everReady, s.readyRestarts = true, s.restarts
	}
	if _, left := o.podsOf(testbed.PrimaryName); left == 0 && !o.retiring.IsZero() && o.oldPrimaryGone.IsZero() {
		o.oldPrimaryGone = now
	}
	ready := 0
	for _, q := range o.pods {
		if q.ready {
			ready++
		}
	}
	switch {
	case ready > 0 && !o.noneSince.IsZero():
		o.noReady = append(o.noReady, interval{o.noneSince, now, o.noneWhy})
		o.noneSince = time.Time{}
	case ready > 0:
		o.everReady = true
	case o.everReady && o.noneSince.IsZero():
		o.noneSince, o.noneWhy = now, s.lost
	}
	o.notify()
}

func (o *observer) deployment(obj any) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deps[d.Name] = d
	if rec, ok := record(d); ok {
		var last *phaseSeen
		for i := len(o.phases) - 1; i >= 0; i-- {
			if o.phases[i].deployment == d.Name {
				last = &o.phases[i]
				break
			}
		}
		if last == nil || last.rec.Phase != rec.Phase {
			o.phases = append(o.phases, phaseSeen{at: time.Now(), deployment: d.Name, rec: rec})
		}
		if d.Name == testbed.PrimaryName && rec.Phase == actuate.PhaseRetiring && o.retiring.IsZero() {
			o.retiring = time.Now()
		}
		o.active = o.active || rec.Active()
	}
	if d.Name == testbed.PrimaryName && replicas(d) == 0 && o.scaledDown.IsZero() {
		o.scaledDown = time.Now()
	}
	o.notify()
}

// wait blocks until cond (called with the observer locked) holds, or ctx ends.
func (o *observer) wait(ctx context.Context, what string, cond func() bool) error {
	for {
		o.mu.Lock()
		ok, ch := cond(), o.changed
		o.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting until %s: %w", what, ctx.Err())
		}
	}
}

// readyPod returns a Ready pod of Deployment name (observer locked).
func (o *observer) readyPod(name string) (string, bool) {
	for _, p := range o.pods {
		if p.deployment == name && p.ready {
			return p.name, true
		}
	}
	return "", false
}

// podsOf counts the pods Deployment name ever had and those still there
// (observer locked).
func (o *observer) podsOf(name string) (ever, now int) {
	for _, p := range o.pods {
		if p.deployment == name {
			ever++
			if !p.gone {
				now++
			}
		}
	}
	return ever, now
}

// completed: the roles are exchanged — the standby is the primary, Ready,
// its record Idle with the switchover's time — and the old primary is the standby at 0
// replicas with no pod left (observer locked).
func (o *observer) completed() bool {
	a, b := o.deps[testbed.PrimaryName], o.deps[testbed.StandbyName]
	if a == nil || b == nil {
		return false
	}
	rec, ok := record(b)
	_, left := o.podsOf(testbed.PrimaryName)
	// Both halves of the role exchange: the agent writes the new primary
	// first, then the old one (actuate's retire), so the old primary's role
	// is the exchange's last write.
	return ok && b.Annotations[contract.AnnRole] == "primary" && rec.Phase == actuate.PhaseIdle && !rec.LastSwitch.IsZero() &&
		a.Annotations[contract.AnnRole] == "standby" && deploymentReady(b) && replicas(a) == 0 && left == 0
}

// aborted: after a switchover was under way, the primary kept its role and
// is Ready, its record Idle, and the cold standby is back at 0 replicas with
// no pod left (observer locked).
func (o *observer) aborted() bool {
	a, b := o.deps[testbed.PrimaryName], o.deps[testbed.StandbyName]
	if a == nil || b == nil || !o.active {
		return false
	}
	rec, ok := record(a)
	_, left := o.podsOf(testbed.StandbyName)
	return ok && a.Annotations[contract.AnnStandby] == testbed.StandbyName && rec.Phase == actuate.PhaseIdle &&
		deploymentReady(a) && replicas(b) == 0 && left == 0
}

func record(d *appsv1.Deployment) (actuate.Record, bool) {
	raw, ok := d.Annotations[contract.AnnRecord]
	if !ok {
		return actuate.Record{}, false
	}
	var rec actuate.Record
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return actuate.Record{Phase: "unreadable: " + actuate.Phase(err.Error())}, true
	}
	return rec, true
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// deploymentReady is actuate's rule: a Ready replica at the current generation.
func deploymentReady(d *appsv1.Deployment) bool {
	return d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1
}

// readyCondition says why a pod is not Ready.
func readyCondition(p *corev1.Pod, deleted bool) string {
	switch {
	case deleted:
		return "deleted"
	case p.DeletionTimestamp != nil:
		return "terminating"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return fmt.Sprintf("Ready %s (%s: %s)", c.Status, c.Reason, c.Message)
		}
	}
	return "no Ready condition"
}

func podReady(p *corev1.Pod) bool { return podCondition(p, corev1.PodReady) }

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
