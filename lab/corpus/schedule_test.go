package corpus

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/stress"
)

func TestLoadIsFromTheFirstBusyPhaseOrBurstToTheRecordingsEnd(t *testing.T) {
	quiet := func(d time.Duration) stress.Phase { return stress.Phase{Duration: d} }
	for _, c := range []struct {
		name     string
		run      Run
		from, to time.Duration
		ok       bool
	}{
		{"quiet throughout", Run{Profile: stress.Profile{Phases: []stress.Phase{quiet(time.Minute), quiet(time.Minute)}}}, 0, 0, false},
		{"memory after the baseline", Run{Profile: stress.Profile{Phases: []stress.Phase{quiet(90 * time.Second), {Duration: time.Minute, Memory: mi}}}},
			90 * time.Second, 150*time.Second + Tail, true},
		{"CPU from the start", Run{Profile: stress.Profile{Phases: []stress.Phase{{Duration: time.Minute, CPU: 0.1}}}}, 0, time.Minute + Tail, true},
		{"traffic only", Run{Profile: stress.Profile{Phases: []stress.Phase{quiet(3 * time.Minute)}},
			Traffic: Traffic{{Start: 2 * time.Minute}, {Start: time.Minute}}}, time.Minute, 3*time.Minute + Tail, true},
		{"traffic before the load", Run{Profile: stress.Profile{Phases: []stress.Phase{quiet(2 * time.Minute), {Duration: time.Minute, CPU: 0.1}}},
			Traffic: Traffic{{Start: time.Minute}}}, time.Minute, 3*time.Minute + Tail, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			from, to, ok := c.run.Load()
			if from != c.from || to != c.to || ok != c.ok {
				t.Errorf("Load() = %v, %v, %v; want %v, %v, %v", from, to, ok, c.from, c.to, c.ok)
			}
		})
	}
}

// loaded is a run that loads from its onset plus from, for a profile of d.
func loaded(id string, from, d time.Duration) Run {
	return Run{ID: id, Profile: stress.Profile{Phases: []stress.Phase{{Duration: from}, {Duration: d - from, CPU: 0.1}}}}
}

func TestScheduleGivesASlotTheRunThatLeavesItIdleTheLeast(t *testing.T) {
	t0 := time.Unix(1000, 0)
	plan := []Run{
		loaded("a", 5*time.Minute, 10*time.Minute),
		loaded("b", time.Minute, 2*time.Minute),
		loaded("c", 3*time.Minute, 4*time.Minute),
		{ID: "idle", Profile: stress.Profile{Phases: []stress.Phase{{Duration: 8 * time.Minute}}}},
		loaded("d", time.Minute, 2*time.Minute),
	}
	s := NewSchedule(plan, 1, 5, 0)
	start := func(at time.Duration, want string) {
		t.Helper()
		if i, ok, wait := s.Next(t0.Add(at)); !ok || plan[i].ID != want {
			t.Fatalf("at %v: started %v (ok %v, wait %v), want %s", at, i, ok, wait, want)
		}
	}
	waits := func(at, want time.Duration) {
		t.Helper()
		if i, ok, wait := s.Next(t0.Add(at)); ok || wait != want {
			t.Fatalf("at %v: started %s (ok %v) or waits %v; want to wait %v", at, plan[i].ID, ok, wait, want)
		}
	}
	// A free slot: the run whose load begins soonest (b, at 1 min; d as soon,
	// later in the plan).
	start(0, "b")
	// b holds the slot to 2 min + Tail: c's load (at 3 min) leaves it idle
	// 50 s, a's (5 min) 2 min 50 s; d's would overlap b's.
	start(0, "c")
	// c holds it to 4 min + Tail: a's load follows 50 s after.
	start(0, "a")
	// a holds it to 10 min + Tail; d's load would begin 1 min after its
	// start. The idle run needs no slot: it takes a broker no loaded run can.
	start(0, "idle")
	waits(0, 10*time.Minute+Tail-time.Minute)
	// b ends: the slot stays a's.
	s.Done(1)
	waits(time.Minute, 9*time.Minute+Tail-time.Minute)
	// a ends before its load (a failed start): c's load still holds the slot
	// to 4 min + Tail.
	s.Done(0)
	waits(2*time.Minute, 2*time.Minute+Tail-time.Minute)
	// c ends at its kill: the slot is free, d starts.
	s.Done(2)
	start(3*time.Minute, "d")
	waits(3*time.Minute, 0)
	if s.Left() != 0 {
		t.Errorf("%d runs left, want none", s.Left())
	}
}

func TestScheduleStartsNoMoreBrokersThanItsPods(t *testing.T) {
	t0 := time.Unix(1000, 0)
	idle := Run{Profile: stress.Profile{Phases: []stress.Phase{{Duration: time.Minute}}}}
	s := NewSchedule([]Run{idle, idle, idle}, 1, 2, 0)
	for range 2 {
		if _, ok, _ := s.Next(t0); !ok {
			t.Fatal("a pod was free, no run started")
		}
	}
	if _, ok, wait := s.Next(t0); ok || wait != 0 {
		t.Fatalf("third run started (%v) or waits %v with both pods busy; want to wait for an end", ok, wait)
	}
	s.Done(0)
	if _, ok, _ := s.Next(t0); !ok {
		t.Fatal("a pod came free, the third run did not start")
	}
}

