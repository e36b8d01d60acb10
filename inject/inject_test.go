package inject_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/controlplane"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml with the current output")

// goldenCases inject testdata/<name>.in.yaml (or in) and compare with
// testdata/<case>.golden.yaml.
var goldenCases = []struct {
	name, in string
	opts     inject.Options
}{
	{name: "plain-deployment-gets-sidecar-and-policy", in: "mosquitto", opts: inject.Options{}},
	{name: "standby-is-written-cold-after-its-primary", in: "mosquitto", opts: inject.Options{Standby: true}},
	{name: "other-kinds-pass-through-and-existing-policy-is-kept", in: "multi", opts: inject.Options{Standby: true}},
	{name: "older-sidecar-of-same-repository-is-updated", in: "upgrade", opts: inject.Options{}},
	{name: "list-is-written-as-its-items", in: "list", opts: inject.Options{Standby: true}},
	{name: "custom-image-and-probe", in: "mosquitto", opts: inject.Options{SidecarImage: "registry.local/amf-sidecar:dev", ProbeMQTT: "tcp://127.0.0.1:1884"}},
	{name: "hot-pair-sidecars-can-pause-their-broker-for-the-fence", in: "hot", opts: inject.Options{Standby: true}},
	{name: "model-name-is-passed-to-both-sidecars", in: "mosquitto", opts: inject.Options{Standby: true, Model: "leadtime"}},
	{name: "broker-beside-an-exporter-is-the-mqtt-port-and-gets-the-kubelet-logs", in: "exporter", opts: inject.Options{Standby: true}},
	{name: "container-flag-names-the-broker-among-app-containers-and-a-native-sidecar", in: "unnamed-ports", opts: inject.Options{Container: "broker"}},
	{name: "node-mode-annotates-primary-and-standby-and-leaves-the-pod-template", in: "exporter", opts: inject.Options{Mode: contract.ModeNode, Standby: true, Model: "leadtime"}},
	{name: "spread-required-keeps-the-pair-on-two-nodes-or-the-standby-pending", in: "mosquitto", opts: inject.Options{Standby: true, Spread: inject.SpreadRequired}},
	{name: "users-affinity-is-kept-and-the-spread-merged-into-it", in: "affinity", opts: inject.Options{Standby: true}},
	{name: "standby-gets-a-claim-of-its-own-like-the-primarys", in: "claim", opts: inject.Options{Standby: true}},
	{name: "state-dir-gives-both-sidecars-the-brokers-data-and-user", in: "claim", opts: inject.Options{Standby: true, StateDir: "/mosquitto/data"}},
	{name: "admission-labels-both-templates-for-the-policy-and-writes-no-sidecar", in: "claim", opts: inject.Options{Admission: true, Standby: true, Model: "leadtime", StateDir: "/mosquitto/data"}},
}

func TestInjectGolden(t *testing.T) {
	for _, tt := range goldenCases {
		t.Run(tt.name, func(t *testing.T) {
			got := mustInject(t, read(t, tt.in+".in.yaml"), tt.opts)
			golden := filepath.Join("testdata", tt.name+".golden.yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./inject -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s (go test ./inject -update rewrites it):\n%s", golden, got)
			}
		})
	}
}

func TestInjectTwiceIsInjectOnce(t *testing.T) {
	for _, tt := range goldenCases {
		t.Run(tt.name, func(t *testing.T) {
			once := mustInject(t, read(t, tt.in+".in.yaml"), tt.opts)
			twice := mustInject(t, once, tt.opts)
			if !bytes.Equal(once, twice) {
				t.Errorf("second injection changed the output:\n--- once\n%s\n--- twice\n%s", once, twice)
			}
		})
	}
}

func TestOtherKindsPassThroughByteForByte(t *testing.T) {
	in := read(t, "multi.in.yaml")
	out := mustInject(t, in, inject.Options{})
	docs := regexp.MustCompile(`(?m)^---$`).Split(string(in), -1)
	for _, d := range docs[:2] { // the ConfigMap and the Service
		if !strings.Contains(string(out), d) {
			t.Errorf("document not passed through unchanged:\n%s", d)
		}
	}
}

// TestExamplesAreInjectOutput keeps manifests/examples what inject writes:
// injecting them again changes nothing.
func TestExamplesAreInjectOutput(t *testing.T) {
	var in []byte
	for _, f := range []string{"broker-a.yaml", "broker-b-standby.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "manifests", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		in = append(append(in, b...), "\n---\n"...)
	}
	out := mustInject(t, in, inject.Options{Standby: true})
	before, after := deployments(t, in), deployments(t, out)
	if len(after) != len(before) {
		t.Fatalf("inject --standby wrote %d Deployments for the %d of the examples", len(after), len(before))
	}
	for i := range before {
		if !equality.Semantic.DeepEqual(before[i], after[i]) {
			a, _ := yaml.Marshal(before[i])
			b, _ := yaml.Marshal(after[i])
			t.Errorf("manifests/examples Deployment %s is not inject's output:\n--- example\n%s\n--- injected\n%s", before[i].Name, a, b)
		}
	}
}

