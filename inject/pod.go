package inject

// The pod template: the sidecar, its volumes and levers, or what node mode
// and the admission policy read instead.

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/contract"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// podTemplate writes into dep's pod template what opts ask: the sidecar,
// or the label and annotations the admission policy reads, or in node mode
// nothing (dep's annotations instead). It returns the broker container, and
// the warnings about it.
func podTemplate(dep *appsv1.Deployment, opts Options, hot bool) (broker corev1.Container, warnings []string, err error) {
	switch {
	case opts.Mode == contract.ModeNode:
		broker, err = annotateNodeMode(dep, opts)
	case opts.Admission:
		broker, warnings, err = labelForAdmission(dep, opts, hot)
	default:
		broker, err = injectSidecar(dep, opts)
	}
	if err != nil {
		return corev1.Container{}, nil, err
	}
	return broker, append(warnings, limitWarnings(dep.Name, broker)...), nil
}

// injectSidecar injects the sidecar into dep's pod template, unless dep is
// in node mode: a pod with both would be refused by the agent.
func injectSidecar(dep *appsv1.Deployment, opts Options) (corev1.Container, error) {
	mode, err := contract.ParseMode(dep.Annotations)
	if err != nil {
		return corev1.Container{}, err
	}
	if mode == contract.ModeNode {
		return corev1.Container{}, fmt.Errorf("the Deployment is in node mode (%s=%s): the node agent watches its pods, and refuses a pod that also carries the sidecar; remove the annotation to inject the sidecar, or inject with --mode node", contract.AnnMode, mode)
	}
	return injectPod(&dep.Spec.Template.Spec, opts)
}

// checkModel refuses a --model that is neither one of embedded (nil: any
// name) nor a path.
func checkModel(model string, embedded []string) error {
	if model != "" && !isPath(model) && len(embedded) > 0 && !slices.Contains(embedded, model) {
		return fmt.Errorf("model %q is not embedded in the sidecar (%s): give one of those, or the path of a model file inside the sidecar container (./%s for a file of that name)",
			model, strings.Join(embedded, ", "), model)
	}
	return nil
}

// labelForAdmission asks the admission policy for dep's sidecar
// (Options.Admission). It tries the injection on a copy of the pod template,
// with the options the template's annotations already give where opts give
// none, so that what the policy would not inject is refused here, with
// inject's reason, and the template keeps only the label and annotations.
func labelForAdmission(dep *appsv1.Deployment, opts Options, hot bool) (corev1.Container, []string, error) {
	mode, err := contract.ParseMode(dep.Annotations)
	if err != nil {
		return corev1.Container{}, nil, err
	}
	if mode == contract.ModeNode {
		return corev1.Container{}, nil, fmt.Errorf("the Deployment is in node mode (%s=%s): the node agent watches its pods, and refuses a pod that also carries the sidecar; remove the annotation to have the sidecar admitted, or inject with --mode node", contract.AnnMode, mode)
	}
	t := &dep.Spec.Template
	if slices.ContainsFunc(t.Spec.InitContainers, isSidecar) {
		return corev1.Container{}, nil, fmt.Errorf("the pod template carries the %s container: the admission policy leaves such pods as they are; remove it, its volumes and the readiness gate %s, or inject without --admission", SidecarName, contract.ConditionHealthy)
	}
	want := admissionAnnotations(t.Annotations, opts, hot)
	trial, err := admissionTrial(opts, want)
	if err != nil {
		return corev1.Container{}, nil, err
	}
	spec := t.Spec.DeepCopy()
	broker, err := injectPod(spec, trial)
	if err != nil {
		return corev1.Container{}, nil, err
	}
	warnings, err := levers(dep.Name, spec, broker, trial.StateDir, want[contract.AnnPauseOnFence] == "true")
	if err != nil {
		return corev1.Container{}, nil, err
	}
	if t.Labels == nil {
		t.Labels = map[string]string{}
	}
	t.Labels[contract.LabelInject] = "true"
	for k, v := range want {
		if v == "" {
			continue
		}
		if t.Annotations == nil {
			t.Annotations = map[string]string{}
		}
		t.Annotations[k] = v
	}
	return broker, warnings, nil
}

