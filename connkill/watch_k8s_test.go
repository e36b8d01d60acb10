package connkill_test

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/connkill"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
)

// kills records the Watcher's requests.
type kills struct {
	mu  sync.Mutex
	got [][]netip.AddrPort
	ch  chan struct{}
}

func (k *kills) kill(_ context.Context, dead []netip.AddrPort) (int, int, error) {
	k.mu.Lock()
	k.got = append(k.got, dead)
	k.mu.Unlock()
	k.ch <- struct{}{}
	return 1, 1, nil
}

// TestTheWatcherAsksToEndTheConnectionsOfARetiredBrokerOnly runs the
// Watcher against a real API server and its controllers: three pods behind
// Services, a broker with the readiness gate amf.io/healthy, a broker in
// node mode (a pod of a Deployment of a pair annotated amf.io/mode: node,
// which inject leaves as the user wrote it), and another app, a
// Deployment's too, without either, each kept terminating by a finalizer
// once deleted (as a pod on a lost node stays). Each broker's deletion asks
// Kill for its endpoint's TCP ports, and again at each later sweep; the
// other app's asks nothing.
func TestTheWatcherAsksToEndTheConnectionsOfARetiredBrokerOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs := cp.Client()
	const ns, finalizer = "mqtt", "amf.io/test-hold"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitServiceAccount(ctx, ns, "default"); err != nil {
		t.Fatal(err)
	}
	k := &kills{ch: make(chan struct{}, 8)}
	w := &connkill.Watcher{Client: cs, Kill: k.kill, Again: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		wcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	pods := map[string]string{} // app → IP
	podNames := map[string]string{}
	for _, app := range []struct {
		name string
		gate bool
		// ann, when set, makes the pod a Deployment's with these
		// annotations.
		ann map[string]string
	}{
		{name: "broker", gate: true},
		{name: "nodebroker", ann: map[string]string{contract.AnnMode: string(contract.ModeNode), contract.AnnStandby: "nodebroker-b", contract.AnnRedundancy: string(contract.Hot)}},
		{name: "web", ann: map[string]string{"app.example/tier": "front"}},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app.name}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": app.name},
			Ports:    []corev1.ServicePort{{Name: "main", Port: 1883, TargetPort: intstr.FromInt32(1883)}, {Name: "ws", Port: 9001, TargetPort: intstr.FromInt32(9001)}},
		}}
		if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: app.name, Labels: map[string]string{"app": app.name}, Finalizers: []string{finalizer}},
			Spec: corev1.PodSpec{NodeName: cp.Nodes[0], Containers: []corev1.Container{{Name: "m", Image: "m",
				Ports: []corev1.ContainerPort{{ContainerPort: 1883}, {ContainerPort: 9001}}}}},
		}
		if app.gate {
			pod.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: contract.ConditionHealthy}}
		}
		if app.ann == nil {
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			// The ReplicaSet controller copies the template's finalizers.
			d := &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: app.name, Annotations: app.ann},
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: pod.Labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Finalizers: pod.Finalizers}, Spec: pod.Spec}},
			}
			d.Spec.Template.Spec.NodeName = ""
			if _, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			// Every pod of the app, the Deployment's replacement too.
			list, _ := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app.name})
			if list == nil {
				return
			}
			for _, p := range list.Items {
				_, _ = cs.CoreV1().Pods(ns).Patch(context.Background(), p.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
			}
		})
		ev, err := watchtools.UntilWithSync(ctx, cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) { o.LabelSelector = "app=" + app.name }),
			&corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
				p, ok := ev.Object.(*corev1.Pod)
				return ok && p.Status.PodIP != "", nil // kwok gives it an IP as it runs it
			})
		if err != nil {
			t.Fatalf("pod of %s without an IP: %v", app.name, err)
		}
		p := ev.Object.(*corev1.Pod)
		pods[app.name], podNames[app.name] = p.Status.PodIP, p.Name
	}
	// The other app first: were it asked for, its request would come
	// before the brokers'.
	for _, name := range []string{"web", "broker", "nodebroker"} {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, podNames[name], metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// For each broker the first request, then one per later sweep
	// (Watcher.Again).
	for i := range 6 {
		select {
		case <-k.ch:
		case <-ctx.Done():
			t.Fatalf("%d requests to end the retired brokers' connections, want 6", i)
		}
	}
	want := map[string][]netip.AddrPort{}
	for _, b := range []string{"broker", "nodebroker"} {
		ip := netip.MustParseAddr(pods[b])
		want[b] = []netip.AddrPort{netip.AddrPortFrom(ip, 1883), netip.AddrPortFrom(ip, 9001)}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	asked := map[string]int{}
	for i, got := range k.got {
		slices.SortFunc(got, func(a, b netip.AddrPort) int { return a.Compare(b) })
		var whose string
		for b, w := range want {
			if slices.Equal(got, w) {
				whose = b
			}
		}
		if whose == "" {
			t.Errorf("request %d: asked to end %v, want a broker's %v (and nothing of web at %s)", i, got, want, pods["web"])
		}
		asked[whose]++
	}
	if asked["broker"] != 3 || asked["nodebroker"] != 3 {
		t.Errorf("requests per broker %v, want 3 each (the first and two sweeps)", asked)
	}
}
