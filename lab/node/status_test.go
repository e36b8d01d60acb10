package node

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestBuildStatus(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0.Add(time.Minute)
	gate := corev1.PodReadinessGate{ConditionType: "amf.io/healthy"}
	spec := corev1.PodSpec{
		RestartPolicy:  corev1.RestartPolicyAlways,
		ReadinessGates: []corev1.PodReadinessGate{gate},
		InitContainers: []corev1.Container{{Name: "amf-sidecar", Image: "sidecar:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}},
		Containers:     []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}},
	}
	running := func(ready, started bool) ctrState {
		return ctrState{run: &instance{id: "aaaa", startedAt: t0}, ready: ready, started: started, imageID: "lab:///x"}
	}
	crashed := &termination{id: "bbbb", exitCode: 137, reason: reasonOOMKilled, startedAt: t0, finishedAt: t0.Add(time.Second)}
	healthy := corev1.PodCondition{Type: "amf.io/healthy", Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0)}
	unhealthy := corev1.PodCondition{Type: "amf.io/healthy", Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0)}
	type want struct {
		phase                                   corev1.PodPhase
		sandbox, initialized, containers, ready corev1.ConditionStatus
		readyReason                             string
		brokerWaiting                           string
	}
	for _, tc := range []struct {
		name     string
		foreign  []corev1.PodCondition
		in       statusInput
		restart  corev1.RestartPolicy
		want     want
		wantGate bool
	}{
		{
			name: "setting up",
			in:   statusInput{sandboxMsg: "volume \"config\": configmap not found"},
			want: want{corev1.PodPending, corev1.ConditionFalse, corev1.ConditionFalse, corev1.ConditionFalse, corev1.ConditionFalse, "ContainersNotReady", reasonPodInitializing},
		},
		{
			name: "sidecar started, broker creating",
			in:   statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(true, true)}}, regular: []ctrSnapshot{{}}},
			want: want{corev1.PodPending, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionFalse, "ContainersNotReady", reasonContainerCreating},
		},
		{
			name: "all ready, gate missing",
			in:   statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(true, true)}}, regular: []ctrSnapshot{{st: running(true, true)}}},
			want: want{corev1.PodRunning, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse, "ReadinessGatesNotReady", ""},
		},
		{
			name:    "all ready, gate False",
			foreign: []corev1.PodCondition{unhealthy},
			in:      statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(true, true)}}, regular: []ctrSnapshot{{st: running(true, true)}}},
			want:    want{corev1.PodRunning, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse, "ReadinessGatesNotReady", ""},
		},
		{
			name:     "all ready, gate True",
			foreign:  []corev1.PodCondition{healthy},
			in:       statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(true, true)}}, regular: []ctrSnapshot{{st: running(true, true)}}},
			want:     want{corev1.PodRunning, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionTrue, "", ""},
			wantGate: true,
		},
		{
			name:    "sidecar not ready",
			foreign: []corev1.PodCondition{healthy},
			in:      statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(false, true)}}, regular: []ctrSnapshot{{st: running(true, true)}}},
			want:    want{corev1.PodRunning, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionFalse, "ContainersNotReady", ""},
		},
		{
			name:    "broker in crash loop",
			foreign: []corev1.PodCondition{healthy},
			in: statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(true, true)}},
				regular: []ctrSnapshot{{st: ctrState{waiting: &corev1.ContainerStateWaiting{Reason: reasonCrashLoopBackOff}, last: crashed, restarts: 2}}}},
			want: want{corev1.PodRunning, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionFalse, "ContainersNotReady", reasonCrashLoopBackOff},
		},
		{
			name:    "OnFailure: broker failed, restarting",
			restart: corev1.RestartPolicyOnFailure,
			in: statusInput{sandbox: true, initialized: true, init: []ctrSnapshot{{st: running(true, true)}},
				regular: []ctrSnapshot{{st: ctrState{term: crashed}}}},
			want: want{corev1.PodRunning, corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionFalse, "ContainersNotReady", ""},
		},
		{
			name:    "Never: broker failed, terminal",
			restart: corev1.RestartPolicyNever,
			in: statusInput{sandbox: true, initialized: true, stopped: true, terminal: corev1.PodFailed,
				init: []ctrSnapshot{{st: ctrState{term: &termination{id: "c", exitCode: 0, reason: reasonCompleted}}}}, regular: []ctrSnapshot{{st: ctrState{term: crashed}}}},
			want: want{corev1.PodFailed, corev1.ConditionFalse, corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionFalse, "PodFailed", ""},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			if tc.restart != "" {
				s.RestartPolicy = tc.restart
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: s}
			pod.Status.Conditions = append([]corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}, tc.foreign...)
			pod.Status.QOSClass = corev1.PodQOSBurstable
			in := tc.in
			in.hostIP, in.startTime = "127.0.0.1", t0
			for len(in.init) < 1 {
				in.init = append(in.init, ctrSnapshot{})
			}
			for len(in.regular) < 1 {
				in.regular = append(in.regular, ctrSnapshot{})
			}
			in.init[0].name, in.init[0].image, in.init[0].kind = "amf-sidecar", "sidecar:1", kindSidecar
			in.regular[0].name, in.regular[0].image = "mosquitto", "eclipse-mosquitto:2"
			st := buildStatus(pod, in, nil, now)
			if st.Phase != tc.want.phase {
				t.Errorf("phase %s, want %s", st.Phase, tc.want.phase)
			}
			conds := map[corev1.PodConditionType]corev1.PodCondition{}
			for _, c := range st.Conditions {
				if _, dup := conds[c.Type]; dup {
					t.Errorf("condition %s twice", c.Type)
				}
				conds[c.Type] = c
			}
			for typ, w := range map[corev1.PodConditionType]corev1.ConditionStatus{
				corev1.PodReadyToStartContainers: tc.want.sandbox, corev1.PodInitialized: tc.want.initialized,
				corev1.ContainersReady: tc.want.containers, corev1.PodReady: tc.want.ready,
			} {
				if c := conds[typ]; c.Status != w {
					t.Errorf("%s = %s (%s: %s), want %s", typ, c.Status, c.Reason, c.Message, w)
				} else if c.ObservedGeneration != 3 {
					t.Errorf("%s observedGeneration %d", typ, c.ObservedGeneration)
				}
			}
			if r := conds[corev1.PodReady].Reason; r != tc.want.readyReason {
				t.Errorf("Ready reason %q (%s), want %q", r, conds[corev1.PodReady].Message, tc.want.readyReason)
			}
			if conds[corev1.PodScheduled].Status != corev1.ConditionTrue || st.QOSClass != corev1.PodQOSBurstable {
				t.Error("a condition or field the node does not own was changed")
			}
			if g, ok := conds["amf.io/healthy"]; len(tc.foreign) > 0 && (!ok || !g.LastTransitionTime.Equal(&tc.foreign[0].LastTransitionTime)) {
				t.Errorf("the readiness gate condition was changed: %+v", g)
			}
			bs := st.ContainerStatuses[0]
			if w := bs.State.Waiting; tc.want.brokerWaiting != "" && (w == nil || w.Reason != tc.want.brokerWaiting) {
				t.Errorf("broker state %+v, want waiting %s", bs.State, tc.want.brokerWaiting)
			}
			if st.HostIP != "127.0.0.1" || st.StartTime == nil || !st.StartTime.Time.Equal(t0) {
				t.Errorf("hostIP %q startTime %v", st.HostIP, st.StartTime)
			}
			if (st.PodIP != "") != in.sandbox {
				t.Errorf("podIP %q with sandbox %v", st.PodIP, in.sandbox)
			}
		})
	}
}

