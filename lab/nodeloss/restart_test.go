package nodeloss_test

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/testbed"
)

// TestStandbysAgentKilledMidFailoverFinishesItAfterItsRestart: the agent
// DaemonSet on three real nodes, a hot pair (primary on node 0, standby on
// node 1), and a power cut of the primary's node. The moment the standby's
// agent records its failover decision on the primary (the first trace of it
// a watcher can see: the record Failover or Retiring, through the API
// server's watch, well before its log line comes through the kubelet), its
// container's process is SIGKILLed, so the kubelet restarts it (the first
// restart: no back-off). Wherever the kill landed (the test reports what
// the cluster showed then), the restarted agent must finish the failover
// (the standby the primary, Ready, the old primary's pod marked for
// deletion), the old primary's node still cut; and after the restore one
// primary remains, the old one back as the hot standby.
func TestStandbysAgentKilledMidFailoverFinishesItAfterItsRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, cl, p := startPair(ctx, t)
	nA, nB := cl.Nodes[0], cl.Nodes[1]
	a, b := testbed.PrimaryName, testbed.StandbyName
	if err := p.WaitPair(ctx, a, b, nA.Name, nB.Name); err != nil {
		t.Fatal(err)
	}
	oldPod, err := p.PodOf(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	guard := p.Agents[nB.Name]
	pid, err := nB.ContainerPID(ctx, testbed.AgentNamespace, guard.Pod, "agent")
	if err != nil {
		t.Fatalf("the standby's agent's process: %v", err)
	}
	evs, stopEvents := nB.Subscribe(ctx)
	defer stopEvents()

	// The watch that sees the decision, open before the cut.
	wctx, stopWatch := context.WithTimeout(ctx, 60*time.Second)
	defer stopWatch()
	lw := cache.NewListWatchFromClient(p.Client.AppsV1().RESTClient(), "deployments", nodeloss.BrokerNamespace, fields.OneTermEqualSelector("metadata.name", a))
	decided := make(chan string, 1)
	go func() {
		_, err := watchtools.UntilWithSync(wctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok {
				return false, nil
			}
			var rec actuate.Record
			_ = json.Unmarshal([]byte(d.Annotations[contract.AnnRecord]), &rec)
			switch {
			case rec.Phase == actuate.PhaseFailover || rec.Phase == actuate.PhaseRetiring:
				decided <- "record " + string(rec.Phase)
				return true, nil
			case d.Annotations[contract.AnnRole] == "standby":
				decided <- "roles exchanged already" // the record's event was folded into this one
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			decided <- ""
		}
	}()

	cut, err := nA.PowerCut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := <-decided
	if seen == "" {
		t.Fatalf("no failover decision recorded on %s within 60 s of the cut", a)
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the standby's agent (pid %d): %v", pid, err)
	}
	at := stateOf(ctx, t, p, a, b)
	t.Logf("power cut of %s; %v later the watch saw %s, and the agent on %s (pid %d) was killed; the cluster then: %s",
		nA.Name, killed.Sub(cut.At).Round(time.Millisecond), seen, nB.Name, pid, at)
	restarted := false
	for !restarted {
		select {
		case ev := <-evs:
			restarted = ev.Pod == guard.Pod && ev.Container == "agent" && ev.Type == kubenode.EventRestarted
			if restarted {
				t.Logf("the kubelet restarted the agent's container, seen %v after the kill", ev.Seen.Sub(killed).Round(time.Millisecond))
			}
		case <-ctx.Done():
			t.Fatalf("the agent's container was not restarted after its kill: %v", ctx.Err())
		}
	}

	// The restarted agent finishes the failover, the node still cut. (Not
	// WaitFailover: it wants the guard's log lines, and those the killed
	// container wrote after the last one streamed are not in the new
	// container's log.)
	until(ctx, t, p, b, "the primary, Ready", func(d *appsv1.Deployment) bool {
		return d.Annotations[contract.AnnRole] == "primary" && d.Annotations[contract.AnnStandby] == a &&
			d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1
	})
	until(ctx, t, p, a, "retired, its standby", func(d *appsv1.Deployment) bool {
		_, policy := d.Annotations[contract.AnnStandby]
		return d.Annotations[contract.AnnRole] == "standby" && d.Annotations[contract.AnnPrimary] == b && !policy
	})
	done := time.Now()
	pod, err := p.Client.CoreV1().Pods(nodeloss.BrokerNamespace).Get(ctx, oldPod, metav1.GetOptions{})
	if err == nil && pod.DeletionTimestamp == nil {
		t.Errorf("the old primary's pod %s is not marked for deletion", oldPod)
	}
	rec := p.Probe.Snapshot()
	gap, _ := rec.MaxGap(cut.At, done)
	t.Logf("the failover finished %v after the cut; the probe's longest interval between fresh messages meanwhile %v",
		done.Sub(cut.At).Round(time.Millisecond), gap.Duration().Round(time.Millisecond))
	if lost := rec.Lost(cut.At.Add(-time.Second), done.Add(-time.Second)); len(lost) > 0 {
		t.Errorf("%d probe messages lost: the hot standby's path should carry them all", len(lost))
	}
	for _, l := range guard.Lines() {
		// How the restarted agent came to it: the record, loaded on the
		// standby's signal, and its fresh guard's own verdict.
		if l.Time.After(killed) && (l.Msg == "resuming switchover" || l.Msg == "guarded node lost" || (l.Msg == "decision" && l.Deployment == nodeloss.BrokerNamespace+"/"+a)) {
			t.Logf("the restarted agent, %v after the kill: %s %s %s %s", l.Time.Sub(killed).Round(time.Millisecond), l.Msg, l.Action, l.Phase, l.Error)
		}
	}
	if nA.Faulty() == "" {
		t.Errorf("%s is not cut any more: the test means the failover to finish while it is", nA.Name)
	}
	if err := p.Restore(ctx, nA); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitOnePrimary(ctx, b, a, oldPod); err != nil {
		t.Fatalf("after the restore: %v", err)
	}
	evList, err := p.Client.EventsV1().Events(nodeloss.BrokerNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exchanges := 0
	for _, ev := range evList.Items {
		if ev.Regarding.Name == a && ev.Reason == "RolesExchanged" {
			exchanges++
			if ev.Series != nil {
				exchanges += int(ev.Series.Count) - 1
			}
		}
	}
	if exchanges > 1 {
		t.Errorf("the roles exchanged %d times (RolesExchanged Events on %s)", exchanges, a)
	}
	t.Logf("restored: one primary (%s), %s back as its hot standby; %d RolesExchanged Event", b, a, exchanges)
}

// until waits (failoverBound) for Deployment name of the pair to satisfy cond.
func until(ctx context.Context, t *testing.T, p *nodeloss.Pair, name, what string, cond func(*appsv1.Deployment) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, failoverBound)
	defer cancel()
	lw := cache.NewListWatchFromClient(p.Client.AppsV1().RESTClient(), "deployments", nodeloss.BrokerNamespace, fields.OneTermEqualSelector("metadata.name", name))
	var last *appsv1.Deployment
	_, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			return false, nil
		}
		last = d
		return cond(d), nil
	})
	if err != nil {
		b, _ := json.Marshal(last)
		t.Fatalf("%s never %s: %v; last seen %s", name, what, err, b)
	}
}

// stateOf says what the cluster shows of the pair: the primary's record and
// replicas, both roles.
func stateOf(ctx context.Context, t *testing.T, p *nodeloss.Pair, a, b string) string {
	t.Helper()
	var out string
	for _, name := range []string{a, b} {
		d, err := p.Client.AppsV1().Deployments(nodeloss.BrokerNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		var rec actuate.Record
		_ = json.Unmarshal([]byte(d.Annotations[contract.AnnRecord]), &rec)
		out += fmt.Sprintf("%s: replicas %d, role %q, record %q; ", name, ptr.Deref(d.Spec.Replicas, 1), d.Annotations[contract.AnnRole], rec.Phase)
	}
	return out
}
