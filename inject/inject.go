// Package inject writes into the Deployments of MQTT brokers what AMF needs
// to keep them available, as `linkerd inject` or `istioctl kube-inject` do
// for their proxies: YAML in, YAML out, no cluster access (amf-agent inject).
//
// In sidecar mode, the default, each apps/v1 Deployment of a
// (multi-document) YAML stream gets:
//
//   - the amf-sidecar as a native sidecar (an init container with
//     restartPolicy Always) running `amf-sidecar run` in pod mode, with
//     --model when Options.Model is set;
//   - a projected ServiceAccount token with audience amf-agent at
//     /var/run/secrets/amf/token, the sidecar's identity towards the agent;
//   - the host's /sys/fs/cgroup mounted read-only, where the sidecar finds the
//     broker container's cgroup, and --container naming the broker (see
//     Options.Container);
//   - when the broker has company (another app container or native sidecar,
//     such as an exporter), the host's /var/log/containers mounted read-only:
//     the cgroup tree knows containers by ID only, and the kubelet's log
//     symlinks there are how the sidecar, which has no API access, learns the
//     broker's ID from its name (package cgroup, "Finding a container
//     by name"). Alone beside the sidecar and the sandbox the broker is found
//     without them, so a plain broker pod gets no extra host path;
//   - POD_UID, POD_NAME, POD_NAMESPACE and NODE_IP from the downward API, and
//     AMF_AGENT=tcp://$(NODE_IP):1884, the node agent's control-plane broker;
//   - the readiness gate amf.io/healthy, which the agent maintains;
//   - on the primary, the policy annotations amf.io/standby (default
//     <name>-standby) and amf.io/redundancy (default cold), unless already set.
//
// In node mode (Options.Mode) the Deployment gets annotations only
// (amf.io/mode=node and the policy), and its pod template is left as it is:
// the node agent watches its pods instead of a sidecar. With Options.Admission
// the pod template gets, instead of the sidecar, the label and annotations
// that the admission policy of manifests/overlays/admission reads, which
// writes the same sidecar into each pod (manifests/admission_test.go keeps
// the two equal field by field).
//
// With Options.Standby each primary is followed by its standby Deployment
// (0 replicas when cold), unless the stream already holds it. A Deployment
// that is a standby (annotation amf.io/role=standby, or named by another's
// amf.io/standby) gets the sidecar but no policy. The two of a pair also
// get a pod anti-affinity against each other's pods by node
// (kubernetes.io/hostname), preferred or required (Options.Spread), merged
// into any affinity the template has: a standby on its primary's node is
// lost with it (DESIGN.md, "Losing a whole node"). In node mode only a
// standby Inject writes gets it, the templates in the stream being left as
// they are; the scheduler keeps an existing pod's anti-affinity for an
// incoming pod too, so the primary's pods avoid the standby's node as well.
//
// A standby gets a PersistentVolumeClaim of its own for every claim its
// primary writes, copied from the claim in the input, or is refused when the
// claim is not there; ConfigMaps, Secrets and read-only claims stay shared,
// and a warning names them (storage.go). StatefulSets are refused: the agent
// pairs Deployments.
//
// A v1 List (kubectl get -o yaml of several objects) is written as its items,
// one document each. Fields the server writes (uid, resourceVersion,
// generation, creationTimestamp, managedFields, status) are dropped from
// Deployments, so the output is a manifest to apply. Documents of other
// kinds pass through byte for byte, comments included; injected Deployments
// are re-serialized (keys sorted, comments dropped except the comment lines
// that open the document). Injection is idempotent: injecting its own output
// changes nothing. What it cannot inject safely it refuses with an error
// naming the document and the reason, and then writes nothing.
//
// Inject (this file) is the steps; each is in the file of its concern:
// stream.go reads and writes the YAML stream, pod.go the pod template (the
// sidecar, the admission label, node mode), pair.go the policy, the standby
// and the spread, storage.go what a standby would share with its primary.
package inject

