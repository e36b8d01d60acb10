package sidecar

import (
	"context"
	"testing"
	"time"

	"github.com/amf-edge/amf/signal"
)

// awaitRecorded waits until r holds a message in state want and returns it.
func awaitRecorded(t *testing.T, r *Recorder, want signal.State) signal.Message {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for seen := 0; ; {
		msgs, next := r.Messages()
		for _, m := range msgs[seen:] {
			if m.State == want {
				return m
			}
		}
		seen = len(msgs)
		select {
		case <-next:
		case <-timeout:
			t.Fatalf("no %s signal in %+v", want, msgs)
		}
	}
}

// TestSidecarPublishesThroughItsPublisher: the loop hands every signal to the
// Publisher, the last (stopping) through Close; the Recorder stands in for
// the MQTT signaller, which the broker tests above exercise.
func TestSidecarPublishesThroughItsPublisher(t *testing.T) {
	src := &loadSource{}
	src.memory.Store(10 << 20)
	rec := NewRecorder()
	sc, err := New(Config{Source: src, Interval: 10 * time.Millisecond, Model: p1Model(t), Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()

	awaitRecorded(t, rec, signal.Healthy)
	src.memory.Store(60 << 20)
	awaitRecorded(t, rec, signal.Anomalous)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	msgs, _ := rec.Messages()
	last := msgs[len(msgs)-1]
	if !rec.Closed() || last.State != signal.Stopping {
		t.Fatalf("closed %v, last %+v: want Close with stopping", rec.Closed(), last)
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Seq != msgs[i-1].Seq+1 {
			t.Fatalf("seq %d after %d", msgs[i].Seq, msgs[i-1].Seq)
		}
	}
}
