package manifests_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// TestARetiredBrokersClientIsMovedAtOnce is the client's view of a broker
// that vanished without a word, on a real kubelet + containerd node with
// kube-proxy: manifests/base (the agent and amf-connkill), an injected
// broker pair behind a ClusterIP Service, and an MQTT client (paho, keep-alive
// 30 s) in a pod of its own, connected through the Service to the primary.
// The primary's pod network is cut (what a power cut of its node looks like
// to the client: no FIN, no reset), then the primary is scaled to 0 as a
// failover does. The agent sees its endpoint turn terminating and has
// amf-connkill end the client's connection, which paho would otherwise
// notice only ≈ 40 s later: the client loses it at once and is served again,
// by the standby, within seconds.
func TestARetiredBrokersClientIsMovedAtOnce(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	cs := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	agent, primary := installBroker(ctx, t, cp)
	const ns = "mqtt"

	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-broker"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": "edge-broker"},
			Ports: []corev1.ServicePort{{Name: "mqtt", Port: 1883, TargetPort: intstr.FromString("mqtt")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Labels: map[string]string{"app": "client"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: images.PauseRef}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubenodetest.WaitPod(ctx, t, cs, ns, "app=client", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	pid, err := n.ContainerPID(ctx, ns, "client", "pause")
	if err != nil {
		t.Fatal(err)
	}
	clientNetns := fmt.Sprintf("/proc/%d/ns/net", pid)

	// The client: paho at a 30 s keep-alive, its sockets in the client pod.
	lost := make(chan time.Time, 4)
	connected := make(chan time.Time, 4)
	service := net.JoinHostPort(svc.Spec.ClusterIP, "1883")
	opts := paho.NewClientOptions().AddBroker("tcp://" + service).SetClientID("moved").SetKeepAlive(30 * time.Second).
		SetAutoReconnect(true).SetMaxReconnectInterval(500 * time.Millisecond).SetConnectTimeout(2 * time.Second).
		SetCustomOpenConnectionFn(func(u *url.URL, _ paho.ClientOptions) (net.Conn, error) {
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			defer dcancel()
			return kubenode.DialIn(dctx, clientNetns, u.Host)
		}).
		SetConnectionLostHandler(func(paho.Client, error) { lost <- time.Now() }).
		SetOnConnectHandler(func(paho.Client) { connected <- time.Now() })
	// Until kube-proxy has written the new Service's rules the node has no
	// route to it: paho tries again every 200 ms.
	opts.SetConnectRetry(true).SetConnectRetryInterval(200 * time.Millisecond)
	mq := paho.NewClient(opts)
	mq.Connect()
	defer mq.Disconnect(0)
	select {
	case <-connected:
	case <-time.After(30 * time.Second):
		t.Fatalf("the client did not connect through %s within 30 s", service)
	}

	// The standby up and Ready, so the Service has somewhere to send the
	// client once the primary is gone.
	scale(ctx, t, cs, ns, "edge-broker-b", 1)
	kubenodetest.WaitPod(ctx, t, cs, ns, "app.kubernetes.io/instance=edge-broker-b", kubenodetest.PodReady)

	// The primary's network cut, then the primary retired as a failover does.
	brokerPID, err := n.ContainerPID(ctx, ns, primary.Name, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(brokerPID)+"/ns/net", "--", "ip", "link", "set", "eth0", "down").CombinedOutput(); err != nil {
		t.Fatalf("cut the primary's network: %v: %s", err, out)
	}
	cut := time.Now()
	scale(ctx, t, cs, ns, "edge-broker-a", 0)

	var lostAt, backAt time.Time
	select {
	case lostAt = <-lost:
	case <-time.After(20 * time.Second): // paho alone: ≈ 40 s (keep-alive 30 s, then its 10 s ping timeout)
		t.Fatal("the client still holds its connection to the retired primary 20 s after the cut")
	}
	select {
	case backAt = <-connected:
	case <-time.After(20 * time.Second):
		t.Fatal("the client was not served again within 20 s of losing its connection")
	}
	t.Logf("the client lost the retired primary %v after the cut, and was served again %v after it", lostAt.Sub(cut).Round(time.Millisecond), backAt.Sub(cut).Round(time.Millisecond))
	if d := backAt.Sub(cut); d > 5*time.Second {
		t.Errorf("the client was served again %v after the cut, want within 5 s", d)
	}
	waitLog(ctx, t, cs, agent, `"msg":"connkill: the node's connections to a retired broker ended"`)
}

func scale(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string, replicas int32) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := cs.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("scale %s to %d: %v", name, replicas, err)
	}
}
