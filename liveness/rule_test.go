package liveness_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/amf-edge/amf/liveness"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// when is a condition on the time since the start of a scenario.
type when func(time.Duration) bool

func always(time.Duration) bool { return true }
func never(time.Duration) bool  { return false }
func before(d time.Duration) when {
	return func(t time.Duration) bool { return t < d }
}
func outside(from, to time.Duration) when {
	return func(t time.Duration) bool { return t < from || t >= to }
}

// guardRun drives a guard of node x for 20 s in 100 ms steps: at every period
// the guard's own renewal arrives if own(t), x's if xBeats(t) (late by
// xDelay), and x's agent answers a probe if xAnswers(t). It returns when x
// was first declared lost (-1: never) and how often it came back.
func guardRun(t *testing.T, own, xBeats, xAnswers when, xDelay time.Duration) (time.Duration, int) {
	t.Helper()
	tm := liveness.DefaultTiming
	g, err := liveness.NewGuard(tm, "guard")
	if err != nil {
		t.Fatal(err)
	}
	g.Watch("x", t0)
	lostAt, backs := time.Duration(-1), 0
	pending := map[time.Duration]time.Time{} // x's renewals in flight
	for d := time.Duration(0); d <= 20*time.Second; d += 100 * time.Millisecond {
		now := t0.Add(d)
		if d%tm.Period == 0 {
			if own(d) {
				g.Observe("guard", now, now)
			}
			if xBeats(d) {
				pending[d+xDelay] = now
			}
			if xAnswers(d) {
				g.Reached("x", now)
			}
		}
		if renew, ok := pending[d]; ok {
			if g.Observe("x", renew, now) {
				backs++
			}
			delete(pending, d)
		}
		for _, n := range g.Lost(now) {
			if n == "x" && lostAt < 0 {
				lostAt = d
			}
		}
	}
	return lostAt, backs
}

func TestGuardDeclaresALostNodeOnlyOnCurrentData(t *testing.T) {
	for _, tc := range []struct {
		name              string
		own, xBeats, xAns when
		xDelay            time.Duration
		// lost within [from, to]; from < 0: never lost
		from, to time.Duration
		backs    int
	}{
		{name: "a node whose heartbeats stop while the guard's go on is lost after Lost", own: always, xBeats: before(5 * time.Second), xAns: before(5 * time.Second),
			from: 7 * time.Second, to: 7600 * time.Millisecond},
		{name: "the API server unreachable: the guard's own heartbeats stop too, nothing is lost", own: before(5 * time.Second), xBeats: before(5 * time.Second), xAns: never,
			from: -1},
		{name: "the API server unreachable for a while, then back: the node's first renewal after the guard's is no loss", own: outside(5*time.Second, 12*time.Second), xBeats: outside(5*time.Second, 12*time.Second), xAns: never,
			xDelay: 400 * time.Millisecond, from: -1},
		{name: "the API server back but the node not: lost a full Lost after the guard's view is current again", own: outside(5*time.Second, 12*time.Second), xBeats: before(5 * time.Second), xAns: never,
			from: 14500 * time.Millisecond, to: 15 * time.Second},
		{name: "a slow node whose renewals arrive 2 s late is not lost", own: always, xBeats: always, xAns: never, xDelay: 2 * time.Second,
			from: -1},
		{name: "a node cut from the API server that still answers its guard is not lost", own: always, xBeats: before(5 * time.Second), xAns: always,
			from: -1},
		{name: "a node lost, then heartbeating again, is back", own: always, xBeats: outside(5*time.Second, 10*time.Second), xAns: never,
			from: 7 * time.Second, to: 7600 * time.Millisecond, backs: 1},
		{name: "a node that never heartbeats once watched is lost a full Lost after the watch began", own: always, xBeats: never, xAns: never,
			from: 2500 * time.Millisecond, to: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lostAt, backs := guardRun(t, tc.own, tc.xBeats, tc.xAns, tc.xDelay)
			if tc.from < 0 {
				if lostAt >= 0 {
					t.Errorf("lost at %v, want never", lostAt)
				}
			} else if lostAt < tc.from || lostAt > tc.to {
				t.Errorf("lost at %v, want within [%v, %v]", lostAt, tc.from, tc.to)
			}
			if backs != tc.backs {
				t.Errorf("back %d times, want %d", backs, tc.backs)
			}
		})
	}
}

