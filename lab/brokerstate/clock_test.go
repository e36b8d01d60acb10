package brokerstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/brokerstate/brokerstatetest"
)

// TestTheClocksRetainedValueIsTheNewestAcknowledged: a real Mosquitto holds
// as the clock's retained value the newest time it acknowledged, which is
// what a read after an event compares with the event's time.
func TestTheClocksRetainedValueIsTheNewestAcknowledged(t *testing.T) {
	bin := brokerstatetest.RequireMosquitto(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := brokerstate.StartMosquitto(ctx, bin, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Kill)
	if _, ok, err := brokerstate.ReadClock(ctx, m.Addr, "clock"); err != nil || ok {
		t.Fatalf("a fresh broker's clock: ok %t, err %v; want none", ok, err)
	}
	k, err := brokerstate.StartClock(ctx, m.Addr, "clock", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// Read until it moved on: it publishes as time goes.
	var first, moved time.Time
	for moved.IsZero() {
		at, ok, err := brokerstate.ReadClock(ctx, m.Addr, "clock")
		if err != nil {
			k.Stop()
			t.Fatal(err)
		}
		switch {
		case !ok:
		case first.IsZero():
			first = at
		case at.After(first):
			moved = at
		}
	}
	last := k.Stop()
	got, ok, err := brokerstate.ReadClock(ctx, m.Addr, "clock")
	if err != nil || !ok {
		t.Fatalf("the clock after Stop: ok %t, err %v", ok, err)
	}
	if !got.Equal(last) || !last.After(first) {
		t.Errorf("retained %v after the clock stopped at %v (first read %v); want the newest acknowledged, later than the first", got, last, first)
	}
}
