package soak

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/liveness"
)

// Fault is one step as it ran.
type Fault struct {
	Step Step `json:"step"`
	// Nodes are the nodes the step's roles named when it began.
	Nodes map[Role]string `json:"nodes"`
	Start time.Time       `json:"start"`
	// Back is when every pair was whole again: both brokers Ready in
	// their roles, one primary, every node Ready, the probes' messages
	// flowing (zero: never, and Err says what was last seen).
	Back time.Time `json:"back"`
	Err  string    `json:"error,omitempty"`
	// Healed is when a power cut's or a partition's node was given back
	// (its link up, its rules gone, thawed).
	Healed time.Time `json:"healed,omitzero"`
	// Down and WithDown are how long the container a SidecarKilled or
	// AgentKilled step (or the one within it) killed was away: from the
	// kill until the kubelet had it Ready again (its back-off included).
	Down     time.Duration `json:"down,omitempty"`
	WithDown time.Duration `json:"with_down,omitempty"`
	// Pairs are what the fault was to each pair, in the run's order.
	Pairs []PairPart `json:"pairs"`
}

// PairPart is what a fault was to one pair.
type PairPart struct {
	Namespace string `json:"namespace"`
	// PrimaryNode and StandbyNode are where the pair's brokers ran when
	// the fault began.
	PrimaryNode string `json:"primary_node"`
	StandbyNode string `json:"standby_node,omitempty"`
	// Acts says the fault took the pair's primary away (its broker, or
	// the node it ran on): the pair must fail over. Moved says its primary
	// changed within the fault, whether it had to or the product's rule
	// let it (an agent or a sidecar away too long).
	Acts  bool `json:"acts,omitempty"`
	Moved bool `json:"moved,omitempty"`
	// Failover is the agent's RetirePrimary decision of a pair that acts.
	Failover time.Time `json:"failover,omitzero"`
	// SOT is the pair's probe's longest interval between fresh messages
	// from the fault's Start to Back; Lost the messages sent meanwhile and
	// never received.
	SOT  time.Duration `json:"sot"`
	Lost int           `json:"lost"`
	// ClientsNotBack are the clients of the primary not served by the
	// new one within the wait, after a fault that acts.
	ClientsNotBack []string `json:"clients_not_back,omitempty"`
	// Clients are each client's figures, seconds after Start (-1: not
	// within the wait).
	Clients []nodeloss.ClientCut `json:"clients,omitempty"`
	// State is what a stateful pair's new primary held, after a fault
	// that failed it over (one that acts, or one the product's rule let
	// act: an agent or a sidecar away too long).
	State *StateCheck `json:"state,omitempty"`
}

// part is the fault's part for namespace ns (nil: none).
func (f Fault) part(ns string) *PairPart {
	for i := range f.Pairs {
		if f.Pairs[i].Namespace == ns {
			return &f.Pairs[i]
		}
	}
	return nil
}

// SOT is the longest probe gap of any pair in the fault.
func (f Fault) SOT() time.Duration {
	var m time.Duration
	for _, p := range f.Pairs {
		m = max(m, p.SOT)
	}
	return m
}

// Lost is the probe messages every pair lost in the fault.
func (f Fault) Lost() int {
	n := 0
	for _, p := range f.Pairs {
		n += p.Lost
	}
	return n
}

// Decision is an action an agent decided (its "decision" line).
type Decision struct {
	Time   time.Time `json:"time"`
	Node   string    `json:"node"`
	Action string    `json:"action"`
	// Reason is an Event's (Action "Event"): SwitchoverConfirmed or
	// Failover, said with a RetirePrimary.
	Reason     string `json:"reason,omitempty"`
	Deployment string `json:"deployment"`
	Raw        string `json:"raw"`
}

// Alarm is a broker pod's health turning anomalous (the agent's
// "transition" line).
type Alarm struct {
	Time time.Time `json:"time"`
	Pod  string    `json:"pod"`
	Raw  string    `json:"raw"`
}

