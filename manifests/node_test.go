package manifests_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// brokerWithExporter is a broker Deployment as a user writes it before AMF:
// Mosquitto (the container with the port named mqtt) beside a second app
// container, as an exporter often is.
func brokerWithExporter(ns string) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": "edge-broker", "app.kubernetes.io/instance": "edge-broker-a"}
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")}
	requests := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("50Mi")}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "edge-broker-a", Namespace: ns, Annotations: map[string]string{"amf.io/standby": "edge-broker-b", "amf.io/redundancy": "cold"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{
						{
							Name: "mosquitto", Image: images.MosquittoRef,
							Ports:     []corev1.ContainerPort{{Name: "mqtt", ContainerPort: 1883}},
							Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests},
						},
						{
							Name: "exporter", Image: images.PauseRef,
							Ports:     []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9234}},
							Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("16Mi")}},
						},
					},
				},
			},
		},
	}
}

// TestInstallOnARealNode is the install path as a user runs it, on a real
// kubelet + containerd node with a cgroup root of its own: kubectl apply -k
// manifests/base, a broker with an exporter beside it injected by the
// amf-agent binary (inject --standby --container mosquitto) and applied. The
// agent's pod becomes Ready and authenticates the sidecar by TokenReview; the
// sidecar, a native sidecar, finds the mosquitto container's cgroup among the
// pause, exporter and its own, reads the pod's network counters, probes the
// broker, and the agent patches the readiness gate, so the pod is Ready.
func TestInstallOnARealNode(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	cs := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	agent, broker := installBroker(ctx, t, cp)
	checkInjectedBroker(ctx, t, cs, n, agent, broker)
}

// installBroker is the install path as a user runs it: kubectl apply -k
// manifests/base, the agent and amf-connkill running (the latter as root
// with its two capabilities, serving the agent's socket), and in namespace
// mqtt the broker with an exporter beside it injected by the amf-agent
// binary (inject --standby --container mosquitto) and applied. It returns
// the agent's pod and the primary's, Ready.
func installBroker(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) (agent, primary *corev1.Pod) {
	t.Helper()
	return installBrokerWith(ctx, t, cp, nil)
}

// installBrokerWith is installBroker with ann added to the primary's
// annotations and extra given to inject.
func installBrokerWith(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ann map[string]string, extra ...string) (agent, primary *corev1.Pod) {
	t.Helper()
	cs := cp.Client()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, nil, "apply", "-k", filepath.Join(repo, "manifests", "base")); err != nil {
		t.Fatalf("kubectl apply -k manifests/base: %v: %s", err, out)
	}
	agent = kubenodetest.WaitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", kubenodetest.PodReady)
	t.Logf("agent pod %s Ready on %s", agent.Name, agent.Spec.NodeName)
	waitLog(ctx, t, cs, agent, "connkill: watching the endpoints of managed brokers")
	waitLog(ctx, t, cs, kubenodetest.WaitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-connkill", kubenodetest.PodReady), `"msg":"connkill serving"`)

	const ns = "mqtt"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := brokerWithExporter(ns)
	maps.Copy(d.Annotations, ann)
	plain, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	injected, warnings := injectWithBinary(t, repo, plain, append([]string{"--standby", "--container", "mosquitto"}, extra...)...)
	t.Logf("inject said: %s", warnings)
	if out, err := cp.Kubectl(ctx, bytes.NewReader(injected), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply the injected broker: %v: %s", err, out)
	}
	return agent, kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-a", kubenodetest.PodReady)
}

