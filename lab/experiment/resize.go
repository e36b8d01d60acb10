package experiment

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/amf-edge/amf/contract"
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
	free := testbed.MemoryRequests(&standby.Spec) + 20<<20
	fill, err := testbed.FillNode(ctx, e.client, NodeName, ns, free)
	if err != nil {
		return err
	}
	e.progress("a pod requesting %s of the node's memory: %s left, the standby's requests and 20Mi", resource.NewQuantity(fill, resource.BinarySI), resource.NewQuantity(free, resource.BinarySI))
	_, err = e.waitPod(ctx, ns, testbed.FillPod, corev1.PodReady, time.Minute)
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
