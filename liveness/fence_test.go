package liveness

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fenceRecorder is a Failover that reports fences and lifts; Lift says
// unsettled while the API server is cut.
type fenceRecorder struct {
	cut           *atomic.Bool
	fences, lifts chan struct{}
}

func (f *fenceRecorder) NodeLost(context.Context, string, time.Time) {}
func (f *fenceRecorder) NodeBack(context.Context, string, time.Time) {}
func (f *fenceRecorder) Fence(_ context.Context, _ string, guards []string) {
	if len(guards) == 1 && guards[0] == "n2" {
		f.fences <- struct{}{}
	}
}
func (f *fenceRecorder) Lift(context.Context) int {
	if f.cut.Load() {
		return 1
	}
	f.lifts <- struct{}{}
	return 0
}

// TestCutOffAgentFencesItsPrimariesAndLiftsOnceItRenewsAgain: an agent whose
// guard never answers (no probe address known) and whose Lease renewals
// fail fences once; when the renewals succeed again it lifts, once.
func TestCutOffAgentFencesItsPrimariesAndLiftsOnceItRenewsAgain(t *testing.T) {
	client := fake.NewClientset()
	var cut atomic.Bool
	unreachable := errors.New("dial tcp 10.0.0.1:6443: i/o timeout")
	renewals := make(chan struct{}, 64) // Lease writes that went through
	client.PrependReactor("*", "leases", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if cut.Load() {
			return true, nil, unreachable
		}
		if act.GetVerb() == "update" {
			select {
			case renewals <- struct{}{}:
			default:
			}
		}
		return false, nil, nil
	})
	tm := Timing{Period: 100 * time.Millisecond, Fence: time.Second, Lost: 1200 * time.Millisecond} // a second of margin: no second fence on a busy machine
	a, err := Listen(AgentConfig{Client: client, Namespace: "amf-system", Node: "n1", Listen: "127.0.0.1:0", Advertise: "127.0.0.1:1", Timing: tm})
	if err != nil {
		t.Fatal(err)
	}
	rec := &fenceRecorder{cut: &cut, fences: make(chan struct{}, 8), lifts: make(chan struct{}, 8)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, rec) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	a.SetGuards(nil, []string{"n2"}) // n2 has no Lease: its address is never known, so never reached
	cut.Store(true)
	wait := func(c chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10 s", what)
		}
	}
	wait(rec.fences, "fence while cut off")
	cut.Store(false)
	wait(rec.lifts, "lift once renewed")
	// Renewing on, nothing more: one fence, one lift.
	for len(renewals) > 0 {
		<-renewals
	}
	for range 3 {
		wait(renewals, "renewal")
	}
	if len(rec.fences) != 0 || len(rec.lifts) != 0 {
		t.Errorf("%d more fences and %d more lifts after the lift", len(rec.fences), len(rec.lifts))
	}
}
