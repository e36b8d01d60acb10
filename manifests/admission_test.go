package manifests_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"

	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/controlplane"
)

const admissionLayout = "overlays/admission"

// warnings collects the API server's warnings per client.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// admission is the overlay applied to a real API server, with a client
// whose warnings the test reads.
type admission struct {
	cp   *controlplane.ControlPlane
	cs   kubernetes.Interface
	warn *warnings
	ns   string
}

// startAdmission applies overlays/admission to a control plane of its own
// (applyAdmission).
func startAdmission(ctx context.Context, t *testing.T) *admission {
	t.Helper()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return applyAdmission(ctx, t, cp, admissionLayout)
}

// applyAdmission applies overlays/admission as a user does (kubectl apply
// -k) and waits until its policies act: the API server loads policies and
// their params from informers, a moment after they are created, the
// mutating and the validating ones each on their own.
func applyAdmission(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, layout string) *admission {
	t.Helper()
	if out, err := cp.Kubectl(ctx, nil, "apply", "-k", layout); err != nil {
		t.Fatalf("kubectl apply -k %s: %v: %s", layout, err, out)
	}
	cfg := cp.AdminConfig()
	w := &warnings{}
	cfg.WarningHandler = w
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &admission{cp: cp, cs: cs, warn: w, ns: "admission"}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: a.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitServiceAccount(ctx, a.ns, "default"); err != nil {
		t.Fatal(err)
	}
	canary := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "canary", Labels: map[string]string{contract.LabelInject: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "m", Image: "eclipse-mosquitto:2"}}},
	}
	a.await(ctx, t, "the policy to inject a pod", func() bool {
		p := a.dryRun(ctx, t, canary)
		a.warn.take()
		return hasSidecar(p.Spec)
	})
	odd := canary.DeepCopy()
	odd.Spec.HostNetwork = true
	a.await(ctx, t, "the policy to warn of a pod it cannot inject", func() bool {
		a.dryRun(ctx, t, odd)
		return len(a.warn.take()) > 0
	})
	oddDeployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "canary"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "canary"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "canary", contract.LabelInject: "true"}}, Spec: odd.Spec},
		},
	}
	a.await(ctx, t, "the policy to warn of a Deployment it cannot inject", func() bool {
		if _, err := cs.AppsV1().Deployments(a.ns).Create(ctx, oddDeployment, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatal(err)
		}
		return len(a.warn.take()) > 0
	})
	return a
}

// ours are the warnings of the overlay's policies, without the API
// server's own (a duplicate port name, say).
func ours(ws []string) []string {
	return slices.DeleteFunc(ws, func(w string) bool { return !strings.Contains(w, "amf.io/inject: ") })
}

// await polls cond, which asks the API server, until it holds: the API
// server says nothing when it has loaded a policy or its params.
func (a *admission) await(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// dryRun creates pod in the test's namespace, server-side dry run: every
// admission plugin and policy runs, nothing is stored.
func (a *admission) dryRun(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Namespace = a.ns
	got, err := a.cs.CoreV1().Pods(a.ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("create pod %s (dry run): %v", pod.Name, err)
	}
	return got
}

func hasSidecar(spec corev1.PodSpec) bool {
	return slices.ContainsFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SidecarName })
}

// comparable is spec without what the ServiceAccount admission plugin adds
// (its kube-api-access-<random> volume and mounts) and with the volumes in
// name order: a pod's volumes are a set keyed by name, and the plugin runs
// before the policy, so its volume comes first there and last after inject.
func comparable(spec corev1.PodSpec) corev1.PodSpec {
	spec = *spec.DeepCopy()
	spec.NodeName = "" // a pod created for real is scheduled
	api := func(name string) bool { return strings.HasPrefix(name, "kube-api-access-") }
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return api(v.Name) })
	slices.SortFunc(spec.Volumes, func(a, b corev1.Volume) int { return strings.Compare(a.Name, b.Name) })
	for _, cs := range []*[]corev1.Container{&spec.InitContainers, &spec.Containers} {
		for i := range *cs {
			c := &(*cs)[i]
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return api(m.Name) })
			if len(c.VolumeMounts) == 0 {
				c.VolumeMounts = nil
			}
		}
	}
	return spec
}