// checkInjectedBroker checks a Ready pod of brokerWithExporter with the
// sidecar: its readiness gate is the agent's, the sidecar runs as a native
// sidecar, finds the mosquitto container's cgroup among the pause, exporter
// and its own, reads the pod's network counters and scores healthy, and the
// agent authenticated its connection.
func checkInjectedBroker(ctx context.Context, t *testing.T, cs kubernetes.Interface, n *kubenode.Node, agent, broker *corev1.Pod) {
	t.Helper()
	ns := broker.Namespace
	gate := false
	for _, c := range broker.Status.Conditions {
		if c.Type == "amf.io/healthy" && c.Status == corev1.ConditionTrue {
			gate = true
		}
	}
	if !gate {
		t.Errorf("pod %s is Ready without the amf.io/healthy condition: %+v", broker.Name, broker.Status.Conditions)
	}
	var brokerID string
	for _, s := range broker.Status.ContainerStatuses {
		if s.Name == "mosquitto" {
			_, brokerID, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if len(broker.Status.InitContainerStatuses) != 1 || broker.Status.InitContainerStatuses[0].Name != "amf-sidecar" || broker.Status.InitContainerStatuses[0].State.Running == nil {
		t.Errorf("the sidecar does not run as a native sidecar: %+v", broker.Status.InitContainerStatuses)
	}
	podDir := filepath.Dir(mustCgroup(ctx, t, n, ns, broker.Name, "mosquitto"))
	ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", podDir))
	var containers int
	for _, e := range ents {
		if e.IsDir() {
			containers++
		}
	}
	if containers != 4 {
		t.Errorf("%s: %d container cgroups, want 4 (pause, sidecar, mosquitto, exporter)", podDir, containers)
	}

	st := sidecarStatus(ctx, t, n, ns, broker.Name)
	if !strings.Contains(st.Target, brokerID[:12]) || !strings.Contains(st.Target, "/"+n.Cgroup+"/kubepods/") {
		t.Errorf("sidecar target %q: want container %s under /%s/kubepods", st.Target, brokerID[:12], n.Cgroup)
	}
	if st.State != "healthy" {
		t.Errorf("sidecar state %q (%s), want healthy", st.State, st.TransitionReason)
	}
	if st.MemoryReference == nil || st.MemoryReference.Source != "container_limit" || st.MemoryReference.Value != 100<<20 {
		t.Errorf("memory reference %+v, want the container's 100 Mi limit", st.MemoryReference)
	}
	// Network counters from the sidecar's own /proc, whose network namespace is
	// the pod's (every container of a pod shares it), not a host mount.
	if _, netSrc, _ := strings.Cut(st.Target, "network "); !strings.HasPrefix(netSrc, "/proc/") || strings.Contains(netSrc, "/host/") {
		t.Errorf("sidecar reads network counters from %q, want its own /proc/<pid>/net/dev (the pod's network)", netSrc)
	}
	if st.Features == nil {
		t.Fatalf("sidecar reports no features: %+v", st)
	}
	logs, err := cs.CoreV1().Pods("amf-system").GetLogs(agent.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), `"msg":"client connected"`) || !strings.Contains(string(logs), broker.Name) {
		t.Errorf("the agent's log shows no authenticated connection from %s:\n%s", broker.Name, logs)
	}
}

// TestAdmissionOverlayOnARealNode is the admission path as a user runs it,
// on a real kubelet + containerd node: kubectl apply -k
// manifests/overlays/admission, then the plain broker Deployment with only
// the label amf.io/inject=true added to its pod template, created as it is.
// The ReplicaSet's pod comes up with the sidecar the policy wrote, which
// finds its broker, and the agent sees its signals: it sets the readiness
// gate, so the pod is Ready.
func TestAdmissionOverlayOnARealNode(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := applyAdmission(ctx, t, cp, filepath.Join("overlays", "admission"))
	cs := a.cs
	agent := kubenodetest.WaitPod(ctx, t, cs, "amf-system", "app.kubernetes.io/name=amf-agent", kubenodetest.PodReady)

	const ns = "mqtt"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := brokerWithExporter(ns)
	d.Spec.Template.Labels[contract.LabelInject] = "true"
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := ours(a.warn.take()); len(w) > 0 {
		t.Errorf("the broker's Deployment was warned about: %q", w)
	}
	broker := kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-a", kubenodetest.PodReady)
	if dep, err := cs.AppsV1().Deployments(ns).Get(ctx, d.Name, metav1.GetOptions{}); err != nil || hasSidecar(dep.Spec.Template.Spec) {
		t.Errorf("the Deployment itself was changed (err %v): the policy is for pods", err)
	}
	checkInjectedBroker(ctx, t, cs, n, agent, broker)
}

// sidecarState is the part of the sidecar's /status this test reads.
type sidecarState struct {
	State            string          `json:"state"`
	TransitionReason string          `json:"transition_reason"`
	Target           string          `json:"target"`
	Features         json.RawMessage `json:"features"`
	MemoryReference  *struct {
		Value  float64 `json:"value"`
		Source string  `json:"source"`
	} `json:"memory_reference"`
}

// sidecarStatus reads the sidecar's loopback-only /status from inside the pod's network.
func sidecarStatus(ctx context.Context, t *testing.T, n *kubenode.Node, ns, pod string) sidecarState {
	t.Helper()
	pid, err := n.ContainerPID(ctx, ns, pod, "amf-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	netns := fmt.Sprintf("/proc/%d/ns/net", pid)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return kubenode.DialIn(ctx, netns, addr)
	}}}
	resp, err := hc.Get("http://127.0.0.1:8086/status")
	if err != nil {
		t.Fatalf("sidecar /status: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st sidecarState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("sidecar /status %q: %v", b, err)
	}
	return st
}

