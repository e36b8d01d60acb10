// Package liveness tells a lost node from a slow or merely cut-off one, for
// the agents (DESIGN.md, "Losing a whole node"). Every agent heartbeats a
// Lease of its own (Heartbeat); an agent that guards primaries running on
// other nodes watches only those nodes' Leases and its own (Watch), so the
// API server's cost grows with the nodes, not with their square.
//
// The decisions are pure and take the time as an argument, like actuate's
// Gate:
//
//   - Guard, on the agent that would take over: a guarded node is lost when
//     the guard's own heartbeats keep arriving through the same watch while
//     the node's have not for Timing.Lost, and the guard cannot reach the
//     node's agent directly either. Its own heartbeats are the proof that its
//     view is current: with the API server unreachable (or the watch stuck)
//     they stop too, and nothing is declared on stale data; once they come
//     back, every guarded node gets a full Lost again (its renewals failed
//     too while the API server was away).
//   - Fencer, on the node that may be cut off: its agent fences (retires its
//     own primaries locally) once for Timing.Fence it has neither renewed its
//     Lease nor reached any of its guards. Timing.Lost exceeds Timing.Fence by
//     a margin (Validate), so a cut-off node has fenced before any guard
//     declares it lost: the failover waits for the fence.
//
// Times compared are always on one machine's clock: a guard compares the
// arrivals of events at itself, a fencer the send times of its own requests.
// Package liveness does not import client-go's informers: Heartbeat and Watch
// are a Lease update and a label-selected watch.
package liveness

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Timing is the heartbeat's and the decisions' timing.
type Timing struct {
	// Period is how often an agent renews its Lease and probes its peers.
	Period time.Duration
	// Fence is how long an agent that renews nothing and reaches no guard
	// waits before it fences its own primaries.
	Fence time.Duration
	// Lost is how long a guarded node's heartbeats must be missing (counted on
	// the guard's own heartbeats seen meanwhile) before it is lost.
	Lost time.Duration
}

// DefaultTiming: a renewal every 500 ms, fenced after 1.5 s, lost after 2.5 s.
var DefaultTiming = Timing{Period: 500 * time.Millisecond, Fence: 1500 * time.Millisecond, Lost: 2500 * time.Millisecond}

// Validate says whether the timing is safe: a node cut off from the API
// server and its guards fences before a guard can declare it lost, with a
// period of margin for the fence itself and for the probes' phase.
func (t Timing) Validate() error {
	if t.Period <= 0 || t.Fence <= 0 || t.Lost <= 0 {
		return fmt.Errorf("liveness: period %v, fence %v and lost %v must all be positive", t.Period, t.Fence, t.Lost)
	}
	if t.Fence < 2*t.Period {
		return fmt.Errorf("liveness: fence %v is under two periods (%v): one late renewal would fence a working node", t.Fence, 2*t.Period)
	}
	if t.Lost < t.Fence+t.Period {
		return fmt.Errorf("liveness: lost %v must be at least fence %v + one period %v, or a guard may take over before a cut-off node has fenced", t.Lost, t.Fence, t.Period)
	}
	return nil
}

// Guard decides, on a guarding agent, which guarded nodes are lost.
type Guard struct {
	t    Timing
	self string
	// own is when the guard's own latest renewal arrived through the watch;
	// freshSince when its view became current again after a stale spell
	// (no guarded node's silence counts from before then: its renewals
	// failed too while the API server was away).
	own, freshSince time.Time
	// nodes are the guarded nodes.
	nodes map[string]*guarded
}

type guarded struct {
	renew   time.Time // the latest renewTime seen (a change is a heartbeat)
	seen    time.Time // when it arrived here
	reached time.Time // the latest direct contact with its agent
	lost    bool
}

// NewGuard returns the guard of agent self.
func NewGuard(t Timing, self string) (*Guard, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &Guard{t: t, self: self, nodes: map[string]*guarded{}}, nil
}

// Watch starts guarding node at now: it gets a full Lost from now before it
// can be declared lost.
func (g *Guard) Watch(node string, now time.Time) {
	if node == g.self {
		return
	}
	if _, ok := g.nodes[node]; !ok {
		g.nodes[node] = &guarded{seen: now}
	}
}

// Unwatch stops guarding node.
func (g *Guard) Unwatch(node string) { delete(g.nodes, node) }

// Observe takes a Lease's renewTime as the watch delivered it at now. An
// event whose renewTime did not change (a label edit, a resync) is no
// heartbeat. It returns true if a lost node is back.
func (g *Guard) Observe(node string, renew, now time.Time) bool {
	if node == g.self {
		if !g.Fresh(now) {
			g.freshSince = now
		}
		g.own = now
		return false
	}
	n, ok := g.nodes[node]
	if !ok || renew.Equal(n.renew) {
		return false
	}
	n.renew, n.seen = renew, now
	back := n.lost
	n.lost = false
	return back
}

// Reached records a direct contact with node's agent at now (a probe over
// the LAN that it answered).
func (g *Guard) Reached(node string, now time.Time) {
	if n, ok := g.nodes[node]; ok {
		n.reached = now
	}
}

// Fresh says whether the guard's view is current at now: its own latest
// heartbeat came back through the watch within two periods.
func (g *Guard) Fresh(now time.Time) bool {
	return !g.own.IsZero() && now.Sub(g.own) <= 2*g.t.Period
}

// Lost returns the guarded nodes newly lost at now, sorted. None while the
// guard's own view is stale.
func (g *Guard) Lost(now time.Time) []string {
	if !g.Fresh(now) {
		return nil
	}
	var lost []string
	for name, n := range g.nodes {
		if n.lost {
			continue
		}
		last := n.seen
		for _, t := range []time.Time{n.reached, g.freshSince} {
			if t.After(last) {
				last = t
			}
		}
		if g.own.Sub(last) >= g.t.Lost {
			n.lost = true
			lost = append(lost, name)
		}
	}
	sort.Strings(lost)
	return lost
}

// Fencer decides, on an agent, when to fence its own primaries.
type Fencer struct {
	t       Timing
	renewed time.Time // send time of the latest renewal that succeeded
	reached time.Time // send time of the latest probe a guard answered
	fenced  bool
}

// NewFencer returns a fencer whose clock starts at now (a fresh agent has a
// full Fence before it can fence).
func NewFencer(t Timing, now time.Time) (*Fencer, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &Fencer{t: t, renewed: now, reached: now}, nil
}

// Renewed records a renewal sent at sent that succeeded.
func (f *Fencer) Renewed(sent time.Time) {
	if sent.After(f.renewed) {
		f.renewed = sent
	}
	f.fenced = false
}

// ReachedGuard records a probe sent at sent that one of the agent's guards
// answered.
func (f *Fencer) ReachedGuard(sent time.Time) {
	if sent.After(f.reached) {
		f.reached = sent
	}
}

// ErrFence says the agent must fence its primaries now.
var ErrFence = errors.New("liveness: cut off from the API server and every guard: fence the primaries")

// Check returns ErrFence once, at the first now at which for Timing.Fence
// neither a renewal nor a guard's answer has come; nil otherwise. After a
// successful renewal it can fence again.
func (f *Fencer) Check(now time.Time) error {
	if f.fenced {
		return nil
	}
	if now.Sub(f.renewed) >= f.t.Fence && now.Sub(f.reached) >= f.t.Fence {
		f.fenced = true
		return ErrFence
	}
	return nil
}
