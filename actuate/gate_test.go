package actuate

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
	"k8s.io/utils/ptr"
)

// fakeClock is the injected clock of the gate tests: it only moves when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) advance(d time.Duration) time.Time { c.t = c.t.Add(d); return c.t }

// step is one input at a time offset from the previous step, and the actions
// it must produce, summarised as "scale:N", "retire", "event:Reason" or
// "warn:Reason".
type step struct {
	after time.Duration
	in    func(at time.Time) Input
	want  []string
	phase Phase // "" = do not check
}

func anom(at time.Time) Input    { return Sample(at, podsignal.Anomalous, ptr.To(0.9)) }
func lowAnom(at time.Time) Input { return Sample(at, podsignal.Anomalous, ptr.To(0.2)) }
func healthy(at time.Time) Input { return Sample(at, podsignal.Healthy, ptr.To(0.1)) }
func gone(at time.Time) Input    { return Sample(at, podsignal.Gone, nil) }
func unhealthy(at time.Time) Input {
	return Sample(at, podsignal.Unhealthy, nil)
}
func stopping(at time.Time) Input { return Sample(at, podsignal.Stopping, nil) }
func starting(at time.Time) Input { return Sample(at, podsignal.Starting, nil) }

// silentWill and silentSession are a sidecar's silence: gone, from its
// Last Will and from its session's end; exited is node mode's pushed exit.
func silentWill(at time.Time) Input    { return goneFrom(at, podsignal.SourceWill) }
func silentSession(at time.Time) Input { return goneFrom(at, podsignal.SourceDisconnect) }
func exited(at time.Time) Input        { return goneFrom(at, podsignal.SourceNode) }
func goneFrom(at time.Time, src podsignal.Source) Input {
	in := Sample(at, podsignal.Gone, nil)
	in.Source, in.Pod = src, "a-0"
	return in
}
func ready(at time.Time) Input    { return StandbyReadiness(at, true) }
func notReady(at time.Time) Input { return StandbyReadiness(at, false) }
func tick(at time.Time) Input     { return Tick(at) }
func orphaned(at time.Time) Input { return Orphaned(at) }
func nodeLost(at time.Time) Input { return NodeLost(at, "node-a") }

// drained: the standby at 0 replicas with no pod left; scaledUp: its
// replicas raised, not Ready yet; terminating: at 0, a pod still there.
func drained(at time.Time) Input     { return StandbyStatus(at, false, false, true) }
func scaledUp(at time.Time) Input    { return StandbyStatus(at, false, true, false) }
func terminating(at time.Time) Input { return StandbyStatus(at, false, false, false) }

func summary(acts []Action) []string {
	out := []string{}
	for _, a := range acts {
		switch a.Kind {
		case ActScaleStandby:
			out = append(out, fmt.Sprintf("scale:%d", a.Replicas))
		case ActRetirePrimary:
			out = append(out, "retire")
		case ActResize:
			out = append(out, fmt.Sprintf("resize:%s:%dMi", a.Pod, a.Memory>>20))
		case ActKeepSize:
			out = append(out, fmt.Sprintf("keep:%dMi", a.Memory>>20))
		case ActEvent:
			if a.Warning {
				out = append(out, "warn:"+a.Reason)
			} else {
				out = append(out, "event:"+a.Reason)
			}
		}
	}
	return out
}

