package testbed

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/lab/images"
)

// FillPod is the name of the pod FillNode creates; it carries the label
// app.kubernetes.io/instance=fill.
const FillPod = "fill"

// FillNode creates a pod in namespace ns on node that requests all the
// memory the node has left but free (its allocatable less every running
// pod's requests), so that the kubelet defers a resize that asks for more.
// It returns the request; the caller waits for the pod and removes it (with
// its namespace).
func FillNode(ctx context.Context, cs kubernetes.Interface, node, ns string, free int64) (int64, error) {
	nd, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return 0, err
	}
	used := int64(0)
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			used += MemoryRequests(&p.Spec)
		}
	}
	alloc := nd.Status.Allocatable[corev1.ResourceMemory]
	fill := alloc.Value() - used - free
	if fill <= 0 {
		return 0, fmt.Errorf("node %s: allocatable %s, requested %d: no room to leave only %d", node, alloc.String(), used, free)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: FillPod, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/instance": FillPod}},
		Spec: corev1.PodSpec{NodeName: node,
			Containers: []corev1.Container{{Name: "pause", Image: images.PauseRef, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(fill, resource.BinarySI)}}}},
		}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create the pod that fills node %s: %w", node, err)
	}
	return fill, nil
}

// MemoryRequests is the memory a pod spec's containers request, init
// containers included: at least what the kubelet counts.
func MemoryRequests(spec *corev1.PodSpec) int64 {
	n := int64(0)
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		r := c.Resources.Requests[corev1.ResourceMemory]
		n += r.Value()
	}
	return n
}