import (
	"errors"
	"fmt"
	"slices"

	"github.com/amf-edge/amf/contract"
	corev1 "k8s.io/api/core/v1"
)

// Names and places of what Inject adds.
const (
	// SidecarName is the sidecar's init container name.
	SidecarName = contract.SidecarName
	// DefaultSidecarImage is the sidecar image used when Options.SidecarImage is empty.
	DefaultSidecarImage = "ghcr.io/amf-edge/amf-sidecar:v0.1.0"
	// TokenVolume holds the projected token, mounted at TokenDir.
	TokenVolume = "amf-token"
	// TokenDir is where the sidecar reads "token" (its --token-file default).
	TokenDir = "/var/run/secrets/amf"
	// CgroupVolume is the host's /sys/fs/cgroup, mounted read-only at HostCgroupRoot.
	CgroupVolume = "amf-host-cgroup"
	// HostCgroupRoot is the sidecar's --host-cgroup-root.
	HostCgroupRoot = "/host/sys/fs/cgroup"
	// LogsVolume is the host's KubeletLogDir, mounted read-only at
	// HostContainerLogs when the broker has other containers beside it.
	LogsVolume = "amf-container-logs"
	// KubeletLogDir is where every kubelet writes its container log symlinks
	// (cgroup.ContainerLogDir, not imported here so that the agent
	// does not link the sidecar's cgroup readers).
	KubeletLogDir = "/var/log/containers"
	// HostContainerLogs is the sidecar's --host-container-logs.
	HostContainerLogs = "/host" + KubeletLogDir
	// MQTTPortName is the port name that marks the broker container.
	MQTTPortName = contract.MQTTPortName
	// AgentPort is the agent DaemonSet's host port (manifests/base).
	AgentPort = 1884
	// StatePort is the agent's state hub, a host port too (manifests/base).
	StatePort = 1886
	// HealthPort is the sidecar's health endpoint (healthcheck.DefaultAddr).
	HealthPort = 8086
	// LabelStandbyOf marks a standby's pods when the primary's selector has no
	// app.kubernetes.io/instance label to vary.
	LabelStandbyOf = "amf.io/standby-of"

	labelInstance = "app.kubernetes.io/instance"
	tokenSeconds  = 3600
	// spreadWeight is the weight of a preferred spread term: the most a term
	// can have, so it outweighs the scheduler's other preferences.
	spreadWeight = 100
)

// Spread is how the two Deployments of a pair are kept off each other's
// node (Options.Spread).
type Spread string

const (
	// SpreadPreferred: preferredDuringSchedulingIgnoredDuringExecution. The
	// scheduler puts them on different nodes when it can, and on one node
	// when there is no other (a one-node edge cluster still gets a standby,
	// which covers the broker's faults, if not the node's).
	SpreadPreferred Spread = "preferred"
	// SpreadRequired: requiredDuringSchedulingIgnoredDuringExecution. Never
	// on one node: with no other node the second stays Pending, a cold
	// standby's switchover waits out its ready-timeout and keeps the primary.
	SpreadRequired Spread = "required"
)