func TestGuardIgnoresEventsWithoutANewRenewal(t *testing.T) {
	g, err := liveness.NewGuard(liveness.DefaultTiming, "guard")
	if err != nil {
		t.Fatal(err)
	}
	g.Watch("x", t0)
	renew := t0
	g.Observe("x", renew, t0)
	for d := time.Duration(0); d <= 5*time.Second; d += 500 * time.Millisecond {
		now := t0.Add(d)
		g.Observe("guard", now, now)
		g.Observe("x", renew, now) // the same renewTime: a label edit, a resync
		if lost := g.Lost(now); len(lost) > 0 {
			if d < liveness.DefaultTiming.Lost {
				t.Fatalf("lost %v at %v, before Lost", lost, d)
			}
			return
		}
	}
	t.Fatal("a node whose Lease only changed otherwise was never lost")
}

// fenceRun drives a fencer for 20 s in 100 ms steps: at every period its
// renewal succeeds if renews(t) and a guard answers if answers(t). It returns
// when it first said to fence (-1: never) and how many times.
func fenceRun(t *testing.T, renews, answers when) (time.Duration, int) {
	t.Helper()
	tm := liveness.DefaultTiming
	f, err := liveness.NewFencer(tm, t0)
	if err != nil {
		t.Fatal(err)
	}
	at, n := time.Duration(-1), 0
	for d := time.Duration(0); d <= 20*time.Second; d += 100 * time.Millisecond {
		now := t0.Add(d)
		if d%tm.Period == 0 {
			if renews(d) {
				f.Renewed(now)
			}
			if answers(d) {
				f.Vouched("guard", now)
			}
		}
		if len(f.Silent(now, []string{"guard"})) > 0 {
			if at < 0 {
				at = d
			}
			n++
		}
	}
	return at, n
}

func TestFencerFencesOnlyWhenCutOffFromTheAPIServerAndEveryGuard(t *testing.T) {
	for _, tc := range []struct {
		name            string
		renews, answers when
		from, to        time.Duration
		times           int
	}{
		{name: "partitioned: no renewal, no guard, fenced after Fence", renews: before(5 * time.Second), answers: before(5 * time.Second),
			from: 6 * time.Second, to: 6500 * time.Millisecond, times: 1},
		{name: "the API server down for everyone: the guards answer, no fence", renews: before(5 * time.Second), answers: always, from: -1},
		{name: "cut from the guards only: it still renews, no fence", renews: always, answers: before(5 * time.Second), from: -1},
		{name: "one late renewal is no fence", renews: outside(5*time.Second, 6*time.Second), answers: never, from: -1},
		{name: "fenced, renewing again, fenced again on the next cut", renews: outside(5*time.Second, 10*time.Second), answers: never,
			from: 6 * time.Second, to: 6500 * time.Millisecond, times: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, n := fenceRun(t, tc.renews, tc.answers)
			if tc.from < 0 {
				if at >= 0 {
					t.Errorf("fenced at %v, want never", at)
				}
				return
			}
			if at < tc.from || at > tc.to {
				t.Errorf("fenced at %v, want within [%v, %v]", at, tc.from, tc.to)
			}
			if n != tc.times {
				t.Errorf("fenced %d times, want %d", n, tc.times)
			}
		})
	}
}

// TestCutOffNodeFencesBeforeItsGuardTakesOver: whatever the phase of a
// partition against the heartbeats, and however late the node's last
// renewal reached the guard, the cut-off node fences before the guard
// declares it lost.
func TestCutOffNodeFencesBeforeItsGuardTakesOver(t *testing.T) {
	tm := liveness.DefaultTiming
	for _, cut := range []time.Duration{5000, 5100, 5250, 5400, 5499} {
		for _, delay := range []time.Duration{0, 100, 300} {
			cut, delay := cut*time.Millisecond, delay*time.Millisecond
			t.Run(fmt.Sprintf("cut at %v, last renewal %v in flight", cut, delay), func(t *testing.T) {
				f, _ := liveness.NewFencer(tm, t0)
				g, _ := liveness.NewGuard(tm, "guard")
				g.Watch("x", t0)
				fencedAt, lostAt := time.Duration(-1), time.Duration(-1)
				pending := map[time.Duration]time.Time{}
				for d := time.Duration(0); d <= 20*time.Second && (fencedAt < 0 || lostAt < 0); d += 10 * time.Millisecond {
					now := t0.Add(d)
					if d%tm.Period == 0 {
						g.Observe("guard", now, now)
						if d < cut { // sent before the cut: it arrives, late
							f.Renewed(now)
							f.Vouched("guard", now)
							g.Reached("x", now)
							pending[d+delay] = now
						}
					}
					if r, ok := pending[d]; ok {
						g.Observe("x", r, now)
					}
					if len(f.Silent(now, []string{"guard"})) > 0 && fencedAt < 0 {
						fencedAt = d
					}
					if len(g.Lost(now)) > 0 && lostAt < 0 {
						lostAt = d
					}
				}
				if fencedAt < 0 || lostAt < 0 || fencedAt+tm.Period > lostAt {
					t.Errorf("fenced at %v, lost at %v: want the fence at least a period before", fencedAt, lostAt)
				}
			})
		}
	}
}

