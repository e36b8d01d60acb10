package manifests_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/lab/controlplane"
)

// layouts are the kustomize folders a user applies with kubectl apply -k.
var layouts = []string{"base", "examples", "overlays/rpi-arm64", "overlays/node-mode", "overlays/admission"}

const fieldManager = "amf-manifests-test"

// TestManifestsOnRealAPIServer renders every layout with the project's kubectl,
// has the API server check it (server-side apply, dry run), applies base and
// examples for real and watches the agent DaemonSet and the example broker run
// on the kwok node; then applies the arm64 overlay for real and watches the
// workloads move to an arm64 node.
func TestManifestsOnRealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rendered := map[string][]byte{}
	for _, l := range layouts {
		out, err := cp.Kubectl(ctx, nil, "kustomize", l)
		if err != nil {
			t.Fatalf("render %s: %v", l, err)
		}
		rendered[l] = out
	}

	// Namespaced objects can be checked only once their namespace exists.
	for _, l := range layouts {
		ns := namespaces(t, rendered[l])
		if _, err := cp.Kubectl(ctx, bytes.NewReader(ns), "apply", "--server-side", "--field-manager="+fieldManager, "-f", "-"); err != nil {
			t.Fatalf("%s: namespaces: %v", l, err)
		}
	}
	for _, l := range layouts {
		t.Run("dry-run/"+l, func(t *testing.T) {
			out, err := cp.Kubectl(ctx, bytes.NewReader(rendered[l]), "apply", "--server-side", "--dry-run=server", "--field-manager="+fieldManager, "-f", "-")
			if err != nil {
				t.Fatal(err)
			}
			if n, want := strings.Count(string(out), "(server dry run)"), documents(t, rendered[l]); n != want {
				t.Errorf("%d objects checked by the server, want %d:\n%s", n, want, out)
			}
		})
	}
	if t.Failed() {
		return
	}

	cs := cp.Client()
	node := cp.Nodes[0]
	t.Run("apply/base+examples", func(t *testing.T) {
		for _, l := range []string{"base", "examples"} {
			if _, err := cp.Kubectl(ctx, bytes.NewReader(rendered[l]), "apply", "--server-side", "--field-manager="+fieldManager, "-f", "-"); err != nil {
				t.Fatalf("apply %s: %v", l, err)
			}
		}
		agent := waitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", node)
		if c := agent.Spec.Containers[0]; c.Ports[0].HostPort != 1884 || !contains(c.Args, "--node-name=$(NODE_NAME)") {
			t.Errorf("agent container: hostPort %d args %q", c.Ports[0].HostPort, c.Args)
		}
		if c := agent.Spec.Containers[0]; !contains(c.Args, "--liveness") || !contains(c.Args, "--liveness-advertise=$(HOST_IP):1885") || !hostPort(c, 1885) {
			t.Errorf("agent container without node loss (--liveness, its probes on host port 1885): ports %+v args %q", c.Ports, c.Args)
		}
		ds, err := cs.AppsV1().DaemonSets("amf-system").Get(ctx, "amf-agent", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Status.DesiredNumberScheduled != 1 {
			t.Errorf("DaemonSet desires %d pods, want 1 (one kwok node)", ds.Status.DesiredNumberScheduled)
		}
		checkLivenessRights(ctx, t, cs)

		broker := waitPod(ctx, t, cs, "amf-example", "app.kubernetes.io/instance=edge-broker-a", node)
		checkBrokerPod(t, broker)
		standby, err := cs.CoreV1().Pods("amf-example").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=edge-broker-b"})
		if err != nil {
			t.Fatal(err)
		}
		if len(standby.Items) != 0 {
			t.Errorf("cold standby runs %d pods, want 0", len(standby.Items))
		}
		svc, err := cs.CoreV1().Services("amf-example").Get(ctx, "edge-broker", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(broker.Labels)) {
			t.Errorf("Service selector %v does not match the broker pod's labels %v", svc.Spec.Selector, broker.Labels)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("apply/overlay-rpi-arm64", func(t *testing.T) {
		const pi = "kwok-rpi-0"
		addArm64Node(ctx, t, cs, pi)
		if _, err := cp.Kubectl(ctx, bytes.NewReader(rendered["overlays/rpi-arm64"]), "apply", "--server-side", "--field-manager="+fieldManager, "-f", "-"); err != nil {
			t.Fatalf("apply overlay: %v", err)
		}
		waitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", pi)
		checkBrokerPod(t, waitPod(ctx, t, cs, "amf-example", "app.kubernetes.io/instance=edge-broker-a", pi))
	})

	// What the agent's ServiceAccount may do, asked of the API server, with
	// base alone and then with the node-mode overlay applied.
	sa := "system:serviceaccount:amf-system:amf-agent"
	may := func(t *testing.T, ns, group, resource, verb string) bool {
		t.Helper()
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:amf-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Group: group, Resource: resource, Verb: verb},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	type right struct{ ns, group, resource, verb string }
	nodeModeRights := []right{{"", "", "pods", "list"}, {"", "", "pods", "watch"}, {"mqtt", "", "pods", "list"}, {"", "apps", "deployments", "list"}}
	t.Run("rbac/base-has-no-node-mode-rights", func(t *testing.T) {
		for _, r := range nodeModeRights {
			if may(t, r.ns, r.group, r.resource, r.verb) {
				t.Errorf("base alone allows %s %s/%s in %q: node mode's rights must be the overlay's only", r.verb, r.group, r.resource, r.ns)
			}
		}
	})
	t.Run("apply/overlay-node-mode", func(t *testing.T) {
		if _, err := cp.Kubectl(ctx, bytes.NewReader(rendered["overlays/node-mode"]), "apply", "--server-side", "--field-manager="+fieldManager, "-f", "-"); err != nil {
			t.Fatalf("apply overlay: %v", err)
		}
		// The rights it must have first: once they are there, the denials
		// below are the authorizer's current answer.
		for _, tc := range []struct {
			right
			want bool
		}{
			{nodeModeRights[0], true}, {nodeModeRights[1], true}, {nodeModeRights[2], true}, {nodeModeRights[3], true},
			{right{"mqtt", "apps", "deployments", "watch"}, true},
			{right{"mqtt", "apps", "replicasets", "get"}, true},
			{right{"mqtt", "events.k8s.io", "events", "create"}, true},
			// Delete, for a node-mode primary it retires: RBAC allows it
			// everywhere, the overlay's admission policy confines it to the
			// agent's node (TestNodeModeAgentDeletesPodsOnlyOnItsOwnNode).
			{right{"mqtt", "", "pods", "delete"}, true},
			{right{"mqtt", "", "pods", "deletecollection"}, false},
			{right{"mqtt", "", "pods", "update"}, false},
			{right{"mqtt", "", "pods", "patch"}, false},
			{right{"mqtt", "", "pods/exec", "create"}, false},
			{right{"mqtt", "", "pods/log", "get"}, false},
			{right{"mqtt", "", "secrets", "get"}, false},
			{right{"mqtt", "", "secrets", "list"}, false},
			{right{"mqtt", "", "configmaps", "list"}, false},
			{right{"mqtt", "apps", "replicasets", "list"}, false},
			{right{"mqtt", "apps", "deployments", "update"}, false},
			{right{"", "", "nodes", "get"}, false},
		} {
			got := may(t, tc.ns, tc.group, tc.resource, tc.verb)
			// The authorizer learns of the new binding through its own
			// watch: ask again for a while before taking a denial as one.
			for deadline := time.Now().Add(10 * time.Second); tc.want && !got && time.Now().Before(deadline); got = may(t, tc.ns, tc.group, tc.resource, tc.verb) {
				time.Sleep(100 * time.Millisecond)
			}
			if got != tc.want {
				t.Errorf("%s %s/%s in %q: allowed %v, want %v", tc.verb, tc.group, tc.resource, tc.ns, got, tc.want)
			}
		}
	})
}

func hostPort(c corev1.Container, port int32) bool {
	for _, p := range c.Ports {
		if p.HostPort == port && p.ContainerPort == port {
			return true
		}
	}
	return false
}

// checkLivenessRights asks the API server (SubjectAccessReview) what the
// agent's ServiceAccount may do with Leases and Nodes as base binds it: its
// heartbeat and its guard's watch in amf-system, nothing else.
func checkLivenessRights(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	for _, tc := range []struct {
		namespace, group, resource, verb string
		want                             bool
	}{
		{"amf-system", "coordination.k8s.io", "leases", "create", true},
		{"amf-system", "coordination.k8s.io", "leases", "update", true},
		{"amf-system", "coordination.k8s.io", "leases", "get", true},
		{"amf-system", "coordination.k8s.io", "leases", "list", true},
		{"amf-system", "coordination.k8s.io", "leases", "watch", true},
		{"amf-system", "coordination.k8s.io", "leases", "delete", false},
		{"amf-example", "coordination.k8s.io", "leases", "update", false},
		{corev1.NamespaceNodeLease, "coordination.k8s.io", "leases", "update", false},
		{corev1.NamespaceNodeLease, "coordination.k8s.io", "leases", "watch", false},
		{"", "", "nodes", "get", false},
		{"", "", "nodes", "list", false},
		{"amf-example", "", "pods", "list", false},
	} {
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:amf-system:amf-agent",
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:amf-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tc.namespace, Group: tc.group, Resource: tc.resource, Verb: tc.verb},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tc.want {
			t.Errorf("the agent may %s %s in %q: %v, want %v (%s)", tc.verb, tc.resource, tc.namespace, sar.Status.Allowed, tc.want, sar.Status.Reason)
		}
	}
}

// checkBrokerPod checks what the injected broker pod must carry once kwok runs it.
func checkBrokerPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != "amf-sidecar" ||
		p.Spec.InitContainers[0].RestartPolicy == nil || *p.Spec.InitContainers[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("broker pod's init containers %+v, want the native sidecar amf-sidecar", p.Spec.InitContainers)
	}
	var sidecarRunning bool
	for _, s := range p.Status.InitContainerStatuses {
		sidecarRunning = sidecarRunning || (s.Name == "amf-sidecar" && s.State.Running != nil)
	}
	if !sidecarRunning {
		t.Errorf("sidecar not running beside the broker: %+v", p.Status.InitContainerStatuses)
	}
	if len(p.Spec.ReadinessGates) != 1 || p.Spec.ReadinessGates[0].ConditionType != "amf.io/healthy" {
		t.Errorf("readiness gates %v, want amf.io/healthy", p.Spec.ReadinessGates)
	}
	// The kwok stage sets every readiness gate's condition True (there is no real
	// sidecar or agent here), so the pod is Ready; on a cluster the agent sets it.
	if !condition(p, "amf.io/healthy") || !condition(p, corev1.PodReady) {
		t.Errorf("broker pod conditions %+v, want amf.io/healthy and Ready True (kwok)", p.Status.Conditions)
	}
	var mosquitto *corev1.Container
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == "mosquitto" {
			mosquitto = &p.Spec.Containers[i]
		}
	}
	if mosquitto == nil {
		t.Fatalf("no mosquitto container in %s", p.Name)
	}
	if l := mosquitto.Resources.Limits; l.Memory().String() != "100Mi" || l.Cpu().String() != "500m" {
		t.Errorf("broker limits %v, want memory 100Mi and CPU 500m", l)
	}
}