func TestInjectRefuses(t *testing.T) {
	const header = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: b\nspec:\n  selector:\n    matchLabels: {app: b}\n  template:\n    metadata:\n      labels: {app: b}\n    spec:\n"
	for _, tt := range []struct {
		name, in string
		opts     inject.Options
		want     string
	}{
		{"sidecar-name-with-another-image", header + "      initContainers: [{name: amf-sidecar, image: example.com/other:1}]\n      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{}, `init container "amf-sidecar" has image "example.com/other:1", not the sidecar`},
		{"regular-container-named-like-the-sidecar", header + "      containers: [{name: amf-sidecar, image: ghcr.io/amf-edge/amf-sidecar:v0.1.0}]\n",
			inject.Options{}, `container "amf-sidecar" is a regular container`},
		{"two-app-containers-and-no-mqtt-port", header + "      containers: [{name: m, image: eclipse-mosquitto:2}, {name: exporter, image: x:1}]\n",
			inject.Options{}, `the pod has 2 containers (m, exporter) and none exposes a port named "mqtt": pass the broker's with --container`},
		{"two-mqtt-ports", header + "      containers: [{name: a, image: m:2, ports: [{name: mqtt, containerPort: 1883}]}, {name: b, image: m:2, ports: [{name: mqtt, containerPort: 1884}]}]\n",
			inject.Options{}, `the pod has 2 containers (a, b) and a, b all expose a port named "mqtt"`},
		{"container-flag-names-nothing", header + "      containers: [{name: m, image: eclipse-mosquitto:2}, {name: exporter, image: x:1}]\n",
			inject.Options{Container: "mosquitto"}, `no container "mosquitto" to watch: the pod's containers are m, exporter`},
		{"logs-volume-name-taken", header + "      containers: [{name: m, image: eclipse-mosquitto:2, ports: [{name: mqtt, containerPort: 1883}]}, {name: exporter, image: x:1}]\n      volumes: [{name: amf-container-logs, emptyDir: {}}]\n",
			inject.Options{}, `volume "amf-container-logs" exists and is not the sidecar's`},
		{"host-network", header + "      hostNetwork: true\n      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{}, "hostNetwork pods are not supported"},
		{"volume-name-taken", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n      volumes: [{name: amf-token, emptyDir: {}}]\n",
			inject.Options{}, `volume "amf-token" exists and is not the sidecar's`},
		{"invalid-policy", strings.Replace(header, "  name: b\n", "  name: b\n  annotations: {amf.io/redundancy: warm}\n", 1) + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{}, "amf.io/redundancy"},
		{"standby-of-redundancy-none", strings.Replace(header, "  name: b\n", "  name: b\n  annotations: {amf.io/redundancy: none}\n", 1) + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Standby: true}, "amf.io/redundancy=none: no standby to write"},
		{"unknown-field", header + "      containers: [{name: m, image: eclipse-mosquitto:2, imagePullPolicyy: Always}]\n",
			inject.Options{}, "not an apps/v1 Deployment this version knows"},
		{"old-api-version", "apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata:\n  name: old\n",
			inject.Options{}, "only apps/v1 Deployments can be injected"},
		{"typed-list", "apiVersion: apps/v1\nkind: DeploymentList\nitems: []\n",
			inject.Options{}, "document 1 (DeploymentList): a apps/v1 DeploymentList is not injected"},
		{"bad-item-in-list", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: x}\n  spec: {bogus: 1}\n",
			inject.Options{}, "document 1 item 1 (Deployment x): not an apps/v1 Deployment"},
		{"not-yaml", "kind: [Deployment\n", inject.Options{}, "document 1: not YAML"},
		{"unknown-spread", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Standby: true, Spread: "always"}, `spread "always": want preferred or required`},
		{"sidecar-into-a-node-mode-deployment", strings.Replace(header, "  name: b\n", "  name: b\n  annotations: {amf.io/mode: node}\n", 1) + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{}, "the Deployment is in node mode (amf.io/mode=node)"},
		{"unknown-mode-annotation", strings.Replace(header, "  name: b\n", "  name: b\n  annotations: {amf.io/mode: daemon}\n", 1) + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{}, `amf.io/mode="daemon": want sidecar or node`},
		{"node-mode-over-an-injected-sidecar", header + "      initContainers: [{name: amf-sidecar, image: ghcr.io/amf-edge/amf-sidecar:v0.1.0}]\n      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Mode: contract.ModeNode}, "the pod template carries the amf-sidecar container: remove it before switching to node mode"},
		{"node-mode-cannot-tell-the-broker", header + "      containers: [{name: m, image: eclipse-mosquitto:2}, {name: exporter, image: x:1}]\n",
			inject.Options{Mode: contract.ModeNode}, `none exposes a port named "mqtt"`},
		{"node-mode-model-path", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Mode: contract.ModeNode, Model: "/m/model.txt"}, "in node mode the agent scores with a model embedded in its own image"},
		{"writable-claim-not-in-the-input", header + "      containers: [{name: m, image: eclipse-mosquitto:2, volumeMounts: [{name: data, mountPath: /mosquitto/data}]}]\n      volumes: [{name: data, persistentVolumeClaim: {claimName: b-data}}]\n",
			inject.Options{Standby: true}, `volume "data" mounts PersistentVolumeClaim "b-data" writable, which is not in the input: the standby needs a claim of its own`},
		{"pair-in-the-input-shares-a-writable-claim", header + "      containers: [{name: m, image: eclipse-mosquitto:2, volumeMounts: [{name: data, mountPath: /mosquitto/data}]}]\n      volumes: [{name: data, persistentVolumeClaim: {claimName: b-data}}]\n---\n" +
			strings.Replace(strings.Replace(header, "  name: b\n", "  name: b-standby\n  annotations: {amf.io/role: standby, amf.io/primary: b}\n", 1), "{app: b}", "{app: b, amf.io/standby-of: b}", 2) +
			"      containers: [{name: m, image: eclipse-mosquitto:2, volumeMounts: [{name: data, mountPath: /mosquitto/data}]}]\n      volumes: [{name: data, persistentVolumeClaim: {claimName: b-data}}]\n",
			inject.Options{}, `b and b-standby, a pair, both mount PersistentVolumeClaim "b-data" writable`},
		{"model-neither-embedded-nor-a-path", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Model: "bogus", EmbeddedModels: []string{"leadtime", "p1"}}, `model "bogus" is not embedded in the sidecar (leadtime, p1): give one of those, or the path of a model file inside the sidecar container (./bogus`},
		{"probe-that-is-not-a-url", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{ProbeMQTT: "not a url"}, `probe: broker URL "not a url": scheme must be one of`},
		{"broker-declaring-only-mqtts", header + "      containers: [{name: m, image: eclipse-mosquitto:2, ports: [{name: mqtts, containerPort: 8883}]}]\n",
			inject.Options{}, `the broker container m declares ports mqtts/8883, none named "mqtt" nor 1883: the sidecar's probe needs the broker's plain MQTT listener`},
		{"port-8086-taken", header + "      containers: [{name: m, image: eclipse-mosquitto:2, ports: [{containerPort: 1883}, {name: metrics, containerPort: 8086}]}]\n",
			inject.Options{}, `container "m" declares port 8086/TCP, where the sidecar serves its health endpoint`},
		{"no-containers", header + "      containers: []\n",
			inject.Options{}, "the pod template has no containers: there is no broker to watch"},
		{"no-containers-node-mode", header + "      containers: []\n",
			inject.Options{Mode: contract.ModeNode}, "the pod template has no containers: there is no broker to watch"},
		{"state-dir-without-a-volume-there", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{StateDir: "/mosquitto/data"}, "the broker container m mounts no volume at /mosquitto/data (--state-dir)"},
		{"state-dir-in-node-mode", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{StateDir: "/mosquitto/data", Mode: contract.ModeNode}, "node mode has none"},
		{"statefulset-alone", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: emqx\n",
			inject.Options{Standby: true}, "document 1 (StatefulSet emqx): a StatefulSet is not injected: AMF pairs a primary Deployment with a standby Deployment"},
		{"statefulset-in-a-stream-with-a-deployment", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: emqx\n",
			inject.Options{}, "document 2 (StatefulSet emqx): a StatefulSet is not injected"},
		{"admission-in-node-mode", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Admission: true, Mode: contract.ModeNode}, "admission is for the sidecar"},
		{"admission-with-a-model-path", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Admission: true, Model: "/models/mine.txt"}, "nothing can mount a model file into it"},
		{"admission-over-an-injected-sidecar", header + "      initContainers: [{name: amf-sidecar, image: ghcr.io/amf-edge/amf-sidecar:v0.1.0}]\n      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Admission: true}, "the admission policy leaves such pods as they are"},
		{"admission-what-inject-refuses", header + "      containers: [{name: m, image: eclipse-mosquitto:2}, {name: exporter, image: x:1}]\n",
			inject.Options{Admission: true}, `none exposes a port named "mqtt"`},
		{"admission-probe-annotation-that-is-not-a-url", strings.Replace(header, "      labels: {app: b}\n", "      labels: {app: b}\n      annotations: {amf.io/probe-mqtt: nope}\n", 1) + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Admission: true}, `amf.io/probe-mqtt: broker URL "nope"`},
		{"unknown-mode-option", header + "      containers: [{name: m, image: eclipse-mosquitto:2}]\n",
			inject.Options{Mode: "daemon"}, `mode "daemon": want sidecar or node`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := inject.Inject([]byte(tt.in), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if out != nil {
				t.Errorf("wrote output despite the error:\n%s", out)
			}
		})
	}
}

