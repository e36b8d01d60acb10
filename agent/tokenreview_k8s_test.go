package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/podsignal"
)

// TestTokenReviewAgainstARealAPIServer runs the TokenReview authenticator, as
// the agent's own ServiceAccount bound to system:auth-delegator, against a
// real kube-apiserver, with tokens from the TokenRequest API (also checking
// the node restriction); then a sidecar connects to the agent with its
// pod-bound token. It skips with one line when
// the control plane binaries are not built (make k8s).
func TestTokenReviewAgainstARealAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs := cp.Client()

	// The agent's identity and the RBAC the DaemonSet gives it.
	const agentNS, agentSA = "amf-system", "amf-agent"
	mustCreate(t, func() error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNS}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "amf-agent-tokenreview"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:auth-delegator"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: agentNS, Name: agentSA}},
		}, metav1.CreateOptions{})
		return err
	})
	agentCfg, err := cp.ServiceAccountConfig(ctx, agentNS, agentSA)
	if err != nil {
		t.Fatal(err)
	}
	agentCS, err := kubernetes.NewForConfig(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	reviews := cluster.NewKube(agentCS)
	newAuth := func() *TokenReviewAuthenticator {
		return NewTokenReviewAuthenticator(reviews, TokenReviewOptions{CacheTTL: -1})
	}

	// A broker pod with its sidecar's ServiceAccount.
	const ns, sa, podName = "tod", "broker", "broker-7f57c8d79b-f2m5m"
	mustCreate(t, func() error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		return err
	})
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// kube-scheduler puts it on the kwok node; a token bound to a scheduled
	// pod also names the node.
	pod = waitScheduled(ctx, t, cs.CoreV1().Pods(ns), pod)
	ten := int64(600)
	token := func(aud []string, bound bool) string {
		t.Helper()
		spec := authnv1.TokenRequestSpec{Audiences: aud, ExpirationSeconds: &ten}
		if bound {
			spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
		}
		tok, err := cp.ServiceAccountToken(ctx, ns, sa, spec)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	bound := token([]string{contract.Audience}, true)
	want := podsignal.PodID{Namespace: ns, Pod: podName}
	if id, err := newAuth().Authenticate(ctx, bound); err != nil || id != want {
		t.Fatalf("pod-bound token: %v, %v; want %v", id, err, want)
	}
	onNode := NewTokenReviewAuthenticator(reviews, TokenReviewOptions{CacheTTL: -1, NodeName: pod.Spec.NodeName})
	if id, err := onNode.Authenticate(ctx, bound); err != nil || id != want {
		t.Errorf("agent of node %s: %v, %v; want %v", pod.Spec.NodeName, id, err, want)
	}
	otherNode := NewTokenReviewAuthenticator(reviews, TokenReviewOptions{CacheTTL: -1, NodeName: "another-node"})
	if _, err := otherNode.Authenticate(ctx, bound); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("agent of another node: error = %v, want ErrUnauthenticated", err)
	}
	for _, c := range []struct {
		name  string
		token string
		want  error
	}{
		{"token not bound to a pod", token([]string{contract.Audience}, false), ErrNotPodBound},
		{"token for the API server's audience", token(nil, true), ErrUnauthenticated},
		{"token for another audience", token([]string{"mqtt-data-plane"}, true), ErrUnauthenticated},
		{"not a token", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", ErrUnauthenticated},
	} {
		if _, err := newAuth().Authenticate(ctx, c.token); !errors.Is(err, c.want) {
			t.Errorf("%s: error = %v, want %v", c.name, err, c.want)
		}
	}

	// The state hubs' relay: only the agents' own ServiceAccount, with a
	// token for contract.StatePeerAudience bound to an agent's pod, is a
	// peer, and its answer is that pod's node. (ServiceAccountConfig made
	// the agent's ServiceAccount.)
	agentPod, err := cs.CoreV1().Pods(agentNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "amf-agent-x7k2p"},
		Spec:       corev1.PodSpec{ServiceAccountName: agentSA, Containers: []corev1.Container{{Name: "agent", Image: "amf-agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentPod = waitScheduled(ctx, t, cs.CoreV1().Pods(agentNS), agentPod)
	agentToken := func(aud string) string {
		t.Helper()
		tok, err := cp.ServiceAccountToken(ctx, agentNS, agentSA, authnv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: &ten,
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID}})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	peerTok := agentToken(contract.StatePeerAudience)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(peerTok), 0o600); err != nil {
		t.Fatal(err)
	}
	account, err := AccountOf(tokFile)
	if err != nil || account != "system:serviceaccount:"+agentNS+":"+agentSA {
		t.Fatalf("AccountOf the agent's token = %q, %v", account, err)
	}
	peers, err := NewPeerAuthenticator(reviews, account)
	if err != nil {
		t.Fatal(err)
	}
	if node, err := peers.AuthenticatePeer(ctx, peerTok); err != nil || node != agentPod.Spec.NodeName {
		t.Fatalf("an agent's peer token: node %q, %v; want %q", node, err, agentPod.Spec.NodeName)
	}
	for _, c := range []struct{ name, token string }{
		{"a sidecar's token for the peers' audience", token([]string{contract.StatePeerAudience}, true)},
		{"the agent's token for the sidecars' audience", agentToken(contract.Audience)},
		{"the agent's token for the API server", agentToken("https://kubernetes.default.svc")},
	} {
		if _, err := peers.AuthenticatePeer(ctx, c.token); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: error = %v, want ErrUnauthenticated", c.name, err)
		}
	}

	// End to end: the sidecar connects to the agent with its projected token.
	ta := startAgent(t, func(c *Config) { c.Authenticator = newAuth() })
	id := podsignal.PodID{Namespace: ns, Pod: podName}
	c := mustDial(t, ta.MQTTAddr(), id, bound, nil)
	publish(t, c, id.Topic(), payload(t, id, podsignal.Healthy, 1))
	if ev := ta.nextEvent(t, id); ev.State != podsignal.Healthy || ev.Source != podsignal.SourcePublish {
		t.Fatalf("event = %+v", ev)
	}
	unbound := token([]string{contract.Audience}, false)
	if _, err := dial(t, ta.MQTTAddr(), id, unbound, nil); err == nil {
		t.Error("an unbound token connected")
	}
	ta.logs.wait(t, "the unbound token refused", lineIs("connection refused", "reason", refuseUnbound))
	for _, l := range ta.logs.rawLines() {
		if strings.Contains(l, bound) || strings.Contains(l, unbound) {
			t.Errorf("a token reached the log: %s", l)
		}
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

// waitScheduled watches pod until the scheduler has given it a node.
func waitScheduled(ctx context.Context, t *testing.T, pods corev1client.PodInterface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if pod.Spec.NodeName != "" {
		return pod
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return p
		}
	}
	t.Fatalf("pod %s not scheduled: %v", pod.Name, ctx.Err())
	return nil
}