// admissionAnnotations are the pod template annotations the admission
// policy injects by: opts' where they give one, else those the template
// has (ann). A "" value is none.
func admissionAnnotations(ann map[string]string, opts Options, hot bool) map[string]string {
	want := map[string]string{
		contract.AnnContainer: cmp.Or(opts.Container, ann[contract.AnnContainer]),
		contract.AnnModel:     cmp.Or(opts.Model, ann[contract.AnnModel]),
		contract.AnnProbeMQTT: cmp.Or(opts.ProbeMQTT, ann[contract.AnnProbeMQTT]),
		contract.AnnStateDir:  cmp.Or(opts.StateDir, ann[contract.AnnStateDir]),
	}
	if hot || ann[contract.AnnPauseOnFence] == "true" {
		want[contract.AnnPauseOnFence] = "true"
	}
	return want
}

// admissionTrial is opts as the policy would inject by the annotations
// want, checked as Inject checks its own options: the template's
// annotations have not been.
func admissionTrial(opts Options, want map[string]string) (Options, error) {
	trial := opts
	trial.Container, trial.Model, trial.ProbeMQTT, trial.StateDir = want[contract.AnnContainer], want[contract.AnnModel], want[contract.AnnProbeMQTT], want[contract.AnnStateDir]
	if err := checkModel(trial.Model, opts.EmbeddedModels); err != nil {
		return Options{}, fmt.Errorf("%s: %w", contract.AnnModel, err)
	}
	if isPath(trial.Model) {
		return Options{}, fmt.Errorf("%s %q is a path: the admission policy writes the sidecar, so nothing can mount a model file into it; give the name of a model embedded in the sidecar", contract.AnnModel, trial.Model)
	}
	if trial.ProbeMQTT != "" {
		if err := contract.CheckBrokerURL(trial.ProbeMQTT); err != nil {
			return Options{}, fmt.Errorf("%s: %w", contract.AnnProbeMQTT, err)
		}
	}
	return trial, nil
}

// annotateNodeMode writes node mode's annotations on dep and nothing in its
// pod template. The broker container must be one the agent can tell
// (brokerContainer's rule); a pod template carrying the sidecar is refused.
func annotateNodeMode(dep *appsv1.Deployment, opts Options) (corev1.Container, error) {
	spec := &dep.Spec.Template.Spec
	if slices.ContainsFunc(spec.InitContainers, isSidecar) || slices.ContainsFunc(spec.Containers, isSidecar) {
		return corev1.Container{}, fmt.Errorf("the pod template carries the %s container: remove it before switching to node mode (the agent refuses a pod with both, and removing it restarts the pods once)", SidecarName)
	}
	name := opts.Container
	if name == "" {
		name = dep.Annotations[contract.AnnContainer]
	}
	broker, err := brokerContainer(spec.Containers, name)
	if err != nil {
		return corev1.Container{}, err
	}
	if dep.Annotations == nil {
		dep.Annotations = map[string]string{}
	}
	dep.Annotations[contract.AnnMode] = string(contract.ModeNode)
	if opts.Model != "" {
		dep.Annotations[contract.AnnModel] = opts.Model
	}
	if opts.Container != "" {
		dep.Annotations[contract.AnnContainer] = opts.Container
	}
	return broker, nil
}

// injectPod adds the sidecar, its volumes and the readiness gate to spec,
// and returns the broker container.
func injectPod(spec *corev1.PodSpec, opts Options) (corev1.Container, error) {
	if spec.HostNetwork {
		return corev1.Container{}, errors.New("hostNetwork pods are not supported: the sidecar's health port and network counters would be the node's")
	}
	company, err := brokersCompany(spec)
	if err != nil {
		return corev1.Container{}, err
	}
	existing, err := injectedSidecar(spec, opts.SidecarImage)
	if err != nil {
		return corev1.Container{}, err
	}
	name := opts.Container // else the one the injected sidecar watches
	if name == "" && existing >= 0 {
		name = argValue(spec.InitContainers[existing].Args, flagContainer)
	}
	broker, err := brokerContainer(spec.Containers, name)
	if err != nil {
		return corev1.Container{}, err
	}
	if err := checkHealthPort(spec); err != nil {
		return corev1.Container{}, err
	}
	probe, err := probeURL(opts.ProbeMQTT, broker)
	if err != nil {
		return corev1.Container{}, err
	}
	sidecar := sidecarContainer(opts.SidecarImage, probe, opts.Model, broker.Name, company > 0)
	if existing >= 0 {
		spec.InitContainers[existing] = sidecar
	} else {
		// First, so that it starts before any other init container.
		spec.InitContainers = append([]corev1.Container{sidecar}, spec.InitContainers...)
	}
	if err := sidecarVolumes(spec, company > 0); err != nil {
		return corev1.Container{}, err
	}
	gate := corev1.PodReadinessGate{ConditionType: contract.ConditionHealthy}
	if !slices.Contains(spec.ReadinessGates, gate) {
		spec.ReadinessGates = append(spec.ReadinessGates, gate)
	}
	return broker, nil
}

