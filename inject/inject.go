// Package inject adds the AMF sidecar to Kubernetes Deployments, as
// `linkerd inject` or `istioctl kube-inject` do for their proxies: YAML in,
// YAML out, no cluster access.
//
// Each apps/v1 Deployment of a (multi-document) YAML stream gets:
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
// With Options.Admission the pod template gets, instead of the sidecar, the
// label and annotations that the admission policy of
// manifests/overlays/admission reads, which writes the same sidecar into each
// pod (manifests/admission_test.go keeps the two equal field by field).
//
// A v1 List (kubectl get -o yaml of several objects) is written as its items,
// one document each. Fields the server writes (uid, resourceVersion,
// generation, creationTimestamp, managedFields, status) are dropped from
// Deployments, so the output is a manifest to apply. Documents of other kinds pass through byte for byte, comments included;
// injected Deployments are re-serialized (keys sorted, comments dropped except
// the comment lines that open the document).
// Injection is idempotent: injecting its own output changes nothing. What it
// cannot inject safely it refuses with an error naming the document and the
// reason, and then writes nothing.
package inject

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/contract"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
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
)

var separator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// document is one YAML document of the stream.
type document struct {
	raw        []byte
	deployment *appsv1.Deployment            // nil: pass through
	claim      *corev1.PersistentVolumeClaim // passed through; read for a standby's own
	where      string                        // for messages: "document 2 (Deployment x)"
}