// the paper's switchover: 3 anomalous samples, standby up, Ready, 3 more, hold.
func switchover() []step {
	return []step{
		{0, anom, nil, PhaseSuspect},
		{time.Second, anom, nil, PhaseSuspect},
		{time.Second, anom, []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		{4 * time.Second, ready, []string{"event:StandbyReady"}, PhaseConfirm},
		{time.Second, anom, nil, PhaseConfirm},
		{time.Second, anom, nil, PhaseConfirm},
		{time.Second, anom, nil, PhaseConfirm}, // 7 s after the decision: hold not over
		{8 * time.Second, tick, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
	}
}

func TestGate(t *testing.T) {
	cold := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}
	hot := cold
	hot.Redundancy = contract.Hot
	none := cold
	none.Redundancy = contract.None
	noGrace := hot
	noGrace.Gates.SidecarGrace = 0
	sec := time.Second
	tests := []struct {
		name   string
		policy contract.Policy
		rec    Record
		steps  []step
	}{
		{"cold switchover retires the primary only after ready, reconfirm and hold", cold, Record{}, switchover()},
		{"the primary's node lost with the hot standby Ready: retired at once", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, nodeLost, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"the primary's node lost before the hot standby is Ready: retired once it is", hot, Record{}, []step{
			{0, nodeLost, []string{"event:Failover"}, PhaseFailover},
			{sec, nodeLost, nil, PhaseFailover},
			{sec, anom, nil, PhaseFailover},
			{sec, ready, []string{"event:StandbyReady", "retire"}, PhaseRetiring},
		}},
		{"the primary's node lost during a switchover's reconfirmation: retired at once", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided"}, PhaseConfirm},
			{sec, nodeLost, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"the primary's node lost with no standby ever Ready: the ready timeout keeps the primary", hot, Record{}, []step{
			{0, nodeLost, []string{"event:Failover"}, PhaseFailover},
			{2 * time.Minute, tick, []string{"warn:StandbyNotReady"}, PhaseIdle},
		}},
		{"hold already over: the third reconfirm sample retires at once", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
			{20 * sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
		}},
		{"a clear sample resets the debounce", cold, Record{}, []step{
			{0, anom, nil, PhaseSuspect}, {sec, anom, nil, PhaseSuspect},
			{sec, healthy, nil, PhaseIdle},
			{sec, anom, nil, PhaseSuspect}, {sec, anom, nil, PhaseSuspect},
			{sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		}},
		{"an anomalous signal below the threshold counts as clear", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, lowAnom, nil, PhaseIdle},
			{sec, anom, nil, PhaseSuspect},
		}},
		{"starting and stopping say nothing", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, stopping, nil, PhaseSuspect}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		}},
		{"samples before the standby is ready do not count as reconfirmation", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, anom, nil, PhaseWaitReady}, {sec, anom, nil, ""}, {sec, anom, nil, ""},
			{20 * sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
		}},
		{"anomaly clears before the standby is ready: abort, scale back after the delay", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, healthy, []string{"event:SwitchoverAborted"}, PhaseAborted},
			{29 * sec, tick, nil, PhaseAborted},
			{sec, tick, []string{"scale:0"}, PhaseIdle},
		}},
		{"anomaly clears during reconfirmation: abort keeps the primary", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, anom, nil, ""},
			{sec, healthy, []string{"event:SwitchoverAborted"}, PhaseAborted},
			{60 * sec, tick, []string{"scale:0"}, PhaseIdle},
		}},
		{"anomaly returning during the abort delay reuses the running standby", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, healthy, []string{"event:SwitchoverAborted"}, PhaseAborted},
			{sec, anom, nil, PhaseAborted}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, nil, PhaseConfirm}, // hold counts from the new decision
			{12 * sec, tick, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
		}},
		{"standby never ready: warning, keep primary, scale standby back", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{119 * sec, tick, nil, PhaseWaitReady},
			{sec, tick, []string{"warn:StandbyNotReady", "scale:0"}, PhaseIdle},
		}},
		{"standby losing readiness before retirement blocks it", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, notReady, []string{"warn:StandbyNotReady"}, PhaseWaitReady},
			{20 * sec, tick, nil, PhaseWaitReady},
			{sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
		}},
		{"gone primary fails over at once and retires when the standby is ready", cold, Record{}, []step{
			{0, gone, []string{"event:Failover", "scale:1"}, PhaseFailover},
			{sec, healthy, nil, PhaseFailover},
			{2 * sec, ready, []string{"event:StandbyReady", "retire"}, PhaseRetiring},
		}},
		{"a retirement held back by an unready standby goes ahead once it is ready", cold, Record{Phase: PhaseRetiring}, []step{
			{0, notReady, nil, PhaseRetiring},
			{sec, anom, nil, PhaseRetiring},
			{sec, ready, []string{"retire"}, PhaseRetiring},
		}},
		{"unhealthy primary fails over at once", cold, Record{}, []step{
			{0, unhealthy, []string{"event:Failover", "scale:1"}, PhaseFailover},
		}},
		{"failover whose standby never gets ready keeps the primary", cold, Record{}, []step{
			{0, gone, []string{"event:Failover", "scale:1"}, PhaseFailover},
			{2 * time.Minute, tick, []string{"warn:StandbyNotReady", "scale:0"}, PhaseIdle},
		}},
		{"crash while waiting for the standby turns the switchover into a failover", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, gone, []string{"event:Failover"}, PhaseFailover},
			{sec, ready, []string{"event:StandbyReady", "retire"}, PhaseRetiring},
		}},
		{"crash with the standby ready retires without waiting for the hold", cold, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, []string{"event:SwitchoverDecided", "scale:1"}, ""},
			{sec, ready, []string{"event:StandbyReady"}, PhaseConfirm},
			{sec, gone, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"hot standby is never scaled and a ready one skips the wait", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided"}, PhaseConfirm},
			{sec, healthy, []string{"event:SwitchoverAborted"}, PhaseIdle},
		}},
		{"hot failover with a ready standby retires at once", hot, Record{StandbyReady: true}, []step{
			{0, gone, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"redundancy none never acts", none, Record{}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, nil, ""}, {sec, gone, nil, ""},
		}},
		{"flap guard refuses a second switchover within the cool-down, warning once", cold, Record{LastSwitch: time.Unix(1000, 0).Add(-time.Minute)}, []step{
			{0, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"warn:FlapGuard"}, PhaseSuspect},
			{sec, anom, nil, PhaseSuspect},
			{4 * time.Minute, anom, []string{"event:SwitchoverDecided", "scale:1"}, PhaseWaitReady},
		}},
		{"resumed in Confirm: samples counted before the watch reports Ready retire once it does", cold,
			Record{Phase: PhaseConfirm, Decision: time.Unix(1000, 0).Add(-20 * time.Second)}, []step{
				{0, anom, nil, PhaseConfirm}, {sec, anom, nil, PhaseConfirm}, {sec, anom, nil, PhaseConfirm},
				{sec, ready, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
			}},
		{"the flap guard does not hold back a failover", cold, Record{LastSwitch: time.Unix(1000, 0)}, []step{
			{sec, gone, []string{"event:Failover", "scale:1"}, PhaseFailover},
		}},
		{"an orphaned cold standby is kept for the abort delay, then scaled back", cold, Record{}, []step{
			{0, anom, nil, PhaseSuspect},
			{sec, orphaned, []string{"warn:OrphanedStandby"}, PhaseAborted},
			{sec, healthy, nil, PhaseAborted},
			{28 * sec, tick, nil, PhaseAborted},
			{sec, tick, []string{"scale:0"}, PhaseIdle},
		}},
		{"an anomaly that persists takes over an orphaned standby without scaling it again", cold, Record{}, []step{
			{0, orphaned, []string{"warn:OrphanedStandby"}, PhaseAborted},
			{sec, ready, nil, PhaseAborted},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, nil, ""},
			{15 * sec, tick, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
		}},
		{"a crash fails over to an orphaned standby at once", cold, Record{}, []step{
			{0, orphaned, []string{"warn:OrphanedStandby"}, PhaseAborted},
			{sec, gone, []string{"event:Failover"}, PhaseFailover},
			{sec, ready, []string{"event:StandbyReady", "retire"}, PhaseRetiring},
		}},
		{"orphan reports are ignored while a switchover is recorded", cold, Record{Phase: PhaseWaitReady, Decision: time.Unix(1000, 0)}, []step{
			{0, orphaned, nil, PhaseWaitReady},
		}},
		{"a hot standby is never an orphan", hot, Record{}, []step{
			{0, orphaned, nil, PhaseIdle},
		}},
		{"hot switchover: no scale-up, retire after the hold", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided"}, PhaseConfirm},
			{sec, anom, nil, ""}, {sec, anom, nil, ""}, {sec, anom, nil, PhaseConfirm},
			{12 * sec, tick, []string{"event:SwitchoverConfirmed", "retire"}, PhaseRetiring},
		}},
		{"hot: the retired old primary is scaled back once drained, until seen scaled up", hot, Record{Restore: true}, []step{
			{0, terminating, nil, PhaseIdle}, // scaled to 0, its pod not gone yet
			{sec, drained, []string{"scale:1"}, PhaseIdle},
			{sec, drained, []string{"scale:1"}, PhaseIdle}, // not seen up yet: again (idempotent)
			{sec, scaledUp, nil, PhaseIdle},
			{sec, drained, nil, PhaseIdle}, // restored once: a later scale-down is someone's choice
		}},
		{"cold never restores its standby", cold, Record{Restore: true}, []step{
			{0, drained, nil, PhaseIdle},
		}},
		{"a silent sidecar whose pod says nothing within the grace: failed over then", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, silentWill, []string{"event:SidecarSilent"}, PhaseIdle},
			{4 * sec, tick, nil, PhaseIdle},
			{sec, tick, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"a silent sidecar that speaks again within the grace keeps the primary", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, silentWill, []string{"event:SidecarSilent"}, PhaseIdle},
			{2 * sec, starting, nil, PhaseIdle},
			{time.Minute, tick, nil, PhaseIdle},
			{sec, healthy, nil, PhaseIdle},
		}},
		{"a second silence does not move the grace on", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, silentWill, []string{"event:SidecarSilent"}, PhaseIdle},
			{3 * sec, silentSession, nil, PhaseIdle},
			{2 * sec, tick, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"a silent sidecar, then its broker unhealthy: failed over at once", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, silentSession, []string{"event:SidecarSilent"}, PhaseIdle},
			{sec, unhealthy, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"node mode's pushed exit is the broker's crash: failed over at once", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, exited, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"a silent sidecar during a switchover's reconfirmation: retired at once", hot, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, anom, nil, ""}, {sec, anom, nil, ""},
			{sec, anom, []string{"event:SwitchoverDecided"}, PhaseConfirm},
			{sec, silentWill, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
		{"a silent cold primary: its standby brought up after the grace", cold, Record{}, []step{
			{0, silentWill, []string{"event:SidecarSilent"}, PhaseIdle},
			{5 * sec, tick, []string{"event:Failover", "scale:1"}, PhaseFailover},
		}},
		{"no grace: a silent sidecar is a crash at once", noGrace, Record{}, []step{
			{0, ready, nil, PhaseIdle},
			{sec, silentWill, []string{"event:Failover", "retire"}, PhaseRetiring},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, NewGate(tt.policy, tt.rec), tt.steps) })
	}
}

