package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/podsignal"
)

// TestActuationFromMQTTSignals wires the agent to the actuator end to end on
// a real control plane: a sidecar signals over MQTT; first with an
// observe-only (dry-run) actuator, which logs the decision and changes
// nothing; then with a real one, which scales the cold standby up after three
// anomalous samples, and, when the sidecar's connection is cut (a crash: Last
// Will "gone"), fails over and retires the primary once the standby is Ready.
func TestActuationFromMQTTSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin := cp.Client()
	const ns = "tod"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The actuator runs as a ServiceAccount bound to exactly actuate.Rules().
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "amf-actuate"}, Rules: actuate.Rules()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "amf-actuate"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "amf-actuate"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "amf-agent"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	saCfg, err := cp.ServiceAccountConfig(ctx, ns, "amf-agent")
	if err != nil {
		t.Fatal(err)
	}
	agentCS, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		name     string
		replicas int32
		ann      map[string]string
	}{
		{"standby", 0, nil},
		{"primary", 1, map[string]string{contract.AnnStandby: "standby", contract.AnnHold: "1s"}},
	} {
		labels := map[string]string{"app": d.name}
		if _, err := admin.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: d.name, Annotations: d.ann},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To(d.replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}}}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	podName := runningPod(ctx, t, admin, ns, "app=primary")
	id := podsignal.PodID{Namespace: ns, Pod: podName}
	const token = "tok-primary-0123456789abcdef"
	ta := startAgent(t, func(c *Config) { c.Authenticator = staticTokens(t, token+" "+id.String()) })
	sidecar := mustDial(t, ta.MQTTAddr(), id, token, func(o *paho.ClientOptions) {
		o.SetBinaryWill(id.Topic(), payload(t, id, podsignal.Gone, 0), 1, true)
	})
	seq := uint64(0)
	send := func(st podsignal.State) {
		t.Helper()
		seq++
		publish(t, sidecar, id.Topic(), payload(t, id, st, seq))
	}
	runActuation := func(dryRun bool, logs *logSink) (stop func()) {
		var reg prometheus.Registerer
		if !dryRun {
			reg = ta.MetricsRegisterer()
		}
		act, err := actuate.New(actuate.Config{Client: agentCS, DryRun: dryRun, Instance: "node-0", Registerer: reg,
			Logger: slog.New(slog.NewJSONHandler(logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(ctx)
		wait := StartActuation(actx, ta.Tracker(), act)
		return func() {
			acancel()
			if err := wait(); err != nil {
				t.Errorf("actuation: %v", err)
			}
		}
	}

	// Observe-only: the decision is logged, nothing is written.
	dryLogs := newLogSink()
	stopDry := runActuation(true, dryLogs)
	send(podsignal.Healthy)
	for range 3 {
		send(podsignal.Anomalous)
	}
	dryLogs.wait(t, "dry-run scale decision", lineIs("decision", "action", "ScaleStandby", "dry_run", "true"))
	stopDry()
	if d := getDep(ctx, t, admin, ns, "standby"); *d.Spec.Replicas != 0 {
		t.Fatalf("observe-only scaled the standby to %d", *d.Spec.Replicas)
	}
	if d := getDep(ctx, t, admin, ns, "primary"); d.Annotations[contract.AnnRecord] != "" {
		t.Fatalf("observe-only wrote the record %s", d.Annotations[contract.AnnRecord])
	}

	// Acting: three anomalous samples over MQTT scale the standby up.
	logs := newLogSink()
	stop := runActuation(false, logs)
	defer stop()
	send(podsignal.Healthy)
	for range 3 {
		send(podsignal.Anomalous)
	}
	waitDep(ctx, t, admin, ns, "standby", "scaled to 1", func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 1 })
	// A crash (connection cut: Last Will "gone") fails over at once; the
	// primary is retired once the standby is Ready, before any reconfirmation.
	sidecar.kill(t)
	d := waitDep(ctx, t, admin, ns, "primary", "retired", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	if s := getDep(ctx, t, admin, ns, "standby"); s.Status.ReadyReplicas < 1 {
		t.Fatalf("primary retired (%v) while the standby has %d Ready replicas", d.Annotations, s.Status.ReadyReplicas)
	}
	logs.wait(t, "failover event", lineIs("event", "reason", "Failover"))
	if n := testutil.ToFloat64(mustCounter(t, ta.m.reg, "amf_actuate_decisions_total", "reason", "Failover")); n != 1 {
		t.Errorf("amf_actuate_decisions_total{reason=Failover} = %v, want 1", n)
	}
}

// mustCounter finds one series of a counter on the agent's registry.
func mustCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q} on the agent's /metrics registry", name, label, value)
	return nil
}

func runningPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, selector string) string {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ev, err := watchtools.UntilWithSync(wctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		return ok && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("no running pod %s: %v", selector, err)
	}
	return ev.Object.(*corev1.Pod).Name
}

func waitDep(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, what string, cond func(*appsv1.Deployment) bool) *appsv1.Deployment {
	t.Helper()
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", name))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last *appsv1.Deployment
	_, err := watchtools.UntilWithSync(wctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if ok {
			last = d
		}
		return ok && d.Status.ObservedGeneration >= d.Generation && cond(d), nil
	})
	if err != nil {
		t.Fatalf("deployment %s never %s: %v (last %+v)", name, what, err, last)
	}
	return last
}

func getDep(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) *appsv1.Deployment {
	t.Helper()
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