// Inject injects the sidecar into every Deployment of a YAML stream and
// returns the new stream. On error it returns no output.
func Inject(in []byte, opts Options) ([]byte, Result, error) {
	if opts.SidecarImage == "" {
		opts.SidecarImage = DefaultSidecarImage
	}
	switch opts.Mode {
	case "":
		opts.Mode = contract.ModeSidecar
	case contract.ModeSidecar:
	case contract.ModeNode:
		if isPath(opts.Model) {
			return nil, Result{}, fmt.Errorf("model %q is a path: in node mode the agent scores with a model embedded in its own image; give its name", opts.Model)
		}
	default:
		return nil, Result{}, fmt.Errorf("mode %q: want %s or %s", opts.Mode, contract.ModeSidecar, contract.ModeNode)
	}
	if opts.ProbeMQTT != "" {
		if err := contract.CheckBrokerURL(opts.ProbeMQTT); err != nil {
			return nil, Result{}, fmt.Errorf("probe: %w", err)
		}
	}
	if err := checkModel(opts.Model, opts.EmbeddedModels); err != nil {
		return nil, Result{}, err
	}
	if opts.Admission && opts.Mode == contract.ModeNode {
		return nil, Result{}, errors.New("admission is for the sidecar, which the policy writes into each pod: node mode has none")
	}
	if opts.Admission && isPath(opts.Model) {
		return nil, Result{}, fmt.Errorf("model %q is a path: the admission policy writes the sidecar, so nothing can mount a model file into it; give the name of a model embedded in the sidecar", opts.Model)
	}
	if opts.StateDir != "" && opts.Mode == contract.ModeNode {
		return nil, Result{}, errors.New("a state folder is for the sidecar, which saves and loads the broker's state: node mode has none")
	}
	switch opts.Spread {
	case "":
		opts.Spread = SpreadPreferred
	case SpreadPreferred, SpreadRequired:
	default:
		return nil, Result{}, fmt.Errorf("spread %q: want %s or %s", opts.Spread, SpreadPreferred, SpreadRequired)
	}
	docs, err := parse(in)
	if err != nil {
		return nil, Result{}, err
	}
	present := map[string]bool{}                 // namespace/name of every Deployment in the stream
	standbyOf := map[string]bool{}               // namespace/name named as a standby by another
	hotStandby := map[string]bool{}              // of those, the hot ones
	byKey := map[string]*appsv1.Deployment{}     // the stream's Deployments as read
	primaryOf := map[string]*appsv1.Deployment{} // a standby's namespace/name → the primary naming it
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, d := range docs {
		if c := d.claim; c != nil {
			claims[key(c.Namespace, c.Name)] = c
		}
		if dep := d.deployment; dep != nil {
			present[key(dep.Namespace, dep.Name)] = true
			byKey[key(dep.Namespace, dep.Name)] = dep.DeepCopy()
			if s := dep.Annotations[contract.AnnStandby]; s != "" {
				standbyOf[key(dep.Namespace, s)] = true
				hotStandby[key(dep.Namespace, s)] = contract.Redundancy(dep.Annotations[contract.AnnRedundancy]) == contract.Hot
				primaryOf[key(dep.Namespace, s)] = dep.DeepCopy()
			}
		}
	}

	var (
		out bytes.Buffer
		res Result
	)
	for i, d := range docs {
		if i > 0 {
			out.WriteString("---\n")
		}
		dep := d.deployment
		if dep == nil {
			out.Write(d.raw)
			continue
		}
		isStandby := dep.Annotations[contract.AnnRole] == "standby" || standbyOf[key(dep.Namespace, dep.Name)]
		hot := hotStandby[key(dep.Namespace, dep.Name)] || !isStandby && contract.Redundancy(dep.Annotations[contract.AnnRedundancy]) == contract.Hot
		var broker corev1.Container
		switch {
		case opts.Mode == contract.ModeNode:
			broker, err = annotateNodeMode(dep, opts)
		case opts.Admission:
			var w []string
			broker, w, err = labelForAdmission(dep, opts, hot)
			res.Warnings = append(res.Warnings, w...)
		default:
			broker, err = injectSidecar(dep, opts)
		}
		if err != nil {
			return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
		}
		res.Warnings = append(res.Warnings, limitWarnings(dep.Name, broker)...)
		res.Injected = append(res.Injected, dep.Name)
		var (
			standby, partner *appsv1.Deployment // partner: the other of dep's pair in the stream
			standbyClaimsOut []ownClaim
			shared           []string // what the written standby shares with dep
		)
		if !isStandby {
			if err := setPolicy(dep); err != nil {
				return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
			}
		}
		if opts.StateDir != "" && opts.Mode == contract.ModeSidecar && !opts.Admission {
			// Before the standby is derived, which copies the pod template.
			w, err := stateLever(dep.Name, &dep.Spec.Template.Spec, broker, opts.StateDir)
			if err != nil {
				return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
			}
			if w != "" {
				res.Warnings = append(res.Warnings, w)
			}
		}
		if hot && opts.Mode == contract.ModeSidecar && !opts.Admission {
			// Before the standby is derived, which copies the pod template:
			// after a role exchange the standby is the primary.
			if w := fenceLever(dep.Name, &dep.Spec.Template.Spec, broker); w != "" {
				res.Warnings = append(res.Warnings, w)
			}
		}
		if !isStandby {
			name := dep.Annotations[contract.AnnStandby]
			partner = byKey[key(dep.Namespace, name)]
			if opts.Standby && !present[key(dep.Namespace, name)] {
				if standby, err = standbyFor(dep); err != nil {
					return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
				}
				var w []string
				standbyClaimsOut, shared, w, err = standbyClaims(standby, dep, claims)
				if err != nil {
					return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
				}
				res.Warnings = append(res.Warnings, w...)
				shared = append(sharedConfig(&standby.Spec.Template.Spec), shared...)
				present[key(dep.Namespace, name)] = true
				// Each avoids the other's pods; the new standby in
				// either mode, the primary unless its template is to
				// stay as it is (node mode).
				w, err := spreadPair(standby, dep, opts.Spread)
				if err == nil && opts.Mode == contract.ModeSidecar {
					w, err = spreadPair(dep, standby, opts.Spread)
				}
				if err != nil {
					return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
				}
				res.Warnings = append(res.Warnings, w...)
				partner = nil
			}
		} else if p := primaryOf[key(dep.Namespace, dep.Name)]; p != nil {
			partner = p
		} else {
			partner = byKey[key(dep.Namespace, dep.Annotations[contract.AnnPrimary])]
		}
		if partner != nil {
			if c := sharedClaim(dep, partner); c != "" {
				return nil, Result{}, fmt.Errorf("%s: %s and %s, a pair, both mount PersistentVolumeClaim %q writable: two brokers cannot share one persistence file, and a ReadWriteOnce claim attaches to one node, where a standby kept off its primary's node never starts; "+
					"give the standby a claim of its own (remove the standby from the input and inject --standby writes it one, with the claim in the input)", d.where, dep.Name, partner.Name, c)
			}
		}
		if opts.Standby && opts.Mode == contract.ModeSidecar && partner != nil {
			// A pair both in the stream (written earlier, or by hand):
			// dep avoids its partner's pods.
			w, err := spreadPair(dep, partner, opts.Spread)
			if err != nil {
				return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
			}
			res.Warnings = append(res.Warnings, w...)
		}
		b, err := marshal(dep)
		if err != nil {
			return nil, Result{}, fmt.Errorf("%s: %w", d.where, err)
		}
		out.Write(leadingComments(d.raw))
		out.Write(b)
		if standby != nil {
			b, err := marshal(standby)
			if err != nil {
				return nil, Result{}, fmt.Errorf("%s: standby: %w", d.where, err)
			}
			redundancy := contract.Redundancy(dep.Annotations[contract.AnnRedundancy])
			out.WriteString("---\n")
			out.WriteString(standbyComment(dep.Name, redundancy, shared))
			out.Write(b)
			res.Standbys = append(res.Standbys, standby.Name)
			if len(shared) > 0 {
				res.Warnings = append(res.Warnings, fmt.Sprintf(
					"standby %s shares %s with %s: where they set MQTT client IDs (a bridge's local_clientid/remote_clientid, a client's ID), give the standby its own before both run at once",
					standby.Name, joinNames(shared), dep.Name))
			}
			if w := recreateWarning(dep, standby.Name, redundancy == contract.Hot); w != "" {
				res.Warnings = append(res.Warnings, w)
			}
			for _, c := range standbyClaimsOut {
				b, err := marshalClaim(c.PersistentVolumeClaim)
				if err != nil {
					return nil, Result{}, fmt.Errorf("%s: claim of the standby: %w", d.where, err)
				}
				out.WriteString("---\n")
				out.WriteString(claimComment(c.From, standby.Name))
				out.Write(b)
			}
		}
	}
	if isPath(opts.Model) && len(res.Injected) > 0 && opts.Mode == contract.ModeSidecar && !opts.Admission {
		res.Warnings = append(res.Warnings, fmt.Sprintf(
			"the sidecar's model %s is a path: mount the model file and its manifest (%s) into the %s container of %s at that path, or give the name of a model embedded in the sidecar image",
			// The rule of model.ManifestPathFor, spelled out so that the agent
			// does not link the model package.
			opts.Model, strings.TrimSuffix(opts.Model, ".txt")+".manifest.json", SidecarName, strings.Join(append(slices.Clone(res.Injected), res.Standbys...), ", ")))
	}
	return out.Bytes(), res, nil
}