// brokersCompany counts the containers that run beside the broker and the
// sidecar: the other app containers and native sidecars. A regular
// container named like the sidecar is refused.
func brokersCompany(spec *corev1.PodSpec) (int, error) {
	if slices.ContainsFunc(spec.Containers, isSidecar) {
		return 0, fmt.Errorf("container %q is a regular container; the sidecar must be the native sidecar (init container) of that name: rename or remove it", SidecarName)
	}
	company := len(spec.Containers) - 1
	for _, c := range spec.InitContainers {
		if c.Name != SidecarName && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			company++
		}
	}
	return company, nil
}

// injectedSidecar is the index in spec's init containers of the sidecar an
// earlier injection wrote, or -1. One of another repository than image is
// not the sidecar, and refused.
func injectedSidecar(spec *corev1.PodSpec, image string) (int, error) {
	i := slices.IndexFunc(spec.InitContainers, isSidecar)
	if i >= 0 {
		if have := spec.InitContainers[i].Image; repository(have) != repository(image) {
			return -1, fmt.Errorf("init container %q has image %q, not the sidecar (%s): rename it or remove it", SidecarName, have, repository(image))
		}
	}
	return i, nil
}

// checkHealthPort refuses a container that declares the TCP port where the
// sidecar serves its health endpoint.
func checkHealthPort(spec *corev1.PodSpec) error {
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, p := range c.Ports {
			if c.Name != SidecarName && p.ContainerPort == HealthPort && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				return fmt.Errorf("container %q declares port %d/TCP, where the sidecar serves its health endpoint (its liveness probe): the two cannot share it in one pod; move that container's port", c.Name, HealthPort)
			}
		}
	}
	return nil
}

// probeURL is the sidecar's --probe-mqtt: probe when given, else the
// broker's MQTT port on loopback.
func probeURL(probe string, broker corev1.Container) (string, error) {
	if probe != "" {
		return probe, nil
	}
	port, err := mqttPort(broker)
	if err != nil {
		return "", err
	}
	return "tcp://127.0.0.1:" + strconv.Itoa(int(port)), nil
}

// sidecarVolumes adds the sidecar's volumes to spec, the kubelet's logs
// only when the broker has company (logs), and refuses a volume of one of
// their names that is not the sidecar's, or an app container mounting the
// sidecar's token.
func sidecarVolumes(spec *corev1.PodSpec, logs bool) error {
	volumes := []corev1.Volume{tokenVolume(), cgroupVolume()}
	if logs {
		volumes = append(volumes, logsVolume())
	} else if i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == LogsVolume }); i >= 0 && equality.Semantic.DeepEqual(spec.Volumes[i], logsVolume()) {
		// Injected when the broker had company it no longer has.
		spec.Volumes = slices.Delete(spec.Volumes, i, i+1)
	}
	for _, v := range volumes {
		i := slices.IndexFunc(spec.Volumes, func(have corev1.Volume) bool { return have.Name == v.Name })
		switch {
		case i < 0:
			spec.Volumes = append(spec.Volumes, v)
		case !equality.Semantic.DeepEqual(spec.Volumes[i], v):
			return fmt.Errorf("volume %q exists and is not the sidecar's: rename it", v.Name)
		}
	}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == TokenVolume {
				return fmt.Errorf("container %q mounts %q: the ServiceAccount token for the agent is the sidecar's only", c.Name, TokenVolume)
			}
		}
	}
	return nil
}

func isSidecar(c corev1.Container) bool { return c.Name == SidecarName }

