package brokerpod

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func pod(init []corev1.Container, cs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{InitContainers: init, Containers: cs}}
}

func TestWhichContainerIsTheBroker(t *testing.T) {
	mqtt := []corev1.ContainerPort{{Name: "mqtt", ContainerPort: 1883}}
	sidecar := corev1.Container{Name: "amf-sidecar", Image: "ghcr.io/amf-edge/amf-sidecar:v0.1.0", Args: []string{"run", "--container=mosquitto"}}
	for _, tc := range []struct {
		name        string
		pod         *corev1.Pod
		named       string
		want, err   string
		wantSidecar string
		wantWatched string
	}{
		{"the only container", pod(nil, corev1.Container{Name: "broker"}), "", "broker", "", "", ""},
		{"the one exposing mqtt among several", pod(nil, corev1.Container{Name: "exporter"}, corev1.Container{Name: "broker", Ports: mqtt}), "", "broker", "", "", ""},
		{"the one named", pod(nil, corev1.Container{Name: "a"}, corev1.Container{Name: "b"}), "b", "b", "", "", ""},
		{"a name the pod does not have", pod(nil, corev1.Container{Name: "a"}), "x", "", "has no such container", "", ""},
		{"several and none exposing mqtt", pod(nil, corev1.Container{Name: "a"}, corev1.Container{Name: "b"}), "", "", "not exactly one", "", ""},
		{"an injected pod names its broker in its sidecar's arguments", pod([]corev1.Container{sidecar}, corev1.Container{Name: "mosquitto"}), "", "mosquitto", "", "amf-sidecar", "mosquitto"},
		{"a sidecar known by its image, the single-dash flag", pod([]corev1.Container{{Name: "watch", Image: "registry.local/amf-sidecar@sha256:ab", Command: []string{"amf-sidecar", "-container=b"}}}, corev1.Container{Name: "b"}), "", "b", "", "watch", "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Container(tc.pod, tc.named)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Container = %q, %v; want an error saying %q", got, err, tc.err)
				}
			} else if err != nil || got != tc.want {
				t.Fatalf("Container = %q, %v; want %q", got, err, tc.want)
			}
			if s := Sidecar(tc.pod); s != tc.wantSidecar {
				t.Errorf("Sidecar = %q, want %q", s, tc.wantSidecar)
			}
			if w := Watched(tc.pod); w != tc.wantWatched {
				t.Errorf("Watched = %q, want %q", w, tc.wantWatched)
			}
		})
	}
}