// leadingComments is the comment block that opens a document, which
// re-serialization would otherwise drop.
func leadingComments(raw []byte) []byte {
	n := 0
	for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			break
		}
		n += len(line)
	}
	return raw[:n]
}

func key(namespace, name string) string { return namespace + "/" + name }

func standbyComment(primary string, r contract.Redundancy, shared []string) string {
	c := "# " + strings.ToUpper(string(r[:1])) + string(r[1:]) + " standby of " + primary + " written by amf-agent inject --standby.\n"
	if len(shared) > 0 {
		c += "# It shares " + joinNames(shared) + " with the primary: give it its own\n" +
			"# MQTT client IDs (bridge local_clientid/remote_clientid) so both can run during a switchover.\n"
	}
	return c
}

// parse splits the stream and decodes its apps/v1 Deployments.
func parse(in []byte) ([]document, error) {
	var docs []document
	n := 0
	for _, part := range separator.Split(string(in), -1) {
		raw := []byte(part)
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		raw = bytes.TrimLeft(raw, "\n")
		if !bytes.HasSuffix(raw, []byte("\n")) {
			raw = append(raw, '\n')
		}
		n++
		where := fmt.Sprintf("document %d", n)
		items, isList, err := listItems(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if !isList {
			items = [][]byte{raw}
		}
		for i, item := range items {
			w := where
			if isList {
				w = fmt.Sprintf("%s item %d", where, i+1)
			}
			d, err := parseDocument(item, w)
			if err != nil {
				return nil, err
			}
			docs = append(docs, d)
		}
	}
	return docs, nil
}

// listItems returns the items of a v1 List (kubectl get -o yaml of several
// objects) as YAML documents, so that the List is written as separate documents.
func listItems(raw []byte) (items [][]byte, isList bool, err error) {
	var list struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := yaml.Unmarshal(raw, &list); err != nil || list.Kind != "List" || list.APIVersion != "v1" {
		return nil, false, nil // not a List; parseDocument reports bad YAML
	}
	for i, it := range list.Items {
		y, err := yaml.JSONToYAML(it)
		if err != nil {
			return nil, true, fmt.Errorf("item %d: %w", i+1, err)
		}
		items = append(items, y)
	}
	return items, true, nil
}

// parseDocument decodes one document; where names it in messages.
func parseDocument(raw []byte, where string) (document, error) {
	d := document{raw: raw, where: where}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		return d, fmt.Errorf("%s: not YAML: %w", d.where, err)
	}
	if meta.Kind != "" {
		d.where = fmt.Sprintf("%s (%s)", d.where, strings.TrimSpace(meta.Kind+" "+meta.Metadata.Name))
	}
	switch {
	case meta.Kind == "Deployment" && meta.APIVersion == "apps/v1":
		var dep appsv1.Deployment
		if err := yaml.UnmarshalStrict(raw, &dep); err != nil {
			return d, fmt.Errorf("%s: not an apps/v1 Deployment this version knows: %w", d.where, err)
		}
		if dep.Name == "" {
			return d, fmt.Errorf("%s: Deployment without metadata.name", d.where)
		}
		d.deployment = &dep
	case meta.Kind == "Deployment":
		return d, fmt.Errorf("%s: apiVersion %q: only apps/v1 Deployments can be injected", d.where, meta.APIVersion)
	case meta.Kind == "StatefulSet":
		return d, fmt.Errorf("%s: a StatefulSet is not injected: AMF pairs a primary Deployment with a standby Deployment, which its agent scales; "+
			"run a one-replica broker as a Deployment (strategy Recreate, its claim in the input: inject --standby gives the standby a claim of its own), "+
			"or leave this StatefulSet out of the input if it is not the broker", d.where)
	case meta.Kind == "PersistentVolumeClaim" && meta.APIVersion == "v1":
		var c corev1.PersistentVolumeClaim
		if err := yaml.Unmarshal(raw, &c); err != nil {
			return d, fmt.Errorf("%s: not a v1 PersistentVolumeClaim: %w", d.where, err)
		}
		d.claim = &c
	case strings.HasSuffix(meta.Kind, "List"):
		return d, fmt.Errorf("%s: a %s %s is not injected: give its items as separate documents (for example kubectl get deployment NAME -o yaml)", d.where, meta.APIVersion, meta.Kind)
	}
	return d, nil
}

