package brokerstate

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
)

// DataDir is where the lab's Mosquitto pods keep their persistence file
// (the eclipse-mosquitto image's persistence_location).
const DataDir = "/mosquitto/data"

// BrokerContainer is the broker's container in Deployment's pods.
const BrokerContainer = "mosquitto"

// Config is a mosquitto.conf with persistence on in DataDir, a plain
// listener on 1883 and the extra lines (autosave settings).
func Config(extra string) string {
	return "listener 1883\nallow_anonymous true\npersistence true\npersistence_location " + DataDir + "/\nlog_dest stdout\n" + extra
}

// Deployment is a one-replica Mosquitto as a user runs it: the lab's image of
// Debian's Mosquitto as its non-root user, the testbed's limits, its
// configuration from ConfigMap configMap (mosquitto.conf) and its data on an
// emptyDir at DataDir, which outlives the container's restarts as a claim
// would. Recreate, as charts with a claim have it.
func Deployment(namespace, name, configMap string, annotations map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/instance": name}
	// The name is what a Service of a pair selects: inject --standby varies
	// the instance for the standby's pods and keeps the rest.
	podLabels := map[string]string{"app.kubernetes.io/instance": name, "app.kubernetes.io/name": name}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](images.MosquittoUser), RunAsGroup: ptr.To[int64](images.MosquittoUser)},
					Containers: []corev1.Container{{
						Name: BrokerContainer, Image: images.MosquittoRef, ImagePullPolicy: corev1.PullNever,
						Ports: []corev1.ContainerPort{{Name: "mqtt", ContainerPort: 1883}},
						Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
							corev1.ResourceMemory: resource.MustParse("100Mi"), corev1.ResourceCPU: resource.MustParse("500m")}},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/mosquitto/config"}, {Name: "data", MountPath: DataDir}},
					}},
					Volumes: []corev1.Volume{
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: configMap}}}},
						{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}
}

// InjectedPair is Deployment name as a hot pair that inject --standby
// --state-dir writes it (the broker's data volume in the sidecar, the
// sidecar as the broker's user in the pod's process namespace), the
// sidecars' images taken from the node as the broker's is.
func InjectedPair(namespace, name string) ([]*appsv1.Deployment, error) {
	return InjectedPairWith(namespace, name, nil, "")
}

// InjectedPairWith is InjectedPair with policy annotations beside
// amf.io/redundancy: hot, and the sidecars' model ("": inject's default).
func InjectedPairWith(namespace, name string, policy map[string]string, model string) ([]*appsv1.Deployment, error) {
	ann := map[string]string{contract.AnnRedundancy: string(contract.Hot)}
	maps.Copy(ann, policy)
	raw, err := yaml.Marshal(Deployment(namespace, name, name, ann))
	if err != nil {
		return nil, err
	}
	out, _, err := inject.Inject(raw, inject.Options{Standby: true, StateDir: DataDir, Model: model})
	if err != nil {
		return nil, err
	}
	var deps []*appsv1.Deployment
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			return nil, err
		}
		for i := range d.Spec.Template.Spec.InitContainers {
			d.Spec.Template.Spec.InitContainers[i].ImagePullPolicy = corev1.PullNever
		}
		deps = append(deps, &d)
	}
	if len(deps) != 2 {
		return nil, fmt.Errorf("inject --standby wrote %d Deployments, want 2", len(deps))
	}
	return deps, nil
}

// RunningPod waits for the pod of Deployment d (by its instance label) whose
// broker container runs. An injected pod is never Ready without an agent to
// set amf.io/healthy, so Ready is not what it waits for.
func RunningPod(ctx context.Context, c kubernetes.Interface, namespace, d string) (*corev1.Pod, error) {
	for {
		pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d})
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				for _, st := range p.Status.ContainerStatuses {
					if st.Name == BrokerContainer && st.State.Running != nil && p.Status.PodIP != "" {
						return p, nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no running broker for %s: %w (%v)", d, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond): // polling the API server, not a synchronisation
		}
	}
}

// Addr is the broker's MQTT address in pod p.
func Addr(p *corev1.Pod) string { return net.JoinHostPort(p.Status.PodIP, "1883") }

// Accepting dials addr every 20 ms until it accepts, as a reconnecting
// client would, and returns when it did.
func Accepting(ctx context.Context, addr string) (time.Time, error) {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s not accepting: %w (%v)", addr, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SidecarState runs amf-sidecar state ARGS in pod's sidecar (kubectl exec
// -i, stdin given) with the file at DataDir, and returns its standard output.
func SidecarState(ctx context.Context, cp *controlplane.ControlPlane, namespace, pod string, stdin []byte, args ...string) ([]byte, error) {
	argv := append([]string{"exec", "-i", "-n", namespace, pod, "-c", inject.SidecarName, "--", "/" + inject.SidecarName, "state"}, args...)
	argv = append(argv, "--file="+DataDir+"/mosquitto.db")
	return cp.Kubectl(ctx, bytes.NewReader(stdin), argv...)
}

// Restarted waits until the node's events say the kubelet started pod's
// broker container again.
func Restarted(ctx context.Context, evs <-chan kubenode.Event, pod string) error {
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				return fmt.Errorf("the node's events ended before %s's broker restarted", pod)
			}
			if ev.Pod == pod && ev.Container == BrokerContainer && ev.Type == kubenode.EventRestarted {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("the kubelet did not restart %s's broker: %w", pod, ctx.Err())
		}
	}
}
