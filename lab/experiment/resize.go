package experiment

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/testbed"
)

// resizePolicy is the primary's policy in mode m: the run's, and the
// memory ceiling in the amf-resize modes.
func (e *env) resizePolicy(m Mode) map[string]string {
	if !m.resizes() {
		return e.cfg.Policy
	}
	p := map[string]string{contract.AnnMemoryCeiling: e.cfg.ResizeCeiling}
	for k, v := range e.cfg.Policy {
		p[k] = v
	}
	return p
}

// fillNode leaves the node the room for the standby's pod and 20 Mi more,
// but not for the resize the ceiling allows: a pod in namespace ns (gone
// with it) requests the rest of the node's allocatable memory.
func (e *env) fillNode(ctx context.Context, ns string, standby *corev1.PodTemplateSpec) error {
	nd, err := e.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods, err := e.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + NodeName})
	if err != nil {
		return err
	}
	requested := func(spec *corev1.PodSpec) int64 {
		n := int64(0)
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			r := c.Resources.Requests[corev1.ResourceMemory]
			n += r.Value()
		}
		return n
	}
	used := int64(0)
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			used += requested(&p.Spec)
		}
	}
	alloc := nd.Status.Allocatable[corev1.ResourceMemory]
	free := requested(&standby.Spec) + 20<<20
	fill := alloc.Value() - used - free
	if fill <= 0 {
		return fmt.Errorf("node %s: allocatable %s, requested %d: no room to leave only %d", NodeName, alloc.String(), used, free)
	}
	e.progress("a pod requesting %s of the node's memory: %s left, the standby's requests and 20Mi", resource.NewQuantity(fill, resource.BinarySI), resource.NewQuantity(free, resource.BinarySI))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "fill", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/instance": "fill"}}, Spec: corev1.PodSpec{
		NodeName: NodeName,
		Containers: []corev1.Container{{Name: "pause", Image: images.PauseRef, ImagePullPolicy: corev1.PullNever,
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(fill, resource.BinarySI)}}}},
	}}
	if _, err := e.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the pod that fills the node: %w", err)
	}
	_, err = e.waitPod(ctx, ns, "fill", corev1.PodReady, time.Minute)
	return err
}

// standbyTemplate is the pod template of the run's standby.
func standbyTemplate(objs testbed.Objects) (*corev1.PodTemplateSpec, error) {
	for _, d := range objs.Deployments {
		if d.Name == testbed.StandbyName {
			return &d.Spec.Template, nil
		}
	}
	return nil, fmt.Errorf("no Deployment %s", testbed.StandbyName)
}
