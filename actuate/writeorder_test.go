package actuate

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
)

// crashModel is the cluster as the Actuator's writes leave it: the replicas
// of primary and standby and the record persisted on the primary. It drives a
// Gate in the Actuator's write order (step): a step's early actions (the
// standby's scale-up) are sent while its record is written, everything else
// after the record.
type crashModel struct {
	t                *testing.T
	p                contract.Policy
	primary, standby int32
	persisted        Record
	trace            []Input // Kind 0: a restart
}

// observe makes an InStandby input agree with the model's standby: a
// standby at 0 replicas is never Ready, and is drained.
func (m *crashModel) observe(in Input) Input {
	if in.Kind == InStandby {
		up := m.standby >= 1
		in.Ready = in.Ready && up
		in.Scaled, in.Drained = up, !up
	}
	return in
}

func (m *crashModel) fail(format string, args ...any) {
	m.t.Helper()
	var trace []string // formatted here only: the test runs a million steps
	for _, in := range m.trace {
		switch in.Kind {
		case 0:
			trace = append(trace, "RESTART")
		case InSample:
			trace = append(trace, string(in.State))
		case InStandby:
			trace = append(trace, fmt.Sprintf("standby{ready:%v scaled:%v}", in.Ready, in.Scaled))
		case InTick:
			trace = append(trace, "tick")
		}
	}
	m.t.Fatalf("%s after %s", fmt.Sprintf(format, args...), strings.Join(trace, " → "))
}

// apply carries out one action and checks the invariant at that instant.
func (m *crashModel) apply(g *Gate, act Action) {
	m.t.Helper()
	switch act.Kind {
	case ActScaleStandby:
		if act.Replicas == 0 && m.primary == 0 {
			m.fail("standby scaled back with the primary retired")
		}
		if m.p.Redundancy == contract.Hot && (act.Replicas == 0 || !g.Rec.Restore) {
			m.fail("hot standby scaled to %d (restore %v)", act.Replicas, g.Rec.Restore)
		}
		m.standby = act.Replicas
	case ActRetirePrimary:
		if !g.Rec.StandbyReady || m.standby < 1 {
			m.fail("primary retired without a Ready standby")
		}
		if m.persisted.Phase != PhaseRetiring {
			m.fail("primary retired before its Retiring record was written (record %s)", m.persisted.Phase)
		}
		m.primary = 0
	}
}

// accounted checks that a cold standby that is up is part of what the Gate
// is doing: never left running with nothing to scale it back.
func (m *crashModel) accounted(g *Gate, when string) {
	m.t.Helper()
	if m.p.Redundancy == contract.Cold && m.standby >= 1 && m.primary >= 1 && !g.Rec.Active() {
		m.fail("%s: cold standby up, record %s: nothing will scale it back", when, g.Rec.Phase)
	}
}

// drive feeds ins (input i at times[i]) to g, and calls stop at every write
// point with the model as that write left it and the inputs after it. It
// returns once the primary is retired (the exchange follows, checked by the
// restart tests on the real control plane).
func (m *crashModel) drive(g *Gate, ins []func(time.Time) Input, times []time.Time, stop func(snap crashModel, at time.Time, i int)) {
	m.t.Helper()
	for i, f := range ins {
		in := m.observe(f(times[i]))
		m.trace = append(m.trace, in)
		old := g.Rec
		acts := g.Step(in)
		var first, later []Action
		persist := g.Persist(old)
		for _, act := range acts {
			if persist && early(act) {
				first = append(first, act)
			} else {
				later = append(later, act)
			}
		}
		for _, act := range first {
			if act.Kind != ActScaleStandby || act.Replicas < 1 {
				m.fail("%+v sent before its record", act)
			}
		}
		for _, act := range later {
			if len(first) > 0 && act.Kind != ActEvent {
				// The Actuator keeps a step whose record failed after its
				// scale-up went out: only Events may ride along.
				m.fail("%+v in the step of an early scale-up", act)
			}
		}
		if persist {
			if stop != nil {
				a := *m // stopped with the scale-up sent, the record not
				for _, act := range first {
					a.apply(g, act)
				}
				stop(a, times[i], i)
				b := *m // stopped with the record written, the scale-up not
				b.persisted = g.Rec
				stop(b, times[i], i)
			}
			for _, act := range first {
				m.apply(g, act)
			}
			m.persisted = g.Rec
		}
		for _, act := range later {
			m.apply(g, act)
			if act.Kind != ActEvent && stop != nil {
				stop(*m, times[i], i)
			}
		}
		if m.primary == 0 {
			return
		}
		m.accounted(g, "after the step")
	}
}