// TestNodeModeChangesOnlyTheDeploymentsAnnotations: what opting in writes
// must not restart a pod, so the pod template of every Deployment of the
// input is exactly the input's (a standby inject writes is new: its
// selector label and anti-affinity are its own).
func TestNodeModeChangesOnlyTheDeploymentsAnnotations(t *testing.T) {
	for _, in := range []string{"mosquitto", "exporter", "multi"} {
		t.Run(in, func(t *testing.T) {
			before := deployments(t, read(t, in+".in.yaml"))
			out := mustInject(t, read(t, in+".in.yaml"), inject.Options{Mode: contract.ModeNode, Standby: true})
			after := deployments(t, out)
			byName := map[string]appsv1.Deployment{}
			for _, d := range after {
				byName[d.Name] = d
			}
			for _, b := range before {
				a, ok := byName[b.Name]
				if !ok {
					t.Fatalf("Deployment %s missing from the output", b.Name)
				}
				if !equality.Semantic.DeepEqual(a.Spec.Template, b.Spec.Template) {
					t.Errorf("Deployment %s: pod template changed:\nbefore %+v\nafter  %+v", b.Name, b.Spec.Template, a.Spec.Template)
				}
				if a.Annotations[contract.AnnMode] != string(contract.ModeNode) {
					t.Errorf("Deployment %s: annotations %v lack %s=node", b.Name, a.Annotations, contract.AnnMode)
				}
				for k, v := range b.Annotations {
					if k != contract.AnnMode && a.Annotations[k] != v {
						t.Errorf("Deployment %s: annotation %s=%q became %q", b.Name, k, v, a.Annotations[k])
					}
				}
			}
			for _, d := range after {
				if d.Annotations[contract.AnnRole] == "standby" && d.Annotations[contract.AnnMode] != string(contract.ModeNode) {
					t.Errorf("standby %s is not in node mode: after a switchover its pods would go unwatched", d.Name)
				}
			}
			if again := mustInject(t, out, inject.Options{Mode: contract.ModeNode, Standby: true}); !bytes.Equal(again, out) {
				t.Errorf("second node-mode injection changed the output:\n%s", again)
			}
		})
	}
}