func TestBuildStatusContainer(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "b"}}}}
	last := &termination{id: "old", exitCode: 137, signal: 9, reason: reasonOOMKilled, startedAt: t0, finishedAt: t0.Add(time.Second)}
	in := statusInput{hostIP: "10.0.0.1", sandbox: true, initialized: true, regular: []ctrSnapshot{{name: "b", image: "img:1",
		st: ctrState{run: &instance{id: "new", startedAt: t0.Add(2 * time.Second)}, last: last, restarts: 1, ready: true, started: true, imageID: "lab:///bin/b"}}}}
	st := buildStatus(pod, in, nil, t0.Add(time.Minute))
	cs := st.ContainerStatuses[0]
	if cs.ContainerID != "lab://new" || cs.RestartCount != 1 || !cs.Ready || cs.Started == nil || !*cs.Started || cs.Image != "img:1" || cs.ImageID != "lab:///bin/b" {
		t.Errorf("status %+v", cs)
	}
	if cs.State.Running == nil || !cs.State.Running.StartedAt.Time.Equal(t0.Add(2*time.Second)) {
		t.Errorf("state %+v", cs.State)
	}
	lt := cs.LastTerminationState.Terminated
	if lt == nil || lt.Reason != reasonOOMKilled || lt.ExitCode != 137 || lt.Signal != 9 || lt.ContainerID != "lab://old" {
		t.Errorf("last state %+v", cs.LastTerminationState)
	}
	// Transition times: kept from what the node wrote last while unchanged.
	prev := st
	later := buildStatus(pod, in, &prev, t0.Add(time.Hour))
	for i, c := range later.Conditions {
		if !c.LastTransitionTime.Equal(&prev.Conditions[i].LastTransitionTime) {
			t.Errorf("%s moved its transition time", c.Type)
		}
	}
	in.regular[0].st.ready = false
	later = buildStatus(pod, in, &prev, t0.Add(time.Hour))
	for _, c := range later.Conditions {
		if c.Type == corev1.PodReady && !c.LastTransitionTime.Time.Equal(t0.Add(time.Hour)) {
			t.Errorf("Ready changed but kept its transition time %v", c.LastTransitionTime)
		}
	}
}
