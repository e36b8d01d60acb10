package actuate_test

import (
	"net/http"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// TestHotStandbySwitchover runs a hot pair on the real control plane: both
// Deployments run. Three anomalous samples decide; the standby, already
// Ready, is never scaled (no request on its scale subresource); after the
// hold the primary is retired and the roles exchanged, and the old primary
// comes back as the new hot standby: a fresh pod, scaled 0 → 1 only once the
// retired pod was gone. Then a crash of the new primary fails over back at
// once (the flap guard holds back switchovers, not failovers) and it comes
// back in turn. A watcher checks the pair's Ready replicas never drop to 0.
func TestHotStandbySwitchover(t *testing.T) {
	t.Parallel()
	ctx, cancel, admin := startCluster(t, 120*time.Second)
	cfg := agentConfig(ctx, t, admin, actuate.Rules())
	var w wire
	w.install(cfg)
	agentClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const hold = 2 * time.Second
	ready := readyLog{a: "hot-a", b: "hot-b"}
	go ready.watch(ctx, t, admin)
	mustCreate(t, func() error { return createDeployment(ctx, admin, "hot-b", 1, nil) })
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "hot-a", 1, map[string]string{
			contract.AnnStandby: "hot-b", contract.AnnRedundancy: "hot", contract.AnnHold: hold.String(),
		})
	})
	for _, n := range []string{"hot-a", "hot-b"} {
		waitDeployment(ctx, t, admin, n, "Ready", func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
	}
	podA, podB := onlyPod(ctx, t, admin, "hot-a"), onlyPod(ctx, t, admin, "hot-b")
	standbyScaled := w.expect(func(r wireReq) bool {
		return r.method == http.MethodPut && isDeploymentPath(r.path, "hot-b", "scale")
	}, nil)

	signals, runDone := startActuator(ctx, t, agentClient)
	send := func(pod string, st podsignal.State) {
		t.Helper()
		select {
		case signals <- observation(admin.ns, pod, st, 0.9, false):
		case <-ctx.Done():
			t.Fatalf("signal for %s not taken: %v", pod, ctx.Err())
		}
	}
	for range 3 {
		send(podA, podsignal.Anomalous)
	}
	decided := time.Now()
	// Ready already: the decision goes straight to the re-confirmation.
	waitDeployment(ctx, t, admin, "hot-a", "record Confirm", func(d *appsv1.Deployment) bool { return recordOf(d).Phase == actuate.PhaseConfirm })
	for range 3 {
		send(podA, podsignal.Anomalous)
	}
	waitDeployment(ctx, t, admin, "hot-a", "retired (0 replicas, role standby)", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 0 && d.Annotations[contract.AnnRole] == "standby"
	})
	if retired := time.Since(decided); retired < hold {
		t.Errorf("primary retired %v after the decision, before the %v hold", retired, hold)
	}
	select {
	case r := <-standbyScaled:
		t.Fatalf("hot standby scaled during the switchover: %s %s", r.method, r.path)
	default:
	}
	b := getDeployment(ctx, t, admin, "hot-b")
	if *b.Spec.Replicas != 1 {
		t.Errorf("hot standby at %d replicas", *b.Spec.Replicas)
	}
	if b.Annotations[contract.AnnRole] != "primary" || b.Annotations[contract.AnnStandby] != "hot-a" || b.Annotations[contract.AnnRedundancy] != "hot" {
		t.Fatalf("new primary's annotations: %v", b.Annotations)
	}

	// The old primary comes back as the new hot standby: a fresh pod.
	waitDeployment(ctx, t, admin, "hot-a", "back as the hot standby (1 Ready)", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 1 && d.Status.ReadyReplicas == 1 && d.Annotations[contract.AnnRole] == "standby"
	})
	if p := onlyPod(ctx, t, admin, "hot-a"); p == podA {
		t.Errorf("the hot standby is the retired pod %s, not a fresh one", p)
	}
	waitDeployment(ctx, t, admin, "hot-b", "record: restored (Restore cleared)", func(d *appsv1.Deployment) bool {
		r := recordOf(d)
		return r.Phase == actuate.PhaseIdle && !r.LastSwitch.IsZero() && !r.Restore
	})
	waitEvent(ctx, t, admin, "hot-a", "RolesExchanged")

	// A crash of the new primary: failover back at once, and hot-b returns.
	send(podB, podsignal.Gone)
	waitDeployment(ctx, t, admin, "hot-a", "the primary again", func(d *appsv1.Deployment) bool {
		return d.Annotations[contract.AnnRole] == "primary" && d.Annotations[contract.AnnStandby] == "hot-b"
	})
	waitDeployment(ctx, t, admin, "hot-b", "back as the hot standby", func(d *appsv1.Deployment) bool {
		return *d.Spec.Replicas == 1 && d.Status.ReadyReplicas == 1 && d.Annotations[contract.AnnRole] == "standby"
	})
	if p := onlyPod(ctx, t, admin, "hot-b"); p == podB {
		t.Errorf("the hot standby is the failed pod %s, not a fresh one", p)
	}
	waitEvent(ctx, t, admin, "hot-b", "Failover")
	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	ready.check(t)
}