// podOf is a pod of d's template, as its ReplicaSet creates it.
func podOf(d *appsv1.Deployment, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
		Spec:       *d.Spec.Template.Spec.DeepCopy(),
	}
}

// optIn is pod with the label and the annotations that ask the policy for
// what opts ask inject for.
func optIn(pod *corev1.Pod, opts inject.Options, hot bool) *corev1.Pod {
	pod = pod.DeepCopy()
	pod.Labels = merged(pod.Labels, map[string]string{contract.LabelInject: "true"})
	ann := map[string]string{}
	for k, v := range map[string]string{contract.AnnContainer: opts.Container, contract.AnnModel: opts.Model, contract.AnnProbeMQTT: opts.ProbeMQTT, contract.AnnStateDir: opts.StateDir} {
		if v != "" {
			ann[k] = v
		}
	}
	if hot {
		ann[contract.AnnPauseOnFence] = "true"
	}
	if len(ann) > 0 {
		pod.Annotations = merged(pod.Annotations, ann)
	}
	return pod
}

func merged(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

// deployments are the Deployments of a YAML stream.
func deployments(t *testing.T, stream []byte) []*appsv1.Deployment {
	t.Helper()
	var ds []*appsv1.Deployment
	for _, doc := range split(stream) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		switch {
		case meta.Kind == "Deployment":
			var d appsv1.Deployment
			if err := yaml.Unmarshal(doc, &d); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, &d)
		case meta.Kind == "List":
			var l struct{ Items []json.RawMessage }
			if err := yaml.Unmarshal(doc, &l); err != nil {
				t.Fatal(err)
			}
			for _, item := range l.Items {
				var d appsv1.Deployment
				if err := json.Unmarshal(item, &d); err != nil {
					t.Fatal(err)
				}
				if d.Kind == "Deployment" {
					ds = append(ds, &d)
				}
			}
		}
	}
	return ds
}

// hotIn says whether d is of a hot pair in the stream: hot itself, or named
// the standby of a hot primary (inject's rule for the fence lever).
func hotIn(d *appsv1.Deployment, all []*appsv1.Deployment) bool {
	if contract.Redundancy(d.Annotations[contract.AnnRedundancy]) == contract.Hot {
		return true
	}
	return slices.ContainsFunc(all, func(p *appsv1.Deployment) bool {
		return p.Annotations[contract.AnnStandby] == d.Name && contract.Redundancy(p.Annotations[contract.AnnRedundancy]) == contract.Hot
	})
}

// sameSpec fails t when the two pods' specs differ, printing both.
func sameSpec(t *testing.T, what string, want, got *corev1.Pod) {
	t.Helper()
	w, g := comparable(want.Spec), comparable(got.Spec)
	if equality.Semantic.DeepEqual(w, g) {
		return
	}
	wy, _ := yaml.Marshal(w)
	gy, _ := yaml.Marshal(g)
	t.Errorf("%s: the policy's pod differs from inject's:\n%s", what, lineDiff(string(wy), string(gy)))
}