// waitPod watches pods matching selector in namespace until one on node is Ready.
func waitPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, namespace, selector, node string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", namespace, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	var last *corev1.Pod
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted {
			return false, nil
		}
		last = p
		return p.Spec.NodeName == node && p.DeletionTimestamp == nil && condition(p, corev1.PodReady), nil
	})
	if err != nil {
		t.Fatalf("no Ready pod %s in %s on %s: %v; last seen: %s", selector, namespace, node, err, describe(last))
	}
	return ev.Object.(*corev1.Pod)
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("%s on %q, phase %s, conditions %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions)
}

// addArm64Node creates a kwok fake node labelled as an arm64 Raspberry Pi and
// waits until it is Ready.
func addArm64Node(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	res := corev1.ResourceList{corev1.ResourceCPU: mustQuantity("4"), corev1.ResourceMemory: mustQuantity("8Gi"), corev1.ResourcePods: mustQuantity("110")}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			NodeInfo: corev1.NodeSystemInfo{Architecture: "arm64", OperatingSystem: "linux", KubeletVersion: "fake"},
		},
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", name))
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				for _, taint := range n.Spec.Taints {
					if taint.Key == corev1.TaintNodeNotReady {
						return false, nil
					}
				}
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("arm64 node %s not Ready: %v", name, err)
	}
}