// TestSpreadKeepsEachOfAPairOffTheOthersNode: every Deployment of a pair
// gets one spread term, of the kind asked, whose selector picks the other's
// pods and not its own, however it was injected before: re-injected with
// the other kind (the old term replaced, not kept beside), or a primary
// injected earlier, injected alone again (its term, copied into the standby
// it writes, would make the standby avoid itself). In node mode only the
// written standby has one.
func TestSpreadKeepsEachOfAPairOffTheOthersNode(t *testing.T) {
	primaryAlone := func(t *testing.T, stream []byte) []byte {
		t.Helper()
		b, err := yaml.Marshal(deployments(t, stream)[0])
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tt := range []struct {
		name   string
		in     func(t *testing.T) []byte
		opts   inject.Options
		kind   inject.Spread
		termed []string // the Deployments with a term
	}{
		{"preferred by default", func(t *testing.T) []byte { return read(t, "mosquitto.in.yaml") },
			inject.Options{Standby: true}, inject.SpreadPreferred, []string{"mosquitto", "mosquitto-standby"}},
		{"preferred, re-injected as required: the term replaced", func(t *testing.T) []byte {
			return mustInject(t, read(t, "mosquitto.in.yaml"), inject.Options{Standby: true})
		}, inject.Options{Standby: true, Spread: inject.SpreadRequired}, inject.SpreadRequired, []string{"mosquitto", "mosquitto-standby"}},
		{"required, re-injected as preferred", func(t *testing.T) []byte {
			return mustInject(t, read(t, "exporter.in.yaml"), inject.Options{Standby: true, Spread: inject.SpreadRequired})
		}, inject.Options{Standby: true}, inject.SpreadPreferred, []string{"mosquitto", "mosquitto-standby"}},
		{"a primary injected before, alone again: its standby avoids the primary, not itself", func(t *testing.T) []byte {
			return primaryAlone(t, mustInject(t, read(t, "mosquitto.in.yaml"), inject.Options{Standby: true}))
		}, inject.Options{Standby: true}, inject.SpreadPreferred, []string{"mosquitto", "mosquitto-standby"}},
		{"a pair both in the stream (the examples without their affinity)", func(t *testing.T) []byte {
			var stream []byte
			for _, f := range []string{"broker-a.yaml", "broker-b-standby.yaml"} {
				b, err := os.ReadFile(filepath.Join("..", "manifests", "examples", f))
				if err != nil {
					t.Fatal(err)
				}
				d := deployments(t, b)[0]
				d.Spec.Template.Spec.Affinity = nil
				if b, err = yaml.Marshal(d); err != nil {
					t.Fatal(err)
				}
				stream = append(append(stream, b...), "---\n"...)
			}
			return stream
		}, inject.Options{Standby: true}, inject.SpreadPreferred, []string{"edge-broker-a", "edge-broker-b"}},
		{"node mode: the written standby only", func(t *testing.T) []byte { return read(t, "mosquitto.in.yaml") },
			inject.Options{Standby: true, Mode: contract.ModeNode}, inject.SpreadPreferred, []string{"mosquitto-standby"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := deployments(t, mustInject(t, tt.in(t), tt.opts))
			byName := map[string]appsv1.Deployment{}
			for _, d := range out {
				byName[d.Name] = d
			}
			partner := func(d appsv1.Deployment) (appsv1.Deployment, bool) {
				if s := d.Annotations[contract.AnnStandby]; s != "" {
					p, ok := byName[s]
					return p, ok
				}
				p, ok := byName[d.Annotations[contract.AnnPrimary]]
				return p, ok
			}
			var termed []string
			for _, d := range out {
				terms := spreadTerms(d)
				other, paired := partner(d)
				if len(terms) == 0 {
					continue
				}
				termed = append(termed, d.Name)
				if !paired || len(terms) != 1 {
					t.Errorf("%s: spread terms %+v, want one against its partner (%v)", d.Name, terms, paired)
					continue
				}
				if terms[0].kind != tt.kind || terms[0].term.TopologyKey != corev1.LabelHostname {
					t.Errorf("%s: a %s term by %s, want %s by %s", d.Name, terms[0].kind, terms[0].term.TopologyKey, tt.kind, corev1.LabelHostname)
				}
				sel, err := metav1.LabelSelectorAsSelector(terms[0].term.LabelSelector)
				if err != nil {
					t.Fatal(err)
				}
				if !sel.Matches(labels.Set(other.Spec.Template.Labels)) || sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("%s: selector %s, want one matching %s's pods %v and not its own %v", d.Name, sel, other.Name, other.Spec.Template.Labels, d.Spec.Template.Labels)
				}
			}
			slices.Sort(termed)
			slices.Sort(tt.termed)
			if !slices.Equal(termed, tt.termed) {
				t.Errorf("Deployments with a spread term %q, want %q", termed, tt.termed)
			}
		})
	}
}

type spreadTerm struct {
	kind inject.Spread
	term corev1.PodAffinityTerm
}

// spreadTerms are d's pod anti-affinity terms by hostname whose selector
// carries an app label of a broker (the inputs' own terms have other labels).
func spreadTerms(d appsv1.Deployment) []spreadTerm {
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return nil
	}
	var out []spreadTerm
	for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		out = append(out, spreadTerm{inject.SpreadRequired, t})
	}
	for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		if w.Weight != 100 {
			continue // the user's
		}
		out = append(out, spreadTerm{inject.SpreadPreferred, w.PodAffinityTerm})
	}
	return out
}

