package node

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// ctrSnapshot is a container's state at one moment, for buildStatus.
type ctrSnapshot struct {
	name, image string
	kind        ctrKind
	launched    bool
	st          ctrState
}

// statusInput is what the node knows of a pod beyond its API object.
type statusInput struct {
	hostIP      string
	startTime   time.Time
	sandbox     bool   // cgroups and volumes ready
	sandboxMsg  string // why not
	initialized bool
	stopped     bool            // everything stopped and cleaned up
	terminal    corev1.PodPhase // "" unless nothing will run again
	init        []ctrSnapshot
	regular     []ctrSnapshot
}

// ownedConditions are the pod conditions the node writes; all others (such
// as readiness gates) belong to someone else.
var ownedConditions = []corev1.PodConditionType{
	corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady,
}

func owned(t corev1.PodConditionType) bool {
	for _, o := range ownedConditions {
		if o == t {
			return true
		}
	}
	return false
}

// buildStatus computes the pod's status: base's status with what the node owns
// replaced. Condition transition times are kept from prev (what the node last
// wrote) or base when the condition's status did not change.
func buildStatus(base *corev1.Pod, in statusInput, prev *corev1.PodStatus, now time.Time) corev1.PodStatus {
	st := *base.Status.DeepCopy()
	st.HostIP = in.hostIP
	st.HostIPs = []corev1.HostIP{{IP: in.hostIP}}
	if in.sandbox {
		st.PodIP = in.hostIP
		st.PodIPs = []corev1.PodIP{{IP: in.hostIP}}
	}
	if !in.startTime.IsZero() && st.StartTime == nil {
		st.StartTime = ptr.To(metav1.NewTime(in.startTime))
	}
	st.ObservedGeneration = base.Generation

	st.InitContainerStatuses = nil
	for _, s := range in.init {
		st.InitContainerStatuses = append(st.InitContainerStatuses, containerStatus(s, reasonPodInitializing, in))
	}
	st.ContainerStatuses = nil
	for _, s := range in.regular {
		def := reasonContainerCreating
		if len(in.init) > 0 && !in.initialized {
			def = reasonPodInitializing
		}
		st.ContainerStatuses = append(st.ContainerStatuses, containerStatus(s, def, in))
	}

	st.Phase = in.terminal
	if st.Phase == "" {
		st.Phase = podPhase(base, st.InitContainerStatuses, st.ContainerStatuses, in.initialized)
	}

	var conds []corev1.PodCondition
	cond := func(t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) {
		c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: base.Generation, LastTransitionTime: metav1.NewTime(now)}
		if old := findCondition(prev, base, t); old != nil && old.Status == s {
			c.LastTransitionTime = old.LastTransitionTime
		}
		conds = append(conds, c)
	}
	if in.sandbox && !in.stopped {
		cond(corev1.PodReadyToStartContainers, corev1.ConditionTrue, "", "")
	} else {
		cond(corev1.PodReadyToStartContainers, corev1.ConditionFalse, "", "")
	}
	if in.initialized || len(in.init) == 0 {
		cond(corev1.PodInitialized, corev1.ConditionTrue, "", "")
	} else {
		var pending []string
		for i, s := range in.init {
			if !initDone(st.InitContainerStatuses[i], s.kind) {
				pending = append(pending, s.name)
			}
		}
		cond(corev1.PodInitialized, corev1.ConditionFalse, "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: %v", pending))
	}
	cr := containersReady(st.Phase, in, st)
	r := readyFrom(cr, base)
	cond(corev1.PodReady, r.Status, r.Reason, r.Message)
	cond(corev1.ContainersReady, cr.Status, cr.Reason, cr.Message)

	// Replace ours in place, keep the others as they are, add ours missing.
	var out []corev1.PodCondition
	used := map[corev1.PodConditionType]bool{}
	for _, c := range st.Conditions {
		if !owned(c.Type) {
			out = append(out, c)
			continue
		}
		for _, n := range conds {
			if n.Type == c.Type {
				out = append(out, n)
				used[n.Type] = true
			}
		}
	}
	for _, n := range conds {
		if !used[n.Type] {
			out = append(out, n)
		}
	}
	st.Conditions = out
	return st
}

func findCondition(prev *corev1.PodStatus, base *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for _, s := range []*corev1.PodStatus{prev, &base.Status} {
		if s == nil {
			continue
		}
		for i := range s.Conditions {
			if s.Conditions[i].Type == t {
				return &s.Conditions[i]
			}
		}
	}
	return nil
}

func initDone(cs corev1.ContainerStatus, kind ctrKind) bool {
	if kind == kindSidecar {
		return cs.Started != nil && *cs.Started
	}
	return cs.Ready
}