// TestOverlayPinsEveryWorkloadToArm64 checks the overlay's rendering without a
// cluster: every workload gets the arm64 nodeSelector and tolerates the
// control-plane taint; base and examples pin nothing.
func TestOverlayPinsEveryWorkloadToArm64(t *testing.T) {
	kubectl := kubectlPath(t)
	for _, tt := range []struct {
		layout   string
		wantArch string
	}{
		{"base", ""},
		{"examples", ""},
		{"overlays/rpi-arm64", "arm64"},
	} {
		t.Run(tt.layout, func(t *testing.T) {
			out := kustomize(t, kubectl, tt.layout)
			n := 0
			for _, doc := range split(out) {
				var obj struct {
					Kind     string
					Metadata metav1.ObjectMeta
					Spec     struct{ Template corev1.PodTemplateSpec }
				}
				if err := yaml.Unmarshal(doc, &obj); err != nil {
					t.Fatal(err)
				}
				if obj.Kind != "Deployment" && obj.Kind != "DaemonSet" {
					continue
				}
				n++
				if got := obj.Spec.Template.Spec.NodeSelector["kubernetes.io/arch"]; got != tt.wantArch {
					t.Errorf("%s %s: kubernetes.io/arch selector %q, want %q", obj.Kind, obj.Metadata.Name, got, tt.wantArch)
				}
				if tt.wantArch != "" && !tolerates(obj.Spec.Template.Spec.Tolerations, "node-role.kubernetes.io/control-plane") {
					t.Errorf("%s %s tolerates %v, not the control-plane taint", obj.Kind, obj.Metadata.Name, obj.Spec.Template.Spec.Tolerations)
				}
			}
			if want := map[string]int{"base": 2, "examples": 2, "overlays/rpi-arm64": 4}[tt.layout]; n != want {
				t.Errorf("%d workloads rendered, want %d", n, want)
			}
		})
	}
}