// Primaries is how many brokers of one pair were primaries serving at
// once, as the API server said at Time: Deployments of role primary with
// a Ready pod.
type Primaries struct {
	Namespace string    `json:"namespace"`
	Time      time.Time `json:"time"`
	Count     int       `json:"count"`
	Pods      []string  `json:"pods,omitempty"`
}

// AgentUse is what an agent's process held at Time.
type AgentUse struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node"`
	PID     int       `json:"pid"`
	RSS     int64     `json:"rss_bytes"`
	Threads int       `json:"threads"`
	// Goroutines is 0 where the agent's /metrics did not answer.
	Goroutines int `json:"goroutines,omitempty"`
}

// History is everything a run saw: the checker's only input.
type History struct {
	Seed       uint64      `json:"seed"`
	Start, End time.Time   `json:"-"`
	Faults     []Fault     `json:"faults"`
	Decisions  []Decision  `json:"decisions"`
	Alarms     []Alarm     `json:"alarms"`
	Primaries  []Primaries `json:"primaries"`
	AgentUse   []AgentUse  `json:"agent_use"`
	// Leftovers are what the end of the run found left over: pods,
	// Deployments, processes, cgroups, mounts (each a line saying what and
	// where).
	Leftovers []string `json:"leftovers,omitempty"`
	// BrokerPods is how many broker pods ran through the run (for the
	// pod-hours of the detector's false-alarm figure).
	BrokerPods int `json:"broker_pods"`
	// Pairs are the pairs' namespaces and modes, in the run's order.
	Pairs []PairInfo `json:"pairs"`
}

// PairInfo names a pair of the run.
type PairInfo struct {
	Namespace string        `json:"namespace"`
	Mode      contract.Mode `json:"mode"`
	// State says the pair is stateful (StatePair).
	State bool `json:"state,omitempty"`
}

// Bounds are what the checker holds a run to.
type Bounds struct {
	// Back bounds the time from a fault to the pairs whole again, by
	// kind; SOT a pair's probe's longest interval between fresh messages
	// meanwhile, for the pairs it takes a primary from (or, for a fault
	// that takes none, every pair), QuietSOT for the others.
	Back, SOT map[Kind]time.Duration
	QuietSOT  time.Duration
	// Overlapped is added to both when a second fault came within one.
	Overlapped time.Duration
	// TwoPrimaries bounds how long two brokers may be primaries at once.
	TwoPrimaries time.Duration
	// UnfencedHeal bounds, for a node-mode pair whose primary's node a
	// partition cut off, how long after the heal its old primary may
	// still serve: nothing can fence it there (DESIGN.md, "The fence,
	// carried out": left open), so it serves the clients on its side
	// until its kubelet, hearing the API server again, stops it.
	UnfencedHeal time.Duration
	// StateAge bounds how much older than a failover's fault the retained
	// set a stateful pair's new primary serves may be (the snapshot's).
	StateAge time.Duration
	// Settle is how long after a fault that acts its failover's last
	// actions (the old primary scaled back as the standby) still belong to
	// it.
	Settle time.Duration
	// AgentGrowth bounds how much an agent's RSS may grow from its first
	// sample to its last: by Bytes, or by Factor, whichever is larger.
	AgentGrowthBytes  int64
	AgentGrowthFactor float64
	// AgentThreads bounds the growth of an agent's threads likewise, and
	// AgentGoroutines that of its goroutines, by count or by factor.
	AgentThreads          int
	AgentGoroutines       int
	AgentGoroutinesFactor float64
	// AgentAway and SidecarSilent are how long an agent, or a primary's
	// sidecar, may be away before a failover is the product's rule, not a
	// false action: the guard's Lost, and amf.io/sidecar-grace (defaults).
	AgentAway, SidecarSilent time.Duration
}

