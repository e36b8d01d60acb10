package brokerstate

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/images"
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
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
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
