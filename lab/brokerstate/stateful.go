package brokerstate

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/inject"
)

// StatefulPair is the pair `amf-agent inject --standby --state-dir DataDir`
// writes of d, a user's one-replica Mosquitto Deployment (its broker
// container named BrokerContainer) that names its standby
// (amf.io/standby, amf.io/redundancy): d's broker first gets its data on an
// emptyDir at DataDir, as Deployment's has it (it outlives the container's
// restarts, as a claim would, and inject refuses a state folder on no
// volume). opts are inject's; Standby and StateDir are set here. d is
// changed. It makes a stateful pair of a Deployment written elsewhere (the
// experiment's edge brokers with their bridges), where InjectedPairWith
// writes its own; d's configuration must have persistence on in DataDir
// (Persistent).
func StatefulPair(d *appsv1.Deployment, opts inject.Options) (primary, standby *appsv1.Deployment, err error) {
	spec := &d.Spec.Template.Spec
	broker := -1
	for i := range spec.Containers {
		if spec.Containers[i].Name == BrokerContainer {
			broker = i
		}
	}
	if broker < 0 {
		return nil, nil, fmt.Errorf("brokerstate: %s has no container %s", d.Name, BrokerContainer)
	}
	for _, v := range spec.Volumes {
		if v.Name == "data" {
			return nil, nil, fmt.Errorf("brokerstate: %s has a volume named data already", d.Name)
		}
	}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	c := &spec.Containers[broker]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: DataDir})

	raw, err := yaml.Marshal(d)
	if err != nil {
		return nil, nil, err
	}
	opts.Standby, opts.StateDir = true, DataDir
	out, _, err := inject.Inject(raw, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("brokerstate: inject --standby --state-dir %s: %w", DataDir, err)
	}
	var deps []*appsv1.Deployment
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(out), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		dep := new(appsv1.Deployment)
		if err := yaml.Unmarshal([]byte(doc), dep); err != nil {
			return nil, nil, fmt.Errorf("brokerstate: read inject's output: %w", err)
		}
		if dep.Kind == "Deployment" {
			deps = append(deps, dep)
		}
	}
	if len(deps) != 2 {
		return nil, nil, fmt.Errorf("brokerstate: inject --standby wrote %d Deployments, want 2", len(deps))
	}
	return deps[0], deps[1], nil
}

// persistenceLine is a mosquitto.conf's persistence setting.
var persistenceLine = regexp.MustCompile(`(?m)^persistence[ \t]+(true|false)[ \t]*$`)

// Persistent is mosquitto.conf conf with persistence on in DataDir, as
// Config writes it, in place of its persistence line: Mosquitto then keeps
// its retained messages, persistent sessions and queues in
// DataDir/mosquitto.db, the file a stateful pair's sidecars save and load.
// A configuration that already names a persistence_location, or says
// nothing of persistence, is refused: where it means to keep its state is
// its own to say.
func Persistent(conf string) (string, error) {
	if strings.Contains(conf, "persistence_location") {
		return "", errors.New("brokerstate: the configuration names its persistence_location already")
	}
	if n := len(persistenceLine.FindAllStringIndex(conf, -1)); n != 1 {
		return "", fmt.Errorf("brokerstate: the configuration has %d persistence lines, want 1", n)
	}
	return persistenceLine.ReplaceAllLiteralString(conf, "persistence true\npersistence_location "+DataDir+"/"), nil
}