// DefaultBounds are the lab's: the failover figures DESIGN.md and the
// README give (a crash failed over in ≈ 0.1 s, a lost node in ≈ 3 s, a
// partition, either way, fenced and failed over in ≈ 3 s), with room for the lab's
// slowest runs; a fault that takes nothing away must not be seen by the
// probe at all beyond its ordinary spacing. A killed agent or sidecar may
// take up to the kubelet's back-off (5 min at most) to be back.
func DefaultBounds() Bounds {
	return Bounds{
		Back: map[Kind]time.Duration{
			Crash: 30 * time.Second, OOM: 30 * time.Second, Anomaly: 2 * time.Minute, EtcdRestart: time.Minute, Hang: time.Minute, PowerCut: 3 * time.Minute, Partition: 3 * time.Minute,
			AsymmetricPartition: 3 * time.Minute, StandbyCut: 3 * time.Minute, KubeletRestart: time.Minute, ContainerdRestart: time.Minute,
			AgentKilled: 6 * time.Minute, SidecarKilled: 6 * time.Minute, APIServerRestart: time.Minute, SlowNode: 2 * time.Minute,
		},
		SOT: map[Kind]time.Duration{
			Crash: 2 * time.Second, OOM: 2 * time.Second, Anomaly: 2 * time.Second, EtcdRestart: 2 * time.Second, Hang: 2 * time.Second, SidecarKilled: 2 * time.Second, PowerCut: 8 * time.Second, Partition: 8 * time.Second,
			AsymmetricPartition: 8 * time.Second, StandbyCut: 2 * time.Second, KubeletRestart: 2 * time.Second, ContainerdRestart: 2 * time.Second,
			AgentKilled: 2 * time.Second, APIServerRestart: 2 * time.Second, SlowNode: 2 * time.Second,
		},
		QuietSOT:     2 * time.Second,
		Overlapped:   30 * time.Second,
		TwoPrimaries: 2 * time.Second,
		// The kubelet's connection to the API server comes back at TCP's
		// next retransmission after the heal (its back-off doubles during
		// the cut), then it stops the deleted pod.
		UnfencedHeal: 10 * time.Second,
		// A snapshot every second (the sidecar's --state-snapshot-every),
		// its save, hand-in and relay (≈ 0.1 s measured), with room for
		// the lab's load.
		StateAge:          2 * time.Second,
		Settle:            5 * time.Second,
		AgentGrowthBytes:  16 << 20,
		AgentGrowthFactor: 0.5,
		AgentThreads:      8,
		// A pair's agent runs ≈ 60; each connected sidecar, guard, probe
		// and watch adds a few, which come and go with the faults.
		AgentGoroutines:       40,
		AgentGoroutinesFactor: 0.5,
		AgentAway:             liveness.DefaultTiming.Lost,
		SidecarSilent:         contract.DefaultGates().SidecarGrace,
	}
}

// Violation is a promise the run broke.
type Violation struct {
	Time time.Time `json:"time"`
	What string    `json:"what"`
	// Around are the faults and decisions within a minute of Time.
	Around []string `json:"around,omitempty"`
}

func (v Violation) String() string {
	return fmt.Sprintf("%s %s", v.Time.UTC().Format("15:04:05.000"), v.What)
}

