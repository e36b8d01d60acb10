package testbed

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
)

// The broker's image and layout, as manifests/examples use them.
const (
	MosquittoImage = "eclipse-mosquitto:2.0.20"
	// MosquittoConfigDir is where the image reads mosquitto.conf.
	MosquittoConfigDir = "/mosquitto/config"
	// BrokerContainer is the broker container's name.
	BrokerContainer = "mosquitto"
)

// Bridge is the testbed's bridge timing (Mosquitto's keepalive_interval and
// restart_timeout, seconds). The testbed used 30 and 30: they shape the reactive
// outage, so they are the default.
type Bridge struct {
	KeepaliveInterval int
	RestartTimeout    int
}

// DefaultBridge is the public testbed's setting.
var DefaultBridge = Bridge{KeepaliveInterval: 30, RestartTimeout: 30}

// EdgeConfig is one edge broker's mosquitto.conf: a listener for the sidecar's
// probe and the two bridges the edge initiates, towards OBU (set/# out, get/# in)
// and RDS (set/# in, get/# out), as the public testbed configures them.
type EdgeConfig struct {
	Listen   string // host:port of the broker's own listener
	RDS, OBU string // host:port of the remote brokers
	ClientID string // prefix of the bridges' client IDs, distinct per edge broker
	Bridge   Bridge
	// Persistence, when set, is the folder Mosquitto keeps its state in
	// (persistence true); else the broker keeps none.
	Persistence string
}

// Render writes the configuration.
func (c EdgeConfig) Render() string {
	var b strings.Builder
	b.WriteString(listener(c.Listen))
	b.WriteString("allow_anonymous true\n")
	if c.Persistence != "" {
		fmt.Fprintf(&b, "persistence true\npersistence_location %s/\n", strings.TrimSuffix(c.Persistence, "/"))
	} else {
		b.WriteString("persistence false\n")
	}
	b.WriteString("log_dest stdout\nconnection_messages true\n")
	bridge := func(name, addr, set, get string) {
		id := c.ClientID + "-" + name
		fmt.Fprintf(&b, "\nconnection %s\naddress %s\ntopic set/# %s\ntopic get/# %s\ncleansession true\ntry_private false\n"+
			"keepalive_interval %d\nrestart_timeout %d\nlocal_clientid %s\nremote_clientid %s\n",
			name, addr, set, get, c.Bridge.KeepaliveInterval, c.Bridge.RestartTimeout, id, id)
	}
	bridge("obu", c.OBU, "out", "in")
	bridge("rds", c.RDS, "in", "out")
	return b.String()
}

// Edge describes the edge broker Deployments of one run.
type Edge struct {
	Namespace string
	Node      string // node the pods must run on
	RDS, OBU  string // remote brokers, host:port
	Bridge    Bridge
	// Ports of the primary (A) and standby (B); HealthPort 0 keeps the
	// sidecar's default (each pod has its own network).
	BrokerPortA, BrokerPortB int
	HealthPortA, HealthPortB int
	AgentAddr                string // the agent's MQTT listener, host:port
	// ClientPrefix starts the bridges' client IDs (default "edge"): edge
	// brokers running at the same time need distinct ones.
	ClientPrefix string
	SidecarImage string // default inject.DefaultSidecarImage
	// SidecarModel is the sidecars' --model, set by inject (Options.Model):
	// an embedded model's name, or a path under ModelMount.
	// Default: the sidecar's default model.
	SidecarModel string
	SidecarArgs  []string // appended to the sidecars' arguments
	// Policy annotations added to the primary (e.g. amf.io/hold).
	Policy map[string]string
	// BrokerImage is the broker container's image (default MosquittoImage;
	// on a real node the lab's image of Debian's Mosquitto).
	BrokerImage string
	// ListenHost is the address the edge broker listens on (default: every
	// address of the pod; the kubelet probes the pod's IP).
	ListenHost string
	// StateDir, when set, makes the pair stateful: the brokers keep their
	// state there (persistence, on an emptyDir, which outlives a
	// container's restarts as a claim would), and inject --state-dir hands
	// it over at every switchover and failover.
	StateDir string
	// ModelDir, when set, is a host folder mounted read-only into the
	// sidecars at ModelMount (a real node's pods see only what is mounted):
	// SidecarModel then names a file under ModelMount.
	ModelDir string
}

// ModelMount is where the sidecars see Edge.ModelDir.
const ModelMount = "/amf-models"

// Names of the edge objects.
const (
	PrimaryName = "edge-broker-a"
	StandbyName = "edge-broker-b"
)

// Objects are the ConfigMaps and Deployments of one run.
type Objects struct {
	ConfigMaps  []*corev1.ConfigMap
	Deployments []*appsv1.Deployment
}

