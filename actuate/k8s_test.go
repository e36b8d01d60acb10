package actuate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/podsignal"
)

// agentSA is the agent's ServiceAccount, in each test's namespace.
const agentSA = "amf-agent"

// TestSwitchoverAndFailover runs the actuator, as a ServiceAccount bound to
// exactly actuate.Rules(), against a real API server, controller manager,
// scheduler and kwok: a cold make-before-break switchover (standby Ready
// before the primary is retired, roles exchanged), then a crash failover back
// (not held back by the flap guard), an invalid policy (Warning Event, no
// action), and the readiness-gate condition. A watcher records every change of
// the Ready replicas and checks primary + standby never drop to 0.
func TestSwitchoverAndFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel, admin := startCluster(t, 90*time.Second)
	agentClient := agentClientset(ctx, t, admin, actuate.Rules())
	checkRBAC(ctx, t, admin)

	// Primary a (its pods declare the amf.io/healthy readiness gate), cold
	// standby b, and c with an invalid policy.
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-b", 0, nil)
	})
	var ready readyLog
	go ready.watch(ctx, t, admin)
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-a", 1, map[string]string{
			contract.AnnStandby: "broker-b", contract.AnnRedundancy: "cold", contract.AnnHold: "2s",
		})
	})
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-c", 1, map[string]string{contract.AnnStandby: "broker-d", contract.AnnRedundancy: "warm"})
	})
	waitDeployment(ctx, t, admin, "broker-a", "1 Ready replica", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
	podA := onlyPod(ctx, t, admin, "broker-a")

	reg := prometheus.NewRegistry()
	act, err := actuate.New(actuate.Config{
		Client:     agentClient,
		Logger:     testLogger(t),
		Instance:   "node-test",
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	signals := make(chan podsignal.Observation)
	runDone := make(chan error, 1)
	go func() { runDone <- act.Run(ctx, signals) }()
	send := func(pod string, st podsignal.State, transition bool) {
		t.Helper()
		select {
		case signals <- observation(admin.ns, pod, st, 0.93, transition):
		case <-ctx.Done():
			t.Fatalf("signal for %s not taken: %v", pod, ctx.Err())
		}
	}

	// Readiness gate: a healthy transition sets amf.io/healthy=True and
	// leaves the kubelet's (kwok's) conditions alone.
	send(podA, podsignal.Healthy, true)
	waitPod(ctx, t, admin, podA, "amf.io/healthy=True next to Ready", func(p *corev1.Pod) bool {
		return condition(p, contract.ConditionHealthy) == corev1.ConditionTrue && condition(p, corev1.PodReady) != ""
	})

	// Invalid policy: a Warning Event, nothing scaled.
	send(onlyPod(ctx, t, admin, "broker-c"), podsignal.Anomalous, true)
	waitEvent(ctx, t, admin, "broker-c", "InvalidPolicy")

	// Switchover: 3 anomalous samples decide; the standby is scaled up.
	send(podA, podsignal.Anomalous, true)
	send(podA, podsignal.Anomalous, false)
	decided := time.Now()
	send(podA, podsignal.Anomalous, false)
	waitDeployment(ctx, t, admin, "broker-b", "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
	toScale := time.Since(decided)
	if rec := record(ctx, t, admin, "broker-a"); rec.Phase != actuate.PhaseWaitReady && rec.Phase != actuate.PhaseConfirm {
		t.Fatalf("record after the decision: %+v", rec)
	}
	// The record says Confirm once the agent's own watch saw the standby Ready.
	waitDeployment(ctx, t, admin, "broker-b", "Ready", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas >= 1 })
	readyAt := time.Now()
	waitDeployment(ctx, t, admin, "broker-a", "record phase Confirm", func(d *appsv1.Deployment) bool {
		return recordOf(d).Phase == actuate.PhaseConfirm
	})
	t.Logf("third anomalous sample → standby scale seen by a watcher: %v; standby Ready seen → record Confirm seen: %v",
		toScale.Round(time.Millisecond), time.Since(readyAt).Round(time.Millisecond))
	if a := replicasOf(ctx, t, admin, "broker-a"); a != 1 {
		t.Fatalf("primary has %d replicas before the re-confirmation", a)
	}
	for range 3 {
		send(podA, podsignal.Anomalous, false)
	}
	waitDeployment(ctx, t, admin, "broker-a", "retired and standby", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Status.ReadyReplicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	retired := time.Since(decided)
	if retired < 2*time.Second {
		t.Errorf("primary retired %v after the decision, before the 2 s hold", retired)
	}
	b := getDeployment(ctx, t, admin, "broker-b")
	if b.Annotations[contract.AnnStandby] != "broker-a" || b.Annotations[contract.AnnRole] != "primary" || b.Annotations[contract.AnnHold] != "2s" {
		t.Fatalf("new primary's annotations after the exchange: %v", b.Annotations)
	}
	if a := getDeployment(ctx, t, admin, "broker-a"); a.Annotations[contract.AnnStandby] != "" || a.Annotations[contract.AnnPrimary] != "broker-b" {
		t.Fatalf("old primary's annotations after the exchange: %v", a.Annotations)
	}
	t.Logf("switchover: decision → primary retired in %v; overlap (both Ready) %v", retired.Round(time.Millisecond), ready.overlap().Round(time.Millisecond))

	// Flap guard: a confirmed anomaly of the new primary within the cool-down
	// (default 5 min) gives a Warning Event and no switchover.
	podB := onlyPod(ctx, t, admin, "broker-b")
	for range 3 {
		send(podB, podsignal.Anomalous, false)
	}
	waitEvent(ctx, t, admin, "broker-b", "FlapGuard")
	if n := replicasOf(ctx, t, admin, "broker-a"); n != 0 {
		t.Fatalf("flap guard: old primary scaled to %d", n)
	}

	// Failover: the new primary's sidecar is gone. The flap guard (5 min) does
	// not hold a failover back; the old primary comes back and b is retired.
	failed := time.Now()
	send(podB, podsignal.Gone, true)
	waitDeployment(ctx, t, admin, "broker-b", "retired after failover", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Status.ReadyReplicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	a := getDeployment(ctx, t, admin, "broker-a")
	if a.Status.ReadyReplicas != 1 || a.Annotations[contract.AnnStandby] != "broker-b" {
		t.Fatalf("after failover broker-a: ready %d annotations %v", a.Status.ReadyReplicas, a.Annotations)
	}
	t.Logf("failover: gone → failed primary retired in %v", time.Since(failed).Round(time.Millisecond))
	for _, reason := range []string{"SwitchoverDecided", "StandbyReady", "SwitchoverConfirmed", "RolesExchanged"} {
		waitEvent(ctx, t, admin, "broker-a", reason)
	}
	waitEvent(ctx, t, admin, "broker-b", "Failover")

	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	ready.check(t)
	// Step latencies: the switchover's steps and the failover's, and both
	// stages of each (decision → standby Ready, decision → retired).
	checkHistograms(t, reg, "amf_actuate_step_seconds", "phase", map[string]uint64{
		"WaitReady": 1, "Confirm": 1, "Retiring": 2, "Failover": 1})
	checkHistograms(t, reg, "amf_actuate_switchover_seconds", "stage", map[string]uint64{"standby_ready": 2, "retired": 2})
}

// checkHistograms checks that histogram name has at least want[v] samples
// for each value v of its label, and logs their mean.
func checkHistograms(t *testing.T, g prometheus.Gatherer, name, label string, want map[string]uint64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					h := m.GetHistogram()
					got[lp.GetValue()] = h.GetSampleCount()
					t.Logf("%s{%s=%q}: %d, mean %.1f ms", name, label, lp.GetValue(), h.GetSampleCount(), 1000*h.GetSampleSum()/float64(max(h.GetSampleCount(), 1)))
				}
			}
		}
	}
	for v, n := range want {
		if got[v] < n {
			t.Errorf("%s{%s=%q}: %d samples, want at least %d", name, label, v, got[v], n)
		}
	}
}