// brokerContainer picks the container the sidecar watches: the one named
// (Options.Container, or the injected sidecar's --container), else the only
// one, else the one exposing a port named MQTTPortName.
func brokerContainer(cs []corev1.Container, name string) (corev1.Container, error) {
	if len(cs) == 0 {
		return corev1.Container{}, errors.New("the pod template has no containers: there is no broker to watch")
	}
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Name
	}
	choices := strings.Join(names, ", ")
	if name != "" {
		i := slices.Index(names, name)
		if i < 0 {
			return corev1.Container{}, fmt.Errorf("no container %q to watch: the pod's containers are %s (pass the broker's with --container)", name, choices)
		}
		return cs[i], nil
	}
	if len(cs) == 1 {
		return cs[0], nil
	}
	var mqtt []string
	for _, c := range cs {
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == MQTTPortName }) {
			mqtt = append(mqtt, c.Name)
		}
	}
	switch len(mqtt) {
	case 1:
		return cs[slices.Index(names, mqtt[0])], nil
	case 0:
		return corev1.Container{}, fmt.Errorf("the pod has %d containers (%s) and none exposes a port named %q: pass the broker's with --container, or name its MQTT port %q", len(cs), choices, MQTTPortName, MQTTPortName)
	}
	return corev1.Container{}, fmt.Errorf("the pod has %d containers (%s) and %s all expose a port named %q: pass the broker's with --container", len(cs), choices, strings.Join(mqtt, ", "), MQTTPortName)
}

// argValue is the value of the last "--flag=value" argument (flag given
// with its "=") in args, or "".
func argValue(args []string, flag string) string {
	v := ""
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, flag); ok {
			v = rest
		}
	}
	return v
}

// limitWarnings warn when the broker has no memory or CPU limit: the
// sidecar then scores against references the user should know about, and
// the features are less like the model's training data.
func limitWarnings(deployment string, broker corev1.Container) []string {
	var ws []string
	where := fmt.Sprintf("Deployment %s: broker container %s has no", deployment, broker.Name)
	const limitRange = " (unless a LimitRange of the namespace sets one)"
	if _, ok := broker.Resources.Limits[corev1.ResourceMemory]; !ok {
		ws = append(ws, where+" memory limit"+limitRange+": the sidecar then takes memory_percent against the nearest limit above it (the pod's, else the node's allocatable memory, else the machine's) or its --memory-reference, and says which in its log and /status; memory alarms come only near that. Set resources.limits.memory to what the broker may use")
	}
	if _, ok := broker.Resources.Limits[corev1.ResourceCPU]; !ok {
		ws = append(ws, where+" CPU limit"+limitRange+": cpu_percent stays per core, as the model was trained on CPU-limited brokers, and a broker that uses more than one core scores beyond anything in its training data. Set resources.limits.cpu")
	}
	return ws
}

// mqttPort is the broker container's port named MQTTPortName, else 1883.
func mqttPort(c corev1.Container) (int32, error) {
	for _, p := range c.Ports {
		if p.Name == MQTTPortName {
			return p.ContainerPort, nil
		}
	}
	var declared []string
	for _, p := range c.Ports {
		if p.ContainerPort == 1883 {
			return 1883, nil
		}
		declared = append(declared, cmp.Or(p.Name, "unnamed")+"/"+strconv.Itoa(int(p.ContainerPort)))
	}
	if len(declared) > 0 {
		// A broker that declares only mqtts (8883) or another port: probing
		// 1883 would keep the sidecar starting for good.
		return 0, fmt.Errorf("the broker container %s declares ports %s, none named %q nor 1883: the sidecar's probe needs the broker's plain MQTT listener on loopback; name that port %q, or give --probe-mqtt",
			c.Name, strings.Join(declared, ", "), MQTTPortName, MQTTPortName)
	}
	return 1883, nil // none declared: Mosquitto's default
}

