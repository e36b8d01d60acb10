package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
)

// TestBinaryResumesOnStart runs the built amf-agent with --actuate
// --resume-on-start against a real control plane (etcd, API server with
// RBAC, controller manager, scheduler, kwok), as the manifests' ServiceAccount
// amf-system/amf-agent with the manifests' RBAC (manifests/base applied with
// the control plane's kubectl, DaemonSet aside) plus the resume rule (list
// deployments, in a ClusterRole of its own), through a kubeconfig carrying a
// token of that ServiceAccount. Two switchovers were left in progress by an
// agent that stopped, on primaries that no longer signal (no sidecar
// connects): one after its primary was scaled to 0 but before the roles were
// exchanged (Retiring), one right after a crash was decided (Failover, the
// standby not scaled up yet). Without a single signal, the binary finishes
// both: the roles exchanged, the second standby scaled up and, once Ready,
// the failed primary retired. A watcher checks each pair's Ready replicas
// never drop to 0.
func TestBinaryResumesOnStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts a Kubernetes control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	bin := buildAgent(t)
	admin := cp.Client()
	const ns = "amf-resume"

	// The manifests' identity and rights, then the resume rule.
	base := filepath.Join("..", "..", "manifests", "base")
	args := []string{"apply"}
	for _, f := range []string{"namespace.yaml", "serviceaccount.yaml", "clusterrole-authn.yaml", "clusterrole-actuate.yaml", "clusterrolebindings.yaml"} {
		args = append(args, "-f", filepath.Join(base, f))
	}
	if out, err := cp.Kubectl(ctx, nil, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	must(t, func() error {
		_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "amf-agent-resume"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"list"}}},
		}, metav1.CreateOptions{})
		return err
	})
	must(t, func() error {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "amf-agent-resume"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "amf-agent-resume"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "amf-system", Name: "amf-agent"}},
		}, metav1.CreateOptions{})
		return err
	})
	exp := int64(3600)
	token, err := cp.ServiceAccountToken(ctx, "amf-system", "amf-agent", authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := writeKubeconfig(t, cp, token)

	// What the stopped agent left.
	must(t, func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	recJSON := func(r actuate.Record) string {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	now := time.Now()
	logs := map[string]*readyLog{"retiring": {}, "failover": {}}
	for pair, l := range logs {
		go l.watch(ctx, admin, ns, pair+"-p", pair+"-s")
	}
	for _, d := range []struct {
		name     string
		replicas int32
		ann      map[string]string
	}{
		{"retiring-s", 1, nil},
		{"retiring-p", 0, map[string]string{contract.AnnStandby: "retiring-s", contract.AnnRecord: recJSON(actuate.Record{
			Phase: actuate.PhaseRetiring, Standby: "retiring-s", Decision: now.Add(-20 * time.Second), Confirmed: 3})}},
		{"failover-s", 0, nil},
		{"failover-p", 1, map[string]string{contract.AnnStandby: "failover-s", contract.AnnRecord: recJSON(actuate.Record{
			Phase: actuate.PhaseFailover, Standby: "failover-s", Decision: now, Failover: true})}},
	} {
		must(t, func() error { return createDeployment(ctx, admin, ns, d.name, d.replicas, d.ann) })
	}
	for _, n := range []string{"retiring-s", "failover-p"} {
		waitDeployment(ctx, t, admin, ns, n, "1 Ready replica", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
	}

	proc := startAgent(t, bin, []string{token}, "--actuate", "--resume-on-start", "--kubeconfig", kubeconfig,
		"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--node-name", cp.Nodes[0])
	if l := proc.await(t, "actuation on"); l["resume_on_start"] != true {
		t.Errorf("actuation line = %v", l)
	}
	resumed := map[any]bool{}
	for range 2 {
		resumed[proc.await(t, "resuming switchover")["deployment"]] = true
	}
	if !resumed[ns+"/retiring-p"] || !resumed[ns+"/failover-p"] {
		t.Errorf("resumed %v, want %s/retiring-p and %s/failover-p", resumed, ns, ns)
	}
	for _, pair := range []string{"retiring", "failover"} {
		p, s := pair+"-p", pair+"-s"
		waitDeployment(ctx, t, admin, ns, p, "retired, the standby", func(d *appsv1.Deployment) bool {
			return *d.Spec.Replicas == 0 && d.Annotations[contract.AnnRole] == "standby" && d.Annotations[contract.AnnPrimary] == s
		})
		waitDeployment(ctx, t, admin, ns, s, "Ready, the primary", func(d *appsv1.Deployment) bool {
			var rec actuate.Record
			_ = json.Unmarshal([]byte(d.Annotations[contract.AnnRecord]), &rec)
			return d.Status.ReadyReplicas == 1 && d.Annotations[contract.AnnRole] == "primary" &&
				d.Annotations[contract.AnnStandby] == p && rec.Phase == actuate.PhaseIdle && !rec.LastSwitch.IsZero()
		})
	}
	proc.stop(t)
	cancel()
	for pair, l := range logs {
		l.check(t, pair)
	}
}

func must(t *testing.T, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig writes a kubeconfig for the API server of cp that
// authenticates with token only.
func writeKubeconfig(t *testing.T, cp *controlplane.ControlPlane, token string) string {
	t.Helper()
	rc := cp.TokenConfig(token)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func createDeployment(ctx context.Context, cs kubernetes.Interface, ns, name string, replicas int32, ann map[string]string) error {
	labels := map[string]string{"app": name}
	_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}}}},
		},
	}, metav1.CreateOptions{})
	return err
}

// waitDeployment watches Deployment ns/name until cond holds at its
// observed generation (30 s at most).
func waitDeployment(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, what string, cond func(*appsv1.Deployment) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", name))
	var last *appsv1.Deployment
	_, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			return false, nil
		}
		last = d
		return d.Status.ObservedGeneration >= d.Generation && cond(d), nil
	})
	if err != nil {
		b, _ := json.Marshal(last)
		t.Fatalf("%s never %s: %v; last seen %s", name, what, err, b)
	}
}

// readyLog records every change of the Ready replicas of a primary and its
// standby, from a watch, to check afterwards that they never both dropped
// to 0 once one was Ready.
type readyLog struct {
	mu    sync.Mutex
	trace []string
	bad   bool
}

func (l *readyLog) watch(ctx context.Context, cs kubernetes.Interface, ns, p, s string) {
	cur := map[string]int32{}
	up := false
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.Everything())
	_, _ = watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok || (d.Name != p && d.Name != s) {
			return false, nil
		}
		if old, seen := cur[d.Name]; seen && old == d.Status.ReadyReplicas {
			return false, nil
		}
		cur[d.Name] = d.Status.ReadyReplicas
		l.mu.Lock()
		defer l.mu.Unlock()
		l.trace = append(l.trace, fmt.Sprintf("%s=%d %s=%d", p, cur[p], s, cur[s]))
		if cur[p]+cur[s] >= 1 {
			up = true
		} else if up {
			l.bad = true
		}
		return false, nil
	})
}

func (l *readyLog) check(t *testing.T, pair string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bad {
		t.Errorf("%s: Ready replicas of primary + standby dropped to 0: %v", pair, l.trace)
	} else {
		t.Logf("%s: Ready replicas %v", pair, l.trace)
	}
}
