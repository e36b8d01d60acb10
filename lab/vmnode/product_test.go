package vmnode_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/lab/vmnode"
	"github.com/amf-edge/amf/ociimage"
)

// TestProductOnTheNode is the install path as a user runs it, on the node as
// Kubernetes ships it now: kubectl apply -k manifests/base, a Mosquitto
// Deployment injected by the amf-agent binary (inject --standby) and
// applied. The sidecar finds its broker's cgroup in the layout the kubelet
// and containerd make with the systemd driver on cgroup v2, reads it
// (memory against the container's limit) and scores it healthy, and the
// agent opens the readiness gate. An OOM kill in the broker's container
// reaches the sidecar through memory.events and the agent fails the broker
// over to its standby.
func TestProductOnTheNode(t *testing.T) {
	ctx, cp, n, agent := install(t, "base")
	cs := cp.Client()
	plain, err := yaml.Marshal(broker(ns))
	if err != nil {
		t.Fatal(err)
	}
	injected := inject(t, plain, "--standby", "--container", "mosquitto")
	if out, err := cp.Kubectl(ctx, bytes.NewReader(injected), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply the injected broker: %v: %s", err, out)
	}
	primary := kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-a", kubenodetest.PodReady)
	t.Logf("broker pod %s Ready (the agent opened its amf.io/healthy gate)", primary.Name)

	// The layout the systemd driver makes on cgroup v2.
	cg, err := n.ContainerCgroup(ctx, primary, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	uid := strings.ReplaceAll(string(primary.UID), "-", "_")
	if want := "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-"; !strings.HasPrefix(cg, want) {
		t.Errorf("the broker's cgroup is %s, want it under %s", cg, want)
	}
	sidecarPID, err := n.ContainerPID(ctx, primary, "amf-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		State, Target    string
		TransitionReason string `json:"transition_reason"`
		Features         json.RawMessage
		MemoryReference  *struct {
			Value  float64
			Source string
		} `json:"memory_reference"`
	}
	b, err := n.GetIn(ctx, sidecarPID, "http://127.0.0.1:8086/status")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("sidecar /status %q: %v", b, err)
	}
	t.Logf("sidecar: state %s, target %s", st.State, st.Target)
	if !strings.Contains(st.Target, strings.TrimPrefix(cg, "/sys/fs/cgroup")) {
		t.Errorf("the sidecar's target %q does not name the broker's cgroup %s", st.Target, cg)
	}
	if st.State != "healthy" {
		t.Errorf("sidecar state %q (%s), want healthy", st.State, st.TransitionReason)
	}
	if st.MemoryReference == nil || st.MemoryReference.Source != "container_limit" || st.MemoryReference.Value != 100<<20 {
		t.Errorf("memory reference %+v, want the container's 100 Mi limit", st.MemoryReference)
	}
	if len(st.Features) == 0 || string(st.Features) == "null" {
		t.Errorf("the sidecar reports no features")
	}

	// An OOM kill in the broker's container; the agent acts on the
	// sidecar's signal: the standby is scaled up.
	oomKill(ctx, t, n, primary)
	awaitLine(ctx, t, n, primary, "amf-sidecar", "the OOM kill", func(m map[string]any) bool { return m["msg"] == "OOM kill in the broker container" })
	awaitStandby(ctx, t, cs, n, agent, ns, "edge-broker-b")
	// Which comes first, the kill, the broker's lost connection or the
	// model's alarm at the climb, depends on the guest's speed: any of
	// them takes the pod out.
	awaitLine(ctx, t, n, agent, "agent", "the primary's transition out of healthy", func(m map[string]any) bool {
		return m["msg"] == "transition" && m["pod"] == primary.Name && m["from"] == "healthy"
	})
}