func TestSidecarModelArgument(t *testing.T) {
	for _, tt := range []struct {
		name     string
		model    string
		wantArg  string // "" = no --model
		wantWarn string // "" = no warning about the model
	}{
		{"no model: the image's default", "", "", ""},
		{"an embedded name", "leadtime", "--model=leadtime", ""},
		{"a path must be mounted", "/models/m.txt", "--model=/models/m.txt", "mount the model file and its manifest (/models/m.manifest.json) into the amf-sidecar container of mosquitto, mosquitto-standby"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, res, err := inject.Inject(read(t, "mosquitto.in.yaml"), inject.Options{Standby: true, Model: tt.model})
			if err != nil {
				t.Fatal(err)
			}
			deps := deployments(t, out)
			if len(deps) != 2 {
				t.Fatalf("%d Deployments, want the primary and its standby", len(deps))
			}
			for _, d := range deps {
				var models []string
				for _, a := range d.Spec.Template.Spec.InitContainers[0].Args {
					if strings.HasPrefix(a, "--model") {
						models = append(models, a)
					}
				}
				if want := []string{tt.wantArg}; (tt.wantArg == "" && len(models) != 0) || (tt.wantArg != "" && !slices.Equal(models, want)) {
					t.Errorf("%s: sidecar model arguments %q, want %q", d.Name, models, tt.wantArg)
				}
			}
			var warned []string
			for _, w := range res.Warnings {
				if strings.Contains(w, "model") {
					warned = append(warned, w)
				}
			}
			if (tt.wantWarn == "") != (len(warned) == 0) || (tt.wantWarn != "" && (len(warned) != 1 || !strings.Contains(warned[0], tt.wantWarn))) {
				t.Errorf("model warnings %q, want one saying %q", warned, tt.wantWarn)
			}
		})
	}
}

func TestInjectWarnsWhenTheBrokerHasNoLimits(t *testing.T) {
	const pod = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: b\nspec:\n  selector:\n    matchLabels: {app: b}\n  template:\n    metadata:\n      labels: {app: b}\n    spec:\n      containers: [{name: m, image: eclipse-mosquitto:2%s}]\n"
	for _, tt := range []struct {
		name, resources string
		want            []string // one warning each
	}{
		{"both limits", ", resources: {limits: {memory: 100Mi, cpu: 500m}}", nil},
		{"requests only", ", resources: {requests: {memory: 50Mi, cpu: 250m}}", []string{"no memory limit", "no CPU limit"}},
		{"memory only", ", resources: {limits: {memory: 100Mi}}", []string{"no CPU limit"}},
		{"none", "", []string{"no memory limit", "no CPU limit"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, res, err := inject.Inject([]byte(fmt.Sprintf(pod, tt.resources)), inject.Options{})
			if err != nil || out == nil {
				t.Fatalf("inject failed: %v (a missing limit is a warning, not a refusal)", err)
			}
			if len(res.Warnings) != len(tt.want) {
				t.Fatalf("warnings %q, want %d", res.Warnings, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(res.Warnings[i], "Deployment b: broker container m has "+w) || !strings.Contains(res.Warnings[i], "LimitRange") {
					t.Errorf("warning %q does not say %q", res.Warnings[i], w)
				}
			}
		})
	}
	if _, res, _ := inject.Inject(read(t, "exporter.in.yaml"), inject.Options{}); len(res.Warnings) != 0 {
		t.Errorf("warnings %q for a limited broker beside an exporter", res.Warnings)
	}
}

// Re-injecting (an upgrade) keeps the container the sidecar watches and
// follows the pod's company: the kubelet logs go with the exporter.
func TestReinjectionKeepsTheWatchedContainer(t *testing.T) {
	once := mustInject(t, read(t, "unnamed-ports.in.yaml"), inject.Options{Container: "metrics"})
	again := mustInject(t, once, inject.Options{})
	if args := sidecarArgs(t, again); !slices.Contains(args, "--container=metrics") {
		t.Errorf("re-injected sidecar args %q, want --container=metrics kept", args)
	}

	alone := deployments(t, mustInject(t, read(t, "exporter.in.yaml"), inject.Options{}))[0]
	if args := alone.Spec.Template.Spec.InitContainers[0].Args; !slices.Contains(args, "--container=mosquitto") || !slices.Contains(args, "--host-container-logs=/host/var/log/containers") {
		t.Fatalf("sidecar args %q, want the broker by name and the kubelet logs", args)
	}
	alone.Spec.Template.Spec.Containers = slices.DeleteFunc(alone.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "exporter" })
	b, err := yaml.Marshal(alone)
	if err != nil {
		t.Fatal(err)
	}
	d := deployments(t, mustInject(t, b, inject.Options{}))[0]
	if args := d.Spec.Template.Spec.InitContainers[0].Args; slices.Contains(args, "--host-container-logs=/host/var/log/containers") {
		t.Errorf("alone again, sidecar args %q still read the kubelet logs", args)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == inject.LogsVolume {
			t.Errorf("alone again, the pod still mounts %s", v.Name)
		}
	}
}

// The host path inject mounts is the directory the sidecar's discovery reads.
func TestKubeletLogDirIsTheSidecars(t *testing.T) {
	if inject.KubeletLogDir != cgroup.ContainerLogDir {
		t.Errorf("inject mounts %s, the sidecar reads the kubelet's %s", inject.KubeletLogDir, cgroup.ContainerLogDir)
	}
}

func sidecarArgs(t *testing.T, stream []byte) []string {
	t.Helper()
	return deployments(t, stream)[0].Spec.Template.Spec.InitContainers[0].Args
}

