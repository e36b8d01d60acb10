package manifests_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/lab/controlplane"
)

// TestNodeModeAgentDeletesPodsOnlyOnItsOwnNode: node mode's agent may
// delete pods (a node-mode primary it retires), and the overlay's admission
// policy confines that to the node its pod-bound token names, on the real
// API server: the agent's token deletes a pod on its node, not one on
// another node; a token of the same account bound to no pod deletes
// nothing; anyone else's deletes are untouched.
func TestNodeModeAgentDeletesPodsOnlyOnItsOwnNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, nil, "apply", "-k", filepath.Join(repo, "manifests", "overlays", "node-mode")); err != nil {
		t.Fatalf("kubectl apply -k manifests/overlays/node-mode: %v: %s", err, out)
	}
	cs := cp.Client()
	mine, other := cp.Nodes[0], cp.Nodes[1]
	// The DaemonSet's pod on the first node (kwok runs it): the agent there.
	agent := waitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", mine)
	client := func(bound bool) kubernetes.Interface {
		t.Helper()
		spec := authenticationv1.TokenRequestSpec{}
		if bound {
			spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agent.Name, UID: agent.UID}
		}
		tok, err := cp.ServiceAccountToken(ctx, "amf-system", "amf-agent", spec)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubernetes.NewForConfig(cp.TokenConfig(tok))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	asAgent, unbound := client(true), client(false)

	const ns = "mqtt"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, node string) string {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "broker", Image: "mosquitto"}}}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	del := func(c kubernetes.Interface, name string) error {
		return c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	forbidden := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only pods on its own node")
	}

	// The policy is in force once the API server has loaded it; until then
	// the agent's delete goes through, so each try takes a pod of its own.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		err := del(asAgent, pod(fmt.Sprintf("elsewhere-%d", i), other))
		if forbidden(err) {
			t.Logf("in force after %d deletes on the other node went through", i)
			break
		}
		if err != nil {
			t.Fatalf("the agent's delete of a pod on another node: %v; want it refused by the policy", err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the policy never refused the agent a pod on another node")
		case <-tick.C:
		}
	}
	if err := del(asAgent, pod("here", mine)); err != nil {
		t.Errorf("the agent's delete of a pod on its own node: %v", err)
	}
	if err := del(unbound, pod("here-unbound", mine)); !forbidden(err) {
		t.Errorf("a delete by the agent's account with a token bound to no pod: %v; want it refused", err)
	}
	if err := del(cs, "here-unbound"); err != nil {
		t.Errorf("the admin's delete: %v; the policy must touch only the agent's", err)
	}
}