// Options configures Inject. The zero value injects DefaultSidecarImage and no standby.
type Options struct {
	// SidecarImage is the sidecar's image; default DefaultSidecarImage. An
	// existing amf-sidecar of the same repository (any tag) is replaced; one of
	// another repository is refused.
	SidecarImage string
	// Standby also writes each primary's standby Deployment.
	Standby bool
	// ProbeMQTT is the sidecar's --probe-mqtt; default tcp://127.0.0.1:<port>
	// with the broker container's port named "mqtt", else 1883.
	ProbeMQTT string
	// Model is the sidecar's --model: the name of a model embedded in the
	// sidecar image (amf-sidecar --help lists them), or a path inside the
	// sidecar container of a model file with its manifest beside it, which
	// the user must mount there (a Result warning says so). Default: none,
	// the image's default model. The standby's sidecar gets the same.
	Model string
	// Mode is contract.ModeSidecar (the default, also when empty) or
	// contract.ModeNode: then only the Deployment's annotations are written
	// (amf.io/mode=node, the policy, amf.io/model from Model, amf.io/container
	// from Container), the pod template is left as it is, so applying the
	// result restarts no pod, and the node agent watches the pods instead of
	// a sidecar.
	Mode contract.Mode
	// Spread is the anti-affinity written on a pair with Standby: default
	// SpreadPreferred.
	Spread Spread
	// EmbeddedModels are the names of the models the sidecar image embeds
	// (amf-agent passes its own: one release). A Model that is neither one
	// of them nor a path is refused; nil checks nothing.
	EmbeddedModels []string
	// StateDir, when set, is the folder of the broker's persistence file
	// (Mosquitto's persistence_location; its image's is /mosquitto/data):
	// the broker's volume there is mounted into the sidecar at the same
	// path, and the sidecar runs as the broker's user in the pod's process
	// namespace, so that it can save and load the broker's state
	// (amf-sidecar state save|load). Sidecar mode only.
	StateDir string
	// Admission (sidecar mode) leaves the sidecar to the admission policy
	// (manifests/overlays/admission), which writes it into each new pod as
	// Inject would into the template: the pod template gets the label
	// contract.LabelInject and, as annotations, Container, Model, ProbeMQTT,
	// StateDir and, for a hot pair, contract.AnnPauseOnFence; nothing else.
	// What Inject would refuse is refused all the same, before it reaches a
	// pod the policy would admit without its sidecar. SidecarImage is the
	// policy's (its ConfigMap), and a Model path, which would need a mount
	// into a container the template does not hold, is refused.
	Admission bool
	// Container names the broker container, which the sidecar watches.
	// Default: the one already named by an injected sidecar, else the pod's
	// only container, else the one exposing a port named MQTTPortName. A
	// name the pod lacks, or no or several such ports, is refused, naming the
	// containers.
	Container string
}

// Result is what Inject wrote, for a summary on stderr.
type Result struct {
	// Injected are the names of the Deployments that carry the sidecar, or
	// in node mode the annotation.
	Injected []string
	// Standbys are the names of the standby Deployments Inject wrote.
	Standbys []string
	// Warnings are things the user must still do (for example give a standby
	// its own client IDs, or limits to a broker without them).
	Warnings []string
}

// Flags of amf-sidecar run that Inject writes, each as one "--flag=value"
// argument so that no value can be read as another flag. They are the
// sidecar's (cmd/amf-sidecar/run.go); cmd/amf-sidecar's tests parse what
// Inject writes with the sidecar's own flags.
const (
	flagHostCgroupRoot    = "--host-cgroup-root="
	flagHostContainerLogs = "--host-container-logs="
	flagProbeMQTT         = "--probe-mqtt="
	flagModel             = "--model="
	flagContainer         = "--container="
	flagStateFile         = "--state-file="
)

// Inject injects the sidecar into every Deployment of a YAML stream and
// returns the new stream. On error it returns no output.
func Inject(in []byte, opts Options) ([]byte, Result, error) {
	opts, err := opts.checked()
	if err != nil {
		return nil, Result{}, err
	}
	docs, err := parse(in)
	if err != nil {
		return nil, Result{}, err
	}
	// The whole stream is read first: a standby may come before the primary
	// naming it, and a claim after the Deployment mounting it.
	inj := injection{opts: opts, pairs: readPairs(docs), claims: readClaims(docs)}
	for _, d := range docs {
		if d.deployment == nil {
			inj.out.add(nil, d.raw) // byte for byte
			continue
		}
		if err := inj.deployment(d); err != nil {
			return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
		}
	}
	inj.warn(modelPathWarning(opts, slices.Concat(inj.res.Injected, inj.res.Standbys)))
	return inj.out.bytes(), inj.res, nil
}

