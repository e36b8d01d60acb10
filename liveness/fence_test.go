package liveness

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amf-edge/amf/cluster/clusterfake"
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
	c := clusterfake.New()
	var cut atomic.Bool // the Lease calls fail while set (Fail["lease"])
	unreachable := errors.New("dial tcp 10.0.0.1:6443: i/o timeout")
	setCut := func(on bool) {
		c.Lock()
		defer c.Unlock()
		cut.Store(on)
		if on {
			c.Fail["lease"] = unreachable
		} else {
			delete(c.Fail, "lease")
		}
	}
	tm := Timing{Period: 100 * time.Millisecond, Fence: time.Second, Lost: 1200 * time.Millisecond} // a second of margin: no second fence on a busy machine
	a, err := Listen(PeerConfig{Cluster: c, Namespace: "amf-system", Node: "n1", Listen: "127.0.0.1:0", Advertise: "127.0.0.1:1", Timing: tm})
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
	setCut(true)
	wait := func(c chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10 s", what)
		}
	}
	wait(rec.fences, "fence while cut off")
	setCut(false)
	wait(rec.lifts, "lift once renewed")
	// Renewing on, nothing more: one fence, one lift.
	c.Lock()
	seen := len(c.Writes)
	c.Unlock()
	n := 0
	if !c.Await(10*time.Second, func() bool { n += countUpdates(c.Writes[seen:]); seen = len(c.Writes); return n >= 3 }) {
		t.Fatalf("%d renewals within 10 s, want 3", n)
	}
	if len(rec.fences) != 0 || len(rec.lifts) != 0 {
		t.Errorf("%d more fences and %d more lifts after the lift", len(rec.fences), len(rec.lifts))
	}
}

// countUpdates counts the Lease updates among writes.
func countUpdates(writes []string) int {
	n := 0
	for _, w := range writes {
		if strings.HasPrefix(w, "lease update ") {
			n++
		}
	}
	return n
}