// Check reads h and returns every violation of b, in time order, and the
// decisions that were false actions (a failover or a resize outside every
// fault that acts).
func Check(h History, b Bounds) (vs []Violation, falseActions []Decision) {
	add := func(at time.Time, format string, args ...any) {
		vs = append(vs, Violation{Time: at, What: fmt.Sprintf("seed %d: ", h.Seed) + fmt.Sprintf(format, args...)})
	}
	for _, f := range h.Faults {
		extra := time.Duration(0)
		if f.Step.With != nil {
			extra = b.Overlapped
		}
		switch {
		case f.Back.IsZero():
			add(f.Start, "%s: the run stopped, the fault not made or the pair not whole again: %s", f.Step, f.Err)
		case f.Back.Sub(f.Start) > b.Back[f.Step.Kind]+extra:
			add(f.Back, "%s: the pair whole again after %.1f s (bound %v)", f.Step, f.Back.Sub(f.Start).Seconds(), b.Back[f.Step.Kind]+extra)
		}
		for _, p := range f.Pairs {
			bound := b.SOT[f.Step.Kind] + extra
			if !p.Acts && f.Step.Kind.Acts() {
				bound = b.QuietSOT + extra
			}
			if p.SOT > bound {
				add(f.Start, "%s: %s: the probe's messages stopped for %.2f s (bound %v)", f.Step, p.Namespace, p.SOT.Seconds(), bound)
			}
			if p.Acts && p.Failover.IsZero() && !f.Back.IsZero() {
				add(f.Start, "%s: %s: no failover", f.Step, p.Namespace)
			}
			if !p.Acts && !p.Moved && p.Lost > 0 {
				add(f.Start, "%s: %s: %d of the probe's messages lost by a fault that takes none of its brokers away", f.Step, p.Namespace, p.Lost)
			}
			for _, c := range p.ClientsNotBack {
				add(f.Start, "%s: %s: client %s not served by the new primary", f.Step, p.Namespace, c)
			}
			if p.State != nil {
				// DESIGN.md: the agent of the standby's node restarted
				// during a handover has lost the state its hub held, and
				// says so (StateNotCarried).
				hubLost := f.Step.With != nil && f.Step.With.Kind == AgentKilled && f.Nodes[f.Step.With.On] == p.StandbyNode
				for _, what := range p.State.broken(f.Start, b.StateAge, hubLost) {
					add(f.Start, "%s: %s: the broker state: %s", f.Step, p.Namespace, what)
				}
			}
		}
	}
	for _, d := range h.Decisions {
		if d.Action != "RetirePrimary" && d.Action != "ResizeInPlace" {
			continue
		}
		ns, _, _ := strings.Cut(d.Deployment, "/")
		if !slices.ContainsFunc(h.Faults, func(f Fault) bool { return f.mayAct(ns, b) && f.covers(d.Time, b.Settle) }) {
			falseActions = append(falseActions, d)
			add(d.Time, "a false action: %s of %s by the agent on %s, outside every fault that takes a broker away", d.Action, d.Deployment, d.Node)
		}
	}
	for _, w := range twoPrimaries(h) {
		bound, from := b.TwoPrimaries, w.since
		if !w.unfenced.IsZero() {
			bound, from = b.UnfencedHeal, w.unfenced
		}
		switch {
		case w.until.IsZero() && h.End.Sub(from) > bound:
			add(w.since, "%s: two primaries (%s) from %s to the end", w.ns, strings.Join(w.pods, ", "), stamp(w.since))
		case !w.until.IsZero() && w.until.Sub(from) > bound && w.unfenced.IsZero():
			add(w.since, "%s: two primaries (%s) for %.1f s (bound %v)", w.ns, strings.Join(w.pods, ", "), w.until.Sub(w.since).Seconds(), bound)
		case !w.until.IsZero() && w.until.Sub(from) > bound:
			add(w.since, "%s: two primaries (%s) for %.1f s, %.1f s after the heal of its node-mode primary's partition (bound %v)",
				w.ns, strings.Join(w.pods, ", "), w.until.Sub(w.since).Seconds(), w.until.Sub(from).Seconds(), bound)
		}
	}
	for _, l := range h.Leftovers {
		add(h.End, "left over: %s", l)
	}
	for node, use := range usesByNode(h.AgentUse) {
		first, last := use[0], use[len(use)-1]
		limit := max(b.AgentGrowthBytes, int64(float64(first.RSS)*b.AgentGrowthFactor))
		if last.RSS-first.RSS > limit {
			add(last.Time, "the agent on %s grew from %.1f MiB to %.1f MiB (bound +%.1f MiB)", node, mib(first.RSS), mib(last.RSS), mib(limit))
		}
		if last.Threads-first.Threads > b.AgentThreads {
			add(last.Time, "the agent on %s grew from %d threads to %d (bound +%d)", node, first.Threads, last.Threads, b.AgentThreads)
		}
		if g0, g1, at, ok := goroutineSpan(use); ok {
			if limit := max(b.AgentGoroutines, int(float64(g0)*b.AgentGoroutinesFactor)); g1-g0 > limit {
				add(at, "the agent on %s grew from %d goroutines to %d (bound +%d)", node, g0, g1, limit)
			}
		}
	}
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].Time.Before(vs[j].Time) })
	for i := range vs {
		vs[i].Around = h.around(vs[i].Time, time.Minute)
	}
	return vs, falseActions
}

