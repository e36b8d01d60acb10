package manifests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
)

// TestResizeInPlaceOnARealNode is the cheapest remedy as a user meets it,
// on a real kubelet + containerd node: the install path with
// amf.io/memory-ceiling on the primary (the sidecar on predict-linear, so
// that a ramp is what it flags), and memory ramped inside the mosquitto
// container (amf-lab stress, as kubectl exec). The agent raises the
// container's memory limit in place instead of switching over: the
// kubelet's status, the container's own cgroup and the sidecar's /status
// have the new limit, the
// same container runs on (no restart, no new pod), and the cold standby is
// never scaled up.
func TestResizeInPlaceOnARealNode(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	cs := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agent, primary := installBrokerWith(ctx, t, cp, map[string]string{contract.AnnMemoryCeiling: "256Mi"}, "--model", "predict-linear")
	const ns, broker = "mqtt", "mosquitto"
	before := containerStatus(t, primary, broker)

	ramp(ctx, t, n, primary.Name, "300s:mem=90Mi,ramp=1Mi/s")

	var line struct{ Note string }
	if err := json.Unmarshal([]byte(waitLogLine(ctx, t, cs, agent, `"msg":"event","component":"actuate","deployment":"mqtt/edge-broker-a","type":"Normal","reason":"Resized"`)), &line); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent: %s", line.Note)
	p, err := cs.CoreV1().Pods(ns).Get(ctx, primary.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var spec corev1.Container
	for _, c := range p.Spec.Containers {
		if c.Name == broker {
			spec = c
		}
	}
	limit := spec.Resources.Limits[corev1.ResourceMemory]
	request := spec.Resources.Requests[corev1.ResourceMemory]
	after := containerStatus(t, p, broker)
	got := after.Resources.Limits[corev1.ResourceMemory]
	t.Logf("memory limit %s → %s (request %s), in the status %s", "100Mi", limit.String(), request.String(), got.String())
	if limit.Value() <= 100<<20 || limit.Value() > 256<<20 || got.Value() != limit.Value() {
		t.Errorf("memory limit %s in the spec, %s in the status: want one value above 100Mi, at most the 256Mi ceiling", limit.String(), got.String())
	}
	if want := 50<<20 + limit.Value() - 100<<20; request.Value() != want {
		t.Errorf("memory request %s, want %d (moved by as much as the limit: the QoS class stays)", request.String(), want)
	}
	if p.Status.QOSClass != corev1.PodQOSBurstable {
		t.Errorf("QoS class %s, want Burstable as before", p.Status.QOSClass)
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", mustCgroup(ctx, t, n, ns, p.Name, broker), "memory.limit_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	if cg, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil || cg != limit.Value() {
		t.Errorf("the container's cgroup limit %q, want %d", b, limit.Value())
	}
	if st := sidecarStatus(ctx, t, n, ns, p.Name); st.MemoryReference == nil || st.MemoryReference.Value != float64(limit.Value()) {
		t.Errorf("the sidecar's /status memory_reference %+v, want the new limit %d", st.MemoryReference, limit.Value())
	}
	if after.ContainerID != before.ContainerID || after.RestartCount != before.RestartCount {
		t.Errorf("container %s → %s, restarts %d → %d: a resize in place must not restart the broker",
			before.ContainerID, after.ContainerID, before.RestartCount, after.RestartCount)
	}
	sb, err := cs.AppsV1().Deployments(ns).Get(ctx, "edge-broker-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := *sb.Spec.Replicas; r != 0 {
		t.Errorf("standby at %d replicas: a resize that took needs no switchover", r)
	}
	// The size survives: recorded on both, and the cold standby's template
	// (it runs no pod) has it, so its pod starts with it.
	pd, err := cs.AppsV1().Deployments(ns).Get(ctx, "edge-broker-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.FormatInt(limit.Value(), 10)
	for _, d := range []*appsv1.Deployment{pd, sb} {
		if got := d.Annotations[contract.AnnMemorySize]; got != want {
			t.Errorf("%s: %s=%q, want %s", d.Name, contract.AnnMemorySize, got, want)
		}
	}
	for _, c := range sb.Spec.Template.Spec.Containers {
		if l := c.Resources.Limits[corev1.ResourceMemory]; c.Name == broker && l.Value() != limit.Value() {
			t.Errorf("standby's template: %s memory limit %s, want %s", broker, l.String(), limit.String())
		}
	}
	for _, c := range pd.Spec.Template.Spec.Containers {
		if l := c.Resources.Limits[corev1.ResourceMemory]; c.Name == broker && l.Value() != 100<<20 {
			t.Errorf("primary's template: %s memory limit %s, want 100Mi as the user wrote it (a change would roll the pod)", broker, l.String())
		}
	}
}

func containerStatus(t *testing.T, p *corev1.Pod, name string) corev1.ContainerStatus {
	t.Helper()
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == name {
			if s.Resources == nil {
				t.Fatalf("container %s of %s reports no resources in its status", name, p.Name)
			}
			return s
		}
	}
	t.Fatalf("pod %s has no container %s", p.Name, name)
	return corev1.ContainerStatus{}
}

// ramp starts amf-lab stress in the broker container of pod (as kubectl
// exec), holding memory up to mem at rate; it stops when the test ends.
func ramp(ctx context.Context, t *testing.T, n *kubenode.Node, pod, profile string) {
	t.Helper()
	var out bytes.Buffer
	sctx, stop := context.WithCancel(ctx)
	cmd, err := n.Exec(sctx, "mqtt", pod, "mosquitto", []string{images.LabBinary, "stress", "--memory-file", "--profile", profile}, &out, &out)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("stress: %s", out.String())
		}
	})
}

