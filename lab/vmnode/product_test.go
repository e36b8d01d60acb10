package vmnode_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path"
	"path/filepath"
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

	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/testbed"
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
	cp, n := start(t)
	cs := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, nil, "apply", "-k", filepath.Join(repo, "manifests", "base")); err != nil {
		t.Fatalf("kubectl apply -k manifests/base: %v: %s", err, out)
	}
	agent := waitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", podReady)
	t.Logf("agent pod %s Ready", agent.Name)

	const ns = "mqtt"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plain, err := yaml.Marshal(broker(ns))
	if err != nil {
		t.Fatal(err)
	}
	injected := inject(t, repo, plain, "--standby", "--container", "mosquitto")
	if out, err := cp.Kubectl(ctx, bytes.NewReader(injected), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply the injected broker: %v: %s", err, out)
	}
	primary := waitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-a", podReady)
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

	// An OOM kill in the broker's container: the lab's stress program, run
	// in the container by containerd, grows past the 100 Mi limit.
	before, err := n.ReadFile(ctx, path.Join(cg, "memory.events"))
	if err != nil {
		t.Fatal(err)
	}
	id := cg[strings.LastIndex(cg, "cri-containerd-")+len("cri-containerd-") : len(cg)-len(".scope")]
	out, _ := n.Run(ctx, "/amf/bin/ctr", "--namespace", "k8s.io", "tasks", "exec", "--exec-id", "oom", id,
		images.LabBinary, "stress", "--memory-file", "--profile", "60s:mem=200Mi")
	t.Logf("the stress exec ended: %s", strings.TrimSpace(string(out)))
	events, _ := n.ReadFile(ctx, path.Join(cg, "memory.events"))
	t.Logf("memory.events before:\n%safter:\n%s", before, events)

	// The agent acts on the sidecar's OOM signal: the standby is scaled up.
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", "edge-broker-b"))
	if _, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		return ok && d.Spec.Replicas != nil && *d.Spec.Replicas == 1, nil
	}); err != nil {
		logs, _ := n.PodLog(ctx, agent, "agent")
		t.Fatalf("the standby was not scaled up after the OOM kill: %v; the agent's log:\n%s", err, logs)
	}
	logs, err := n.PodLog(ctx, agent, "agent")
	if err != nil {
		t.Fatal(err)
	}
	var oom string
	for _, l := range strings.Split(string(logs), "\n") {
		if strings.Contains(l, `"msg":"transition"`) && strings.Contains(l, primary.Name) && strings.Contains(strings.ToLower(l), "oom") {
			oom = l
		}
	}
	if oom == "" {
		sc, _ := n.PodLog(ctx, primary, "amf-sidecar")
		p, _ := cs.CoreV1().Pods(ns).Get(ctx, primary.Name, metav1.GetOptions{})
		st, _ := json.MarshalIndent(p.Status.ContainerStatuses, "", " ")
		t.Errorf("the agent's log has no transition of %s for the OOM kill:\n%s\nthe sidecar's:\n%s\nthe pod's containers: %s", primary.Name, logs, sc, st)
	}
	t.Logf("agent: %s", oom)
}

// broker is a Mosquitto Deployment as a user writes it before AMF, with the
// standby named and a 100 Mi memory limit.
func broker(ns string) *appsv1.Deployment {
	lbl := map[string]string{"app.kubernetes.io/name": "edge-broker", "app.kubernetes.io/instance": "edge-broker-a"}
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")}
	requests := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("50Mi")}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "edge-broker-a", Namespace: ns, Annotations: map[string]string{"amf.io/standby": "edge-broker-b", "amf.io/redundancy": "cold"}},
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
func inject(t *testing.T, repo string, in []byte, args ...string) []byte {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "amf-agent")
	if b, err := exec.Command("go", "build", "-C", repo, "-o", bin, "./cmd/amf-agent").CombinedOutput(); err != nil {
		t.Fatalf("go build amf-agent: %v: %s", err, b)
	}
	cmd := exec.Command(bin, append([]string{"inject"}, args...)...)
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

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitPod watches the pods of ns that selector picks until one satisfies ok.
func waitPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, selector string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, isPod := ev.Object.(*corev1.Pod)
		return isPod && ev.Type != watch.Deleted && p.DeletionTimestamp == nil && ok(p), nil
	})
	if err != nil {
		pods, _ := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		b, _ := json.MarshalIndent(pods, "", " ")
		t.Fatalf("no pod %s in %s: %v\n%s", selector, ns, err, b)
	}
	return ev.Object.(*corev1.Pod)
}