// injectPod adds the sidecar, its volumes and the readiness gate to spec,
// and returns the broker container.
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
	if slices.ContainsFunc(t.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == SidecarName }) {
		return corev1.Container{}, nil, fmt.Errorf("the pod template carries the %s container: the admission policy leaves such pods as they are; remove it, its volumes and the readiness gate %s, or inject without --admission", SidecarName, contract.ConditionHealthy)
	}
	ann := t.Annotations
	want := map[string]string{
		contract.AnnContainer: cmp.Or(opts.Container, ann[contract.AnnContainer]),
		contract.AnnModel:     cmp.Or(opts.Model, ann[contract.AnnModel]),
		contract.AnnProbeMQTT: cmp.Or(opts.ProbeMQTT, ann[contract.AnnProbeMQTT]),
		contract.AnnStateDir:  cmp.Or(opts.StateDir, ann[contract.AnnStateDir]),
	}
	if hot || ann[contract.AnnPauseOnFence] == "true" {
		want[contract.AnnPauseOnFence] = "true"
	}
	trial := opts
	trial.Container, trial.Model, trial.ProbeMQTT, trial.StateDir = want[contract.AnnContainer], want[contract.AnnModel], want[contract.AnnProbeMQTT], want[contract.AnnStateDir]
	if err := checkModel(trial.Model, opts.EmbeddedModels); err != nil {
		return corev1.Container{}, nil, fmt.Errorf("%s: %w", contract.AnnModel, err)
	}
	if isPath(trial.Model) {
		return corev1.Container{}, nil, fmt.Errorf("%s %q is a path: the admission policy writes the sidecar, so nothing can mount a model file into it; give the name of a model embedded in the sidecar", contract.AnnModel, trial.Model)
	}
	if trial.ProbeMQTT != "" {
		if err := contract.CheckBrokerURL(trial.ProbeMQTT); err != nil {
			return corev1.Container{}, nil, fmt.Errorf("%s: %w", contract.AnnProbeMQTT, err)
		}
	}
	spec := t.Spec.DeepCopy()
	broker, err := injectPod(spec, trial)
	if err != nil {
		return corev1.Container{}, nil, err
	}
	var warnings []string
	if trial.StateDir != "" {
		w, err := stateLever(dep.Name, spec, broker, trial.StateDir)
		if err != nil {
			return corev1.Container{}, nil, err
		}
		if w != "" {
			warnings = append(warnings, w)
		}
	}
	if want[contract.AnnPauseOnFence] == "true" {
		if w := fenceLever(dep.Name, spec, broker); w != "" {
			warnings = append(warnings, w)
		}
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

// annotateNodeMode writes node mode's annotations on dep and nothing in its
// pod template. The broker container must be one the agent can tell
// (brokerContainer's rule); a pod template carrying the sidecar is refused.
func annotateNodeMode(dep *appsv1.Deployment, opts Options) (corev1.Container, error) {
	spec := &dep.Spec.Template.Spec
	if slices.ContainsFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == SidecarName }) ||
		slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == SidecarName }) {
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

func injectPod(spec *corev1.PodSpec, opts Options) (corev1.Container, error) {
	if spec.HostNetwork {
		return corev1.Container{}, errors.New("hostNetwork pods are not supported: the sidecar's health port and network counters would be the node's")
	}
	var apps []string
	for _, c := range spec.Containers {
		if c.Name == SidecarName {
			return corev1.Container{}, fmt.Errorf("container %q is a regular container; the sidecar must be the native sidecar (init container) of that name: rename or remove it", SidecarName)
		}
		apps = append(apps, c.Name)
	}
	company := len(apps) - 1 // containers that run beside the broker and the sidecar
	for _, c := range spec.InitContainers {
		if c.Name != SidecarName && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			company++
		}
	}
	existing := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == SidecarName })
	if existing >= 0 {
		if have := spec.InitContainers[existing].Image; repository(have) != repository(opts.SidecarImage) {
			return corev1.Container{}, fmt.Errorf("init container %q has image %q, not the sidecar (%s): rename it or remove it", SidecarName, have, repository(opts.SidecarImage))
		}
	}
	name := opts.Container
	if name == "" && existing >= 0 {
		name = argValue(spec.InitContainers[existing].Args, flagContainer)
	}
	broker, err := brokerContainer(spec.Containers, name)
	if err != nil {
		return corev1.Container{}, err
	}

	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, p := range c.Ports {
			if c.Name != SidecarName && p.ContainerPort == HealthPort && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				return corev1.Container{}, fmt.Errorf("container %q declares port %d/TCP, where the sidecar serves its health endpoint (its liveness probe): the two cannot share it in one pod; move that container's port", c.Name, HealthPort)
			}
		}
	}
	probe := opts.ProbeMQTT
	if probe == "" {
		port, err := mqttPort(broker)
		if err != nil {
			return corev1.Container{}, err
		}
		probe = "tcp://127.0.0.1:" + strconv.Itoa(int(port))
	}
	sidecar := sidecarContainer(opts.SidecarImage, probe, opts.Model, broker.Name, company > 0)
	if existing >= 0 {
		spec.InitContainers[existing] = sidecar
	} else {
		// First, so that it starts before any other init container.
		spec.InitContainers = append([]corev1.Container{sidecar}, spec.InitContainers...)
	}

	volumes := []corev1.Volume{tokenVolume(), cgroupVolume()}
	if company > 0 {
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
			return corev1.Container{}, fmt.Errorf("volume %q exists and is not the sidecar's: rename it", v.Name)
		}
	}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == TokenVolume {
				return corev1.Container{}, fmt.Errorf("container %q mounts %q: the ServiceAccount token for the agent is the sidecar's only", c.Name, TokenVolume)
			}
		}
	}

	gate := corev1.PodReadinessGate{ConditionType: contract.ConditionHealthy}
	if !slices.Contains(spec.ReadinessGates, gate) {
		spec.ReadinessGates = append(spec.ReadinessGates, gate)
	}
	return broker, nil
}

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
	i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == SidecarName })
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
	j := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == SidecarName })
	sc := &spec.InitContainers[j]
	if k := slices.IndexFunc(sc.VolumeMounts, func(v corev1.VolumeMount) bool { return path.Clean(v.MountPath) == path.Clean(m.MountPath) }); k >= 0 {
		return "", fmt.Errorf("the %s container already mounts %s at %s", SidecarName, sc.VolumeMounts[k].Name, m.MountPath)
	}
	sc.VolumeMounts = append(sc.VolumeMounts, mount)
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