// overlap is a time two brokers of a pair served as primaries.
type overlap struct {
	ns           string
	pods         []string
	since, until time.Time // until zero: to the end
	// unfenced is, for a node-mode pair whose primary's node a partition
	// began to cut off before since, when that node was healed: until
	// then nothing could stop its old primary (zero otherwise).
	unfenced time.Time
}

// twoPrimaries are the pairs' overlaps, from the samples.
func twoPrimaries(h History) []overlap {
	nodeMode := map[string]bool{}
	for _, p := range h.Pairs {
		nodeMode[p.Namespace] = p.Mode == contract.ModeNode
	}
	var out []overlap
	for ns, samples := range primariesByPair(h.Primaries) {
		var w *overlap
		for _, p := range samples {
			switch {
			case p.Count > 1 && w == nil:
				w = &overlap{ns: ns, pods: p.Pods, since: p.Time}
			case p.Count <= 1 && w != nil:
				w.until = p.Time
				out = append(out, *w)
				w = nil
			}
		}
		if w != nil {
			out = append(out, *w)
		}
	}
	for i := range out {
		if !nodeMode[out[i].ns] {
			continue
		}
		for _, f := range h.Faults {
			p := f.part(out[i].ns)
			cut := f.Step.Kind == Partition || f.Step.Kind == AsymmetricPartition
			if cut && p != nil && p.Acts && !f.Healed.IsZero() && !out[i].since.Before(f.Start) && !out[i].since.After(f.Healed) {
				out[i].unfenced = f.Healed
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].since.Before(out[j].since) })
	return out
}

// mayAct says whether a failover of the pair in namespace ns within the
// fault is no false action: the fault takes its primary away, or it killed
// the agent of its primary's node, or its primary's sidecar, and that
// stayed away for longer than the product's rule allows (the guard's Lost:
// a dead agent is a lost node to its guard; the sidecar grace), as the
// kubelet's back-off holds a container killed again (10 s, doubling).
func (f Fault) mayAct(ns string, b Bounds) bool {
	p := f.part(ns)
	if p == nil {
		return false
	}
	away := func(st *Step, down time.Duration) bool {
		switch {
		case st == nil:
			return false
		case st.Kind == AgentKilled:
			return f.Nodes[st.On] == p.PrimaryNode && down > b.AgentAway
		case st.Kind == SidecarKilled:
			return st.On == PrimaryNode && ns == f.struck() && down > b.SidecarSilent
		}
		return false
	}
	return p.Acts || away(&f.Step, f.Down) || away(f.Step.With, f.WithDown)
}

// struck is the namespace of the pair the step names.
func (f Fault) struck() string {
	if f.Step.Pair < len(f.Pairs) {
		return f.Pairs[f.Step.Pair].Namespace
	}
	return ""
}

// covers says whether t falls within the fault, from its start until
// settle after it was whole again (until the end if it never was).
func (f Fault) covers(t time.Time, settle time.Duration) bool {
	return !t.Before(f.Start) && (f.Back.IsZero() || !t.After(f.Back.Add(settle)))
}

