package vmnode_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/lab/vmnode"
)

// start boots a control plane and a guest node for t; both stop at its end.
func start(t *testing.T, forward ...int) (*controlplane.ControlPlane, *vmnode.Node) {
	t.Helper()
	return startWith(t, nil, forward...)
}

// startWith is start with files put on the guest's run disk (Config.Files).
func startWith(t *testing.T, files map[string]string, forward ...int) (*controlplane.ControlPlane, *vmnode.Node) {
	t.Helper()
	require(t)
	imgs := kubenodetest.Images(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{NoFakeNodes: true})
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg := vmnode.Config{ControlPlane: cp, Repo: repo, Forward: forward, Files: files, Log: t.Logf}
	for _, im := range imgs {
		cfg.Images = append(cfg.Images, im.Archive)
	}
	began := time.Now()
	n, err := vmnode.Launch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s Ready %.1fs after the boot began: kubelet %s, %s, guest %v", n.Name, time.Since(began).Seconds(), n.KubeletVersion, n.RuntimeVersion, n.Guest)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the guest's console ends with:\n%s", n.ConsoleTail(16<<10))
			diagnose(t, n)
		}
		n.Stop()
	})
	return cp, n
}

// diagnose logs the guest's network and its units' last lines.
func diagnose(t *testing.T, n *vmnode.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range [][]string{
		{"/usr/sbin/ip", "addr"}, {"/usr/sbin/ip", "route"}, {"/usr/sbin/iptables-save"},
		{"/usr/bin/systemctl", "--failed", "--no-pager"},
		{"/usr/bin/journalctl", "-u", "containerd", "-u", "kubelet", "-n", "80", "--no-pager", "-o", "cat"},
	} {
		out, err := n.Run(ctx, c[0], c[1:]...)
		t.Logf("guest: %s (%v):\n%s", strings.Join(c, " "), err, out)
	}
}

// require skips t where the host cannot run a guest node, or fails it with
// AMF_REQUIRE_VMNODE=1 (CI).
func require(t *testing.T) {
	t.Helper()
	fail := t.Skipf
	if os.Getenv("AMF_REQUIRE_VMNODE") == "1" {
		fail = t.Fatalf
	}
	if testing.Short() {
		t.Skip("a guest node takes minutes to boot under TCG")
	}
	if err := vmnode.Check(); err != nil {
		fail("%v", err)
	}
	kubenodetest.Require(t)
}

// TestNodeAsShippedNowRunsAPod: a kubelet at its defaults (failCgroupV1
// true: it refuses a cgroup v1 host), containerd 2 and the systemd cgroup
// driver in a cgroup v2 guest become a Ready Node of the host's control
// plane and run a Mosquitto pod that a client on the host talks to.
func TestNodeAsShippedNowRunsAPod(t *testing.T) {
	cp, n := start(t, 1883)
	for k, want := range map[string]string{"cgroup": "cgroup2fs", "ip": "10.0.2.15"} {
		if n.Guest[k] != want {
			t.Errorf("the guest says %s=%q, want %q", k, n.Guest[k], want)
		}
	}
	if !strings.HasPrefix(n.RuntimeVersion, "containerd://2.") {
		t.Errorf("the Node's runtime is %q, want containerd 2", n.RuntimeVersion)
	}
	if !strings.HasPrefix(n.KubeletVersion, "v1.36.") {
		t.Errorf("the Node's kubelet is %q, want v1.36", n.KubeletVersion)
	}

	c := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "broker", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:                      n.Name,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers: []corev1.Container{{
				Name: "mosquitto", Image: images.MosquittoRef, ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{ContainerPort: 1883, HostPort: 1883}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "pods", p.Namespace, fields.OneTermEqualSelector("metadata.name", p.Name))
	began := time.Now()
	if _, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.State.Running != nil {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the pod is not running: %v (failed units: %v)", err, n.Failed())
	}
	t.Logf("the pod ran %.1fs after its creation", time.Since(began).Seconds())

	// A round trip through the broker in the guest's pod, from the host.
	o := mqtt.NewClientOptions().AddBroker("tcp://" + n.Forwarded[1883]).SetClientID("vmnode-test").SetConnectRetry(true).SetConnectRetryInterval(200 * time.Millisecond)
	cl := mqtt.NewClient(o)
	if tok := cl.Connect(); !tok.WaitTimeout(time.Minute) || tok.Error() != nil {
		t.Fatalf("connect to the pod's broker through %s: %v", n.Forwarded[1883], tok.Error())
	}
	defer cl.Disconnect(100)
	got := make(chan string, 1)
	if tok := cl.Subscribe("vmnode/t", 1, func(_ mqtt.Client, m mqtt.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	want := fmt.Sprintf("from the host at %d", time.Now().UnixNano())
	if tok := cl.Publish("vmnode/t", 1, false, want); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case m := <-got:
		if m != want {
			t.Errorf("got %q, want %q", m, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the message did not come back through the pod's broker")
	}
}