// containerStatus is one container's status.
func containerStatus(s ctrSnapshot, defaultReason string, in statusInput) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{
		Name:         s.name,
		Image:        s.image,
		ImageID:      s.st.imageID,
		RestartCount: s.st.restarts,
		Ready:        s.st.ready,
		Started:      ptr.To(s.st.started),
	}
	switch {
	case s.st.run != nil:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(s.st.run.startedAt)}
		cs.ContainerID = "lab://" + s.st.run.id
	case s.st.term != nil:
		cs.State.Terminated = s.st.term.api()
		cs.ContainerID = "lab://" + s.st.term.id
	case s.st.waiting != nil:
		cs.State.Waiting = s.st.waiting.DeepCopy()
	default:
		w := &corev1.ContainerStateWaiting{Reason: defaultReason}
		if !in.sandbox {
			w.Message = in.sandboxMsg
		}
		cs.State.Waiting = w
	}
	if s.st.last != nil {
		cs.LastTerminationState.Terminated = s.st.last.api()
		if cs.ContainerID == "" {
			cs.ContainerID = "lab://" + s.st.last.id
		}
	}
	return cs
}

// podPhase is the kubelet's getPhase (with ContainerRestartRules, the 1.35+
// default) for a pod that is not terminal.
func podPhase(pod *corev1.Pod, initStatuses, statuses []corev1.ContainerStatus, initialized bool) corev1.PodPhase {
	get := func(list []corev1.ContainerStatus, name string) (corev1.ContainerStatus, bool) {
		for _, s := range list {
			if s.Name == name {
				return s, true
			}
		}
		return corev1.ContainerStatus{}, false
	}
	restartable := func(c *corev1.Container, exit int32) bool {
		policy := pod.Spec.RestartPolicy
		if c.RestartPolicy != nil {
			policy = corev1.RestartPolicy(*c.RestartPolicy)
		}
		switch policy {
		case corev1.RestartPolicyNever:
			return false
		case corev1.RestartPolicyOnFailure:
			return exit != 0
		}
		return true
	}
	pendingInit, pendingSidecars, failedInitForGood := 0, 0, 0
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if isSidecar(c) {
			continue
		}
		s, ok := get(initStatuses, c.Name)
		switch {
		case !ok || s.State.Running != nil:
			pendingInit++
		case s.State.Terminated != nil:
			if code := s.State.Terminated.ExitCode; code != 0 && !(restartable(c, code) && pod.Spec.RestartPolicy != corev1.RestartPolicyNever) {
				failedInitForGood++
			}
		case s.State.Waiting != nil && s.LastTerminationState.Terminated != nil:
			if code := s.LastTerminationState.Terminated.ExitCode; code != 0 && !restartable(c, code) {
				failedInitForGood++
			}
		default:
			pendingInit++
		}
	}
	unknown, running, waiting, stopped, stoppedForGood, succeeded := 0, 0, 0, 0, 0, 0
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if !isSidecar(c) {
			continue
		}
		s, ok := get(initStatuses, c.Name)
		switch {
		case !ok:
			unknown++
		case s.State.Running != nil:
			if s.Started == nil || !*s.Started {
				pendingSidecars++
			}
			running++
		case s.State.Terminated != nil:
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated == nil {
				pendingSidecars++
				waiting++
			}
		default:
			pendingSidecars++
			unknown++
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		s, ok := get(statuses, c.Name)
		switch {
		case !ok:
			unknown++
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			code := s.State.Terminated.ExitCode
			if !restartable(c, code) {
				stoppedForGood++
			}
			if code == 0 {
				succeeded++
			}
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated != nil {
				stopped++
				if !restartable(c, s.LastTerminationState.Terminated.ExitCode) {
					stoppedForGood++
				}
			} else {
				waiting++
			}
		default:
			unknown++
		}
	}
	if failedInitForGood > 0 {
		return corev1.PodFailed
	}
	switch {
	case pendingInit > 0 || pendingSidecars > 0 && !initialized, waiting > 0:
		return corev1.PodPending
	case running > 0 && unknown == 0:
		return corev1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		if stopped != stoppedForGood {
			return corev1.PodRunning
		}
		if stopped == succeeded {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	}
	return corev1.PodPending
}

// containersReady is the kubelet's ContainersReady: every container and
// native sidecar ready.
func containersReady(phase corev1.PodPhase, in statusInput, st corev1.PodStatus) corev1.PodCondition {
	switch phase {
	case corev1.PodSucceeded:
		return corev1.PodCondition{Status: corev1.ConditionFalse, Reason: "PodCompleted"}
	case corev1.PodFailed:
		return corev1.PodCondition{Status: corev1.ConditionFalse, Reason: "PodFailed"}
	}
	var unready []string
	for i, s := range in.init {
		if s.kind == kindSidecar && !st.InitContainerStatuses[i].Ready {
			unready = append(unready, s.name)
		}
	}
	for i, s := range in.regular {
		if !st.ContainerStatuses[i].Ready {
			unready = append(unready, s.name)
		}
	}
	if len(unready) > 0 {
		return corev1.PodCondition{Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: fmt.Sprintf("containers with unready status: %v", unready)}
	}
	return corev1.PodCondition{Status: corev1.ConditionTrue}
}

