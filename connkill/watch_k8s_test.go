package connkill_test

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

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
// Watcher against a real API server and its EndpointSlice controller: two
// pods behind Services, a broker with the readiness gate amf.io/healthy and
// another app without it, each kept terminating by a finalizer once
// deleted (as a pod on a lost node stays). The broker's deletion asks Kill
// for its endpoint's TCP ports, and again at each later sweep; the other
// app's asks nothing.
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

	pods := map[string]string{} // name → IP
	for _, app := range []struct {
		name string
		gate bool
	}{{"broker", true}, {"web", false}} {
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
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = cs.CoreV1().Pods(ns).Patch(context.Background(), app.name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
		})
		ev, err := watchtools.UntilWithSync(ctx, cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, fields.OneTermEqualSelector("metadata.name", app.name)),
			&corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
				p, ok := ev.Object.(*corev1.Pod)
				return ok && p.Status.PodIP != "", nil // kwok gives it an IP as it runs it
			})
		if err != nil {
			t.Fatalf("pod %s without an IP: %v", app.name, err)
		}
		pods[app.name] = ev.Object.(*corev1.Pod).Status.PodIP
	}
	// The other app first: were it asked for, its request would come
	// before the broker's.
	for _, name := range []string{"web", "broker"} {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The first request, then one per later sweep (Watcher.Again).
	for i := range 3 {
		select {
		case <-k.ch:
		case <-ctx.Done():
			t.Fatalf("%d requests to end the retired broker's connections, want 3", i)
		}
	}
	ip := netip.MustParseAddr(pods["broker"])
	want := []netip.AddrPort{netip.AddrPortFrom(ip, 1883), netip.AddrPortFrom(ip, 9001)}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, got := range k.got {
		slices.SortFunc(got, func(a, b netip.AddrPort) int { return a.Compare(b) })
		if !slices.Equal(got, want) {
			t.Errorf("request %d: asked to end %v, want the broker's %v (and nothing of web at %s)", i, got, want, pods["web"])
		}
	}
}
