package healthcheck

import (
	"strings"
	"testing"
	"time"
)

// fakeClock is a settable clock for the freshness checks.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestProbeState(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s := NewProbeState(5 * time.Second)
	s.now = clock.now

	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "no probe result") {
		t.Fatalf("before any result: %v", err)
	}
	s.Report(Result{Reason: "probe message not echoed within 1s", At: clock.t})
	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "not echoed") {
		t.Fatalf("after a failure: %v, want its reason", err)
	}
	s.Report(Result{OK: true, RTT: time.Millisecond, At: clock.t})
	if err := s.Check(); err != nil {
		t.Fatalf("after a pass: %v", err)
	}
	clock.t = clock.t.Add(6 * time.Second)
	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("stale pass: %v, want stalled", err)
	}
	if r, ok := s.Last(); !ok || !r.OK {
		t.Fatalf("Last() = %+v, %v", r, ok)
	}
}

func TestHeartbeat(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	h := NewHeartbeat(3 * time.Second)
	h.now = clock.now
	h.Beat()
	clock.t = clock.t.Add(3 * time.Second)
	if err := h.Check(); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	clock.t = clock.t.Add(time.Millisecond)
	if err := h.Check(); err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("past the limit: %v", err)
	}
	h.Beat()
	if err := h.Check(); err != nil {
		t.Fatalf("after a beat: %v", err)
	}
}

func TestOnChange(t *testing.T) {
	var got []bool
	report := OnChange(func(r Result) { got = append(got, r.OK) })
	for _, ok := range []bool{false, false, true, true, true, false, true} {
		report(Result{OK: ok})
	}
	want := []bool{false, true, false, true}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	lo, hi := 100*time.Millisecond, time.Second
	for n, ceil := range map[int]time.Duration{1: lo, 2: 2 * lo, 4: 8 * lo, 5: hi, 50: hi} {
		for range 100 {
			if d := backoff(n, lo, hi); d < ceil/2 || d > ceil {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", n, d, ceil/2, ceil)
			}
		}
	}
}