func TestTimingRefusesAGuardThatCouldTakeOverBeforeTheFence(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    liveness.Timing
		ok   bool
	}{
		{"the defaults", liveness.DefaultTiming, true},
		{"lost under fence + a period", liveness.Timing{Period: time.Second, Fence: 2 * time.Second, Lost: 2500 * time.Millisecond}, false},
		{"fence under two periods", liveness.Timing{Period: time.Second, Fence: time.Second, Lost: 5 * time.Second}, false},
		{"zero", liveness.Timing{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.t.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestFencerFencesForEachGuardThatStopsVouching(t *testing.T) {
	tm := liveness.DefaultTiming
	f, err := liveness.NewFencer(tm, t0)
	if err != nil {
		t.Fatal(err)
	}
	guards := []string{"b", "c"}
	var fenced []string
	var at time.Duration
	for d := time.Duration(0); d <= 10*time.Second; d += 100 * time.Millisecond {
		now := t0.Add(d)
		if d%tm.Period == 0 {
			if d < 2*time.Second {
				f.Renewed(now)
			}
			f.Vouched("b", now) // b sees this node throughout
			if d < 3*time.Second {
				f.Vouched("c", now) // c loses sight of it at 3 s
			}
		}
		if s := f.Silent(now, guards); len(s) > 0 {
			fenced, at = append(fenced, s...), d
		}
	}
	if len(fenced) != 1 || fenced[0] != "c" {
		t.Fatalf("fenced for %v, want c alone", fenced)
	}
	if at < 3*time.Second+tm.Fence-tm.Period || at > 3*time.Second+tm.Fence+tm.Period {
		t.Errorf("fenced for c at %v, want about %v", at, 3*time.Second+tm.Fence)
	}
	f.Renewed(t0.Add(11 * time.Second))
	if s := f.Silent(t0.Add(11*time.Second), guards); len(s) != 0 {
		t.Errorf("fenced again right after a renewal: %v", s)
	}
}

// TestAsymmetricPartitionFencesBeforeTheGuardTakesOver: a node cut from the
// API server whose probes still reach its guard, while the guard can no
// longer reach it (new connections into the node refused): the guard stops
// vouching for it, so it fences before the guard declares it lost, whatever
// the phase of the cut. Without vouching it would not fence at all.
func TestAsymmetricPartitionFencesBeforeTheGuardTakesOver(t *testing.T) {
	tm := liveness.DefaultTiming
	for _, cut := range []time.Duration{5000, 5100, 5250, 5400, 5499} {
		for _, phase := range []time.Duration{0, 100, 250, 400} { // of the node's probes against the guard's
			cut, phase := cut*time.Millisecond, phase*time.Millisecond
			t.Run(fmt.Sprintf("cut at %v, probes %v apart", cut, phase), func(t *testing.T) {
				f, _ := liveness.NewFencer(tm, t0)
				g, _ := liveness.NewGuard(tm, "guard")
				g.Watch("x", t0)
				sights := liveness.NewSights()
				fencedAt, lostAt := time.Duration(-1), time.Duration(-1)
				for d := time.Duration(0); d <= 20*time.Second && (fencedAt < 0 || lostAt < 0); d += 10 * time.Millisecond {
					now := t0.Add(d)
					if d%tm.Period == 0 {
						g.Observe("guard", now, now)
						if d < cut { // the node's renewals, and the guard's probes of it, until the cut
							f.Renewed(now)
							g.Observe("x", now, now)
							g.Reached("x", now)
							sights.Saw("x", now)
						}
					}
					if (d-phase)%tm.Period == 0 && d >= phase { // the node probes its guard: always reaches it
						if sights.Vouches("x", now, tm.Vouch()) {
							f.Vouched("guard", now)
						}
					}
					if len(f.Silent(now, []string{"guard"})) > 0 && fencedAt < 0 {
						fencedAt = d
					}
					if len(g.Lost(now)) > 0 && lostAt < 0 {
						lostAt = d
					}
				}
				if fencedAt < 0 || lostAt < 0 || fencedAt >= lostAt {
					t.Errorf("fenced at %v, lost at %v: want the fence first", fencedAt, lostAt)
				}
				t.Logf("fenced %v, lost %v", fencedAt, lostAt)
				if margin := lostAt - fencedAt; margin < tm.Period/4 {
					t.Errorf("fenced only %v before it was declared lost, want at least %v (the fence's own action)", margin, tm.Period/4)
				}
			})
		}
	}
}