// repository is an image reference without its tag or digest.
func repository(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// modelPathWarning says that a Model path must be mounted into the sidecars
// of the Deployments named, or is "".
func modelPathWarning(opts Options, deployments []string) string {
	if !isPath(opts.Model) || len(deployments) == 0 || opts.Mode != contract.ModeSidecar || opts.Admission {
		return ""
	}
	return fmt.Sprintf("the sidecar's model %s is a path: mount the model file and its manifest (%s) into the %s container of %s at that path, or give the name of a model embedded in the sidecar image",
		// The rule of model.ManifestPathFor, spelled out so that the agent
		// does not link the model package.
		opts.Model, strings.TrimSuffix(opts.Model, ".txt")+".manifest.json", SidecarName, strings.Join(deployments, ", "))
}

// isPath says whether a --model value is a path rather than an embedded name
// (names never hold a slash), to warn that the file must be in the container.
func isPath(model string) bool { return strings.Contains(model, "/") }

func sidecarContainer(image, probe, model, broker string, logs bool) corev1.Container {
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	args := []string{"run", flagHostCgroupRoot + HostCgroupRoot, flagProbeMQTT + probe, flagContainer + broker}
	if logs {
		args = append(args, flagHostContainerLogs+HostContainerLogs)
	}
	if model != "" {
		args = append(args, flagModel+model)
	}
	mounts := []corev1.VolumeMount{
		{Name: TokenVolume, MountPath: TokenDir, ReadOnly: true},
		{Name: CgroupVolume, MountPath: HostCgroupRoot, ReadOnly: true},
	}
	if logs {
		mounts = append(mounts, corev1.VolumeMount{Name: LogsVolume, MountPath: HostContainerLogs, ReadOnly: true})
	}
	return corev1.Container{
		Name:          SidecarName,
		Image:         image,
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Args:          args,
		Env: []corev1.EnvVar{
			field("POD_UID", "metadata.uid"),
			field("POD_NAME", "metadata.name"),
			field("POD_NAMESPACE", "metadata.namespace"),
			field("NODE_IP", "status.hostIP"),
			// $(NODE_IP) expands because NODE_IP is defined above.
			{Name: "AMF_AGENT", Value: "tcp://$(NODE_IP):" + strconv.Itoa(AgentPort)},
		},
		Ports: []corev1.ContainerPort{{Name: "amf-health", ContainerPort: HealthPort, Protocol: corev1.ProtocolTCP}},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("amf-health")}},
			PeriodSeconds: 10,
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("48Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](65532),
			RunAsGroup:               ptr.To[int64](65532),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: mounts,
	}
}

// sidecarLevers gives the sidecar in dep's pod template its levers (see
// levers) and, with stateDir, tells the agent that the pods hold state to
// carry.
func sidecarLevers(dep *appsv1.Deployment, broker corev1.Container, stateDir string, hot bool) ([]string, error) {
	warnings, err := levers(dep.Name, &dep.Spec.Template.Spec, broker, stateDir, hot)
	if err != nil {
		return nil, err
	}
	if stateDir != "" {
		if dep.Spec.Template.Annotations == nil {
			dep.Spec.Template.Annotations = map[string]string{}
		}
		dep.Spec.Template.Annotations[contract.AnnStateDir] = path.Clean(stateDir)
	}
	return warnings, nil
}

// levers gives the sidecar in spec what it needs to save and load the
// broker's state in stateDir ("": none, stateLever), and to pause the broker
// for the fence (fenceLever), and returns what the user must still do.
func levers(deployment string, spec *corev1.PodSpec, broker corev1.Container, stateDir string, fence bool) ([]string, error) {
	var warnings []string
	if stateDir != "" {
		w, err := stateLever(deployment, spec, broker, stateDir)
		if err != nil {
			return nil, err
		}
		if w != "" {
			warnings = append(warnings, w)
		}
	}
	if fence {
		if w := fenceLever(deployment, spec, broker); w != "" {
			warnings = append(warnings, w)
		}
	}
	return warnings, nil
}

// fenceLever lets a hot pair's sidecar pause its broker when the node
// agent fences (DESIGN.md, "Losing a whole node"; pause), by
// brokerUser. A broker whose user is not in the pod template (the image's) or
// is root gets a warning instead: the sidecar never runs as root, and the
// fence is then only reported.
func fenceLever(deployment string, spec *corev1.PodSpec, broker corev1.Container) (warning string) {
	if who := brokerUser(spec, broker); who != "" {
		return fmt.Sprintf("%s is hot, but its broker's user is %s: set a non-root runAsUser on the %s container (or the pod) so that its sidecar can pause it when the node agent fences; until then a fence is only reported",
			deployment, who, broker.Name)
	}
	return ""
}

