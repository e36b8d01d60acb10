package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amf-edge/amf/podsignal"
)

func newTestTracker(historyLen int) *Tracker {
	return newTracker(slog.New(slog.DiscardHandler), newMetrics(), historyLen, time.Now)
}

func message(t *testing.T, id podsignal.PodID, state podsignal.State, seq uint64) *podsignal.Message {
	t.Helper()
	m, err := podsignal.Decode(id.Topic(), payload(t, id, state, seq))
	if err != nil {
		t.Fatal(err)
	}
	return &m
}

func TestSubscriberThatFallsBehindIsToldWhatItMissed(t *testing.T) {
	tr := newTestTracker(4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := tr.Subscribe(ctx, 1)
	s := tr.begin(podA, podA.String())
	for seq := uint64(1); seq <= 3; seq++ {
		tr.publish(s, message(t, podA, podsignal.Anomalous, seq), time.Now())
	}
	if ev := <-events; ev.Message.Seq != 1 || ev.Missed != 0 {
		t.Fatalf("first event = seq %d, missed %d; want seq 1, missed 0", ev.Message.Seq, ev.Missed)
	}
	tr.publish(s, message(t, podA, podsignal.Anomalous, 4), time.Now())
	if ev := <-events; ev.Message.Seq != 4 || ev.Missed != 2 {
		t.Fatalf("next event = seq %d, missed %d; want seq 4, missed 2", ev.Message.Seq, ev.Missed)
	}
	if got := testutil.ToFloat64(tr.m.eventsDropped); got != 2 {
		t.Errorf("events dropped = %v, want 2", got)
	}
	cancel()
	for range events { // closed once the subscription's context ends
	}
}

func TestHistoryKeepsTheLatestTransitions(t *testing.T) {
	tr := newTestTracker(3)
	s := tr.begin(podA, podA.String())
	states := []podsignal.State{podsignal.Starting, podsignal.Healthy, podsignal.Healthy, podsignal.Anomalous, podsignal.Unhealthy, podsignal.Stopping}
	for i, st := range states {
		tr.publish(s, message(t, podA, st, uint64(i+1)), time.Now())
	}
	st, _ := tr.Pod(podA)
	want := []podsignal.State{podsignal.Anomalous, podsignal.Unhealthy, podsignal.Stopping}
	if len(st.History) != len(want) {
		t.Fatalf("history = %+v, want %d transitions", st.History, len(want))
	}
	for i, tr := range st.History {
		if tr.To != want[i] {
			t.Errorf("history[%d] = %+v, want to %s", i, tr, want[i])
		}
	}
	if st.History[0].From != podsignal.Healthy || st.History[0].Seq != 4 {
		t.Errorf("history[0] = %+v, want healthy → anomalous at seq 4", st.History[0])
	}
	// The snapshot is a copy.
	st.History[0].To = podsignal.Gone
	if again, _ := tr.Pod(podA); again.History[0].To != podsignal.Anomalous {
		t.Error("a snapshot's history aliases the tracker's")
	}
}

func TestPruneForgetsOnlyDepartedPods(t *testing.T) {
	tr := newTestTracker(4)
	gone := tr.begin(podA, podA.String())
	tr.publish(gone, message(t, podA, podsignal.Healthy, 1), time.Now())
	tr.end(gone, false)
	live := tr.begin(podB, podB.String())
	tr.publish(live, message(t, podB, podsignal.Healthy, 1), time.Now())

	if got := tr.prune(time.Now().Add(-time.Hour)); len(got) != 0 {
		t.Fatalf("pruned recent pods %v", got)
	}
	got := tr.prune(time.Now().Add(time.Hour))
	if len(got) != 1 || got[0] != podA {
		t.Fatalf("pruned %v, want only %s", got, podA)
	}
	if pods := tr.Pods(); len(pods) != 1 || pods[0].PodID != podB {
		t.Errorf("pods after prune = %+v", pods)
	}
	if g := testutil.ToFloat64(tr.m.pods.WithLabelValues("gone")); g != 0 {
		t.Errorf("pods gone gauge = %v after prune, want 0", g)
	}
	if g := testutil.ToFloat64(tr.m.pods.WithLabelValues("healthy")); g != 1 {
		t.Errorf("pods healthy gauge = %v, want 1", g)
	}
}

func TestEndIsIdempotent(t *testing.T) {
	tr := newTestTracker(4)
	s := tr.begin(podA, podA.String())
	tr.end(s, true)
	tr.end(s, false) // the listener's safety net after OnDisconnect
	if got := testutil.ToFloat64(tr.m.sessions); got != 0 {
		t.Errorf("sessions = %v, want 0", got)
	}
	if got := testutil.ToFloat64(tr.m.disconnects.WithLabelValues("unclean")); got != 0 {
		t.Errorf("unclean disconnects = %v, want 0", got)
	}
}

// TestLocalSessionIsRecordedAsASidecarsIs: node mode's observations reach
// subscribers with source node, duplicates are ignored, a stop and the end
// leave the pod stopping (not gone: no failover), and an end without a stop
// is gone.
func TestLocalSessionIsRecordedAsASidecarsIs(t *testing.T) {
	tr := newTestTracker(8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := tr.Subscribe(ctx, 16)
	ls := tr.BeginLocal(podA)
	ls.Observe(message(t, podA, podsignal.Healthy, 1), time.Now())
	ls.Observe(message(t, podA, podsignal.Healthy, 1), time.Now()) // a duplicate
	ls.Observe(message(t, podA, podsignal.Unhealthy, 2), time.Now())
	ls.Observe(message(t, podA, podsignal.Stopping, 3), time.Now())
	ls.End()
	ls.End() // again: nothing
	want := []struct {
		state podsignal.State
		src   podsignal.Source
	}{{podsignal.Healthy, podsignal.SourceNode}, {podsignal.Unhealthy, podsignal.SourceNode}, {podsignal.Stopping, podsignal.SourceNode}, {podsignal.Stopping, podsignal.SourceNode}}
	for i, w := range want {
		ev := <-events
		if ev.State != w.state || ev.Source != w.src || ev.PodID != podA {
			t.Fatalf("event %d = %s %s %s, want %s %s", i, ev.PodID, ev.State, ev.Source, w.state, w.src)
		}
	}
	select {
	case ev := <-events:
		t.Fatalf("extra event %+v", ev)
	default:
	}
	if got := testutil.ToFloat64(tr.m.sessions); got != 0 {
		t.Errorf("MQTT sessions gauge = %v, want 0: a local session is not a connection", got)
	}

	crash := tr.BeginLocal(podB)
	crash.Observe(message(t, podB, podsignal.Healthy, 7), time.Now())
	crash.End()
	if st, _ := tr.Pod(podB); st.State != podsignal.Gone || st.Connected {
		t.Errorf("after an end without a stop: %s connected %v, want gone and not connected", st.State, st.Connected)
	}

	tr.shutdown()
	if tr.BeginLocal(podA) != nil {
		t.Error("BeginLocal after shutdown returned a session")
	}
}
