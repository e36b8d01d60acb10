package corpus

import (
	"slices"
	"time"

	"github.com/amf-edge/amf/lab/stress"
)

// Tail is how long a run is recorded after its profile's planned end: the
// recorder stops at the kill (plus a few samples) or at the profile's end
// plus Tail, whichever comes first.
const Tail = 10 * time.Second

// Load is when run r loads its broker, from its onset: from the start of its
// first phase that is not quiet, or of its first traffic burst if that comes
// sooner, to the end of its recording (Tail after the profile). A run with
// neither (an idle run) has no load: ok is false.
func (r Run) Load() (from, to time.Duration, ok bool) {
	from = -1
	var at time.Duration
	for _, ph := range r.Profile.Phases {
		if ph != (stress.Phase{Duration: ph.Duration}) {
			from = at
			break
		}
		at += ph.Duration
	}
	for _, b := range r.Traffic {
		if from < 0 || b.Start < from {
			from = b.Start
		}
	}
	if from < 0 {
		return 0, 0, false
	}
	return from, r.Profile.Duration() + Tail, true
}

// Schedule says when each run of a recording starts, so that the quiet
// lead-ins, which are most of a corpus's time, overlap other runs' load:
// at most slots runs load the machine at once, at most pods brokers run at
// once (NewSchedule), and a run starts only when a load slot will be free by the time its
// load begins. A slot is held from a run's load to its planned end (a
// failing run ends sooner, never later), so no run ever waits for a slot
// once started: its lead-in is the one drawn, its onset the profile's
// start, and two loads never overlap on one slot.
//
// Of the runs that may start, the one that leaves its slot idle the least
// starts first: a free slot gets the run whose load begins soonest, a slot
// still held for 5 minutes the run whose lead-in lasts just over that. Runs
// without load need only a pod; they take one that no loaded run can use yet.
//
// Schedule is pure bookkeeping on times it is given; it is not safe for
// concurrent use.
type Schedule struct {
	plan    []Run
	setup   time.Duration
	maxPods int
	slots   []slot
	left    []int // indexes into plan not started yet, in plan order
	slotOf  map[int]int
	started map[int]bool // runs started and not ended: one broker each
}

// slot is one load slot: the planned end of the load of each run given it
// that has not ended (their loads follow one another).
type slot map[int]time.Time

// heldUntil is when the last load planned on the slot ends (zero: free).
func (sl slot) heldUntil() time.Time {
	var t time.Time
	for _, u := range sl {
		if u.After(t) {
			t = u
		}
	}
	return t
}

// NewSchedule schedules plan on slots load slots and pods brokers at once
// (pods is raised to slots if lower). setup is the time allowed between a
// run's start and its onset (the broker's Deployment coming Ready) until
// Onset says when it came.
func NewSchedule(plan []Run, slots, pods int, setup time.Duration) *Schedule {
	slots = max(slots, 1)
	s := &Schedule{plan: plan, setup: setup, maxPods: max(pods, slots), slots: make([]slot, slots),
		slotOf: map[int]int{}, started: map[int]bool{}}
	for i := range s.slots {
		s.slots[i] = slot{}
	}
	for i := range plan {
		s.left = append(s.left, i)
	}
	return s
}

// Left is how many runs have not started.
func (s *Schedule) Left() int { return len(s.left) }

// Next is the run to start at now (ok), or, if none may start yet, how long
// until one may: wait is 0 when only a run's end can let one start (every
// pod busy, or no run left).
func (s *Schedule) Next(now time.Time) (run int, ok bool, wait time.Duration) {
	if len(s.started) >= s.maxPods || len(s.left) == 0 {
		return 0, false, 0
	}
	best, bestSlot, bestIdle := -1, -1, time.Duration(0)
	quiet := -1
	wait = -1
	for k, i := range s.left {
		from, _, loads := s.plan[i].Load()
		if !loads {
			if quiet < 0 {
				quiet = k
			}
			continue
		}
		for j, sl := range s.slots {
			free := sl.heldUntil().Sub(now) // how long the slot is held yet
			if free > from {
				if w := free - from; wait < 0 || w < wait {
					wait = w
				}
				continue
			}
			if idle := from - max(free, 0); best < 0 || idle < bestIdle {
				best, bestSlot, bestIdle = k, j, idle
			}
		}
	}
	if best < 0 && quiet >= 0 {
		best = quiet
	}
	if best < 0 {
		return 0, false, max(wait, 0)
	}
	run = s.left[best]
	s.left = slices.Delete(s.left, best, best+1)
	s.started[run] = true
	if bestSlot >= 0 {
		s.slotOf[run] = bestSlot
		s.slots[bestSlot][run] = s.plannedEnd(run, now.Add(s.setup))
	}
	return run, true, 0
}

// plannedEnd is when run's load ends if its onset is at onset.
func (s *Schedule) plannedEnd(run int, onset time.Time) time.Time {
	_, to, _ := s.plan[run].Load()
	return onset.Add(to)
}

// Onset says when run's profile started: its load's end is planned from it.
func (s *Schedule) Onset(run int, onset time.Time) {
	if j, ok := s.slotOf[run]; ok {
		s.slots[j][run] = s.plannedEnd(run, onset)
	}
}

// Done says run ended: its pod is free, and its load no longer holds its
// slot.
func (s *Schedule) Done(run int) {
	if !s.started[run] {
		return
	}
	delete(s.started, run)
	if j, ok := s.slotOf[run]; ok {
		delete(s.slotOf, run)
		delete(s.slots[j], run)
	}
}

// Estimate is how long recording plan takes on slots load slots and pods
// brokers at once if every run lasts as planned (a failing one ends at its
// kill, sooner) after setup: the schedule played on a simulated clock.
func Estimate(plan []Run, slots, pods int, setup time.Duration) time.Duration {
	s := NewSchedule(plan, slots, pods, setup)
	start := time.Unix(0, 0)
	now := start
	ends := map[int]time.Time{} // running runs' ends
	for s.Left() > 0 || len(ends) > 0 {
		i, ok, wait := s.Next(now)
		if ok {
			onset := now.Add(setup)
			s.Onset(i, onset)
			ends[i] = onset.Add(plan[i].Profile.Duration() + Tail)
			continue
		}
		// Nothing starts now: the clock moves to the next end or to when
		// a run may start, whichever is first.
		next, first := time.Time{}, -1
		for i, t := range ends {
			if first < 0 || t.Before(next) || (t.Equal(next) && i < first) {
				next, first = t, i
			}
		}
		if wait > 0 && (first < 0 || now.Add(wait).Before(next)) {
			now = now.Add(wait)
			continue
		}
		if first < 0 {
			break // cannot happen: a run left either fits a slot or waits for one
		}
		now = next
		s.Done(first)
		delete(ends, first)
	}
	return now.Sub(start)
}