// brokerUser gives the sidecar what it needs to signal the broker: the
// pod's process namespace shared, so the sidecar sees the broker's
// processes, and the sidecar running as the broker's user, who may signal
// its own processes without any capability. It returns "" once done, or
// why it cannot be ("root", "not in the pod template").
func brokerUser(spec *corev1.PodSpec, broker corev1.Container) (cannot string) {
	var uid, gid *int64
	if sc := spec.SecurityContext; sc != nil {
		uid, gid = sc.RunAsUser, sc.RunAsGroup
	}
	if sc := broker.SecurityContext; sc != nil {
		uid, gid = cmp.Or(sc.RunAsUser, uid), cmp.Or(sc.RunAsGroup, gid)
	}
	if uid == nil || *uid == 0 {
		return map[bool]string{true: "root", false: "not in the pod template"}[uid != nil]
	}
	spec.ShareProcessNamespace = ptr.To(true)
	i := slices.IndexFunc(spec.InitContainers, isSidecar)
	sc := spec.InitContainers[i].SecurityContext
	sc.RunAsUser = ptr.To(*uid)
	if gid != nil {
		sc.RunAsGroup = ptr.To(*gid)
	}
	return ""
}

// stateLever lets the sidecar save and load the broker's state
// (sidecar/handover; amf-sidecar state save|load): the broker's volume that
// holds dir mounted into the sidecar at the same path, writable, and
// brokerUser. A broker without a volume there is refused: its state would
// not outlive its container, so there is nothing to hand over.
func stateLever(deployment string, spec *corev1.PodSpec, broker corev1.Container, dir string) (warning string, err error) {
	dir = path.Clean(dir)
	i := slices.IndexFunc(broker.VolumeMounts, func(m corev1.VolumeMount) bool {
		mp := path.Clean(m.MountPath)
		return mp == dir || strings.HasPrefix(dir, mp+"/")
	})
	if i < 0 {
		return "", fmt.Errorf("the broker container %s mounts no volume at %s (--state-dir): its persistence file there would not outlive the container; mount one there (an emptyDir keeps it across container restarts, a claim across pod restarts), or give the folder of its persistence_location", broker.Name, dir)
	}
	m := broker.VolumeMounts[i]
	mount := corev1.VolumeMount{Name: m.Name, MountPath: m.MountPath, SubPath: m.SubPath, SubPathExpr: m.SubPathExpr}
	j := slices.IndexFunc(spec.InitContainers, isSidecar)
	sc := &spec.InitContainers[j]
	if k := slices.IndexFunc(sc.VolumeMounts, func(v corev1.VolumeMount) bool { return path.Clean(v.MountPath) == path.Clean(m.MountPath) }); k >= 0 {
		return "", fmt.Errorf("the %s container already mounts %s at %s", SidecarName, sc.VolumeMounts[k].Name, m.MountPath)
	}
	sc.VolumeMounts = append(sc.VolumeMounts, mount)
	// The lever the agent pulls (DESIGN.md, "Broker state"): the final
	// state handed to the node agent's hub, a state it hands put in.
	// Mosquitto's persistence_file is mosquitto.db unless configured.
	if !slices.ContainsFunc(sc.Args, func(a string) bool { return strings.HasPrefix(a, flagStateFile) }) {
		sc.Args = append(sc.Args, flagStateFile+path.Join(dir, "mosquitto.db"))
	}
	if !slices.ContainsFunc(sc.Env, func(e corev1.EnvVar) bool { return e.Name == "AMF_STATE_HUB" }) {
		sc.Env = append(sc.Env, corev1.EnvVar{Name: "AMF_STATE_HUB", Value: "http://$(NODE_IP):" + strconv.Itoa(StatePort)})
	}
	if who := brokerUser(spec, broker); who != "" {
		return fmt.Sprintf("%s: its broker's user is %s: set a non-root runAsUser on the %s container (or the pod), the user its persistence file belongs to, so that its sidecar can save and load the broker's state; until then amf-sidecar state save|load cannot",
			deployment, who, broker.Name), nil
	}
	return "", nil
}

// logsVolume is the host's KubeletLogDir: the kubelet creates it at start,
// so a missing one means no kubelet, and the pod should not start.
func logsVolume() corev1.Volume {
	return corev1.Volume{Name: LogsVolume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: KubeletLogDir, Type: ptr.To(corev1.HostPathDirectory),
	}}}
}

func tokenVolume() corev1.Volume {
	return corev1.Volume{Name: TokenVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
			Audience: contract.Audience, ExpirationSeconds: ptr.To[int64](tokenSeconds), Path: "token",
		}}},
	}}}
}

func cgroupVolume() corev1.Volume {
	return corev1.Volume{Name: CgroupVolume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: "/sys/fs/cgroup", Type: ptr.To(corev1.HostPathDirectory),
	}}}
}