// restart is a fresh driver on snap: it loads the persisted record, repeats
// the current phase (Resume), adopts an orphaned cold standby, and returns
// its Gate.
func (m *crashModel) restart(now time.Time) *Gate {
	m.t.Helper()
	m.trace = append(m.trace, Input{})
	if m.primary == 0 && m.persisted.Phase != PhaseRetiring {
		m.fail("stopped with the primary retired and the record %s: the exchange would never be finished", m.persisted.Phase)
	}
	rec := m.persisted
	rec.StandbyReady = false // learned again from the watch
	g := NewGate(m.p, rec)
	for _, act := range g.Resume() {
		switch act.Kind {
		case ActRetirePrimary:
			// The Actuator reads the standby right before: Ready goes on.
			if m.standby >= 1 {
				m.primary = 0
			}
		default:
			m.apply(g, act)
		}
	}
	if m.p.Redundancy == contract.Cold && !rec.Active() && m.standby >= 1 && m.primary >= 1 {
		old := g.Rec
		for _, act := range g.Step(Orphaned(now)) {
			if act.Kind != ActEvent {
				m.fail("orphan adoption acts: %+v", act)
			}
		}
		if g.Persist(old) {
			m.persisted = g.Rec
		}
	}
	if m.primary >= 1 {
		m.accounted(g, "after the restart")
	}
	return g
}

// TestWriteOrderCrashSafety runs every input sequence of length 6 (anomalous,
// healthy, gone, standby Ready, standby not Ready, tick; one minute apart,
// gates shortened) from a cold pair, a hot pair and a hot pair restoring its
// standby, in the Actuator's write order, stops the driver at every write
// point (the scale-up sent without its record, the record without its
// scale-up, after each later action), restarts it from the persisted record
// and the replicas, and feeds it the rest of the sequence. Checked throughout
// (crashModel): only a scale-up goes before its record, and only with Events
// beside it; the primary is retired only with a Ready standby and its
// Retiring record written; a stop never leaves a retired primary without a
// Retiring record; a cold standby that is up is always part of a recorded
// switchover or abort (after a restart too: an orphan is adopted); a hot
// standby is never scaled down, and up only to restore it.
func TestWriteOrderCrashSafety(t *testing.T) {
	alphabet := []func(time.Time) Input{anom, healthy, gone, ready, notReady, tick}
	cold := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}
	cold.Gates.Hold, cold.Gates.Debounce, cold.Gates.Reconfirm = 0, 1, 1
	hot := cold
	hot.Redundancy = contract.Hot
	starts := []struct {
		name    string
		p       contract.Policy
		rec     Record
		standby int32
	}{
		{"cold", cold, Record{}, 0},
		{"hot", hot, Record{}, 1},
		{"hot restoring", hot, Record{Restore: true}, 0},
	}
	const length = 6
	n := len(alphabet)
	total := 1
	for range length {
		total *= n
	}
	t0 := time.Unix(1000, 0)
	times := make([]time.Time, length)
	for i := range times {
		times[i] = t0.Add(time.Duration(i+1) * time.Minute)
	}
	for _, st := range starts {
		t.Run(st.name, func(t *testing.T) {
			stops := 0
			for code := range total {
				ins := make([]func(time.Time) Input, length)
				c := code
				for i := range ins {
					ins[i] = alphabet[c%n]
					c /= n
				}
				m := crashModel{t: t, p: st.p, primary: 1, standby: st.standby, persisted: NewGate(st.p, st.rec).Rec}
				m.drive(NewGate(st.p, st.rec), ins, times, func(snap crashModel, at time.Time, i int) {
					stops++
					snap.trace = slices.Clone(snap.trace)
					g := snap.restart(at)
					if snap.primary >= 1 {
						snap.drive(g, ins[i+1:], times[i+1:], nil)
					}
				})
			}
			t.Logf("%d sequences, %d stops", total, stops)
		})
	}
}