// runSteps feeds g the steps on a fake clock and checks each one's actions
// and phase, and that every change of the record but the debounce counts
// is persisted (Persist).
func runSteps(t *testing.T, g *Gate, steps []step) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	for i, s := range steps {
		in := s.in(clk.advance(s.after))
		old := g.Rec
		got := summary(g.Step(in))
		want := s.want
		if want == nil {
			want = []string{}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d (%+v): actions %v, want %v (record %+v)", i, in.Kind, got, want, g.Rec)
		}
		if s.phase != "" && g.Rec.Phase != s.phase {
			t.Fatalf("step %d: phase %s, want %s", i, g.Rec.Phase, s.phase)
		}
		if old.Resize != g.Rec.Resize && !g.Persist(old) {
			t.Fatalf("step %d: the resize's progress %+v → %+v is not persisted", i, old.Resize, g.Rec.Resize)
		}
	}
}

// TestGateRetireNeedsReadyStandby checks the invariant over every input
// sequence of length 6 from a small alphabet: RetirePrimary is only ever
// emitted while the latest standby observation was Ready.
func TestGateRetireNeedsReadyStandby(t *testing.T) {
	// With a memory ceiling, so that resizes in place (leak, applied,
	// deferred) interleave with everything else.
	leak := memSample(podsignal.Anomalous, 80, 0.05, 100)
	alphabet := []func(time.Time) Input{anom, healthy, gone, silentWill, ready, notReady, tick, orphaned, nodeLost, leak, applied, deferred}
	p := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates(), MemoryCeiling: 256 * mi}
	p.Gates.Hold = 0
	p.Gates.Debounce, p.Gates.Reconfirm = 1, 1
	n := len(alphabet)
	total := 1
	for range 6 {
		total *= n
	}
	for code := range total {
		clk := &fakeClock{t: time.Unix(1000, 0)}
		g := NewGate(p, Record{})
		var trace []string
		c := code
		for range 6 {
			in := alphabet[c%n](clk.advance(time.Minute))
			c /= n
			acts := g.Step(in)
			trace = append(trace, fmt.Sprint(in.Kind, in.State, in.Ready))
			for _, a := range acts {
				if a.Kind == ActRetirePrimary && !g.Rec.StandbyReady {
					t.Fatalf("retire without a Ready standby after %s", strings.Join(trace, " → "))
				}
			}
			if g.Rec.Phase == PhaseRetiring {
				break
			}
		}
	}
}