// readyFrom is the kubelet's Ready: ContainersReady and every readiness gate's
// condition True.
func readyFrom(cr corev1.PodCondition, pod *corev1.Pod) corev1.PodCondition {
	if cr.Status != corev1.ConditionTrue {
		return cr
	}
	var msgs []string
	for _, g := range pod.Spec.ReadinessGates {
		c := findCondition(nil, pod, g.ConditionType)
		switch {
		case c == nil:
			msgs = append(msgs, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", g.ConditionType))
		case c.Status != corev1.ConditionTrue:
			msgs = append(msgs, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", g.ConditionType, c.Status))
		}
	}
	if len(msgs) > 0 {
		msg := msgs[0]
		for _, m := range msgs[1:] {
			msg += ", " + m
		}
		return corev1.PodCondition{Status: corev1.ConditionFalse, Reason: "ReadinessGatesNotReady", Message: msg}
	}
	return corev1.PodCondition{Status: corev1.ConditionTrue}
}

// ownedPart is the part of a status the node writes, for comparing.
func ownedPart(st corev1.PodStatus) corev1.PodStatus {
	o := corev1.PodStatus{
		Phase: st.Phase, HostIP: st.HostIP, HostIPs: st.HostIPs, PodIP: st.PodIP, PodIPs: st.PodIPs,
		StartTime: st.StartTime, InitContainerStatuses: st.InitContainerStatuses,
		ContainerStatuses: st.ContainerStatuses, ObservedGeneration: st.ObservedGeneration,
	}
	for _, c := range st.Conditions {
		if owned(c.Type) {
			o.Conditions = append(o.Conditions, c)
		}
	}
	return o
}

// snapshotLocked captures the pod's state. p.mu must be held.
func (p *pod) snapshotLocked() statusInput {
	in := statusInput{
		hostIP: p.n.cfg.HostIP, startTime: p.startTime, sandbox: p.sandbox, sandboxMsg: p.sandboxMsg,
		initialized: p.initialized, stopped: p.stopped, terminal: p.terminal,
	}
	snap := func(c *ctr) ctrSnapshot {
		return ctrSnapshot{name: c.name, image: c.spec.Image, kind: c.kind, launched: c.launched.Load(), st: c.st}
	}
	for _, c := range p.init {
		in.init = append(in.init, snap(c))
	}
	for _, c := range p.regular {
		in.regular = append(in.regular, snap(c))
	}
	return in
}

// statusLoop patches the status after each change, retrying failures with
// back-off, until ctx ends.
func (p *pod) statusLoop(ctx context.Context) {
	retry := time.Duration(0)
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		var again <-chan time.Time
		var timer clock.Timer
		if err := p.syncStatus(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			retry = min(max(2*retry, 200*time.Millisecond), 10*time.Second)
			p.log.Warn("patch pod status, retrying", "err", err, "in", retry)
			timer = p.n.clock.NewTimer(retry)
			again = timer.C()
		} else {
			retry = 0
		}
		select {
		case <-ch:
		case <-again:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// syncStatus patches the pod's status if what the node owns changed since its
// last write. It uses a strategic merge patch computed from the newest pod
// version seen, with the pod's UID as a precondition, as the kubelet does.
func (p *pod) syncStatus(ctx context.Context) error {
	p.mu.Lock()
	if p.apiGone {
		p.mu.Unlock()
		return nil
	}
	in := p.snapshotLocked()
	base, prev := p.api, p.lastSent
	p.mu.Unlock()

	st := buildStatus(base, in, prev, p.n.clock.Now())
	want := ownedPart(st)
	if prev != nil && apiequality.Semantic.DeepEqual(want, *prev) {
		return nil
	}
	oldJSON, err := json.Marshal(corev1.Pod{Status: base.Status})
	if err != nil {
		return err
	}
	newJSON, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: p.uid}, Status: st})
	if err != nil {
		return err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, corev1.Pod{})
	if err != nil {
		return fmt.Errorf("status patch: %w", err)
	}
	got, err := p.n.cfg.Client.CoreV1().Pods(p.ns).Patch(ctx, p.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		// A patch carries no resourceVersion, so a conflict is the UID
		// precondition: the pod of that name is another incarnation.
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			p.mu.Lock()
			p.apiGone = true
			p.mu.Unlock()
			return nil
		}
		return fmt.Errorf("patch status: %w", err)
	}
	p.mu.Lock()
	p.lastSent = &want
	if newer(got, p.api) {
		p.api = got
	}
	p.mu.Unlock()
	p.log.Debug("status patched", "phase", st.Phase, "patch", string(patch))
	return nil
}