// TestResumeAfterRestart starts an actuator (ResumeOnStart, no signals at
// all) on records left by an agent that died mid-switchover: right after
// deciding (WaitReady: the standby was never scaled), right after a crash was
// decided (Failover: standby never scaled) and right after deciding to retire
// (Retiring: primary still up). The new agent scales the first
// standby and waits for it (Confirm), and retires the second primary and
// exchanges the roles, never bringing a pair's Ready replicas to 0.
func TestResumeAfterRestart(t *testing.T) {
	ctx, cancel, admin := startCluster(t, 90*time.Second)
	agentClient := agentClientset(ctx, t, admin, actuate.RulesWithResume())
	recJSON := func(r actuate.Record) string {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	now := time.Now()
	var ready readyLog // watches broker-a / broker-b: the Retiring pair
	go ready.watch(ctx, t, admin)
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-b", 1, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-a", 1, map[string]string{contract.AnnStandby: "broker-b",
			contract.AnnRecord: recJSON(actuate.Record{Phase: actuate.PhaseRetiring, Standby: "broker-b", Decision: now.Add(-20 * time.Second), Confirmed: 3})})
	})
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-d", 0, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-c", 1, map[string]string{contract.AnnStandby: "broker-d",
			contract.AnnRecord: recJSON(actuate.Record{Phase: actuate.PhaseWaitReady, Standby: "broker-d", Decision: now})})
	})
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-f", 0, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-e", 1, map[string]string{contract.AnnStandby: "broker-f",
			contract.AnnRecord: recJSON(actuate.Record{Phase: actuate.PhaseFailover, Standby: "broker-f", Decision: now, Failover: true})})
	})
	for _, n := range []string{"broker-a", "broker-b", "broker-c", "broker-e"} {
		waitDeployment(ctx, t, admin, n, "1 Ready replica", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
	}

	act, err := actuate.New(actuate.Config{Client: agentClient, ResumeOnStart: true,
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- act.Run(ctx, make(chan podsignal.Observation)) }()

	waitDeployment(ctx, t, admin, "broker-a", "retired on resume", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Status.ReadyReplicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	waitDeployment(ctx, t, admin, "broker-b", "primary after the resumed exchange", func(d *appsv1.Deployment) bool {
		return d.Annotations[contract.AnnStandby] == "broker-a" && recordOf(d).Phase == actuate.PhaseIdle && !recordOf(d).LastSwitch.IsZero()
	})
	waitDeployment(ctx, t, admin, "broker-e", "retired after the resumed failover", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	if f := getDeployment(ctx, t, admin, "broker-f"); f.Status.ReadyReplicas != 1 || f.Annotations[contract.AnnStandby] != "broker-e" {
		t.Fatalf("after the resumed failover broker-f: %d ready, annotations %v", f.Status.ReadyReplicas, f.Annotations)
	}
	waitDeployment(ctx, t, admin, "broker-d", "scaled up on resume", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
	waitDeployment(ctx, t, admin, "broker-c", "record Confirm on resume", func(d *appsv1.Deployment) bool {
		return recordOf(d).Phase == actuate.PhaseConfirm && *d.Spec.Replicas == 1
	})
	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	ready.check(t)
}

// TestAbortAndStandbyNeverReady: an anomaly that clears before the standby
// is Ready aborts the switchover and the cold standby is scaled back after the
// abort delay; a standby that cannot become Ready (unschedulable) gives a
// Warning Event at the ready timeout, is scaled back, and the primary stays.
func TestAbortAndStandbyNeverReady(t *testing.T) {
	t.Parallel()
	ctx, cancel, admin := startCluster(t, 90*time.Second)
	agentClient := agentClientset(ctx, t, admin, actuate.Rules())
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-b", 0, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-a", 1, map[string]string{contract.AnnStandby: "broker-b", contract.AnnAbortDelay: "1s"})
	})
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-never", 0, nil) })
	if _, err := admin.AppsV1().Deployments(admin.ns).Patch(ctx, "broker-never", "application/merge-patch+json",
		[]byte(`{"spec":{"template":{"spec":{"nodeSelector":{"amf.io/no-such-node":"x"}}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-c", 1, map[string]string{contract.AnnStandby: "broker-never", contract.AnnReadyTimeout: "3s"})
	})
	podA, podC := onlyPod(ctx, t, admin, "broker-a"), onlyPod(ctx, t, admin, "broker-c")

	signals, runDone := startActuator(ctx, t, agentClient)
	send := func(pod string, st podsignal.State) {
		select {
		case signals <- observation(admin.ns, pod, st, 0.9, false):
		case <-ctx.Done():
			t.Fatalf("signal not taken: %v", ctx.Err())
		}
	}

	// Abort: decided, then healthy before the standby was confirmed.
	for range 3 {
		send(podA, podsignal.Anomalous)
	}
	waitDeployment(ctx, t, admin, "broker-b", "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
	send(podA, podsignal.Healthy)
	waitEvent(ctx, t, admin, "broker-a", "SwitchoverAborted")
	waitDeployment(ctx, t, admin, "broker-b", "scaled back to 0 after the abort delay", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 0 })
	if d := getDeployment(ctx, t, admin, "broker-a"); *d.Spec.Replicas != 1 || d.Status.ReadyReplicas != 1 {
		t.Fatalf("primary after the abort: %d replicas, %d ready", *d.Spec.Replicas, d.Status.ReadyReplicas)
	}

	// Never Ready: the standby is scaled up, stays Pending, and is given up.
	for range 3 {
		send(podC, podsignal.Anomalous)
	}
	waitDeployment(ctx, t, admin, "broker-never", "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
	for range 3 {
		send(podC, podsignal.Anomalous) // not counted: the standby is not Ready
	}
	waitEvent(ctx, t, admin, "broker-c", "StandbyNotReady")
	waitDeployment(ctx, t, admin, "broker-never", "scaled back to 0", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 0 })
	if d := getDeployment(ctx, t, admin, "broker-c"); *d.Spec.Replicas != 1 || recordOf(d).Phase != actuate.PhaseIdle {
		t.Fatalf("primary after the ready timeout: %d replicas, record %+v", *d.Spec.Replicas, recordOf(d))
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestAPIServerRestartDuringSwitchover stops the API server right after the
// standby was scaled up and starts it again: the actuator's standby watch
// resumes, the record reaches Confirm and the switchover completes.
func TestAPIServerRestartDuringSwitchover(t *testing.T) {
	t.Parallel()
	ctx, cancel, admin := startOwnCluster(t, 90*time.Second)
	agentClient := agentClientset(ctx, t, admin, actuate.Rules())
	mustCreate(t, func() error { return createDeployment(ctx, admin, "broker-b", 0, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-a", 1, map[string]string{contract.AnnStandby: "broker-b", contract.AnnHold: "1s"})
	})
	podA := onlyPod(ctx, t, admin, "broker-a")
	signals, runDone := startActuator(ctx, t, agentClient)
	send := func(st podsignal.State) {
		select {
		case signals <- observation(admin.ns, podA, st, 0.9, false):
		case <-ctx.Done():
			t.Fatalf("signal not taken: %v", ctx.Err())
		}
	}
	for range 3 {
		send(podsignal.Anomalous)
	}
	waitDeployment(ctx, t, admin, "broker-b", "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
	t0 := time.Now()
	if err := admin.cp.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %v", time.Since(t0).Round(time.Millisecond))
	waitDeployment(ctx, t, admin, "broker-a", "record Confirm after the restart", func(d *appsv1.Deployment) bool {
		return recordOf(d).Phase == actuate.PhaseConfirm
	})
	for range 3 {
		send(podsignal.Anomalous)
	}
	waitDeployment(ctx, t, admin, "broker-a", "retired", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// agentClientset returns a clientset of the ServiceAccount amf-agent of the
// test's namespace, bound to exactly rules by a ClusterRoleBinding (named
// after the namespace: the tests share the control plane).
func agentClientset(ctx context.Context, t testing.TB, admin *kube, rules []rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(agentConfig(ctx, t, admin, rules))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// agentConfig binds the agent's ServiceAccount to exactly rules, like
// agentClientset, and returns its client configuration (with the agent
// binary's QPS and burst), for tests that wrap its transport.
func agentConfig(ctx context.Context, t testing.TB, admin *kube, rules []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	role := "amf-agent-actuate-" + admin.ns
	mustCreate(t, func() error {
		_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: admin.ns, Name: agentSA}},
		}, metav1.CreateOptions{})
		return err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = admin.RbacV1().ClusterRoleBindings().Delete(ctx, role, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(ctx, role, metav1.DeleteOptions{})
	})
	cfg, err := admin.cp.ServiceAccountConfig(ctx, admin.ns, agentSA)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg
}

// checkRBAC asks the API server (SubjectAccessReview) what the agent's
// identity may do: its job, and nothing of the dangerous rest.
func checkRBAC(ctx context.Context, t testing.TB, admin *kube) {
	t.Helper()
	user := "system:serviceaccount:" + admin.ns + ":" + agentSA
	tests := []struct {
		group, resource, sub, verb string
		want                       bool
	}{
		{"apps", "deployments", "scale", "update", true},
		{"apps", "deployments", "", "patch", true},
		{"apps", "deployments", "", "watch", true},
		{"", "pods", "status", "patch", true},
		{"", "pods", "resize", "patch", true},
		{"", "pods", "resize", "update", false},
		{"", "pods", "ephemeralcontainers", "patch", false},
		{"events.k8s.io", "events", "", "create", true},
		{"events.k8s.io", "events", "", "patch", true},
		{"events.k8s.io", "events", "", "delete", false},
		{"", "pods", "", "delete", false},
		{"", "secrets", "", "get", false},
		{"apps", "deployments", "", "update", false},
		{"apps", "deployments", "", "delete", false},
		{"apps", "deployments", "", "list", false},
		{"", "pods", "", "patch", false},
		{"apps", "statefulsets", "scale", "update", false},
		{"rbac.authorization.k8s.io", "clusterroles", "", "create", false},
	}
	for _, tt := range tests {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + admin.ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: admin.ns, Group: tt.group, Resource: tt.resource, Subresource: tt.sub, Verb: tt.verb},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tt.want {
			t.Errorf("agent may %s %s/%s/%s: %v, want %v (%s)", tt.verb, tt.group, tt.resource, tt.sub, sar.Status.Allowed, tt.want, sar.Status.Reason)
		}
	}
}

func createDeployment(ctx context.Context, k *kube, name string, replicas int32, ann map[string]string) error {
	labels := map[string]string{"app": name}
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}}}
	if name == "broker-a" {
		spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: contract.ConditionHealthy}}
	}
	_, err := k.AppsV1().Deployments(k.ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns, Annotations: ann},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}, metav1.CreateOptions{})
	return err
}

// plane is the control plane the package's real-API tests share: started
// by the first of them, stopped by TestMain after the last (with -count=N,
// after the last run), so that a test costs its own work, not a start.
var plane = &controlplane.Shared{Options: controlplane.Options{Nodes: 1}}

func TestMain(m *testing.M) {
	code := m.Run()
	plane.Stop(code != 0)
	os.Exit(code)
}

// kube is one test's admin client, the control plane it is on, and the
// test's namespace, where everything of the test lives.
type kube struct {
	kubernetes.Interface
	cp *controlplane.ControlPlane
	ns string
}

// startCluster gives the test a namespace of its own (and a kwok node) on
// the shared control plane, and returns a context bounded by timeout
// (cancel it to stop what runs under it) and the test's admin client.
//
// A test whose agents act only on the signals of its own pods calls
// t.Parallel first: nothing it does reaches another namespace. A test whose
// agent resumes at start (ResumeOnStart, actuate.RulesWithResume) lists the
// Deployments of every namespace and would take up the switchovers of the
// tests beside it, so it runs alone, before the parallel ones.
func startCluster(t *testing.T, timeout time.Duration) (context.Context, context.CancelFunc, *kube) {
	t.Helper()
	ctx, cancel := clusterContext(t, timeout)
	cp := plane.Get(ctx, t)
	return ctx, cancel, &kube{Interface: cp.Client(), cp: cp, ns: plane.Namespace(ctx, t, "amf-actuate")}
}

// startOwnCluster is startCluster on a control plane of the test's own, for
// a test that stops or restarts its components.
func startOwnCluster(t *testing.T, timeout time.Duration) (context.Context, context.CancelFunc, *kube) {
	t.Helper()
	ctx, cancel := clusterContext(t, timeout)
	cp, err := controlplane.Start(ctx, t, controlplane.Options{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	k := &kube{Interface: cp.Client(), cp: cp, ns: "amf-actuate"}
	mustCreate(t, func() error {
		_, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns}}, metav1.CreateOptions{})
		return err
	})
	return ctx, cancel, k
}

// clusterContext skips a real-API test under -short, and returns its
// context, bounded by timeout and cancelled when the test ends.
func clusterContext(t *testing.T, timeout time.Duration) (context.Context, context.CancelFunc) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Kubernetes control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx, cancel
}

// startActuator runs an actuator on client, logging to the test, until ctx ends;
// it returns the channel to send signals on and Run's result.
func startActuator(ctx context.Context, t *testing.T, client kubernetes.Interface) (chan podsignal.Observation, chan error) {
	t.Helper()
	act, err := actuate.New(actuate.Config{Client: client, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	signals := make(chan podsignal.Observation)
	runDone := make(chan error, 1)
	go func() { runDone <- act.Run(ctx, signals) }()
	return signals, runDone
}

func mustCreate(t testing.TB, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatal(err)
	}
}

func until[T runtime.Object](ctx context.Context, t testing.TB, lw cache.ListerWatcher, obj T, what string, cond func(T) bool) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last T
	_, err := watchtools.UntilWithSync(ctx, lw, obj, nil, func(ev watch.Event) (bool, error) {
		o, ok := ev.Object.(T)
		if !ok {
			return false, nil
		}
		last = o
		return cond(o), nil
	})
	if err != nil {
		b, _ := json.Marshal(last)
		t.Fatalf("never %s: %v; last seen %s", what, err, b)
	}
	return last
}

func waitDeployment(ctx context.Context, t testing.TB, k *kube, name, what string, cond func(*appsv1.Deployment) bool) *appsv1.Deployment {
	t.Helper()
	lw := cache.NewListWatchFromClient(k.AppsV1().RESTClient(), "deployments", k.ns, fields.OneTermEqualSelector("metadata.name", name))
	return until(ctx, t, lw, &appsv1.Deployment{}, name+" "+what, func(d *appsv1.Deployment) bool {
		return d.Status.ObservedGeneration >= d.Generation && cond(d)
	})
}

func waitPod(ctx context.Context, t testing.TB, k *kube, name, what string, cond func(*corev1.Pod) bool) {
	t.Helper()
	lw := cache.NewListWatchFromClient(k.CoreV1().RESTClient(), "pods", k.ns, fields.OneTermEqualSelector("metadata.name", name))
	until(ctx, t, lw, &corev1.Pod{}, name+" "+what, cond)
}

func waitEvent(ctx context.Context, t testing.TB, k *kube, regarding, reason string) {
	t.Helper()
	waitEventWith(ctx, t, k, regarding, reason, "", func(*eventsv1.Event) bool { return true })
}

// waitEventWith waits for an agent's Event regarding a Deployment, with
// reason, that satisfies cond (described by what).
func waitEventWith(ctx context.Context, t testing.TB, k *kube, regarding, reason, what string, cond func(*eventsv1.Event) bool) *eventsv1.Event {
	t.Helper()
	lw := cache.NewListWatchFromClient(k.EventsV1().RESTClient(), "events", k.ns, fields.Everything())
	return until(ctx, t, lw, &eventsv1.Event{}, fmt.Sprintf("event %s on %s %s", reason, regarding, what), func(e *eventsv1.Event) bool {
		return e.Regarding.Name == regarding && e.Reason == reason && e.ReportingController == actuate.Controller && cond(e)
	})
}

func onlyPod(ctx context.Context, t testing.TB, k *kube, app string) string {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(k.CoreV1().RESTClient(), "pods", k.ns, func(o *metav1.ListOptions) { o.LabelSelector = "app=" + app })
	p := until(ctx, t, lw, &corev1.Pod{}, "a running pod of "+app, func(p *corev1.Pod) bool {
		return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning
	})
	return p.Name
}

func getDeployment(ctx context.Context, t testing.TB, k *kube, name string) *appsv1.Deployment {
	t.Helper()
	d, err := k.AppsV1().Deployments(k.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func replicasOf(ctx context.Context, t testing.TB, k *kube, name string) int32 {
	return *getDeployment(ctx, t, k, name).Spec.Replicas
}

func recordOf(d *appsv1.Deployment) actuate.Record {
	var r actuate.Record
	_ = json.Unmarshal([]byte(d.Annotations[contract.AnnRecord]), &r)
	return r
}

func record(ctx context.Context, t testing.TB, k *kube, name string) actuate.Record {
	return recordOf(getDeployment(ctx, t, k, name))
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// readyLog records every change of the Ready replicas of broker-a and
// broker-b, from a watch, to check the invariant afterwards.
type readyLog struct {
	// a and b name the pair watched; empty: broker-a and broker-b.
	a, b    string
	mu      sync.Mutex
	entries []readyEntry
}

type readyEntry struct {
	at   time.Time
	a, b int32
}

func (l *readyLog) watch(ctx context.Context, t testing.TB, k *kube) {
	if l.a == "" {
		l.a, l.b = "broker-a", "broker-b"
	}
	cur := map[string]int32{}
	lw := cache.NewListWatchFromClient(k.AppsV1().RESTClient(), "deployments", k.ns, fields.Everything())
	_, _ = watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok || (d.Name != l.a && d.Name != l.b) {
			return false, nil
		}
		if old, seen := cur[d.Name]; seen && old == d.Status.ReadyReplicas {
			return false, nil
		}
		cur[d.Name] = d.Status.ReadyReplicas
		l.mu.Lock()
		l.entries = append(l.entries, readyEntry{time.Now(), cur[l.a], cur[l.b]})
		l.mu.Unlock()
		return false, nil
	})
}

// overlap is how long both were Ready during the first switchover.
func (l *readyLog) overlap() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var from time.Time
	for _, e := range l.entries {
		if e.a >= 1 && e.b >= 1 && from.IsZero() {
			from = e.at
		}
		if !from.IsZero() && (e.a == 0 || e.b == 0) {
			return e.at.Sub(from)
		}
	}
	return 0
}

// check: once anything was Ready, primary + standby never dropped to 0, and
// both were Ready at once (make before break).
func (l *readyLog) check(t testing.TB) {
	t.Helper()
	if trace, ok := l.invariant(t); ok && !slices.Contains(trace, "a=1 b=1") {
		t.Errorf("no overlap of primary and standby seen: %v", trace)
	}
}

// invariant checks that once anything was Ready, primary + standby never
// dropped to 0 Ready replicas, and returns the trace of Ready counts.
func (l *readyLog) invariant(t testing.TB) ([]string, bool) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	up := false
	var trace []string
	for _, e := range l.entries {
		trace = append(trace, fmt.Sprintf("a=%d b=%d", e.a, e.b))
		if e.a+e.b >= 1 {
			up = true
		} else if up {
			t.Errorf("Ready replicas of primary + standby dropped to 0: %v", trace)
			return trace, false
		}
	}
	t.Logf("Ready replicas of %s, %s: %v", l.a, l.b, trace)
	return trace, true
}

// testLogger is the logger of an actuator under test. Its lines are kept and
// printed when the test fails, so a failure says what the agent did; with
// AMF_ACTUATE_LOG=1 they are printed as they come.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t, live: os.Getenv("AMF_ACTUATE_LOG") != ""}
	t.Cleanup(func() {
		if !t.Failed() || w.live {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Logf("the actuator's log:\n%s", w.buf.Bytes())
	})
	return slog.New(slog.NewJSONHandler(w, nil))
}

type testWriter struct {
	t    testing.TB
	live bool
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (w *testWriter) Write(p []byte) (int, error) {
	if w.live {
		w.t.Logf("%s", p)
		return len(p), nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// observation is what the agent's tracker hands the actuator for one signal
// of pod in ns, received now.
func observation(ns, pod string, st podsignal.State, p float64, transition bool) podsignal.Observation {
	return podsignal.Observation{PodID: podsignal.PodID{Namespace: ns, Pod: pod}, State: st, Transition: transition,
		Source: podsignal.SourcePublish, Message: &podsignal.Message{State: st, Probability: &p}, Received: time.Now()}
}
