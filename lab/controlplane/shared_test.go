package controlplane_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
)

// TestSharedStartsOnceAndGivesEachTestANamespaceOfItsOwn: two tests asking
// the shared control plane get the same one, each its own namespace; when
// a test ends, its Deployments are gone at once (another test's agent may
// list every namespace) and its namespace is being deleted; Stop stops it.
func TestSharedStartsOnceAndGivesEachTestANamespaceOfItsOwn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	shared := &controlplane.Shared{Options: controlplane.Options{Nodes: 1}}
	t.Cleanup(func() { shared.Stop(t.Failed()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var planes []*controlplane.ControlPlane
	var names []string
	for _, name := range []string{"first", "second"} {
		t.Run(name, func(t *testing.T) {
			cp := shared.Get(ctx, t)
			ns := shared.Namespace(ctx, t, "amf-shared")
			planes, names = append(planes, cp), append(names, ns)
			labels := map[string]string{"app": "x"}
			_, err := cp.Client().AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if len(planes) != 2 || planes[0] != planes[1] {
		t.Fatalf("control planes %v: want one, shared", planes)
	}
	if names[0] == names[1] {
		t.Fatalf("both tests got namespace %s", names[0])
	}
	cs := planes[0].Client()
	for _, ns := range names {
		list, err := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 0 {
			t.Errorf("namespace %s keeps %d Deployments after its test", ns, len(list.Items))
		}
		n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err == nil && n.DeletionTimestamp == nil {
			t.Errorf("namespace %s not being deleted after its test", ns)
		}
	}
	shared.Stop(false)
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err == nil {
		t.Errorf("the API server still answers after Stop")
	}
}
