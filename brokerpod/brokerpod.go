// Package brokerpod reads what a pod says about its broker: which container
// is the broker, by inject's rule, and which is the AMF sidecar. Node mode
// picks the container it watches by it, the actuator the one it resizes.
package brokerpod

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/amf-edge/amf/contract"
)

// Sidecar names the pod's AMF sidecar container, "" when it has none: a
// container named as inject names it, or running the sidecar's image.
func Sidecar(pod *corev1.Pod) string {
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		repo, _, _ := strings.Cut(c.Image, "@") // a digest, then a tag
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
		if c.Name == contract.SidecarName || strings.HasSuffix(repo, "/amf-sidecar") {
			return c.Name
		}
	}
	return ""
}

// Container picks the broker container by inject's rule: the one named,
// else the only one, else the one exposing a port named mqtt.
func Container(pod *corev1.Pod, named string) (string, error) {
	var names, mqtt []string
	for _, c := range pod.Spec.Containers {
		names = append(names, c.Name)
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == contract.MQTTPortName }) {
			mqtt = append(mqtt, c.Name)
		}
	}
	switch {
	case named != "" && slices.Contains(names, named):
		return named, nil
	case named != "":
		return "", fmt.Errorf("%s=%s: the pod has no such container (it has %s)", contract.AnnContainer, named, strings.Join(names, ", "))
	case len(names) == 1:
		return names[0], nil
	case len(mqtt) == 1:
		return mqtt[0], nil
	}
	return "", fmt.Errorf("the pod has %d containers (%s) and not exactly one exposes a port named %q: name the broker with %s on the Deployment",
		len(names), strings.Join(names, ", "), contract.MQTTPortName, contract.AnnContainer)
}

// Watched is the broker container the pod's AMF sidecar watches, as inject
// and the admission policy write it (its --container argument); "" when
// the pod has no sidecar or it does not say.
func Watched(pod *corev1.Pod) string {
	name := Sidecar(pod)
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if c.Name != name {
			continue
		}
		for _, a := range slices.Concat(c.Command, c.Args) {
			for _, p := range []string{"--container=", "-container="} {
				if v, ok := strings.CutPrefix(a, p); ok {
					return v
				}
			}
		}
	}
	return ""
}