// TestNodeModeOnTheNode is node mode as a user installs it, on the node as
// Kubernetes ships it now: kubectl apply -k manifests/overlays/node-mode
// and two plain Mosquitto pairs annotated by amf-agent inject --mode node.
// The agent pod finds each broker's container in the systemd driver's
// layout; one broker's process killed (SIGKILL, from the guest) and the
// other's container OOM-killed reach the agent as the pushed exit and the
// OOM kill, and it fails each over to its standby.
func TestNodeModeOnTheNode(t *testing.T) {
	ctx, cp, n, agent := install(t, "overlays/node-mode")
	cs := cp.Client()
	primaries := map[string]*corev1.Pod{}
	for _, pair := range []string{"crash", "oom"} {
		plain, err := yaml.Marshal(broker(ns, pair))
		if err != nil {
			t.Fatal(err)
		}
		annotated := inject(t, plain, "--mode", "node", "--standby")
		if out, err := cp.Kubectl(ctx, bytes.NewReader(annotated), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply the annotated broker: %v: %s", err, out)
		}
		primaries[pair] = kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance="+pair+"-a", kubenodetest.PodReady)
	}
	for _, p := range primaries {
		awaitTransition(ctx, t, n, agent, p, "node", "")
		cg, err := n.ContainerCgroup(ctx, p, "mosquitto")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(cg, "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/") {
			t.Errorf("the broker's cgroup is %s, want it under kubepods-burstable.slice", cg)
		}
	}

	crash := primaries["crash"]
	pid, err := n.ContainerPID(ctx, crash, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	killed, err := n.Kill(ctx, pid)
	if err != nil {
		t.Fatalf("kill the broker: %v", err)
	}
	awaitStandby(ctx, t, cs, n, agent, ns, "crash-b")
	m := awaitTransition(ctx, t, n, agent, crash, "node", "exited")
	if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["received"])); err == nil {
		// Both the guest's clock; under emulation, not the host's pace.
		t.Logf("the kill reached the agent %v after the signal (the guest's clock)", at.Sub(killed).Round(100*time.Microsecond))
	}

	oom := primaries["oom"]
	oomKill(ctx, t, n, oom)
	awaitLine(ctx, t, n, agent, "agent", "the OOM kill", func(m map[string]any) bool {
		return m["msg"] == "OOM kill in the broker container" && m["pod"] == ns+"/"+oom.Name
	})
	awaitStandby(ctx, t, cs, n, agent, ns, "oom-b")
}

// ns is the namespace of the tests' brokers.
const ns = "mqtt"

// install boots a node, applies the kustomization manifests/<layout> as a
// user would (kubectl apply -k), creates the brokers' namespace and returns
// once the agent's pod is Ready; ctx bounds the rest of the test.
func install(t *testing.T, layout string) (ctx context.Context, cp *controlplane.ControlPlane, n *vmnode.Node, agent *corev1.Pod) {
	t.Helper()
	cp, n = start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, nil, "apply", "-k", filepath.Join(repo, "manifests", layout)); err != nil {
		t.Fatalf("kubectl apply -k manifests/%s: %v: %s", layout, err, out)
	}
	cs := cp.Client()
	agent = kubenodetest.WaitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", kubenodetest.PodReady)
	t.Logf("agent pod %s Ready", agent.Name)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ctx, cp, n, agent
}

// containerID is the runtime's ID of a container of pod.
func containerID(t *testing.T, pod *corev1.Pod, container string) string {
	t.Helper()
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			_, id, _ := strings.Cut(s.ContainerID, "://")
			return id
		}
	}
	t.Fatalf("pod %s has no container %s", pod.Name, container)
	return ""
}

// oomKill makes the kernel OOM-kill the broker's container: the lab's
// stress program, run in the container by containerd, grows past its
// 100 Mi limit (memory.oom.group, which the kubelet sets on cgroup v2,
// then ends the whole container).
func oomKill(ctx context.Context, t *testing.T, n *vmnode.Node, pod *corev1.Pod) {
	t.Helper()
	cg, err := n.ContainerCgroup(ctx, pod, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := n.ReadFile(ctx, path.Join(cg, "memory.oom.group")); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Errorf("memory.oom.group of the broker's container is %q (%v), want 1 (the kubelet's on cgroup v2)", b, err)
	}
	out, _ := n.Run(ctx, "/amf/bin/ctr", "--namespace", "k8s.io", "tasks", "exec", "--exec-id", "oom", containerID(t, pod, "mosquitto"),
		images.LabBinary, "stress", "--memory-file", "--profile", "60s:mem=200Mi")
	t.Logf("the stress exec ended: %s", strings.TrimSpace(string(out)))
}