func TestGateResume(t *testing.T) {
	cold := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}
	hot := cold
	hot.Redundancy = contract.Hot
	tests := []struct {
		name string
		p    contract.Policy
		rec  Record
		want []string
	}{
		{"idle does nothing", cold, Record{Phase: PhaseIdle}, []string{}},
		{"waiting cold standby is scaled up again", cold, Record{Phase: PhaseWaitReady}, []string{"scale:1"}},
		{"failover cold standby is scaled up again", cold, Record{Phase: PhaseFailover}, []string{"scale:1"}},
		{"hot standby is not scaled", hot, Record{Phase: PhaseWaitReady}, []string{}},
		{"retiring retires again", cold, Record{Phase: PhaseRetiring}, []string{"retire"}},
		{"confirm waits for samples", cold, Record{Phase: PhaseConfirm}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summary(NewGate(tt.p, tt.rec).Resume()); !slices.Equal(got, tt.want) {
				t.Errorf("Resume = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestGateDeadline(t *testing.T) {
	p := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}
	d := time.Unix(1000, 0)
	tests := []struct {
		name string
		rec  Record
		want time.Time
		ok   bool
	}{
		{"idle has none", Record{Phase: PhaseIdle}, time.Time{}, false},
		{"waiting: ready timeout", Record{Phase: PhaseWaitReady, Decision: d}, d.Add(2 * time.Minute), true},
		{"confirming before enough samples: none", Record{Phase: PhaseConfirm, Decision: d, Confirmed: 1}, time.Time{}, false},
		{"confirmed: end of hold", Record{Phase: PhaseConfirm, Decision: d, Confirmed: 3, StandbyReady: true}, d.Add(15 * time.Second), true},
		{"confirmed, standby readiness not known yet (resumed): none", Record{Phase: PhaseConfirm, Decision: d, Confirmed: 3}, time.Time{}, false},
		{"aborted: scale back time", Record{Phase: PhaseAborted, AbortAt: d}, d, true},
		{"a silent sidecar: the end of its grace", Record{Phase: PhaseSuspect, SidecarGone: d}, d.Add(5 * time.Second), true},
		{"aborted and a silent sidecar: the sooner", Record{Phase: PhaseAborted, AbortAt: d.Add(time.Minute), SidecarGone: d}, d.Add(5 * time.Second), true},
		{"a silence left in a record of a switchover: the switchover's", Record{Phase: PhaseWaitReady, Decision: d, SidecarGone: d}, d.Add(2 * time.Minute), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := NewGate(p, tt.rec).Deadline()
			if ok != tt.ok || !got.Equal(tt.want) {
				t.Errorf("Deadline = %v %v, want %v %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestGatePersist(t *testing.T) {
	p := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}
	at := time.Unix(1000, 0)
	g := NewGate(p, Record{})
	old := g.Rec
	g.Step(anom(at))
	if g.Persist(old) {
		t.Error("a debounce sample asks to be persisted; it must not (one write per second)")
	}
	g.Step(anom(at))
	old = g.Rec
	g.Step(anom(at))
	if !g.Persist(old) {
		t.Error("the decision is not persisted before acting")
	}
	h := NewGate(contract.Policy{Standby: "b", Redundancy: contract.Hot, Gates: contract.DefaultGates()}, Record{Restore: true})
	old = h.Rec
	h.Step(scaledUp(at))
	if !h.Persist(old) {
		t.Error("a hot standby seen restored is not recorded: a restart would restore it again")
	}
}

func TestGateRetired(t *testing.T) {
	g := NewGate(contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}, Record{Phase: PhaseRetiring, Confirmed: 3})
	at := time.Unix(5000, 0)
	g.Retired(at)
	if g.Rec.Phase != PhaseIdle || !g.Rec.LastSwitch.Equal(at) || g.Rec.Confirmed != 0 {
		t.Errorf("after Retired: %+v", g.Rec)
	}
}

func TestGateRecordsWhatDroveADecisionAndNothingForACrash(t *testing.T) {
	p := contract.Policy{Standby: "b", Redundancy: contract.Cold, Gates: contract.DefaultGates()}
	p.Gates.Debounce = 2
	const why = "memory_percent +1.5"
	explained := func(at time.Time) Input { in := anom(at); in.Why = why; return in }
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name    string
		inputs  []func(time.Time) Input
		wantWhy string
		reason  string // the Event whose message must carry wantWhy
	}{
		{"a confirmed anomaly records the confirming sample's explanation", []func(time.Time) Input{anom, explained}, why, "SwitchoverDecided"},
		{"a sidecar that sends none leaves it empty", []func(time.Time) Input{anom, anom}, "", "SwitchoverDecided"},
		{"a crash is its own cause", []func(time.Time) Input{explained, gone}, "", "Failover"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGate(p, Record{})
			var acts []Action
			for i, in := range tc.inputs {
				acts = g.Step(in(t0.Add(time.Duration(i) * time.Second)))
			}
			if g.Rec.Why != tc.wantWhy {
				t.Errorf("record's why %q, want %q", g.Rec.Why, tc.wantWhy)
			}
			i := slices.IndexFunc(acts, func(a Action) bool { return a.Reason == tc.reason })
			if i < 0 {
				t.Fatalf("no %s Event in %v", tc.reason, summary(acts))
			}
			if has := strings.Contains(acts[i].Message, "driven by"); has != (tc.wantWhy != "") || !strings.Contains(acts[i].Message, tc.wantWhy) {
				t.Errorf("%s message %q, want it to say %q", tc.reason, acts[i].Message, tc.wantWhy)
			}
		})
	}
}