// lineDiff lists the lines only in want (-) or only in got (+), in order.
func lineDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range wl {
		if !slices.Contains(gl, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range gl {
		if !slices.Contains(wl, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}

// admissionCases are inject's golden inputs and options in sidecar mode:
// the policy must give each pod what inject gives its template. What inject
// does to a Deployment as a whole (the standby, the spread, the policy
// annotations) is not a pod's, so the cases run without --standby.
var admissionCases = []struct {
	name, in string
	opts     inject.Options
}{
	{"plain", "mosquitto", inject.Options{}},
	{"several-deployments-and-other-kinds", "multi", inject.Options{}},
	{"list", "list", inject.Options{}},
	{"probe", "mosquitto", inject.Options{ProbeMQTT: "tcp://127.0.0.1:1884"}},
	{"hot-pair-user", "hot", inject.Options{}},
	{"model", "mosquitto", inject.Options{Model: "p1"}},
	{"model-path", "mosquitto", inject.Options{Model: "/models/mine.txt"}},
	{"broker-beside-an-exporter", "exporter", inject.Options{}},
	{"container-among-app-containers-and-a-native-sidecar", "unnamed-ports", inject.Options{Container: "broker"}},
	{"users-affinity", "affinity", inject.Options{}},
	{"claim", "claim", inject.Options{}},
	{"state-dir", "claim", inject.Options{StateDir: "/mosquitto/data"}},
}

// TestAdmissionPolicyGivesEachPodWhatInjectGivesItsTemplate runs the overlay
// on the real API server (v1.36.5) and creates, server-side dry run, the pods
// of inject's own test inputs, labelled amf.io/inject=true and annotated as
// inject's flags ask (by hand, and by inject --admission): each pod's spec
// must be what inject writes into its template, field by field, after the
// API server's defaults. Pods inject already handled are left as they are.
func TestAdmissionPolicyGivesEachPodWhatInjectGivesItsTemplate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := startAdmission(ctx, t)
	for _, tt := range admissionCases {
		t.Run(tt.name, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("..", "inject", "testdata", tt.in+".in.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			opts := tt.opts
			opts.EmbeddedModels = model.EmbeddedNames()
			out, _, err := inject.Inject(in, opts)
			if err != nil {
				t.Fatal(err)
			}
			before, after := deployments(t, in), deployments(t, out)
			if len(before) == 0 || len(before) != len(after) {
				t.Fatalf("%d Deployments in, %d out", len(before), len(after))
			}
			// inject --admission labels and annotates the same templates
			// for the policy (a model path it refuses: nothing could mount
			// the file into a sidecar the policy writes).
			var labelled []*appsv1.Deployment
			if admitted := opts; !strings.Contains(opts.Model, "/") {
				admitted.Admission = true
				out, _, err := inject.Inject(in, admitted)
				if err != nil {
					t.Fatalf("inject --admission: %v", err)
				}
				labelled = deployments(t, out)
			}
			for i, d := range before {
				pod := podOf(d, d.Name)
				if hasSidecar(pod.Spec) {
					// Handled by inject already: the policy leaves it.
					got := a.dryRun(ctx, t, optIn(pod, tt.opts, false))
					sameSpec(t, d.Name+" (injected before)", a.dryRun(ctx, t, pod), got)
					continue
				}
				want := a.dryRun(ctx, t, podOf(after[i], d.Name))
				got := a.dryRun(ctx, t, optIn(pod, tt.opts, hotIn(d, before)))
				if !hasSidecar(got.Spec) {
					t.Errorf("%s: no sidecar; the API server warned %q", d.Name, a.warn.take())
					continue
				}
				sameSpec(t, d.Name, want, got)
				if labelled != nil {
					sameSpec(t, d.Name+" (inject --admission)", want, a.dryRun(ctx, t, podOf(labelled[i], d.Name)))
				}
				if w := ours(a.warn.take()); len(w) > 0 {
					t.Errorf("%s: warned %q for a pod it injected", d.Name, w)
				}
			}
		})
	}
}

// TestAdmissionPolicyAdmitsWhatItCannotInjectUnchangedAndSaysWhy: each pod
// inject refuses (its template, with the same options) is created as it is,
// never refused, and its creator gets a warning saying why.
func TestAdmissionPolicyAdmitsWhatItCannotInjectUnchangedAndSaysWhy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := startAdmission(ctx, t)
	mosquitto := corev1.Container{Name: "m", Image: "eclipse-mosquitto:2"}
	exporter := corev1.Container{Name: "exporter", Image: "x:1"}
	withPorts := func(c corev1.Container, ports ...corev1.ContainerPort) corev1.Container {
		c.Ports = ports
		return c
	}
	mqtt := corev1.ContainerPort{Name: "mqtt", ContainerPort: 1883}
	for _, tt := range []struct {
		name string
		spec corev1.PodSpec
		opts inject.Options
		want string // in the warning
	}{
		{"regular-container-named-like-the-sidecar", corev1.PodSpec{Containers: []corev1.Container{{Name: inject.SidecarName, Image: inject.DefaultSidecarImage}}},
			inject.Options{}, `container "amf-sidecar" is a regular container`},
		{"two-app-containers-and-no-mqtt-port", corev1.PodSpec{Containers: []corev1.Container{mosquitto, exporter}},
			inject.Options{}, `the pod has 2 containers (m, exporter) and none exposes a port named "mqtt"`},
		{"two-mqtt-ports", corev1.PodSpec{Containers: []corev1.Container{withPorts(mosquitto, mqtt), withPorts(exporter, corev1.ContainerPort{Name: "mqtt", ContainerPort: 1884})}},
			inject.Options{}, `m, exporter all expose a port named "mqtt"`},
		{"container-annotation-names-nothing", corev1.PodSpec{Containers: []corev1.Container{mosquitto, exporter}},
			inject.Options{Container: "broker"}, `no container "broker" to watch (amf.io/container): the pod's containers are m, exporter`},
		{"host-network", corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{mosquitto}},
			inject.Options{}, "hostNetwork pods are not supported"},
		{"volume-name-taken", corev1.PodSpec{Containers: []corev1.Container{mosquitto}, Volumes: []corev1.Volume{{Name: inject.TokenVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
			inject.Options{}, "a volume of the pod is named like the sidecar's"},
		{"logs-volume-name-taken", corev1.PodSpec{Containers: []corev1.Container{withPorts(mosquitto, mqtt), exporter}, Volumes: []corev1.Volume{{Name: inject.LogsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
			inject.Options{}, "a volume of the pod is named like the sidecar's"},
		{"model-neither-embedded-nor-a-path", corev1.PodSpec{Containers: []corev1.Container{mosquitto}},
			inject.Options{Model: "bogus"}, `model "bogus" is not embedded in the sidecar (leadtime, p1, predict-linear)`},
		{"probe-that-is-not-a-url", corev1.PodSpec{Containers: []corev1.Container{mosquitto}},
			inject.Options{ProbeMQTT: "not a url"}, `amf.io/probe-mqtt "not a url" is not a broker URL`},
		{"probe-of-another-scheme", corev1.PodSpec{Containers: []corev1.Container{mosquitto}},
			inject.Options{ProbeMQTT: "http://127.0.0.1:1883"}, `amf.io/probe-mqtt "http://127.0.0.1:1883" is not a broker URL`},
		{"broker-declaring-only-mqtts", corev1.PodSpec{Containers: []corev1.Container{withPorts(mosquitto, corev1.ContainerPort{Name: "mqtts", ContainerPort: 8883})}},
			inject.Options{}, `the broker container m declares ports mqtts/8883, none named "mqtt" nor 1883`},
		{"port-8086-taken", corev1.PodSpec{Containers: []corev1.Container{withPorts(mosquitto, corev1.ContainerPort{ContainerPort: 1883}, corev1.ContainerPort{Name: "metrics", ContainerPort: 8086})}},
			inject.Options{}, "declares port 8086/TCP, where the sidecar serves its health endpoint"},
		{"state-dir-without-a-volume-there", corev1.PodSpec{Containers: []corev1.Container{mosquitto}},
			inject.Options{StateDir: "/mosquitto/data"}, "the broker container m mounts no volume at /mosquitto/data (amf.io/state-dir)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &appsv1.Deployment{
				TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
				ObjectMeta: metav1.ObjectMeta{Name: "b"},
				Spec: appsv1.DeploymentSpec{
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "b"}}, Spec: tt.spec},
				},
			}
			in, err := yaml.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			opts := tt.opts
			opts.EmbeddedModels = model.EmbeddedNames()
			if _, _, err := inject.Inject(in, opts); err == nil {
				t.Fatalf("inject takes it: the case is not one inject refuses")
			}
			pod := podOf(d, "b")
			plain := a.dryRun(ctx, t, pod)
			a.warn.take()
			got := a.dryRun(ctx, t, optIn(pod, tt.opts, false))
			sameSpec(t, "admitted", plain, got)
			w := ours(a.warn.take())
			if len(w) != 1 || !strings.Contains(w[0], "amf.io/inject: pod admitted without the AMF sidecar: ") || !strings.Contains(w[0], tt.want) {
				t.Errorf("warnings %q, want one saying %q", w, tt.want)
			}
		})
	}
}

// TestAdmissionPolicyOnPodsCreatedTheWaysUsersCreateThem: for real (the
// controllers and a kwok node): a Deployment's ReplicaSet, a bare pod, a
// chart-style Deployment whose MQTT port is not named mqtt; pods not opted
// in (no label, or another value) untouched; a Deployment the
// policy cannot inject warned about at create and its pod admitted as it is;
// the params ConfigMap changed, then deleted, which leaves new pods alone
// rather than refused.
func TestAdmissionPolicyOnPodsCreatedTheWaysUsersCreateThem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := startAdmission(ctx, t)
	cs := a.cs
	labels := map[string]string{"app.kubernetes.io/name": "mosquitto", "app.kubernetes.io/instance": "broker", contract.LabelInject: "true"}
	chart := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "broker-mosquitto", Namespace: a.ns,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "mosquitto-2.4.1"},
			Annotations: map[string]string{"meta.helm.sh/release-name": "broker"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "mosquitto", "app.kubernetes.io/instance": "broker"}},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"checksum/config": "5e1f"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "mosquitto", Image: "eclipse-mosquitto:2.0.20",
					Ports: []corev1.ContainerPort{{Name: "tcp-mqtt", ContainerPort: 1883}, {Name: "websocket", ContainerPort: 9001}},
				}}},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(a.ns).Create(ctx, chart, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := a.warn.take(); len(w) > 0 {
		t.Errorf("warned %q at the create of a Deployment the policy can inject", w)
	}
	pod := waitPod(ctx, t, cs, a.ns, "app.kubernetes.io/instance=broker", a.cp.Nodes[0])
	plain := chart.DeepCopy()
	delete(plain.Spec.Template.Labels, contract.LabelInject)
	in, err := yaml.Marshal(plain)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := inject.Inject(in, inject.Options{})
	if err != nil {
		t.Fatal(err)
	}
	injected := deployments(t, out)[0]
	sameSpec(t, "the ReplicaSet's pod of a chart-style Deployment", a.dryRun(ctx, t, podOf(injected, "expected")), pod)
	if i := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SidecarName }); i < 0 || !slices.Contains(pod.Spec.InitContainers[i].Args, "--probe-mqtt=tcp://127.0.0.1:1883") {
		t.Errorf("the chart's pod has no sidecar probing its port 1883 (named tcp-mqtt): %+v", pod.Spec.InitContainers)
	}

	bare := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: a.ns, Labels: map[string]string{contract.LabelInject: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "m", Image: "eclipse-mosquitto:2", Ports: []corev1.ContainerPort{{Name: "mqtt", ContainerPort: 1884}}}}},
	}
	created, err := cs.CoreV1().Pods(a.ns).Create(ctx, bare, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasSidecar(created.Spec) || !slices.Contains(created.Spec.InitContainers[0].Args, "--probe-mqtt=tcp://127.0.0.1:1884") {
		t.Errorf("bare pod: %+v", created.Spec.InitContainers)
	}

	for _, label := range []string{"", "false", "yes"} {
		other := bare.DeepCopy()
		other.Name = "other-" + cmp.Or(label, "unlabelled")
		delete(other.Labels, contract.LabelInject)
		if label != "" {
			other.Labels[contract.LabelInject] = label
		}
		got, err := cs.CoreV1().Pods(a.ns).Create(ctx, other, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasSidecar(got.Spec) || len(got.Spec.ReadinessGates) > 0 || len(got.Spec.Volumes) != 1 {
			t.Errorf("a pod labelled %s=%q was changed: %+v", contract.LabelInject, label, got.Spec)
		}
		if w := ours(a.warn.take()); len(w) > 0 {
			t.Errorf("a pod labelled %s=%q was warned about: %q", contract.LabelInject, label, w)
		}
	}

	odd := chart.DeepCopy()
	odd.Name = "odd"
	odd.Spec.Selector.MatchLabels["app.kubernetes.io/instance"] = "odd"
	odd.Spec.Template.Labels["app.kubernetes.io/instance"] = "odd"
	odd.Spec.Template.Spec.Containers = append(odd.Spec.Template.Spec.Containers, corev1.Container{Name: "exporter", Image: "x:1"})
	if _, err := cs.AppsV1().Deployments(a.ns).Create(ctx, odd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const why = `the pod has 2 containers (mosquitto, exporter) and none exposes a port named "mqtt"`
	if w := ours(a.warn.take()); len(w) != 1 || !strings.Contains(w[0], "amf.io/inject: the pods of this Deployment will be admitted without the AMF sidecar: "+why) {
		t.Errorf("create of a Deployment the policy cannot inject warned %q, want it to say %q", w, why)
	}
	oddPod := waitPod(ctx, t, cs, a.ns, "app.kubernetes.io/instance=odd", a.cp.Nodes[0])
	if hasSidecar(oddPod.Spec) || slices.ContainsFunc(oddPod.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool { return g.ConditionType == contract.ConditionHealthy }) {
		t.Errorf("the odd Deployment's pod was changed: %+v", oddPod.Spec)
	}

	nodeMode := chart.DeepCopy()
	nodeMode.Name = "node-mode"
	nodeMode.Annotations = map[string]string{contract.AnnMode: string(contract.ModeNode)}
	nodeMode.Spec.Replicas = ptr.To[int32](0)
	if _, err := cs.AppsV1().Deployments(a.ns).Create(ctx, nodeMode, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := ours(a.warn.take()); len(w) != 1 || !strings.Contains(w[0], "this Deployment is in node mode") {
		t.Errorf("a node-mode Deployment asking for the sidecar warned %q", w)
	}

	cm, err := cs.CoreV1().ConfigMaps("amf-system").Get(ctx, "amf-inject", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["image"] != inject.DefaultSidecarImage {
		t.Errorf("the overlay's image %q is not inject's default %q", cm.Data["image"], inject.DefaultSidecarImage)
	}
	cm.Data["image"] = "registry.local/amf-sidecar:dev"
	cm.Data["model"] = "p1"
	if _, err := cs.CoreV1().ConfigMaps("amf-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := podOf(chart, "probe")
	a.await(ctx, t, "the new image", func() bool {
		p := a.dryRun(ctx, t, probe)
		return hasSidecar(p.Spec) && p.Spec.InitContainers[0].Image == "registry.local/amf-sidecar:dev"
	})
	if p := a.dryRun(ctx, t, probe); !slices.Contains(p.Spec.InitContainers[0].Args, "--model=p1") {
		t.Errorf("the params' model is not the sidecar's: %q", p.Spec.InitContainers[0].Args)
	}
	if err := cs.CoreV1().ConfigMaps("amf-system").Delete(ctx, "amf-inject", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.await(ctx, t, "pods left alone without the params", func() bool { return !hasSidecar(a.dryRun(ctx, t, probe).Spec) })
	if _, err := cs.CoreV1().Pods(a.ns).Create(ctx, podOf(chart, "without-params"), metav1.CreateOptions{}); err != nil {
		t.Errorf("a pod was refused with the policy's params gone: %v", err)
	}
	a.warn.take()
}

// TestAdmissionOverlayForTheBetaAPI applies overlays/admission-v1beta1, the
// policy as Kubernetes 1.34 and 1.35 serve it, to an API server that serves
// admissionregistration.k8s.io/v1beta1 as those do when asked
// (--runtime-config; this one is v1.36.5, which keeps the beta API behind
// it): the policy is stored as given, and pods get the sidecar.
func TestAdmissionOverlayForTheBetaAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{APIServerFlags: []string{"--runtime-config=admissionregistration.k8s.io/v1beta1=true"}})
	if err != nil {
		t.Fatal(err)
	}
	a := applyAdmission(ctx, t, cp, "overlays/admission-v1beta1")
	if _, err := a.cs.AdmissionregistrationV1beta1().MutatingAdmissionPolicies().Get(ctx, "amf-inject", metav1.GetOptions{}); err != nil {
		t.Errorf("the beta policy: %v", err)
	}
	if _, err := a.cs.AdmissionregistrationV1beta1().MutatingAdmissionPolicyBindings().Get(ctx, "amf-inject", metav1.GetOptions{}); err != nil {
		t.Errorf("the beta binding: %v", err)
	}
}

// TestAdmissionPoliciesShareTheirVariablesAndVocabulary: the three policies
// of the overlay decide alike (the same variables after the two that find
// the pod spec and its annotations), name the models the sidecar embeds, and
// use the contract's keys and inject's names.
func TestAdmissionPoliciesShareTheirVariablesAndVocabulary(t *testing.T) {
	var mutating []admissionv1.MutatingAdmissionPolicy
	var validating []admissionv1.ValidatingAdmissionPolicy
	var raw []byte
	for _, f := range []string{"mutatingadmissionpolicy.yaml", "validatingadmissionpolicies.yaml"} {
		b, err := os.ReadFile(filepath.Join(admissionLayout, f))
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, b...)
		for _, doc := range split(b) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatal(err)
			}
			switch meta.Kind {
			case "MutatingAdmissionPolicy":
				var p admissionv1.MutatingAdmissionPolicy
				if err := yaml.UnmarshalStrict(doc, &p); err != nil {
					t.Fatal(err)
				}
				mutating = append(mutating, p)
			case "ValidatingAdmissionPolicy":
				var p admissionv1.ValidatingAdmissionPolicy
				if err := yaml.UnmarshalStrict(doc, &p); err != nil {
					t.Fatal(err)
				}
				validating = append(validating, p)
			}
		}
	}
	if len(mutating) != 1 || len(validating) != 2 {
		t.Fatalf("%d mutating and %d validating policies, want 1 and 2", len(mutating), len(validating))
	}
	shared := mutating[0].Spec.Variables
	if len(shared) < 3 || shared[0].Name != "spec" || shared[1].Name != "ann" {
		t.Fatalf("variables %v: want spec and ann first", shared)
	}
	for _, v := range validating {
		if !equality.Semantic.DeepEqual(v.Spec.Variables[2:], shared[2:]) {
			t.Errorf("%s decides otherwise than amf-inject: its variables after spec and ann differ", v.Name)
		}
		if *v.Spec.FailurePolicy != admissionv1.Ignore {
			t.Errorf("%s: failurePolicy %s, want Ignore", v.Name, *v.Spec.FailurePolicy)
		}
	}
	if *mutating[0].Spec.FailurePolicy != admissionv1.Ignore {
		t.Errorf("amf-inject: failurePolicy %s, want Ignore: a pod's creation must never fail for the sidecar", *mutating[0].Spec.FailurePolicy)
	}
	embedded := `"['` + strings.Join(model.EmbeddedNames(), "', '") + `']"`
	i := slices.IndexFunc(shared, func(v admissionv1.Variable) bool { return v.Name == "embedded" })
	if i < 0 || `"`+shared[i].Expression+`"` != embedded {
		t.Errorf("the policy's embedded models are not the sidecar's: want the expression %s", embedded)
	}
	for _, word := range []string{contract.LabelInject, contract.AnnContainer, contract.AnnModel, contract.AnnProbeMQTT, contract.AnnStateDir, contract.AnnPauseOnFence,
		contract.ConditionHealthy, contract.Audience, inject.SidecarName, inject.TokenVolume, inject.TokenDir, inject.CgroupVolume, inject.HostCgroupRoot,
		inject.LogsVolume, inject.KubeletLogDir, inject.HostContainerLogs, fmt.Sprint(inject.HealthPort), fmt.Sprint(inject.AgentPort)} {
		if !bytes.Contains(raw, []byte(word)) {
			t.Errorf("the policies do not say %q", word)
		}
	}
}

var _ rest.WarningHandler = (*warnings)(nil)