// checked is opts with its defaults set, or why Inject cannot do as they say.
func (opts Options) checked() (Options, error) {
	if opts.SidecarImage == "" {
		opts.SidecarImage = DefaultSidecarImage
	}
	switch opts.Mode {
	case "":
		opts.Mode = contract.ModeSidecar
	case contract.ModeSidecar:
	case contract.ModeNode:
		if isPath(opts.Model) {
			return Options{}, fmt.Errorf("model %q is a path: in node mode the agent scores with a model embedded in its own image; give its name", opts.Model)
		}
	default:
		return Options{}, fmt.Errorf("mode %q: want %s or %s", opts.Mode, contract.ModeSidecar, contract.ModeNode)
	}
	if opts.ProbeMQTT != "" {
		if err := contract.CheckBrokerURL(opts.ProbeMQTT); err != nil {
			return Options{}, fmt.Errorf("probe: %w", err)
		}
	}
	if err := checkModel(opts.Model, opts.EmbeddedModels); err != nil {
		return Options{}, err
	}
	if opts.Admission && opts.Mode == contract.ModeNode {
		return Options{}, errors.New("admission is for the sidecar, which the policy writes into each pod: node mode has none")
	}
	if opts.Admission && isPath(opts.Model) {
		return Options{}, fmt.Errorf("model %q is a path: the admission policy writes the sidecar, so nothing can mount a model file into it; give the name of a model embedded in the sidecar", opts.Model)
	}
	if opts.StateDir != "" && opts.Mode == contract.ModeNode {
		return Options{}, errors.New("a state folder is for the sidecar, which saves and loads the broker's state: node mode has none")
	}
	switch opts.Spread {
	case "":
		opts.Spread = SpreadPreferred
	case SpreadPreferred, SpreadRequired:
	default:
		return Options{}, fmt.Errorf("spread %q: want %s or %s", opts.Spread, SpreadPreferred, SpreadRequired)
	}
	return opts, nil
}

// injection is one Inject: what it read of the whole stream, and what it
// has written so far.
type injection struct {
	opts   Options
	pairs  *pairs
	claims map[string]*corev1.PersistentVolumeClaim // by namespace/name, with the standbys' own once written
	out    output
	res    Result
}

// deployment injects the Deployment of d and writes it, and after it the
// standby it derives, if any. The order of the steps is the order of the
// warnings, and decides which of two faults is reported.
func (inj *injection) deployment(d document) error {
	dep, opts := d.deployment, inj.opts
	isStandby, hot := inj.pairs.role(dep)
	broker, warnings, err := podTemplate(dep, opts, hot)
	if err != nil {
		return err
	}
	inj.warn(warnings...)
	inj.res.Injected = append(inj.res.Injected, dep.Name)
	if !isStandby {
		if err := setPolicy(dep); err != nil {
			return err
		}
	}
	if opts.Mode == contract.ModeSidecar && !opts.Admission {
		// Before the standby is derived, which copies the pod template:
		// after a role exchange the standby is the primary.
		w, err := sidecarLevers(dep, broker, opts.StateDir, hot)
		if err != nil {
			return err
		}
		inj.warn(w...)
	}
	// The other of dep's pair is in the stream, or is to be written.
	var s *standby
	switch partner := inj.pairs.partner(dep, isStandby); {
	case partner != nil:
		w, err := pairInStream(dep, partner, opts)
		if err != nil {
			return err
		}
		inj.warn(w...)
	case !isStandby && opts.Standby && inj.pairs.lacksStandby(dep):
		if s, warnings, err = newStandby(dep, opts, inj.claims); err != nil {
			return err
		}
		inj.pairs.wrote(s)
		inj.warn(warnings...)
	}
	if err := inj.out.deployment(d.raw, dep); err != nil {
		return err
	}
	if s != nil {
		if err := inj.out.standby(dep, s); err != nil {
			return err
		}
		inj.res.Standbys = append(inj.res.Standbys, s.Name)
		inj.warn(s.warnings(dep)...)
	}
	return nil
}

// warn adds the warnings that are not "".
func (inj *injection) warn(warnings ...string) {
	for _, w := range warnings {
		if w != "" {
			inj.res.Warnings = append(inj.res.Warnings, w)
		}
	}
}

func key(namespace, name string) string { return namespace + "/" + name }
