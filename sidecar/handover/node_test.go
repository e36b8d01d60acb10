package handover_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/mosquittodb"
)

const nodeNS = "mqtt"

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
	pair, err := brokerstate.InjectedPair(nodeNS, "broker")
	if err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for _, d := range pair {
		if !ptr.Deref(d.Spec.Template.Spec.ShareProcessNamespace, false) {
			t.Fatalf("inject did not share %s's process namespace", d.Name)
		}
		if _, err := c.AppsV1().Deployments(nodeNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range pair {
		p, err := brokerstate.RunningPod(ctx, c, nodeNS, d.Name)
		if err == nil {
			_, err = brokerstate.Accepting(ctx, brokerstate.Addr(p))
		}
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	primary, standby := pods[0], pods[1]
	addr := brokerstate.Addr

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

	state, err := brokerstate.SidecarState(ctx, cp, nodeNS, primary.Name, nil, "save")
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
	if _, err := brokerstate.SidecarState(ctx, cp, nodeNS, standby.Name, state, "load"); err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(t0)
	if err := brokerstate.Restarted(ctx, evs, standby.Name); err != nil {
		t.Fatal(err)
	}
	restartedAfter := time.Since(t0)
	if _, err := brokerstate.Accepting(ctx, addr(standby)); err != nil {
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