// span is when a simulated run started, loaded and ended.
type span struct{ start, loadFrom, end time.Time }

// simulate plays the schedule with setups of up to the allowance and runs
// that may end before their plan (a failing run at its kill), drawn from
// rng, and returns each run's span.
func simulate(plan []Run, slots, pods int, setup time.Duration, rng *rand.Rand) map[int]span {
	s := NewSchedule(plan, slots, pods, setup)
	now := time.Unix(0, 0)
	spans := map[int]span{}
	running := map[int]bool{}
	for s.Left() > 0 || len(running) > 0 {
		if i, ok, _ := s.Next(now); ok {
			onset := now.Add(time.Duration(rng.Int64N(int64(setup) + 1)))
			s.Onset(i, onset)
			from, to, loads := plan[i].Load()
			if !loads {
				from = to
			}
			end := onset.Add(to)
			if plan[i].Failing && loads {
				end = onset.Add(from + time.Duration(rng.Int64N(int64(to-from)+1)))
			}
			spans[i], running[i] = span{now, onset.Add(from), end}, true
			continue
		}
		_, _, wait := s.Next(now)
		first := -1
		for i := range running {
			if first < 0 || spans[i].end.Before(spans[first].end) {
				first = i
			}
		}
		if wait > 0 && (first < 0 || now.Add(wait).Before(spans[first].end)) {
			now = now.Add(wait)
			continue
		}
		now = spans[first].end
		s.Done(first)
		delete(running, first)
	}
	return spans
}

func TestScheduleNeverOverlapsMoreLoadsThanSlotsNorWaitsOnceARunStarted(t *testing.T) {
	plan, err := Plan(1, 5)
	if err != nil {
		t.Fatal(err)
	}
	for i := range plan {
		if plan[i], err = (LeadIn{Max: 10 * time.Minute}).Apply(plan[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ slots, pods int }{{1, 1}, {2, 2}, {2, 8}, {3, 6}, {1, 10}} {
		for seed := range uint64(20) {
			spans := simulate(plan, c.slots, c.pods, 20*time.Second, rand.New(rand.NewPCG(seed, 1)))
			if len(spans) != len(plan) {
				t.Fatalf("slots %d pods %d seed %d: %d runs started, want %d", c.slots, c.pods, seed, len(spans), len(plan))
			}
			// Sweep the loads' and the brokers' starts and ends.
			type edge struct {
				at    time.Time
				d     int
				load  bool
				index int
			}
			var edges []edge
			for i, sp := range spans {
				edges = append(edges, edge{sp.start, 1, false, i}, edge{sp.end, -1, false, i})
				if _, _, loads := plan[i].Load(); loads {
					edges = append(edges, edge{sp.loadFrom, 1, true, i}, edge{sp.end, -1, true, i})
				}
			}
			slices.SortFunc(edges, func(a, b edge) int {
				if c := a.at.Compare(b.at); c != 0 {
					return c
				}
				return a.d - b.d // an end before a start at the same time
			})
			loads, pods := 0, 0
			for _, e := range edges {
				if e.load {
					loads += e.d
				} else {
					pods += e.d
				}
				if loads > c.slots || pods > c.pods {
					t.Fatalf("slots %d pods %d seed %d: at %v (%s), %d runs loading and %d brokers",
						c.slots, c.pods, seed, e.at.Sub(time.Unix(0, 0)), plan[e.index].ID, loads, pods)
				}
			}
		}
	}
}

func TestScheduleOverlapsLeadInsWithOtherRunsLoad(t *testing.T) {
	plan, err := Plan(1, 5)
	if err != nil {
		t.Fatal(err)
	}
	var load time.Duration
	for i := range plan {
		if plan[i], err = (LeadIn{Max: 10 * time.Minute}).Apply(plan[i]); err != nil {
			t.Fatal(err)
		}
		if from, to, ok := plan[i].Load(); ok {
			load += to - from
		}
	}
	const setup = 15 * time.Second
	// Brokers only as many as slots: every lead-in holds a slot idle, as when
	// each worker recorded one run after the other.
	serial := Estimate(plan, 2, 2, setup)
	overlapped := Estimate(plan, 2, 8, setup)
	bound := load / 2 // two slots kept busy with load and nothing else
	t.Logf("%d runs: %v with 2 brokers, %v with 8; the loads alone fill 2 slots for %v", len(plan), serial, overlapped, bound)
	if overlapped > bound*5/4 {
		t.Errorf("overlapped schedule takes %v, over 1.25 × the %v its loads need", overlapped, bound)
	}
	if serial < bound*2 {
		t.Errorf("serial schedule %v is not even twice the loads' %v: the plan's lead-ins are not most of its time", serial, bound)
	}
}
