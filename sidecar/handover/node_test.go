package handover_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/mosquittodb"
)

const (
	nodeNS   = "mqtt"
	dataDir  = brokerstate.DataDir
	stateArg = "--file=" + dataDir + "/mosquitto.db"
)

// brokerPair is a hot pair as inject --standby --state-dir writes it (the
// broker's data volume in the sidecar, the sidecar as the broker's user in
// the pod's process namespace), running the lab's image of Debian's
// Mosquitto with persistence on an emptyDir.
func brokerPair(t *testing.T) []*appsv1.Deployment {
	t.Helper()
	in := brokerstate.Deployment(nodeNS, "broker", "broker", map[string]string{contract.AnnRedundancy: string(contract.Hot)})
	raw, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := inject.Inject(raw, inject.Options{Standby: true, StateDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	var deps []*appsv1.Deployment
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		spec := &d.Spec.Template.Spec
		if !ptr.Deref(spec.ShareProcessNamespace, false) {
			t.Fatalf("inject did not share %s's process namespace", d.Name)
		}
		for i := range spec.InitContainers {
			if spec.InitContainers[i].Name == inject.SidecarName {
				spec.InitContainers[i].ImagePullPolicy = corev1.PullNever
			}
		}
		deps = append(deps, &d)
	}
	if len(deps) != 2 {
		t.Fatalf("inject --standby wrote %d Deployments, want 2", len(deps))
	}
	return deps
}

// TestTheKubeletRestartsTheStandbyOnTheStateItWasHanded: the handover's
// levers on a real kubelet and containerd, in the sidecar containers as
// inject writes them (non-root, read-only root, no capability): the
// primary's state saved by its sidecar, loaded by the standby's, whose
// broker the kubelet restarts on it; real clients then find every retained
// message, their sessions and what was queued for them. The standby held
// none of it before, so the check can fail.
func TestTheKubeletRestartsTheStandbyOnTheStateItWasHanded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real node")
	}
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	sub, err := brokerstate.MosquittoSub()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := cp.Client()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodeNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(nodeNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "broker"}, Data: map[string]string{"mosquitto.conf": brokerstate.Config("")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, d := range brokerPair(t) {
		if _, err := c.AppsV1().Deployments(nodeNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	primary := runningPod(ctx, t, c, "broker")
	standby := runningPod(ctx, t, c, "broker-standby")
	addr := func(p *corev1.Pod) string { return net.JoinHostPort(p.Status.PodIP, "1883") }
	for _, p := range []*corev1.Pod{primary, standby} {
		if err := waitListening(ctx, addr(p)); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}

	plan := brokerstate.Plan{Retained: 100, Sessions: 2, V5Sessions: 1, Queued: 5, MosquittoSub: sub}
	if err := brokerstate.Seed(ctx, addr(primary), plan); err != nil {
		t.Fatal(err)
	}
	before, err := brokerstate.Check(ctx, addr(standby), plan)
	if err != nil {
		t.Fatal(err)
	}
	if before.RetainedFound != 0 || len(before.SessionsLost) != len(plan.SessionIDs()) {
		t.Fatalf("the standby held state before the handover: %v", before)
	}

	state, err := sidecarExec(ctx, cp, primary.Name, nil, "/"+inject.SidecarName, "state", "save", stateArg)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := mosquittodb.Read(state)
	if err != nil {
		t.Fatalf("the primary's sidecar saved no whole state: %v", err)
	}
	t.Logf("the primary's state: %d bytes, %d retained, sessions %v, %d queued", sum.Bytes, sum.Retained, sum.Sessions, sum.Queued)

	evs, stop := n.Subscribe(ctx)
	defer stop()
	t0 := time.Now()
	if _, err := sidecarExec(ctx, cp, standby.Name, state, "/"+inject.SidecarName, "state", "load", stateArg); err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(t0)
	for restarted := false; !restarted; {
		select {
		case ev := <-evs:
			restarted = ev.Pod == standby.Name && ev.Container == "mosquitto" && ev.Type == kubenode.EventRestarted
		case <-ctx.Done():
			t.Fatalf("the kubelet did not restart the standby's broker: %v", ctx.Err())
		}
	}
	restartedAfter := time.Since(t0)
	if err := waitListening(ctx, addr(standby)); err != nil {
		t.Fatal(err)
	}
	t.Logf("load took %v; the kubelet's restart seen %v after the load began, the broker listening %v after",
		loaded.Round(time.Millisecond), restartedAfter.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))

	after, err := brokerstate.Check(ctx, addr(standby), plan)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Lossless() || after.Duplicates != 0 || after.RetainedFound != plan.Retained || after.QueuedFound != 3*plan.Queued {
		t.Errorf("the standby after the handover: %v; want all %d retained, %d queued, no session lost, no duplicate", after, plan.Retained, 3*plan.Queued)
	}
}

// runningPod waits for the pod of Deployment d whose broker container runs
// (the pods are not Ready: no agent sets amf.io/healthy here).
func runningPod(ctx context.Context, t *testing.T, c kubernetes.Interface, d string) *corev1.Pod {
	t.Helper()
	for {
		pods, err := c.CoreV1().Pods(nodeNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d})
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				for _, s := range p.Status.ContainerStatuses {
					if s.Name == "mosquitto" && s.State.Running != nil && p.Status.PodIP != "" {
						return p
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no running broker for %s: %v (%v)", d, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond): // a poll of the API server, not a synchronisation
		}
	}
}

func waitListening(ctx context.Context, addr string) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not listening: %w (%v)", addr, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sidecarExec runs argv in pod's sidecar container (kubectl exec -i), stdin
// given, and returns its standard output.
func sidecarExec(ctx context.Context, cp *controlplane.ControlPlane, pod string, stdin []byte, argv ...string) ([]byte, error) {
	return cp.Kubectl(ctx, bytes.NewReader(stdin), append([]string{"exec", "-i", "-n", nodeNS, pod, "-c", inject.SidecarName, "--"}, argv...)...)
}