// Reactive is the baseline: the edge broker alone, as plain Kubernetes runs it
// (no sidecar, no standby, no agent).
func (e Edge) Reactive() (Objects, error) {
	if err := e.check(); err != nil {
		return Objects{}, err
	}
	return Objects{
		ConfigMaps:  []*corev1.ConfigMap{e.configMap(PrimaryName, e.BrokerPortA, "a")},
		Deployments: []*appsv1.Deployment{e.plain(PrimaryName, e.BrokerPortA, nil)},
	}, nil
}

// AMF is the primary with the sidecar injected by package inject (exactly what
// `amf-agent inject --standby` writes), and its cold standby with its own
// configuration and ports.
func (e Edge) AMF() (Objects, error) {
	if err := e.check(); err != nil {
		return Objects{}, err
	}
	ann := map[string]string{contract.AnnStandby: StandbyName, contract.AnnRedundancy: string(contract.Cold)}
	for k, v := range e.Policy {
		ann[k] = v
	}
	in, err := yaml.Marshal(e.plain(PrimaryName, e.BrokerPortA, ann))
	if err != nil {
		return Objects{}, err
	}
	out, _, err := inject.Inject(in, inject.Options{Standby: true, SidecarImage: e.SidecarImage, Model: e.SidecarModel, StateDir: e.StateDir})
	if err != nil {
		return Objects{}, fmt.Errorf("inject the edge broker: %w", err)
	}
	deps, err := decodeDeployments(out)
	if err != nil {
		return Objects{}, err
	}
	if len(deps) != 2 || deps[0].Name != PrimaryName || deps[1].Name != StandbyName {
		return Objects{}, fmt.Errorf("inject wrote %d Deployments, want %s and %s", len(deps), PrimaryName, StandbyName)
	}
	primary, standby := deps[0], deps[1]
	if err := e.adapt(primary, PrimaryName, e.BrokerPortA, e.HealthPortA); err != nil {
		return Objects{}, err
	}
	if err := e.adapt(standby, StandbyName, e.BrokerPortB, e.HealthPortB); err != nil {
		return Objects{}, err
	}
	return Objects{
		ConfigMaps:  []*corev1.ConfigMap{e.configMap(PrimaryName, e.BrokerPortA, "a"), e.configMap(StandbyName, e.BrokerPortB, "b")},
		Deployments: []*appsv1.Deployment{primary, standby},
	}, nil
}

// NodeMode is AMF without the sidecar: the primary and its cold standby as
// `amf-agent inject --mode node --standby` writes them (the Deployments
// annotated amf.io/mode=node, the pod templates the user's), with the
// app-logic probe the sidecar would run given to the agent (amf.io/probe,
// the broker's port) and the model named by amf.io/model. SidecarModel must
// then be an embedded model's name.
func (e Edge) NodeMode() (Objects, error) {
	if err := e.check(); err != nil {
		return Objects{}, err
	}
	if e.ModelDir != "" {
		return Objects{}, errors.New("testbed: node mode scores with a model embedded in the agent, not a model file")
	}
	ann := map[string]string{contract.AnnStandby: StandbyName, contract.AnnRedundancy: string(contract.Cold)}
	for k, v := range e.Policy {
		ann[k] = v
	}
	in, err := yaml.Marshal(e.plain(PrimaryName, e.BrokerPortA, ann))
	if err != nil {
		return Objects{}, err
	}
	out, _, err := inject.Inject(in, inject.Options{Mode: contract.ModeNode, Standby: true, Model: e.SidecarModel})
	if err != nil {
		return Objects{}, fmt.Errorf("annotate the edge broker for node mode: %w", err)
	}
	deps, err := decodeDeployments(out)
	if err != nil {
		return Objects{}, err
	}
	if len(deps) != 2 || deps[0].Name != PrimaryName || deps[1].Name != StandbyName {
		return Objects{}, fmt.Errorf("inject wrote %d Deployments, want %s and %s", len(deps), PrimaryName, StandbyName)
	}
	for i, d := range deps {
		config, port := PrimaryName, e.BrokerPortA
		if i == 1 {
			config, port = StandbyName, e.BrokerPortB
		}
		e.adaptBroker(d, config, port)
		d.Annotations[contract.AnnProbe] = "mqtt://:" + strconv.Itoa(port)
	}
	return Objects{
		ConfigMaps:  []*corev1.ConfigMap{e.configMap(PrimaryName, e.BrokerPortA, "a"), e.configMap(StandbyName, e.BrokerPortB, "b")},
		Deployments: deps,
	}, nil
}

func (e Edge) check() error {
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{{"Namespace", e.Namespace != ""}, {"RDS", e.RDS != ""}, {"OBU", e.OBU != ""}, {"BrokerPortA", e.BrokerPortA > 0}} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("testbed: edge description lacks %s", strings.Join(missing, ", "))
	}
	return nil
}