func mustCgroup(ctx context.Context, t *testing.T, n *kubenode.Node, ns, pod, container string) string {
	t.Helper()
	cg, err := n.ContainerCgroup(ctx, ns, pod, container)
	if err != nil {
		t.Fatal(err)
	}
	return cg
}

// injectWithBinary runs `amf-agent inject` (built from this module) on in.
func injectWithBinary(t *testing.T, repo string, in []byte, args ...string) (out []byte, stderr string) {
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
	return out, e.String()
}

// TestNodeModeDeletesItsRetiredPodWithTheControllersDown: a node-mode
// pair's crash failover retires the primary by scaling it to 0, and its
// kubelet restarts the crashed broker at once; with no readiness gate on a
// node-mode pod, that empty broker would serve in its Services until the
// ReplicaSet controller deletes the pod. The agent deletes it itself: here
// with the controller manager stopped (as a slow or restarting one leaves
// the cluster), so nothing else could. A hot pair, whose failover needs no
// controller; once the controllers are back, the old primary returns as the
// hot standby.
func TestNodeModeDeletesItsRetiredPodWithTheControllersDown(t *testing.T) {
	l := startNodeModePair(t, contract.Hot)
	ctx, cp, cs, n, awaitLine, ns := l.ctx, l.cp, l.cs, l.n, l.awaitLine, nodeModeNS
	primary := kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-a", kubenodetest.PodReady)
	kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-b", kubenodetest.PodReady)
	awaitLine("the primary healthy", func(m map[string]any) bool {
		return m["msg"] == "transition" && m["pod"] == primary.Name && m["source"] == "node" && m["to"] == "healthy"
	})
	// The standby's Deployment says Ready before the controllers stop: the
	// failover reads it, at its current generation, which the agent's
	// record of the pair's nodes moves (an annotation bumps a Deployment's
	// generation): so once those are written.
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", "edge-broker-b"))
	if _, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		return ok && d.Annotations[contract.AnnPrimaryNode] != "" && d.Annotations[contract.AnnStandbyNode] != "" &&
			d.Status.ReadyReplicas == 1 && d.Status.ObservedGeneration == d.Generation, nil
	}); err != nil {
		t.Fatalf("the hot standby's Deployment never said Ready with the pair's nodes recorded: %v", err)
	}

	cp.StopControllerManager()
	pid, err := n.ContainerPID(ctx, ns, primary.Name, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitLine("the retired pod deleted", func(m map[string]any) bool {
		return m["msg"] == "retired pod deleted" && m["pod"] == ns+"/"+primary.Name
	})
	p, err := cs.CoreV1().Pods(ns).Get(ctx, primary.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		t.Fatal(err)
	case p.DeletionTimestamp == nil:
		t.Errorf("the retired pod %s has no deletion mark", primary.Name)
	}
	t.Logf("the retired pod deleted by the agent %v after the kill, with the controller manager down", time.Since(killed).Round(time.Millisecond))

	if err := cp.StartControllerManager(ctx); err != nil {
		t.Fatal(err)
	}
	lw = cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", "edge-broker-a"))
	if _, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		return ok && d.Annotations[contract.AnnRole] == "standby" && d.Status.ReadyReplicas == 1 && d.Status.ObservedGeneration == d.Generation, nil
	}); err != nil {
		t.Fatalf("the old primary did not come back as the hot standby: %v", err)
	}
}