// setPolicy sets the policy annotations the user has not set, and checks them.
func setPolicy(d *appsv1.Deployment) error {
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	if _, ok := d.Annotations[contract.AnnStandby]; !ok {
		d.Annotations[contract.AnnStandby] = d.Name + "-standby"
	}
	if _, ok := d.Annotations[contract.AnnRedundancy]; !ok {
		d.Annotations[contract.AnnRedundancy] = string(contract.Cold)
	}
	if _, _, err := contract.ParsePolicy(d.Name, d.Annotations); err != nil {
		return fmt.Errorf("policy annotations: %w", err)
	}
	return nil
}

// standbyFor derives the standby Deployment of an injected primary.
func standbyFor(primary *appsv1.Deployment) (*appsv1.Deployment, error) {
	name := primary.Annotations[contract.AnnStandby]
	var replicas int32
	switch r := contract.Redundancy(primary.Annotations[contract.AnnRedundancy]); r {
	case contract.Cold:
	case contract.Hot:
		replicas = ptr.Deref(primary.Spec.Replicas, 1)
	default:
		return nil, fmt.Errorf("%s=%s: no standby to write", contract.AnnRedundancy, r)
	}
	if primary.Spec.Selector == nil || len(primary.Spec.Selector.MatchLabels) == 0 {
		return nil, errors.New("the selector has no matchLabels to tell the standby's pods apart")
	}
	s := primary.DeepCopy()
	s.Name = name
	s.OwnerReferences = nil
	s.Status = appsv1.DeploymentStatus{}
	for _, k := range []string{contract.AnnStandby, contract.AnnRedundancy, contract.AnnThreshold, contract.AnnDebounce, contract.AnnReconfirm,
		contract.AnnHold, contract.AnnReadyTimeout, contract.AnnCooldown, contract.AnnAbortDelay, contract.AnnRecord, contract.AnnRole, contract.AnnPrimary,
		"kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision"} {
		delete(s.Annotations, k)
	}
	s.Annotations[contract.AnnRole] = "standby"
	s.Annotations[contract.AnnPrimary] = primary.Name
	s.Spec.Replicas = ptr.To(replicas)

	// The standby's selector must not match the primary's pods. The primary's
	// selector is immutable and may match the standby's pods; that is harmless,
	// as each ReplicaSet owns its pods and a Deployment adopts only orphans.
	sel := s.Spec.Selector.MatchLabels
	if s.Spec.Template.Labels == nil {
		s.Spec.Template.Labels = map[string]string{}
	}
	if sel[labelInstance] == primary.Name {
		sel[labelInstance] = name
		s.Spec.Template.Labels[labelInstance] = name
		if s.Labels[labelInstance] == primary.Name {
			s.Labels[labelInstance] = name
		}
	} else {
		sel[LabelStandbyOf] = primary.Name
		s.Spec.Template.Labels[LabelStandbyOf] = primary.Name
	}
	// The primary's own spread term (a primary injected before) is against
	// the standby's pods: not the standby's to keep.
	if err := dropSpread(s, primary); err != nil {
		return nil, err
	}
	return s, nil
}

