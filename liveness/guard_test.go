package liveness

import (
	"context"
	"testing"
	"time"

	"github.com/amf-edge/amf/cluster/clusterfake"
)

// TestGuardOnTheFakeDeclaresLostOnlyTheNodeThatStoppedHeartbeating: the
// guard's whole path (its own and the guarded nodes' Heartbeats, the
// label-selected list+watch of their Leases) on the agents' fake cluster: a
// node whose agent stops renewing is declared lost while the guard's own
// renewals keep arriving, the one still renewing is not.
func TestGuardOnTheFakeDeclaresLostOnlyTheNodeThatStoppedHeartbeating(t *testing.T) {
	c := clusterfake.New()
	tm := Timing{Period: 100 * time.Millisecond, Fence: 500 * time.Millisecond, Lost: 1500 * time.Millisecond} // wide margins: a busy machine delays renewals
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	beat := func(ctx context.Context, node string) {
		h := &Heartbeat{Cluster: c, Namespace: "amf-system", Node: node, Timing: tm}
		go func() { _ = h.Run(ctx) }()
	}
	beat(ctx, "guard")
	beat(ctx, "alive")
	dyingCtx, die := context.WithCancel(ctx)
	beat(dyingCtx, "dying")
	lost := make(chan string, 8)
	done := make(chan error, 1)
	go func() {
		done <- RunGuard(ctx, GuardConfig{Cluster: c, Namespace: "amf-system", Self: "guard", Nodes: []string{"alive", "dying"}, Timing: tm,
			OnLost: func(node string, _ time.Time) { lost <- node }})
	}()
	time.Sleep(2 * tm.Lost) // every node heartbeats: nothing lost
	select {
	case n := <-lost:
		t.Fatalf("%s lost while heartbeating", n)
	default:
	}
	die()
	select {
	case n := <-lost:
		if n != "dying" {
			t.Fatalf("lost %s, want dying", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the node that stopped heartbeating not lost within 10 s")
	}
	cancel()
	<-done
}