// TestStandbyWarningsSayWhatThePairShares: the shared-configuration warning
// names what is shared and appears only when something is; Recreate is said
// for what it means to the pair; a claim left shared is one read-only.
func TestStandbyWarningsSayWhatThePairShares(t *testing.T) {
	claim := string(read(t, "claim.in.yaml"))
	for _, tt := range []struct {
		name, in string
		want     []string // one warning containing each, in this order
	}{
		{"configmap-is-named", string(read(t, "mosquitto.in.yaml")),
			[]string{"standby mosquitto-standby shares ConfigMap mosquitto with mosquitto: where they set MQTT client IDs"}},
		{"claim-alone-shares-nothing-and-recreate-is-said", claim,
			[]string{"mosquitto has strategy Recreate, kept, and mosquitto-standby gets it too: a rollout stops the old pod before the new one starts, which an orderly stop does not make a switchover: with a cold standby its clients wait for the new pod"}},
		{"hot-pair-recreate", strings.Replace(claim, "  name: mosquitto\n  namespace: mqtt\n  labels:\n    app.kubernetes.io/name: mosquitto\n    app.kubernetes.io/instance", "  name: mosquitto\n  namespace: mqtt\n  annotations: {amf.io/redundancy: hot}\n  labels:\n    app.kubernetes.io/name: mosquitto\n    app.kubernetes.io/instance", 1),
			[]string{"the hot standby mosquitto-standby serves its clients meanwhile"}},
		{"read-only-claim-and-secret-are-shared", strings.NewReplacer("            - name: data\n              mountPath: /mosquitto/data\n",
			"            - name: data\n              mountPath: /mosquitto/data\n              readOnly: true\n          envFrom: [{secretRef: {name: mqtt-users}}]\n").Replace(claim),
			[]string{"standby mosquitto-standby shares Secret mqtt-users, PersistentVolumeClaim mosquitto-data (read-only) with mosquitto", "strategy Recreate"}},
		{"claim-of-no-class", strings.Replace(claim, "storageClassName: local-path", `storageClassName: ""`, 1),
			[]string{`claim data-mosquitto-standby of standby mosquitto-standby has storageClassName "" as mosquitto-data has: nothing provisions it`, "strategy Recreate"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, res, err := inject.Inject([]byte(tt.in), inject.Options{Standby: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Standbys) != 1 || res.Standbys[0] != "mosquitto-standby" {
				t.Errorf("standbys %q, want mosquitto-standby", res.Standbys)
			}
			if len(res.Warnings) != len(tt.want) {
				t.Fatalf("warnings %q, want %d", res.Warnings, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(res.Warnings[i], w) {
					t.Errorf("warning %d %q, want one containing %q", i, res.Warnings[i], w)
				}
			}
		})
	}
}

// TestInjectedOutputAcceptedByAPIServer applies every golden output (and the
// examples re-injected) with server-side dry-run on a real API server.
func TestInjectedOutputAcceptedByAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kubectl(ctx, nil, "create", "namespace", "mqtt"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range goldenCases {
		t.Run(tt.name, func(t *testing.T) {
			out := mustInject(t, read(t, tt.in+".in.yaml"), tt.opts)
			res, err := cp.Kubectl(ctx, bytes.NewReader(out), "apply", "--server-side", "--dry-run=server", "--field-manager=amf-inject-test", "-f", "-")
			if err != nil {
				t.Fatal(err)
			}
			docs := len(regexp.MustCompile(`(?m)^---$`).Split(string(out), -1))
			if n := strings.Count(string(res), "(server dry run)"); n != docs {
				t.Errorf("server checked %d objects, want %d:\n%s", n, docs, res)
			}
		})
	}
}

// runningBroker starts a real control plane with the Mosquitto Deployment
// of mosquitto.in.yaml rolled out in namespace mqtt, and returns kubectl on
// it (failing the test on an error) for the rest of the test.
func runningBroker(t *testing.T) (context.Context, *controlplane.ControlPlane, func(stdin []byte, args ...string) []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(stdin []byte, args ...string) []byte {
		t.Helper()
		out, err := cp.Kubectl(ctx, bytes.NewReader(stdin), args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	kubectl(nil, "create", "namespace", "mqtt")
	kubectl(read(t, "mosquitto.in.yaml"), "apply", "-f", "-")
	kubectl(nil, "-n", "mqtt", "rollout", "status", "deployment/mosquitto", "--timeout=60s")
	return ctx, cp, kubectl
}

// TestInjectIntoRunningDeployment follows the README: a running broker,
// kubectl get deployments -o yaml | amf-agent inject | kubectl apply -f -, and its pod is
// replaced by one with the native sidecar and the readiness gate.
func TestInjectIntoRunningDeployment(t *testing.T) {
	ctx, cp, kubectl := runningBroker(t)

	live := kubectl(nil, "-n", "mqtt", "get", "deployments", "-o", "yaml") // a v1 List
	injected := mustInject(t, live, inject.Options{Standby: true})
	kubectl(injected, "apply", "-f", "-")
	kubectl(nil, "-n", "mqtt", "rollout", "status", "deployment/mosquitto", "--timeout=60s")

	pods, err := cp.Client().CoreV1().Pods("mqtt").List(ctx, metav1.ListOptions{LabelSelector: "app=mosquitto"})
	if err != nil {
		t.Fatal(err)
	}
	var running []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		running = append(running, p.Name)
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != inject.SidecarName || len(p.Spec.ReadinessGates) != 1 {
			t.Errorf("pod %s: init containers %v, readiness gates %v; want the sidecar and amf.io/healthy", p.Name, p.Spec.InitContainers, p.Spec.ReadinessGates)
		}
	}
	if len(running) != 1 {
		t.Errorf("pods %v, want one (the cold standby has 0 replicas)", running)
	}
	standby, err := cp.Client().AppsV1().Deployments("mqtt").Get(ctx, "mosquitto-standby", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *standby.Spec.Replicas != 0 {
		t.Errorf("standby has %d replicas, want 0", *standby.Spec.Replicas)
	}
}

func mustInject(t *testing.T, in []byte, opts inject.Options) []byte {
	t.Helper()
	out, _, err := inject.Inject(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deployments decodes the Deployments of a stream, in order.
func deployments(t *testing.T, stream []byte) []appsv1.Deployment {
	t.Helper()
	var ds []appsv1.Deployment
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(stream), -1) {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		if d.Kind == "Deployment" {
			ds = append(ds, d)
		}
	}
	return ds
}

// TestNodeModeOptInRestartsNoPod applies node mode's output to a running
// Deployment on the real API server: the same pod keeps running (no new
// ReplicaSet, no new pod), and the Deployment carries amf.io/mode=node.
func TestNodeModeOptInRestartsNoPod(t *testing.T) {
	ctx, cp, kubectl := runningBroker(t)
	podUIDs := func() []string {
		t.Helper()
		pods, err := cp.Client().CoreV1().Pods("mqtt").List(ctx, metav1.ListOptions{LabelSelector: "app=mosquitto"})
		if err != nil {
			t.Fatal(err)
		}
		var uids []string
		for _, p := range pods.Items {
			uids = append(uids, string(p.UID))
		}
		slices.Sort(uids)
		return uids
	}
	before := podUIDs()
	d0, err := cp.Client().AppsV1().Deployments("mqtt").Get(ctx, "mosquitto", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	live := kubectl(nil, "-n", "mqtt", "get", "deployment", "mosquitto", "-o", "yaml")
	kubectl(mustInject(t, live, inject.Options{Mode: contract.ModeNode, Standby: true}), "apply", "-f", "-")
	kubectl(nil, "-n", "mqtt", "rollout", "status", "deployment/mosquitto", "--timeout=60s")

	d1, err := cp.Client().AppsV1().Deployments("mqtt").Get(ctx, "mosquitto", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d1.Annotations[contract.AnnMode] != "node" {
		t.Errorf("annotations %v lack %s=node", d1.Annotations, contract.AnnMode)
	}
	// The generation moves (the API server bumps it for annotations too, as
	// the Deployment controller copies them to the ReplicaSet); the pod
	// template, and so its ReplicaSet, must not.
	if !equality.Semantic.DeepEqual(d0.Spec.Template, d1.Spec.Template) {
		t.Errorf("pod template changed:\n%+v\n%+v", d0.Spec.Template, d1.Spec.Template)
	}
	rss, err := cp.Client().AppsV1().ReplicaSets("mqtt").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var owned []string
	for _, rs := range rss.Items {
		if ref := metav1.GetControllerOf(&rs); ref != nil && ref.UID == d0.UID {
			owned = append(owned, rs.Name)
		}
	}
	if len(owned) != 1 {
		t.Errorf("ReplicaSets of the primary %v, want the one from before", owned)
	}
	if after := podUIDs(); !slices.Equal(before, after) || len(after) != 1 {
		t.Errorf("pods %v before, %v after: opting in must restart nothing", before, after)
	}
}

func TestHotBrokerWithoutANonRootUserIsWarnedAndNotShared(t *testing.T) {
	base, err := os.ReadFile("testdata/hot.in.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"the image's user", "        runAsUser: 1883\n", "", "not in the pod template"},
		{"root", "        runAsUser: 1883\n", "        runAsUser: 0\n", "is root"},
		{"cold: nothing to fence", "amf.io/redundancy: hot", "amf.io/redundancy: cold", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := strings.Replace(string(base), tc.from, tc.to, 1)
			out, res, err := inject.Inject([]byte(in), inject.Options{Standby: true})
			if err != nil {
				t.Fatal(err)
			}
			var warned []string
			for _, w := range res.Warnings {
				if strings.Contains(w, "fences") {
					warned = append(warned, w)
				}
			}
			if tc.want == "" && len(warned) > 0 || tc.want != "" && (len(warned) != 1 || !strings.Contains(warned[0], tc.want)) {
				t.Errorf("fence warnings %q, want one saying %q", warned, tc.want)
			}
			if strings.Contains(string(out), "shareProcessNamespace") {
				t.Error("the process namespace is shared without a sidecar that could use it")
			}
		})
	}
}

// TestTheRealSchedulerKeepsTheSpreadPairOffOneNode applies inject --standby's
// output for a hot pair (both running) to a real control plane with two kwok
// nodes and its real scheduler, and reads where the pods went. One node is
// made the one the scheduler's resource scores prefer (a filler pod takes
// most of the other's CPU), so without the spread both go there (checked:
// the terms stripped), and with it, preferred or required, they go to two
// nodes. In node mode the primary's template has no term: after both are
// placed, the filler moves to the primary's node and its pod is deleted;
// the replacement stays off the standby's node all the same, as the
// scheduler keeps an existing pod's anti-affinity for an incoming one. With
// one node schedulable (the other cordoned), preferred puts both on it and
// required leaves the standby Pending, unschedulable.
func TestTheRealSchedulerKeepsTheSpreadPairOffOneNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(stdin []byte, args ...string) {
		t.Helper()
		if _, err := cp.Kubectl(ctx, bytes.NewReader(stdin), args...); err != nil {
			t.Fatal(err)
		}
	}
	kubectl(nil, "create", "namespace", "mqtt")
	cs := cp.Client()
	// hotPair is mosquitto.in.yaml as Deployment name, hot, injected.
	hotPair := func(t *testing.T, name string, opts inject.Options, strip bool) []byte {
		t.Helper()
		d := deployments(t, read(t, "mosquitto.in.yaml"))[0]
		d.Name, d.Labels = name, map[string]string{"app": name}
		d.Spec.Selector.MatchLabels = map[string]string{"app": name}
		d.Spec.Template.Labels = map[string]string{"app": name}
		d.Annotations = map[string]string{contract.AnnRedundancy: string(contract.Hot)}
		b, err := yaml.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		opts.Standby = true
		out := mustInject(t, b, opts)
		if !strip {
			return out
		}
		var stream []byte
		for _, d := range deployments(t, out) {
			d.Spec.Template.Spec.Affinity = nil
			b, err := yaml.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			stream = append(append(stream, b...), "---\n"...)
		}
		return stream
	}
	// filler takes 24 of the 32 CPUs of node until the test's end or the
	// returned removal.
	filler := func(t *testing.T, name, node string) (remove func()) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mqtt"}, Spec: corev1.PodSpec{NodeName: node,
			Containers: []corev1.Container{{Name: "busy", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("24")}}}}}}
		if _, err := cs.CoreV1().Pods("mqtt").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		remove = func() {
			once.Do(func() {
				if err := cs.CoreV1().Pods("mqtt").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
					t.Error(err)
				}
			})
		}
		t.Cleanup(remove)
		return remove
	}
	// placed waits for the one live pod matching selector to be scheduled
	// (its node) or found unschedulable ("").
	placed := func(t *testing.T, selector string) (pod, node string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", "mqtt", func(o *metav1.ListOptions) { o.LabelSelector = selector })
		_, err := watchtools.UntilWithSync(wctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.DeletionTimestamp != nil || ev.Type == watch.Deleted {
				return false, nil
			}
			if p.Spec.NodeName != "" {
				pod, node = p.Name, p.Spec.NodeName
				return true, nil
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					pod = p.Name
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("no pod of %s placed: %v", selector, err)
		}
		return pod, node
	}
	primaryOf := func(name string) string { return "app=" + name + ",!" + inject.LabelStandbyOf }
	standbyOf := func(name string) string { return "app=" + name + "," + inject.LabelStandbyOf + "=" + name }
	remove := func(t *testing.T, name string) {
		t.Helper()
		kubectl(nil, "-n", "mqtt", "delete", "deployment", name, name+"-standby", "--wait=false")
	}
	free, full := cp.Nodes[0], cp.Nodes[1]

	for i, tt := range []struct {
		name  string
		opts  inject.Options
		strip bool // the spread terms removed: the control
	}{
		{"without the spread: both on the node the resources prefer", inject.Options{}, true},
		{"preferred: two nodes", inject.Options{}, false},
		{"required: two nodes", inject.Options{Spread: inject.SpreadRequired}, false},
		{"node mode, the standby's term only: two nodes, the primary's new pod too", inject.Options{Mode: contract.ModeNode}, false},
	} {
		t.Run("two nodes/"+tt.name, func(t *testing.T) {
			name := fmt.Sprintf("spread-%d", i)
			unfill := filler(t, name+"-filler", full)
			kubectl(hotPair(t, name, tt.opts, tt.strip), "apply", "-f", "-")
			defer remove(t, name)
			pp, pn := placed(t, primaryOf(name))
			_, sn := placed(t, standbyOf(name))
			switch {
			case tt.strip:
				if pn != free || sn != free {
					t.Fatalf("without the spread: primary on %q, standby on %q; want both on %s, which the resources prefer (else this test shows nothing)", pn, sn, free)
				}
				return
			case pn == "" || sn == "" || pn == sn:
				t.Fatalf("primary on %q, standby on %q: want two nodes", pn, sn)
			}
			if tt.opts.Mode != contract.ModeNode {
				return
			}
			unfill()
			filler(t, name+"-filler-2", pn) // the resources now prefer the standby's node
			kubectl(nil, "-n", "mqtt", "delete", "pod", pp, "--wait=false")
			if p2, n2 := placed(t, primaryOf(name)); p2 == pp || n2 != pn {
				t.Errorf("the primary's pod replaced by %s on %q, want a new one off the standby's node %s", p2, n2, sn)
			}
		})
	}

	kubectl(nil, "cordon", full)
	for _, tt := range []struct {
		name    string
		opts    inject.Options
		pending bool
	}{
		{"preferred: both on it", inject.Options{}, false},
		// The two Deployments' pods reach the scheduler in no set order,
		// and a required anti-affinity holds both ways (an existing pod's
		// term applies to an incoming one): the one placed first runs,
		// the other stays Pending, whichever it is.
		{"required: one of the two Pending", inject.Options{Spread: inject.SpreadRequired}, true},
	} {
		t.Run("one node/"+tt.name, func(t *testing.T) {
			name := fmt.Sprintf("one-node-%v", tt.pending)
			kubectl(hotPair(t, name, tt.opts, false), "apply", "-f", "-")
			defer remove(t, name)
			_, pn := placed(t, primaryOf(name))
			_, sn := placed(t, standbyOf(name))
			switch {
			case tt.pending && (pn == "") == (sn == ""):
				t.Errorf("primary on %q, standby on %q: want one on %s and the other Pending (the required spread)", pn, sn, free)
			case tt.pending && pn+sn != free:
				t.Errorf("primary on %q, standby on %q: want the one placed on the one schedulable node %s", pn, sn, free)
			case !tt.pending && (pn != free || sn != free):
				t.Errorf("primary on %q, standby on %q: want both on %s (the only node)", pn, sn, free)
			}
		})
	}
}