// TestActuationRoleIsReferenced checks that base binds the actuation ClusterRole
// that manifests/rbac_test.go compares with actuate.Rules(), and the TokenReview rule.
// TestNodeModeOverlayAddsItsRightsMountAndFlag checks the node-mode
// overlay's rendering without a cluster: the agent gets --node-mode, the
// host's cgroup tree read-only and the host's PID namespace, and the
// ClusterRole bound to its ServiceAccount; base has none of it.
func TestNodeModeOverlayAddsItsRightsMountAndFlag(t *testing.T) {
	kubectl := kubectlPath(t)
	base := kustomize(t, kubectl, "base")
	for _, never := range []string{"amf-agent-node-mode", "--node-mode", "hostPID"} {
		if bytes.Contains(base, []byte(never)) {
			t.Errorf("base renders %q: node mode is the overlay's option", never)
		}
	}
	var ds struct {
		Kind string
		Spec struct {
			Template struct {
				Spec corev1.PodSpec
			}
		}
	}
	var binding, role bool
	for _, d := range split(kustomize(t, kubectl, "overlays/node-mode")) {
		var obj struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal(d, &obj); err != nil {
			t.Fatal(err)
		}
		switch {
		case obj.Kind == "DaemonSet" && obj.Metadata.Name == "amf-agent":
			if err := yaml.Unmarshal(d, &ds); err != nil {
				t.Fatal(err)
			}
		case obj.Kind == "ClusterRole" && obj.Metadata.Name == "amf-agent-node-mode":
			role = true
		case obj.Kind == "ClusterRoleBinding" && obj.Metadata.Name == "amf-agent-node-mode":
			binding = bytes.Contains(d, []byte("name: amf-agent\n")) && bytes.Contains(d, []byte("namespace: amf-system"))
		}
	}
	if !role || !binding {
		t.Errorf("overlay renders role %v, binding to amf-system/amf-agent %v; want both", role, binding)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("the agent pod does not share the host's PID namespace")
	}
	c := spec.Containers[0]
	for _, arg := range []string{"--node-mode", "--host-cgroup-root=/host/sys/fs/cgroup", "--node-name=$(NODE_NAME)", "--actuate"} {
		if !contains(c.Args, arg) {
			t.Errorf("agent args %q lack %s", c.Args, arg)
		}
	}
	// Beside base's: the connkill socket's folder and the state hub's peer
	// token, read-only.
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/host/sys/fs/cgroup" && m.ReadOnly }) ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/run/amf/connkill" && m.ReadOnly }) ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/var/run/secrets/amf.io/state-peer" && m.ReadOnly
		}) ||
		len(c.VolumeMounts) != 3 {
		t.Errorf("agent mounts %+v, want the host cgroup tree at /host/sys/fs/cgroup beside base's connkill folder and peer token, all read-only", c.VolumeMounts)
	}
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/sys/fs/cgroup" }) || len(spec.Volumes) != 3 {
		t.Errorf("agent volumes %+v, want hostPath /sys/fs/cgroup beside base's", spec.Volumes)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("agent security context %+v: node mode must keep it non-root without capabilities", sc)
	}
}

func TestActuationRoleIsReferenced(t *testing.T) {
	out := kustomize(t, kubectlPath(t), "base")
	for _, want := range []string{"name: amf-agent-actuate", "name: amf-agent-authn", "tokenreviews", "name: amf-agent-liveness"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("base renders no %q", want)
		}
	}
}

func kubectlPath(t *testing.T) string {
	t.Helper()
	dir, err := controlplane.BinDir()
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "kubectl"))
	}
	if err != nil {
		if os.Getenv(controlplane.EnvRequire) == "1" {
			t.Fatalf("kubectl not built (%v) and %s=1: run make k8s", err, controlplane.EnvRequire)
		}
		t.Skipf("kubectl not built (%v): run make k8s", err)
	}
	return filepath.Join(dir, "kubectl")
}