// nodeModeNS is the namespace of the node-mode tests' broker pair.
const nodeModeNS = "mqtt"

// nodeModeLab is a real node with manifests/overlays/node-mode applied and a
// plain broker pair (edge-broker-a, its standby edge-broker-b) in
// nodeModeNS, annotated by amf-agent inject --mode node --standby.
type nodeModeLab struct {
	ctx       context.Context
	cp        *controlplane.ControlPlane
	cs        kubernetes.Interface
	n         *kubenode.Node
	agent     *corev1.Pod
	awaitLine func(what string, ok func(map[string]any) bool) map[string]any
}

// startNodeModePair starts a nodeModeLab whose pair has the redundancy
// given; it returns once the agent's pod is Ready (its log followed from
// its start) and the pair is applied.
func startNodeModePair(t *testing.T, redundancy contract.Redundancy) *nodeModeLab {
	t.Helper()
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	l := &nodeModeLab{cp: cp, cs: cp.Client(), n: n}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	l.ctx = ctx
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, nil, "apply", "-k", filepath.Join(repo, "manifests", "overlays", "node-mode")); err != nil {
		t.Fatalf("kubectl apply -k manifests/overlays/node-mode: %v: %s", err, out)
	}
	l.agent = kubenodetest.WaitPod(ctx, t, l.cs, "amf-system", "app.kubernetes.io/name=amf-agent", kubenodetest.PodReady)
	l.awaitLine = followLog(ctx, t, l.cs, l.agent)
	if _, err := l.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodeModeNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := brokerWithExporter(nodeModeNS)
	d.Spec.Template.Spec.Containers = d.Spec.Template.Spec.Containers[:1] // a plain broker
	d.Annotations[contract.AnnRedundancy] = string(redundancy)
	plain, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	annotated, _ := injectWithBinary(t, repo, plain, "--mode", "node", "--standby")
	if out, err := cp.Kubectl(ctx, bytes.NewReader(annotated), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply the annotated broker: %v: %s", err, out)
	}
	return l
}

// followLog follows the JSON lines of the log of pod's first container
// (through the API server and the kubelet) until ctx ends; the function it
// returns waits for the next line ok accepts, failing t with every line seen
// when none comes.
func followLog(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) func(what string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	stream, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	lines := make(chan map[string]any, 256)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stream)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				lines <- m
			}
		}
	}()
	var seen []string
	return func(what string, ok func(map[string]any) bool) map[string]any {
		t.Helper()
		for {
			select {
			case m, open := <-lines:
				if !open {
					t.Fatalf("%s's log ended before %s; seen:\n%s", pod.Name, what, strings.Join(seen, "\n"))
				}
				b, _ := json.Marshal(m)
				seen = append(seen, string(b))
				if ok(m) {
					return m
				}
			case <-ctx.Done():
				t.Fatalf("no %s in %s's log; seen:\n%s", what, pod.Name, strings.Join(seen, "\n"))
			}
		}
	}
}