// around lists the faults and decisions within d of t, in time order.
func (h History) around(t time.Time, d time.Duration) []string {
	type line struct {
		at   time.Time
		text string
	}
	var ls []line
	near := func(at time.Time) bool { return at.Sub(t).Abs() <= d }
	for _, f := range h.Faults {
		if near(f.Start) || (!f.Back.IsZero() && near(f.Back)) || f.covers(t, 0) {
			ls = append(ls, line{f.Start, fmt.Sprintf("%s fault: %s on %v", stamp(f.Start), f.Step, f.Nodes)})
			if !f.Back.IsZero() {
				ls = append(ls, line{f.Back, fmt.Sprintf("%s whole again after %s", stamp(f.Back), f.Step.Kind)})
			}
		}
	}
	for _, x := range h.Decisions {
		if near(x.Time) {
			what := x.Action
			if x.Reason != "" {
				what = x.Reason
			}
			ls = append(ls, line{x.Time, fmt.Sprintf("%s the agent on %s: %s %s", stamp(x.Time), x.Node, what, x.Deployment)})
		}
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].at.Before(ls[j].at) })
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.text
	}
	return out
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// primariesByPair groups the samples by pair, each in time order.
func primariesByPair(ps []Primaries) map[string][]Primaries {
	out := map[string][]Primaries{}
	for _, p := range ps {
		out[p.Namespace] = append(out[p.Namespace], p)
	}
	for _, s := range out {
		sort.SliceStable(s, func(i, j int) bool { return s[i].Time.Before(s[j].Time) })
	}
	return out
}

// usesByNode groups the samples by node, each in time order.
func usesByNode(us []AgentUse) map[string][]AgentUse {
	out := map[string][]AgentUse{}
	for _, u := range us {
		out[u.Node] = append(out[u.Node], u)
	}
	for _, s := range out {
		sort.SliceStable(s, func(i, j int) bool { return s[i].Time.Before(s[j].Time) })
	}
	return out
}

// goroutineSpan is the first and the last goroutine count of a node's
// samples that have one.
func goroutineSpan(use []AgentUse) (first, last int, at time.Time, ok bool) {
	for _, u := range use {
		if u.Goroutines == 0 {
			continue
		}
		if !ok {
			first, ok = u.Goroutines, true
		}
		last, at = u.Goroutines, u.Time
	}
	return first, last, at, ok
}

// Report is the run's figures; its JSON is the soak's last line.
type Report struct {
	DurationS    float64          `json:"duration_s"`
	Seed         uint64           `json:"seed"`
	Pairs        []PairInfo       `json:"pairs"`
	Faults       map[Kind]int     `json:"faults"`
	Overlapped   int              `json:"overlapped"`
	Violations   int              `json:"violations"`
	FalseActions int              `json:"false_actions"`
	SOTP99       map[Kind]float64 `json:"sot_p99_s"`
	BackP99      map[Kind]float64 `json:"back_p99_s"`
	// ClientP99 is, per kind of fault that takes the primary away, the
	// p99 over its clients of the time until the new primary served each
	// (one not served counts as the wait: ClientsNotBack).
	ClientP99      map[Kind]float64 `json:"client_sot_p99_s"`
	ClientsNotBack int              `json:"clients_not_back"`
	// Retirements counts the primaries retired by reason: a switchover
	// completed (SwitchoverConfirmed) or a failover (Failover).
	Retirements map[string]int `json:"retirements"`
	Lost        map[Kind]int   `json:"lost"`
	// AgentRSS is the largest agent's RSS in its first and last samples.
	AgentRSSStart float64 `json:"agent_rss_mib_start"`
	AgentRSSEnd   float64 `json:"agent_rss_mib_end"`
	// AgentGoroutines likewise: the most goroutines of an agent at its
	// first and last samples that read them.
	AgentGoroutinesStart int `json:"agent_goroutines_start"`
	AgentGoroutinesEnd   int `json:"agent_goroutines_end"`
	// PodHours are the healthy brokers' hours in the run and FalseAlarms
	// their health turning anomalous with no fault to cause it: the
	// detector's false-alarm figure (its goal ≤ 1 per pod-day).
	PodHours    float64 `json:"pod_hours"`
	FalseAlarms int     `json:"false_alarms"`
	// StateHandovers counts a stateful pair's handovers after faults that
	// took its primary away, by how the state went (final, snapshot, not
	// carried); StateLost what of its plan the new primaries did not hold
	// (retained, sessions, qos1) and delivered twice (duplicates);
	// StateRetainedAgeMax the oldest retained set a failover left, by the
	// clock, seconds before its fault.
	// UnfencedTwoPrimaries is how long, in all, node-mode pairs had two
	// primaries while a partition cut their old one off and until its
	// kubelet stopped it after the heal: node mode has no fence
	// (Bounds.UnfencedHeal), and this is what that costs.
	UnfencedTwoPrimaries float64        `json:"unfenced_two_primaries_s"`
	StateHandovers       map[string]int `json:"state_handovers,omitempty"`
	StateLost            map[string]int `json:"state_lost,omitempty"`
	StateRetainedAgeMax  float64        `json:"state_retained_age_max_s,omitempty"`
}

