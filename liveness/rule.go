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
//   - Fencer, on the node that may be cut off: its agent fences (retires
//     locally) the primaries of a guard once for Timing.Fence it has neither
//     renewed its Lease nor had that guard vouch for it (a guard vouches while
//     it sees the node: Sights, Timing.Vouch). Timing.Lost exceeds
//     Timing.Fence by a margin (Validate), so a cut-off node has fenced
//     before any guard declares it lost: the failover waits for the fence.
//
// Times compared are always on one machine's clock: a guard compares the
// arrivals of events at itself, a fencer the send times of its own requests.
// Package liveness does not import client-go's clientset or informers:
// Heartbeat and RunGuard are a Lease update and a label-selected
// list+watch, made through Cluster, its part of the agent's one seam to the
// API server (package cluster), whose fake (clusterfake) its tests use.
package liveness

import (
	"fmt"
	"slices"
	"sort"
	"sync"
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
	_, back := g.heartbeat(node, renew, now)
	return back
}

// heartbeat is Observe, also saying whether the event was a heartbeat.
func (g *Guard) heartbeat(node string, renew, now time.Time) (beat, back bool) {
	if node == g.self {
		if !g.Fresh(now) {
			g.freshSince = now
		}
		g.own = now
		return true, false
	}
	n, ok := g.nodes[node]
	if !ok || renew.Equal(n.renew) {
		return false, false
	}
	n.renew, n.seen = renew, now
	back = n.lost
	n.lost = false
	return true, back
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

// Fencer decides, on an agent, when to fence its own primaries: those of
// each guard that has stopped vouching for it (Silent), since each guard
// takes over only the primaries whose standby runs on its node.
type Fencer struct {
	t       Timing
	renewed time.Time // send time of the latest renewal that succeeded
	// reached is, by guard, the send time of the latest probe it answered
	// vouching for this agent; since is when Silent first asked about a
	// guard (a full Fence from then).
	reached, since map[string]time.Time
	fenced         map[string]bool // guards fenced for since the latest renewal
}

// NewFencer returns a fencer whose clock starts at now (a fresh agent has a
// full Fence before it can fence).
func NewFencer(t Timing, now time.Time) (*Fencer, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &Fencer{t: t, renewed: now, reached: map[string]time.Time{}, since: map[string]time.Time{}, fenced: map[string]bool{}}, nil
}

// Renewed records a renewal sent at sent that succeeded.
func (f *Fencer) Renewed(sent time.Time) {
	if sent.After(f.renewed) {
		f.renewed = sent
	}
	clear(f.fenced)
}

// Vouched records a probe sent at sent that guard answered vouching for
// this agent: the guard sees it (its heartbeats or its answers), so will
// not declare its node lost yet.
func (f *Fencer) Vouched(guard string, sent time.Time) {
	if sent.After(f.reached[guard]) {
		f.reached[guard] = sent
	}
}

// Silent returns, of guards, those that this agent must fence for now,
// each once until a renewal succeeds: for Timing.Fence it has neither
// renewed its Lease nor had that guard vouch for it. Any other guard
// vouching does not help: it takes over none of these primaries.
func (f *Fencer) Silent(now time.Time, guards []string) []string {
	var out []string
	for _, g := range guards {
		if _, ok := f.since[g]; !ok {
			f.since[g] = now
		}
		last := f.reached[g]
		if f.since[g].After(last) {
			last = f.since[g]
		}
		if !f.fenced[g] && now.Sub(f.renewed) >= f.t.Fence && now.Sub(last) >= f.t.Fence {
			f.fenced[g] = true
			out = append(out, g)
		}
	}
	return out
}

// Vouch is how long a guard vouches for a guarded node's agent after it
// last saw it (a heartbeat, an answer): Lost − Fence − Period/2, so that an
// agent its guard can no longer see stops being vouched for early enough to
// fence before that guard declares it lost (a check's fifth of a period
// and the fence's own action fit in the half period left). With the
// defaults 750 ms: more than the period between two sights, so a guard
// that sees the agent vouches for it without a gap.
func (t Timing) Vouch() time.Duration { return t.Lost - t.Fence - t.Period/2 }

// Sights are when a guard last saw each guarded node's agent (a heartbeat
// through its watch, an answer to its probe): what the guard vouches by
// when that agent probes it, naming its node. Safe for concurrent use: the
// guard records, the probe server reads.
type Sights struct {
	mu   sync.Mutex
	last map[string]time.Time // by node
}

// NewSights returns an empty record.
func NewSights() *Sights { return &Sights{last: map[string]time.Time{}} }

// Saw records a sight of node's agent at at.
func (s *Sights) Saw(node string, at time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	if at.After(s.last[node]) {
		s.last[node] = at
	}
	s.mu.Unlock()
}

// Keep forgets every node but those given (the guarded nodes now), and
// starts each new one as seen at now: a guard vouches for a node it has
// just begun to guard for a full Vouch.
func (s *Sights) Keep(nodes []string, now time.Time) {
	s.mu.Lock()
	for n := range s.last {
		if !slices.Contains(nodes, n) {
			delete(s.last, n)
		}
	}
	for _, n := range nodes {
		if _, ok := s.last[n]; !ok {
			s.last[n] = now
		}
	}
	s.mu.Unlock()
}

// Vouches says whether the guard vouches, at now, for the agent of node:
// seen within within, or not a node it guards (it makes no claim on those,
// and takes none of their primaries over).
func (s *Sights) Vouches(node string, now time.Time, within time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.last[node]
	return !ok || now.Sub(last) <= within
}