// awaitStandby waits until the standby Deployment is scaled up.
func awaitStandby(ctx context.Context, t *testing.T, cs kubernetes.Interface, n *vmnode.Node, agent *corev1.Pod, ns, standby string) {
	t.Helper()
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", standby))
	if _, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		return ok && d.Spec.Replicas != nil && *d.Spec.Replicas == 1, nil
	}); err != nil {
		logs, _ := n.PodLog(ctx, agent, "agent")
		t.Fatalf("the standby %s was not scaled up: %v; the agent's log:\n%s", standby, err, logs)
	}
}

// awaitTransition waits for the agent's log to show the transition of pod
// from source: to healthy when reason is "", else to unhealthy for reason.
func awaitTransition(ctx context.Context, t *testing.T, n *vmnode.Node, agent, pod *corev1.Pod, source, reason string) map[string]any {
	t.Helper()
	to := "unhealthy"
	if reason == "" {
		to = "healthy"
	}
	return awaitLine(ctx, t, n, agent, "agent", fmt.Sprintf("the transition of %s to %s from %s (%q)", pod.Name, to, source, reason), func(m map[string]any) bool {
		return m["msg"] == "transition" && m["pod"] == pod.Name && m["source"] == source && m["to"] == to && strings.Contains(fmt.Sprint(m["reason"]), reason)
	})
}

// awaitLine waits for a JSON line of a container's log that ok accepts.
// The log is a file in the guest, with nothing to wait on from the host: it
// is read again every 250 ms, for up to a minute.
func awaitLine(ctx context.Context, t *testing.T, n *vmnode.Node, pod *corev1.Pod, container, what string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		logs, err := n.PodLog(ctx, pod, container)
		for _, l := range strings.Split(string(logs), "\n") {
			_, js, found := strings.Cut(l, " F ")
			var m map[string]any
			if found && json.Unmarshal([]byte(js), &m) == nil && ok(m) {
				t.Logf("%s: %s", container, js)
				return m
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no %s in the log of %s/%s (%v):\n%s", what, pod.Name, container, err, logs)
		case <-tick.C:
		}
	}
}

// broker is a Mosquitto Deployment as a user writes it before AMF, with the
// standby named and a 100 Mi memory limit: edge-broker-a, its standby
// edge-broker-b, or with a prefix, <prefix>-a and <prefix>-b.
func broker(ns string, prefix ...string) *appsv1.Deployment {
	name := "edge-broker"
	if len(prefix) > 0 {
		name = prefix[0]
	}
	lbl := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name + "-a"}
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")}
	requests := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("50Mi")}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-a", Namespace: ns, Annotations: map[string]string{"amf.io/standby": name + "-b", "amf.io/redundancy": "cold"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: lbl},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "mosquitto", Image: images.MosquittoRef,
					Ports:     []corev1.ContainerPort{{Name: "mqtt", ContainerPort: 1883}},
					Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests},
				}}},
			},
		},
	}
}

// inject runs `amf-agent inject` (built from this module) on in.
func inject(t *testing.T, in []byte, args ...string) []byte {
	t.Helper()
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// Go's build cache makes the second test's build a relink at most.
	dir := t.TempDir()
	if err := ociimage.GoBuild(t.Context(), "", repo, runtime.GOARCH, dir, "./cmd/amf-agent"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "amf-agent"), append([]string{"inject"}, args...)...)
	cmd.Stdin = bytes.NewReader(in)
	var e bytes.Buffer
	cmd.Stderr = &e
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("amf-agent inject %s: %v: %s", strings.Join(args, " "), err, e.String())
	}
	t.Logf("inject said: %s", e.String())
	return out
}