// spreadPair makes d's pods avoid the nodes of other's pods (the other
// Deployment of d's pair), as spread says: the term is added unless there,
// AMF's term of the other kind is removed, and everything else of d's
// affinity is kept. A pair whose pods no label selector tells apart gets a
// warning instead.
func spreadPair(d, other *appsv1.Deployment, spread Spread) (warnings []string, err error) {
	sel, ok, err := podsOf(other, d)
	if err != nil {
		return nil, err
	}
	if !ok {
		return []string{fmt.Sprintf("Deployment %s: the pods of %s carry every label of its own pods, so no anti-affinity can keep the two off one node: give %s's pods a label of their own and inject again",
			d.Name, other.Name, other.Name)}, nil
	}
	spec := &d.Spec.Template.Spec
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.PodAntiAffinity == nil {
		spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	pa := spec.Affinity.PodAntiAffinity
	term := corev1.PodAffinityTerm{LabelSelector: sel, TopologyKey: corev1.LabelHostname}
	same := func(t corev1.PodAffinityTerm) bool { return equality.Semantic.DeepEqual(t, term) }
	sameWeighted := func(w corev1.WeightedPodAffinityTerm) bool { return same(w.PodAffinityTerm) }
	switch spread {
	case SpreadRequired:
		pa.PreferredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.PreferredDuringSchedulingIgnoredDuringExecution, sameWeighted)
		if !slices.ContainsFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution, same) {
			pa.RequiredDuringSchedulingIgnoredDuringExecution = append(pa.RequiredDuringSchedulingIgnoredDuringExecution, term)
		}
	default:
		pa.RequiredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution, same)
		if !slices.ContainsFunc(pa.PreferredDuringSchedulingIgnoredDuringExecution, sameWeighted) {
			pa.PreferredDuringSchedulingIgnoredDuringExecution = append(pa.PreferredDuringSchedulingIgnoredDuringExecution,
				corev1.WeightedPodAffinityTerm{Weight: spreadWeight, PodAffinityTerm: term})
		}
	}
	return nil, nil
}

