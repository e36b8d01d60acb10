package nodewatch_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/nodewatch"
	"github.com/amf-edge/amf/podsignal"
)

// noSidecars refuses every MQTT client: in node mode no sidecar connects.
type noSidecars struct{}

func (noSidecars) Authenticate(context.Context, string) (podsignal.PodID, error) {
	return podsignal.PodID{}, agent.ErrUnauthenticated
}

// TestNodeModeOnARealNode: a Deployment annotated amf.io/mode=node with a
// real Mosquitto broker on the real kubelet + containerd node, the agent's
// tracker and a Watcher in this process (root, the host's cgroup and PID
// view, as the DaemonSet's node-mode pod has them). The pipeline starts
// when the pod runs, the broker's kill and its OOM kill reach the tracker as
// unhealthy through the pushed notifications (their reasons say so), the
// restarted container is followed back to healthy, and a scale-down ends
// in stopping, not gone.
func TestNodeModeOnARealNode(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	cs := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	a, err := agent.New(agent.Config{MQTTAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authenticator: noSidecars{}})
	if err != nil {
		t.Fatal(err)
	}
	events := a.Tracker().Subscribe(ctx, 1024)
	agentDone := make(chan error, 1)
	go func() { agentDone <- a.Run(ctx) }()
	md, err := metadata.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	w, err := nodewatch.New(nodewatch.Config{
		Client: cs, Metadata: md, NodeName: n.Name,
		Begin: func(id podsignal.PodID) nodewatch.Session {
			if s := a.Tracker().BeginLocal(id); s != nil {
				return s
			}
			return nil
		},
		Cgroup: []cgroup.Option{cgroup.WithKubeletCgroupRoot("/" + n.Cgroup)},
	})
	if err != nil {
		t.Fatal(err)
	}
	watchDone := make(chan error, 1)
	go func() { watchDone <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-watchDone; err != nil {
			t.Errorf("watcher: %v", err)
		}
		if err := <-agentDone; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	const ns = "mqtt"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, broker(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(ctx, t, cp, ns, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	runningSeen := time.Now()
	id := podsignal.PodID{Namespace: ns, Pod: pod.Name}

	// next returns the next observation of the pod that satisfies ok.
	next := func(what string, bound time.Duration, ok func(podsignal.Observation) bool) podsignal.Observation {
		t.Helper()
		timeout := time.After(bound)
		for {
			select {
			case ev, open := <-events:
				if !open {
					t.Fatalf("tracker closed before %s", what)
				}
				if ev.PodID == id && ev.Source == podsignal.SourceNode && ok(ev) {
					return ev
				}
			case <-timeout:
				t.Fatalf("no %s within %v", what, bound)
			}
		}
	}
	state := func(s podsignal.State) func(podsignal.Observation) bool {
		return func(ev podsignal.Observation) bool { return ev.State == s }
	}

	first := next("first node-mode observation", time.Minute, func(podsignal.Observation) bool { return true })
	t.Logf("pipeline started %v after this test saw the pod Running (its own watch of the same API server)", first.Received.Sub(runningSeen))
	if first.State != podsignal.Starting {
		t.Errorf("first observation %s, want starting", first.State)
	}
	if d := first.Received.Sub(runningSeen); d > 5*time.Second {
		t.Errorf("pipeline started %v after the pod ran; the target is 1 s", d)
	}
	next("healthy (scored, and the MQTT probe through the pod's IP passed)", 30*time.Second, state(podsignal.Healthy))

	// A hang: the broker stopped; only the app-logic probe can tell.
	pid, err := n.ContainerPID(ctx, ns, pod.Name, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	hung := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	hang := next("unhealthy while the broker hangs", 30*time.Second, state(podsignal.Unhealthy))
	t.Logf("broker SIGSTOP → tracker unhealthy: %v (%s)", hang.Received.Sub(hung), hang.Message.Reason)
	if !strings.Contains(hang.Message.Reason, "probe") {
		t.Errorf("reason %q: want the app-logic probe's", hang.Message.Reason)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	next("healthy after the broker resumed", 30*time.Second, state(podsignal.Healthy))

	// A crash: the broker's process killed from the host.
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	crash := next("unhealthy after the kill", 30*time.Second, state(podsignal.Unhealthy))
	t.Logf("broker SIGKILL → tracker unhealthy: %v (%s)", crash.Received.Sub(killed), crash.Message.Reason)
	// Pushed either way: the pidfd's exit, or the probe's connection lost
	// (the kernel closes the broker's sockets as it exits); a sample would
	// say the container is gone.
	if r := crash.Message.Reason; !strings.Contains(r, "exited") && !strings.Contains(r, "probe") {
		t.Errorf("reason %q: want the pushed exit, not the next sample", r)
	}
	if d := crash.Received.Sub(killed); d > 5*time.Second {
		t.Errorf("unhealthy %v after the kill", d)
	}
	next("healthy again (the restarted container)", time.Minute, state(podsignal.Healthy))

	// An OOM kill: memory over the limit inside the container, charged to
	// it (the lab's injector exec'd through the runtime).
	stress, err := n.Exec(ctx, ns, pod.Name, "mosquitto", []string{images.LabBinary, "stress", "--memory-file", "--profile", "60s:mem=200Mi"}, os.Stderr, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	oom := next("unhealthy after the OOM kill", time.Minute, state(podsignal.Unhealthy))
	_ = stress.Wait()
	t.Logf("OOM → tracker unhealthy (%s)", oom.Message.Reason)
	// The OOM kill is named whichever comes first, the notification or the
	// exit of a killed broker (told by the cgroup's oom_kill counter).
	if r := oom.Message.Reason; !strings.Contains(r, "OOM kill") && !strings.Contains(r, "probe") {
		t.Errorf("reason %q: want the OOM kill", r)
	}
	next("healthy after the OOM kill's restart", 2*time.Minute, state(podsignal.Healthy))

	// A scale-down deletes the pod: stopping, never gone (no failover).
	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "broker", Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: 0}}
	if _, err := cs.AppsV1().Deployments(ns).UpdateScale(ctx, "broker", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	end := next("the end of the pipeline", time.Minute, func(ev podsignal.Observation) bool {
		return ev.State == podsignal.Stopping || ev.State == podsignal.Gone
	})
	if end.State != podsignal.Stopping {
		t.Errorf("scale-down ended in %s, want stopping", end.State)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test deadline")
	}
}

func broker(ns string) *appsv1.Deployment {
	labels := map[string]string{"app": "broker"}
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")}
	requests := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("50Mi")}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "broker", Namespace: ns, Annotations: map[string]string{
			contract.AnnMode: string(contract.ModeNode), contract.AnnProbe: "mqtt://:1883"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "mosquitto", Image: images.MosquittoRef,
					Ports:     []corev1.ContainerPort{{Name: "mqtt", ContainerPort: 1883}},
					Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests},
				}}},
			},
		},
	}
}

// waitPod watches the pods of ns until one not terminating satisfies ok.
func waitPod(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lw := cache.NewListWatchFromClient(cp.Client().CoreV1().RESTClient(), "pods", ns, fields.Everything())
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, isPod := ev.Object.(*corev1.Pod)
		return isPod && ev.Type != watch.Deleted && p.DeletionTimestamp == nil && ok(p), nil
	})
	if err != nil {
		t.Fatalf("no pod in %s: %v", ns, err)
	}
	return ev.Object.(*corev1.Pod)
}
