package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
)

// TestControlPlane starts the control plane and checks what the agent's tests
// rely on: Deployments get Ready pods (kwok), the scale subresource works both
// ways, TokenRequest + TokenReview give the ServiceAccount and pod identity,
// impersonation and RBAC apply, the built kubectl talks to the server.
func TestControlPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	cp, err := controlplane.Start(ctx, t, controlplane.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane %s started in %v (nodes %v, dir %s)", cp.Version, cp.StartDuration.Round(time.Millisecond), cp.Nodes, cp.Dir)
	if !strings.HasPrefix(cp.Version, "v1.") || strings.HasPrefix(cp.Version, "v0.0.0") {
		t.Errorf("server version %q: the binaries lack the version ldflags", cp.Version)
	}
	cs := cp.Client()

	const ns, sa, name = "amf-cp-test", "amf-sidecar", "broker"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: sa,
					Containers:         []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}},
				},
			},
		},
	}
	t0 := time.Now()
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicas(ctx, t, cs, ns, name, 1)
	t.Logf("deployment Ready (1 replica) %v after create", time.Since(t0).Round(time.Millisecond))

	for _, n := range []int32{0, 2} {
		t0 := time.Now()
		// The deployment controller writes status all the time, so an update with
		// the resourceVersion read may conflict: read again and retry.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			scale, err := cs.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			scale.Spec.Replicas = n
			_, err = cs.AppsV1().Deployments(ns).UpdateScale(ctx, name, scale, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		waitReplicas(ctx, t, cs, ns, name, n)
		got, err := cs.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Replicas != n || got.Spec.Replicas != n {
			t.Errorf("scale after scaling to %d: spec %d status %d", n, got.Spec.Replicas, got.Status.Replicas)
		}
		t.Logf("scaled to %d via the scale subresource: followed in %v", n, time.Since(t0).Round(time.Millisecond))
	}

	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(&p) {
			running = append(running, p)
		}
	}
	if len(running) != 2 {
		t.Fatalf("%d Running+Ready pods after scaling to 2, want 2", len(running))
	}
	for _, p := range running {
		if !slices.Contains(cp.Nodes, p.Spec.NodeName) {
			t.Errorf("pod %s on node %q, not a kwok node %v", p.Name, p.Spec.NodeName, cp.Nodes)
		}
	}

	// TokenReview of a ServiceAccount token for the agent's audience.
	review := func(token string, aud ...string) authenticationv1.TokenReviewStatus {
		t.Helper()
		tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: aud},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status
	}
	const audience = "amf-agent"
	tok, err := cp.ServiceAccountToken(ctx, ns, sa, authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To[int64](600)})
	if err != nil {
		t.Fatal(err)
	}
	st := review(tok, audience)
	wantUser := "system:serviceaccount:" + ns + ":" + sa
	if !st.Authenticated || st.User.Username != wantUser || !slices.Contains(st.Audiences, audience) {
		t.Errorf("TokenReview: authenticated %v user %q audiences %v error %q, want %q for %q", st.Authenticated, st.User.Username, st.Audiences, st.Error, wantUser, audience)
	}
	if st := review(tok, "some-other-audience"); st.Authenticated {
		t.Errorf("TokenReview accepted a token for %q under another audience", audience)
	}

	// A pod-bound token names its pod.
	pod := running[0]
	tok, err = cp.ServiceAccountToken(ctx, ns, sa, authenticationv1.TokenRequestSpec{
		Audiences:         []string{audience},
		ExpirationSeconds: ptr.To[int64](600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	})
	if err != nil {
		t.Fatal(err)
	}
	st = review(tok, audience)
	if !st.Authenticated || st.User.Username != wantUser {
		t.Fatalf("TokenReview of the pod-bound token: authenticated %v user %q error %q", st.Authenticated, st.User.Username, st.Error)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != pod.Name {
		t.Errorf("extra pod-name = %v, want [%s]", got, pod.Name)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(got) != 1 || got[0] != string(pod.UID) {
		t.Errorf("extra pod-uid = %v, want [%s]", got, pod.UID)
	}
	t.Logf("pod-bound token: user %s extra %v", st.User.Username, st.User.Extra)

	// rest.Configs for a ServiceAccount and an impersonated user; RBAC applies to both.
	saCfg, err := cp.ServiceAccountConfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  string
		cs   *kubernetes.Clientset
		user string
	}{
		{"service account", kubernetes.NewForConfigOrDie(saCfg), wantUser},
		{"impersonated user", kubernetes.NewForConfigOrDie(cp.ImpersonateConfig("alice", "amf-testers")), "alice"},
	} {
		ssr, err := c.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: SelfSubjectReview: %v", c.who, err)
		}
		if ssr.Status.UserInfo.Username != c.user {
			t.Errorf("%s: SelfSubjectReview user %q, want %q", c.who, ssr.Status.UserInfo.Username, c.user)
		}
		if _, err := c.cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s: listing secrets: %v, want Forbidden (RBAC)", c.who, err)
		}
	}

	// The built kubectl, server-side dry run.
	manifest := filepath.Join(t.TempDir(), "cm.yaml")
	if err := os.WriteFile(manifest, []byte(`apiVersion: v1
kind: ConfigMap
metadata:
  name: dry-run-only
  namespace: `+ns+`
data:
  k: v
`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := cp.Kubectl(ctx, nil, "apply", "--dry-run=server", "-f", manifest)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "configmap/dry-run-only") || !strings.Contains(string(out), "server dry run") {
		t.Errorf("kubectl apply --dry-run=server said %q", out)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "dry-run-only", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap after a server dry run: %v, want NotFound", err)
	}
	out, err = cp.Kubectl(ctx, nil, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Client struct {
			GitVersion string `json:"gitVersion"`
		} `json:"clientVersion"`
		Server struct {
			GitVersion string `json:"gitVersion"`
		} `json:"serverVersion"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("kubectl version: %v: %s", err, out)
	}
	if v.Client.GitVersion != cp.Version || v.Server.GitVersion != cp.Version {
		t.Errorf("kubectl version: client %q server %q, want %q", v.Client.GitVersion, v.Server.GitVersion, cp.Version)
	}

	// The API server restarts on its port with the same data; the controllers follow.
	t0 = time.Now()
	if err := cp.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %v", time.Since(t0).Round(time.Millisecond))
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale, err := cs.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		scale.Spec.Replicas = 1
		_, err = cs.AppsV1().Deployments(ns).UpdateScale(ctx, name, scale, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitReplicas(ctx, t, cs, ns, name, 1)

	// etcd killed and started again on its data: what was written before
	// is there, and writes go through again.
	t0 = time.Now()
	if err := cp.RestartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd restarted in %v", time.Since(t0).Round(time.Millisecond))
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale, err := cs.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if scale.Spec.Replicas != 1 {
			return fmt.Errorf("replicas %d after etcd's restart, want the 1 written before it", scale.Spec.Replicas)
		}
		scale.Spec.Replicas = 2
		_, err = cs.AppsV1().Deployments(ns).UpdateScale(ctx, name, scale, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitReplicas(ctx, t, cs, ns, name, 2)

	t0 = time.Now()
	cp.Stop()
	t.Logf("stopped in %v", time.Since(t0).Round(time.Millisecond))
	if _, err := cs.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); err == nil {
		t.Error("API server still answers after Stop")
	}
}

// waitReplicas watches the Deployment until its controller has seen the latest
// spec and it has exactly n replicas, all updated and Ready.
func waitReplicas(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string, n int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", name))
	var last appsv1.DeploymentStatus
	_, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			return false, nil
		}
		last = d.Status
		return d.Status.ObservedGeneration >= d.Generation && d.Spec.Replicas != nil && *d.Spec.Replicas == n &&
			d.Status.Replicas == n && d.Status.UpdatedReplicas == n && d.Status.ReadyReplicas == n, nil
	})
	if err != nil {
		t.Fatalf("deployment %s/%s never had %d ready replicas: %v (last status %+v)", ns, name, n, err, last)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