// dropSpread removes from d's template AMF's terms against d's own pods: a
// standby copied from its primary would otherwise avoid itself.
func dropSpread(d, primary *appsv1.Deployment) error {
	sel, ok, err := podsOf(d, primary)
	if err != nil || !ok {
		return err
	}
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return nil
	}
	term := corev1.PodAffinityTerm{LabelSelector: sel, TopologyKey: corev1.LabelHostname}
	pa := a.PodAntiAffinity
	pa.RequiredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution,
		func(t corev1.PodAffinityTerm) bool { return equality.Semantic.DeepEqual(t, term) })
	pa.PreferredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.PreferredDuringSchedulingIgnoredDuringExecution,
		func(w corev1.WeightedPodAffinityTerm) bool {
			return equality.Semantic.DeepEqual(w.PodAffinityTerm, term)
		})
	if len(pa.RequiredDuringSchedulingIgnoredDuringExecution) == 0 && len(pa.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution = nil, nil
		a.PodAntiAffinity = nil
		if equality.Semantic.DeepEqual(*a, corev1.Affinity{}) {
			d.Spec.Template.Spec.Affinity = nil
		}
	}
	return nil
}

// podsOf is a label selector of the pods of d and of none of other's: d's
// own selector, and where that matches other's pods too (a standby told
// apart only by amf.io/standby-of), also the absence of a label only
// other's pods carry. ok is false when no such label exists.
func podsOf(d, other *appsv1.Deployment) (sel *metav1.LabelSelector, ok bool, err error) {
	if d.Spec.Selector == nil {
		return nil, false, fmt.Errorf("the Deployment %s has no selector", d.Name)
	}
	sel = d.Spec.Selector.DeepCopy()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, false, fmt.Errorf("the selector of Deployment %s: %w", d.Name, err)
	}
	theirs := other.Spec.Template.Labels
	if !s.Matches(labels.Set(theirs)) {
		return sel, true, nil
	}
	var only []string // label keys of other's pods that d's pods lack
	for k := range theirs {
		if _, mine := d.Spec.Template.Labels[k]; !mine {
			only = append(only, k)
		}
	}
	if len(only) == 0 {
		return nil, false, nil
	}
	slices.Sort(only)
	k := only[0]
	if slices.Contains(only, LabelStandbyOf) {
		k = LabelStandbyOf
	}
	sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpDoesNotExist})
	return sel, true, nil
}

// marshal writes d as YAML without status and null timestamps.
func marshal(d *appsv1.Deployment) ([]byte, error) {
	d = d.DeepCopy()
	d.APIVersion, d.Kind = "apps/v1", "Deployment"
	// Written by the server (kubectl get -o yaml): the output is a manifest to
	// apply, not an update of that snapshot.
	d.UID, d.ResourceVersion, d.Generation, d.ManagedFields = "", "", 0, nil
	d.CreationTimestamp = metav1.Time{}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
	if err != nil {
		return nil, err
	}
	delete(u, "status")
	if spec, _ := u["spec"].(map[string]any); spec != nil {
		if st, _ := spec["strategy"].(map[string]any); st != nil && len(st) == 0 {
			delete(spec, "strategy")
		}
	}
	for _, path := range [][]string{{"metadata"}, {"spec", "template", "metadata"}} {
		m := u
		for _, p := range path {
			m, _ = m[p].(map[string]any)
		}
		if m != nil && m["creationTimestamp"] == nil {
			delete(m, "creationTimestamp")
		}
	}
	return yaml.Marshal(u)
}