// Figures sums h up; wait is what a client not served counts as.
func Figures(h History, vs []Violation, falseActions []Decision, wait time.Duration) Report {
	r := Report{DurationS: h.End.Sub(h.Start).Seconds(), Seed: h.Seed, Faults: map[Kind]int{},
		SOTP99: map[Kind]float64{}, BackP99: map[Kind]float64{}, Lost: map[Kind]int{}, ClientP99: map[Kind]float64{},
		Violations: len(vs), FalseActions: len(falseActions), Pairs: h.Pairs, Retirements: map[string]int{}}
	for _, d := range h.Decisions {
		if d.Action == "Event" {
			r.Retirements[d.Reason]++
		}
	}
	sots, backs, clients := map[Kind][]float64{}, map[Kind][]float64{}, map[Kind][]float64{}
	for _, f := range h.Faults {
		k := f.Step.Kind
		r.Faults[k]++
		if f.Step.With != nil {
			r.Overlapped++
			r.Faults[f.Step.With.Kind]++
		}
		r.Lost[k] += f.Lost()
		sots[k] = append(sots[k], f.SOT().Seconds())
		for _, p := range f.Pairs {
			if c := p.State; c != nil {
				if r.StateHandovers == nil {
					r.StateHandovers, r.StateLost = map[string]int{}, map[string]int{"retained": 0, "sessions": 0, "qos1": 0, "duplicates": 0}
				}
				r.StateHandovers[c.Handover]++
				r.StateLost["retained"] += c.RetainedLost
				r.StateLost["sessions"] += c.SessionsLost
				r.StateLost["qos1"] += c.QoS1Lost
				r.StateLost["duplicates"] += c.Duplicates
				if c.Handover == "snapshot" && !c.Clock.IsZero() {
					r.StateRetainedAgeMax = max(r.StateRetainedAgeMax, c.RetainedAge(f.Start).Seconds())
				}
			}
			for _, c := range p.Clients {
				clients[k] = append(clients[k], c.Figure(wait))
				if c.ServedS < 0 {
					r.ClientsNotBack++
				}
			}
		}
		if !f.Back.IsZero() {
			backs[k] = append(backs[k], f.Back.Sub(f.Start).Seconds())
		}
	}
	for k, xs := range sots {
		r.SOTP99[k] = nodeloss.Quantile(xs, 0.99)
	}
	for k, xs := range backs {
		r.BackP99[k] = nodeloss.Quantile(xs, 0.99)
	}
	for k, xs := range clients {
		r.ClientP99[k] = nodeloss.Quantile(xs, 0.99)
	}
	for _, use := range usesByNode(h.AgentUse) {
		r.AgentRSSStart = max(r.AgentRSSStart, mib(use[0].RSS))
		r.AgentRSSEnd = max(r.AgentRSSEnd, mib(use[len(use)-1].RSS))
		if g0, g1, _, ok := goroutineSpan(use); ok {
			r.AgentGoroutinesStart, r.AgentGoroutinesEnd = max(r.AgentGoroutinesStart, g0), max(r.AgentGoroutinesEnd, g1)
		}
	}
	for _, w := range twoPrimaries(h) {
		if !w.unfenced.IsZero() {
			r.UnfencedTwoPrimaries += cmp.Or(w.until, h.End).Sub(w.since).Seconds()
		}
	}
	r.PodHours = float64(h.BrokerPods) * h.End.Sub(h.Start).Hours()
	settle := DefaultBounds().Settle
	for _, a := range h.Alarms {
		if !slices.ContainsFunc(h.Faults, func(f Fault) bool { return f.covers(a.Time, settle) }) {
			r.FalseAlarms++
		}
	}
	return r
}