// TestResizeInPlaceFallsBackToASwitchoverOnARealNode: each case where a
// resize cannot answer a broker whose memory climbs, on a real kubelet +
// containerd node, ends in today's switchover, and the switchover's Event
// says why no resize answered it: no ceiling (the policy off), a leak that
// would use any room the ceiling allows before a switchover completes, and
// a node without the room (the kubelet's Deferred, the old size put back).
func TestResizeInPlaceFallsBackToASwitchoverOnARealNode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		profile string
		fill    bool   // leave the node no room for the resize (a pod requesting the rest)
		want    string // in the SwitchoverDecided Event
	}{
		{"policy off: no ceiling, no resize", nil, "300s:mem=90Mi,ramp=1Mi/s", false, "bringing up the standby"},
		{"a leak faster than any room the ceiling allows", map[string]string{contract.AnnMemoryCeiling: "128Mi"}, "300s:mem=400Mi,ramp=3Mi/s", false, "before a switchover could complete"},
		{"a node without the room: Deferred, the old size back", map[string]string{contract.AnnMemoryCeiling: "256Mi"}, "300s:mem=90Mi,ramp=1Mi/s", true, "resize refused: the kubelet says Deferred"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
			cs := cp.Client()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			agent, primary := installBrokerWith(ctx, t, cp, tc.ann, "--model", "predict-linear")
			if tc.fill {
				fillNode(ctx, t, cs, primary.Spec.NodeName, 20<<20)
			}
			// A ramp that starts with the sidecar can be confirmed before
			// the sidecar has the samples a slope needs, and then the Event
			// says the sample had no slope to judge by, not this case's why:
			// the ramp starts once its features are all defined (the last,
			// memory_growth_rate, after two 5 s steps).
			waitGrowthRate(ctx, t, n, "mqtt", primary.Name)
			ramp(ctx, t, n, primary.Name, tc.profile)
			var line struct{ Note string }
			if err := json.Unmarshal([]byte(waitLogLine(ctx, t, cs, agent, `"deployment":"mqtt/edge-broker-a","type":"Normal","reason":"SwitchoverDecided"`)), &line); err != nil {
				t.Fatal(err)
			}
			t.Logf("agent: %s", line.Note)
			if !strings.Contains(line.Note, tc.want) {
				t.Errorf("SwitchoverDecided %q, want it to say %q", line.Note, tc.want)
			}
			if tc.ann == nil && strings.Contains(line.Note, "resize") {
				t.Errorf("SwitchoverDecided %q speaks of a resize for a workload without a ceiling", line.Note)
			}
			sb, err := cs.AppsV1().Deployments("mqtt").Get(ctx, "edge-broker-b", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if *sb.Spec.Replicas != 1 {
				t.Errorf("standby at %d replicas after the decision, want 1", *sb.Spec.Replicas)
			}
			p, err := cs.CoreV1().Pods("mqtt").Get(ctx, primary.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range p.Spec.Containers {
				if l := c.Resources.Limits[corev1.ResourceMemory]; c.Name == "mosquitto" && l.Value() != 100<<20 {
					t.Errorf("the broker's memory limit %s after the switchover's decision, want the 100Mi it had", l.String())
				}
			}
		})
	}
}

// waitGrowthRate waits until the pod's sidecar reports memory_growth_rate.
func waitGrowthRate(ctx context.Context, t *testing.T, n *kubenode.Node, ns, pod string) {
	t.Helper()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var f map[string]*float64
		if st := sidecarStatus(ctx, t, n, ns, pod); json.Unmarshal(st.Features, &f) == nil && f[contract.FeatureNames()[contract.MemoryGrowthRate]] != nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the sidecar of %s reports no memory_growth_rate: %v", pod, ctx.Err())
		case <-tick.C:
		}
	}
}

// fillNode creates a pod that requests all the memory the node has left
// but free, so that a resize asking more is Deferred by the kubelet.
func fillNode(ctx context.Context, t *testing.T, cs kubernetes.Interface, node string, free int64) {
	t.Helper()
	fill, err := testbed.FillNode(ctx, cs, node, "mqtt", free)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s: a pod requesting %d leaves %d", node, fill, free)
	kubenodetest.WaitPod(ctx, t, cs, "mqtt", "", func(p *corev1.Pod) bool { return p.Name == testbed.FillPod && kubenodetest.PodReady(p) })
}