// waitLog follows the log of pod's first container until a line holds want.
func waitLog(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, want string) {
	t.Helper()
	waitLogLine(ctx, t, cs, pod, want)
}

// waitLogLine is waitLog, returning the line.
func waitLogLine(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, want string) string {
	t.Helper()
	rc, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return sc.Text()
		}
	}
	t.Fatalf("%s's log ended without %q: %v", pod.Name, want, sc.Err())
	return ""
}

// TestNodeModeOverlayOnARealNode is node mode as a user installs it, on a
// real kubelet + containerd node: kubectl apply -k manifests/overlays/node-mode
// (the agent pod non-root, without capabilities, the host's cgroup tree
// read-only, hostPID) and a plain Mosquitto Deployment annotated with
// amf-agent inject --mode node. The agent's own log shows the pipeline on the
// broker's container with its exit watched, the pod healthy from source
// node, and, once the broker is killed from the host, unhealthy by the
// pushed exit; the same actuator then fails over to the cold standby (whose
// pod gets a pipeline of its own) and retires the crashed primary.
func TestNodeModeOverlayOnARealNode(t *testing.T) {
	l := startNodeModePair(t, contract.Cold)
	ctx, cs, n, agent, awaitLine, ns := l.ctx, l.cs, l.n, l.agent, l.awaitLine, nodeModeNS
	if !agent.Spec.HostPID || agent.Spec.Containers[0].SecurityContext.RunAsNonRoot == nil || !*agent.Spec.Containers[0].SecurityContext.RunAsNonRoot {
		t.Errorf("agent pod: hostPID %v, security context %+v", agent.Spec.HostPID, agent.Spec.Containers[0].SecurityContext)
	}
	awaitLine("node mode on", func(m map[string]any) bool { return m["msg"] == "node mode watching" })
	broker := kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-a", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if len(broker.Spec.InitContainers) != 0 || len(broker.Spec.Containers) != 1 {
		t.Errorf("broker pod has %d init containers and %d containers: node mode injects nothing", len(broker.Spec.InitContainers), len(broker.Spec.Containers))
	}
	target := awaitLine("the pipeline's target", func(m map[string]any) bool {
		return m["msg"] == "node pipeline target" && m["pod"] == ns+"/"+broker.Name
	})
	if target["exit_watch"] != true {
		t.Errorf("the agent pod does not watch the broker's exit: %v", target)
	}
	t.Logf("target line: %v", target)
	onPod := func(to string) func(map[string]any) bool {
		return func(m map[string]any) bool {
			return m["msg"] == "transition" && m["pod"] == broker.Name && m["source"] == "node" && m["to"] == to
		}
	}
	awaitLine("healthy from source node", onPod("healthy"))
	pid, err := n.ContainerPID(ctx, ns, broker.Name, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	crash := awaitLine("unhealthy after the kill", onPod("unhealthy"))
	if r, _ := crash["reason"].(string); !strings.Contains(r, "exited") {
		t.Errorf("unhealthy because %q: want the pushed exit", r)
	}

	// The same actuator acts on it: crash failover to the cold standby
	// (annotated for node mode too, so its pod gets a pipeline), and the
	// crashed primary retired once the standby is Ready.
	standby := kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-b", kubenodetest.PodReady)
	t.Logf("standby pod %s Ready %v after the kill", standby.Name, time.Since(killed).Round(time.Millisecond))
	awaitLine("the standby's pipeline", func(m map[string]any) bool {
		return m["msg"] == "node pipeline target" && m["pod"] == ns+"/"+standby.Name
	})
	lw := cache.NewListWatchFromClient(cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", "edge-broker-a"))
	if _, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		return ok && d.Spec.Replicas != nil && *d.Spec.Replicas == 0, nil
	}); err != nil {
		t.Fatalf("the crashed primary was not retired (scaled to 0): %v", err)
	}
	t.Logf("crashed primary retired (0 replicas) %v after the kill", time.Since(killed).Round(time.Millisecond))
}
