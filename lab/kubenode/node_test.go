package kubenode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// pod is a Burstable pod (requests half its limits) bound to node.
func pod(name, node, image string, limits corev1.ResourceList, cmd ...string) *corev1.Pod {
	requests := corev1.ResourceList{}
	for k, v := range limits {
		h := v.DeepCopy()
		h.Set(v.Value() / 2)
		if k == corev1.ResourceCPU {
			h = *resource.NewMilliQuantity(v.MilliValue()/2, resource.DecimalSI)
		}
		requests[k] = h
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullNever, Command: cmd,
				Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests},
			}},
		},
	}
}

// waitPod watches a pod until cond holds.
func waitPod(t *testing.T, c kubernetes.Interface, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "pods", metav1.NamespaceDefault, fields.OneTermEqualSelector("metadata.name", name))
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		return ok && cond(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s: not %s within %v: %v", name, what, timeout, err)
	}
	return ev.Object.(*corev1.Pod)
}

func running(p *corev1.Pod) bool {
	return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil && p.Status.PodIP != ""
}

// TestNodeRunsPodsInTheirOwnNetworkUnderItsCgroupRoot: a pod on the real node
// has an IP of the node's pod range and a network namespace of its own, its
// containers' cgroups are under the node's cgroup root beside the pause
// container, and the API server reaches the kubelet (logs).
func TestNodeRunsPodsInTheirOwnNetworkUnderItsCgroupRoot(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{})
	c := cp.Client()
	ctx := context.Background()
	p := pod("broker", n.Name, images.MosquittoRef, corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("250m")})
	if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := waitPod(t, c, p.Name, time.Minute, "running", running)

	_, cidr, err := net.ParseCIDR(n.PodCIDR)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(got.Status.PodIP); !cidr.Contains(ip) {
		t.Errorf("pod IP %s not in the node's pod range %s", got.Status.PodIP, n.PodCIDR)
	}
	cg, err := n.ContainerCgroup(ctx, p.Namespace, p.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Dir(cg)
	if !strings.HasPrefix(cg, "/"+n.Cgroup+"/kubepods/burstable/pod"+string(got.UID)+"/") {
		t.Errorf("container cgroup %s: want it under /%s/kubepods/burstable/pod%s", cg, n.Cgroup, got.UID)
	}
	ents, err := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", podDir))
	if err != nil {
		t.Fatal(err)
	}
	var containers int
	for _, e := range ents {
		if e.IsDir() {
			containers++
		}
	}
	if containers != 2 {
		t.Errorf("%s holds %d container cgroups, want 2 (pause + main)", podDir, containers)
	}
	limit, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes"))
	if err != nil || strings.TrimSpace(string(limit)) != fmt.Sprint(64<<20) {
		t.Errorf("memory.limit_in_bytes %q (%v), want %d", limit, err, 64<<20)
	}
	pid, err := n.ContainerPID(ctx, p.Namespace, p.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	hostNS, _ := os.Readlink("/proc/self/ns/net")
	podNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	nodeNS, _ := os.Readlink(n.NetNS)
	if podNS == hostNS || podNS == nodeNS || podNS == "" {
		t.Errorf("pod network namespace %q; host %q, node %q: want its own", podNS, hostNS, nodeNS)
	}
	// The broker answers on the pod's IP, from the host, through the node
	// (once it listens: a running container may not have bound its port yet,
	// and a loaded machine showed "connection refused" right after the start).
	var derr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var conn net.Conn
		if conn, derr = net.DialTimeout("tcp", net.JoinHostPort(got.Status.PodIP, "1883"), 5*time.Second); derr == nil {
			conn.Close()
			break
		}
	}
	if derr != nil {
		t.Errorf("dial the broker at its pod IP: %v", derr)
	}
	logs, err := c.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "mosquitto") {
		t.Errorf("kubectl logs through the kubelet: %q, %v", logs, err)
	}
}

// TestOOMKilledContainerIsRestartedWithTheKubeletsBackoff: memory over the
// limit inside the container (the lab's injector, exec'd through the runtime)
// ends it as OOMKilled with exit 137, and the kubelet restarts it; the next
// crash waits out the back-off.
func TestOOMKilledContainerIsRestartedWithTheKubeletsBackoff(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{})
	c := cp.Client()
	ctx := context.Background()
	p := pod("oom", n.Name, images.MosquittoRef, corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")})
	if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, p.Name, time.Minute, "running", running)
	evs, stop := n.Subscribe(ctx)
	defer stop()
	for crash := 1; crash <= 2; crash++ {
		waitPod(t, c, p.Name, time.Minute, "running again", func(p *corev1.Pod) bool {
			return running(p) && p.Status.ContainerStatuses[0].RestartCount == int32(crash-1)
		})
		cmd, err := n.Exec(ctx, p.Namespace, p.Name, "main", []string{images.LabBinary, "stress", "--memory-file", "--profile", "30s:mem=64Mi"}, os.Stderr, os.Stderr)
		if err != nil {
			t.Fatal(err)
		}
		var oom kubenode.Event
		for oom.Type != kubenode.EventOOMKilled {
			select {
			case oom = <-evs:
			case <-time.After(time.Minute):
				t.Fatalf("crash %d: no OOMKilled event within a minute", crash)
			}
		}
		_ = cmd.Wait()
		if oom.ExitCode != 137 || oom.Container != "main" {
			t.Errorf("crash %d: %+v, want container main, exit 137", crash, oom)
		}
		var restart kubenode.Event
		for restart.Type != kubenode.EventRestarted {
			select {
			case restart = <-evs:
			case <-time.After(time.Minute):
				t.Fatalf("crash %d: no restart within a minute", crash)
			}
		}
		t.Logf("crash %d: OOMKilled at %v, restarted %v later", crash, oom.Time.Format(time.RFC3339), restart.Time.Sub(oom.Time))
		if d := restart.Time.Sub(oom.Time); crash == 2 && d < 9*time.Second {
			t.Errorf("second restart %v after the crash: want the kubelet's 10 s back-off", d)
		}
	}
}