func (e Edge) configMap(name string, port int, suffix string) *corev1.ConfigMap {
	prefix := e.ClientPrefix
	if prefix == "" {
		prefix = "edge"
	}
	conf := EdgeConfig{Listen: e.ListenHost + ":" + strconv.Itoa(port), RDS: e.RDS, OBU: e.OBU, ClientID: prefix + "-" + suffix, Bridge: e.Bridge, Persistence: e.StateDir}
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace},
		Data:       map[string]string{"mosquitto.conf": conf.Render()},
	}
}

// plain is the broker Deployment as a user would write it: Mosquitto with the
// testbed's limits (100 Mi, 500m) and a TCP readiness probe.
func (e Edge) plain(name string, port int, annotations map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": "edge-broker", "app.kubernetes.io/instance": name}
	var nodeSelector map[string]string
	if e.Node != "" {
		nodeSelector = map[string]string{corev1.LabelHostname: e.Node}
	}
	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace, Labels: map[string]string{"app.kubernetes.io/name": "edge-broker"}, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  nodeSelector,
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1883), RunAsGroup: ptr.To[int64](1883),
					},
					Containers: []corev1.Container{{
						Name:  BrokerContainer,
						Image: cmp.Or(e.BrokerImage, MosquittoImage),
						Ports: []corev1.ContainerPort{{Name: "mqtt", ContainerPort: int32(port), Protocol: corev1.ProtocolTCP}},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("50Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("mqtt")}},
							PeriodSeconds: 1,
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: MosquittoConfigDir, ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}},
					}}},
				},
			},
		},
	}
	if e.StateDir != "" {
		spec := &d.Spec.Template.Spec
		spec.Containers[0].VolumeMounts = append(spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: e.StateDir})
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return d
}

// adapt fits an injected Deployment to a run: its
// own configuration, broker port and health port, and the agent's address.
func (e Edge) adapt(d *appsv1.Deployment, config string, brokerPort, healthPort int) error {
	e.adaptBroker(d, config, brokerPort)
	spec := &d.Spec.Template.Spec
	var sidecar *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == inject.SidecarName {
			sidecar = &spec.InitContainers[i]
		}
	}
	if sidecar == nil {
		return errors.New("testbed: the injected Deployment has no sidecar")
	}
	probe := regexp.MustCompile(`^--probe-mqtt=.*`)
	for i, a := range sidecar.Args {
		if probe.MatchString(a) {
			sidecar.Args[i] = "--probe-mqtt=tcp://127.0.0.1:" + strconv.Itoa(brokerPort)
		}
	}
	if healthPort > 0 {
		sidecar.Args = append(sidecar.Args, "--http=127.0.0.1:"+strconv.Itoa(healthPort))
		for i := range sidecar.Ports {
			if sidecar.Ports[i].Name == "amf-health" {
				sidecar.Ports[i].ContainerPort = int32(healthPort)
			}
		}
	}
	// Spelled out, so a run's pods say where their token is.
	sidecar.Args = append(sidecar.Args, "--token-file="+inject.TokenDir+"/token")
	sidecar.Args = append(sidecar.Args, e.SidecarArgs...)
	if e.ModelDir != "" {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "amf-models", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: e.ModelDir, Type: ptr.To(corev1.HostPathDirectory)},
		}})
		sidecar.VolumeMounts = append(sidecar.VolumeMounts, corev1.VolumeMount{Name: "amf-models", MountPath: ModelMount, ReadOnly: true})
	}
	for i := range sidecar.Env {
		if sidecar.Env[i].Name == "AMF_AGENT" && e.AgentAddr != "" {
			_, port, _ := strings.Cut(e.AgentAddr, ":")
			sidecar.Env[i].Value = "tcp://$(NODE_IP):" + port
		}
	}
	return nil
}

// adaptBroker gives a Deployment's broker its own configuration and port.
func (e Edge) adaptBroker(d *appsv1.Deployment, config string, brokerPort int) {
	spec := &d.Spec.Template.Spec
	for i := range spec.Volumes {
		if cm := spec.Volumes[i].ConfigMap; cm != nil && spec.Volumes[i].Name == "config" {
			cm.Name = config
		}
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == BrokerContainer {
			spec.Containers[i].Ports[0].ContainerPort = int32(brokerPort)
		}
	}
}

func decodeDeployments(stream []byte) ([]*appsv1.Deployment, error) {
	var out []*appsv1.Deployment
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(stream), -1) {
		if len(bytes.TrimSpace([]byte(doc))) == 0 {
			continue
		}
		d := new(appsv1.Deployment)
		if err := yaml.UnmarshalStrict([]byte(doc), d); err != nil {
			return nil, fmt.Errorf("testbed: read inject's output: %w", err)
		}
		if d.Kind == "Deployment" {
			out = append(out, d)
		}
	}
	return out, nil
}
