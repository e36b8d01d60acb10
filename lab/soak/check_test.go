package soak

import (
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/nodeloss"
)

var t0 = time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// Two pairs, as a run has them: "mqtt" with its primary on n0, "mqtt-1"
// with its primary on n1.
func parts() []PairPart {
	return []PairPart{{Namespace: "mqtt", PrimaryNode: "n0"}, {Namespace: "mqtt-1", PrimaryNode: "n1"}}
}

// crashAt is a crash of pair 0's broker at s seconds, failed over 0.1 s
// later, whole 5 s later.
func crashAt(s float64) Fault {
	f := Fault{Step: Step{Kind: Crash, On: PrimaryNode}, Nodes: map[Role]string{PrimaryNode: "n0"}, Start: at(s), Back: at(s + 5), Pairs: parts()}
	f.Pairs[0].Acts, f.Pairs[0].Failover, f.Pairs[0].SOT = true, at(s+0.1), 300*time.Millisecond
	return f
}

// quietAt is a fault of kind k on pair 0's node role at s seconds, whole
// after 10 s, down for (a killed container).
func quietAt(k Kind, role Role, s float64, down time.Duration) Fault {
	node := map[Role]string{PrimaryNode: "n0", StandbyNode: "n1", ThirdNode: "n2"}[role]
	return Fault{Step: Step{Kind: k, On: role}, Nodes: map[Role]string{role: node}, Start: at(s), Back: at(s + 10), Down: down, Pairs: parts()}
}

func retire(s float64, dep string) Decision {
	return Decision{Time: at(s), Node: "n1", Action: "RetirePrimary", Deployment: dep}
}

func TestCheckerFindsWhatARunBroke(t *testing.T) {
	quiet := quietAt(KubeletRestart, StandbyNode, 100, 0)
	a := "mqtt/edge-broker-a"
	for _, tc := range []struct {
		name string
		h    History
		want []string // a substring of each violation, in time order
	}{
		{name: "a clean run", h: History{Faults: []Fault{crashAt(10), quiet},
			Decisions: []Decision{retire(10.1, a), {Time: at(12), Action: "ScaleStandby"}},
			Primaries: []Primaries{{Namespace: "mqtt", Time: at(10.1), Count: 2}, {Namespace: "mqtt", Time: at(10.5), Count: 1}}}},
		{name: "a failover outside every fault", h: History{Faults: []Fault{crashAt(10), quiet}, Decisions: []Decision{retire(10.1, a), retire(105, a)}},
			want: []string{"a false action: RetirePrimary of mqtt/edge-broker-a"}},
		{name: "a failover of the pair a crash left alone", h: History{Faults: []Fault{crashAt(10)}, Decisions: []Decision{retire(10.1, a), retire(10.2, "mqtt-1/edge-broker-a")}},
			want: []string{"a false action: RetirePrimary of mqtt-1/edge-broker-a"}},
		{name: "a power cut fails over every pair whose primary ran there", h: History{Faults: []Fault{func() Fault {
			f := quietAt(PowerCut, PrimaryNode, 10, 0)
			f.Pairs[0].Acts, f.Pairs[0].Failover, f.Pairs[1].PrimaryNode = true, at(13), "n0"
			f.Pairs[1].Acts, f.Pairs[1].Failover = true, at(13.1)
			return f
		}()}, Decisions: []Decision{retire(13, a), retire(13.1, "mqtt-1/edge-broker-a")}}},
		{name: "a pair a power cut took its primary from never failed over", h: History{Faults: []Fault{func() Fault {
			f := quietAt(PowerCut, PrimaryNode, 10, 0)
			f.Pairs[0].Acts, f.Pairs[0].Failover = true, at(13)
			f.Pairs[1].Acts = true
			return f
		}()}, Decisions: []Decision{retire(13, a)}},
			want: []string{"mqtt-1: no failover"}},
		{name: "a failover while a killed agent was away longer than its guard waits is no false action", h: History{Faults: []Fault{quietAt(AgentKilled, PrimaryNode, 100, 10*time.Second)},
			Decisions: []Decision{retire(108, a)}}},
		{name: "a failover of a pair whose primary was not on the killed agent's node is a false action", h: History{Faults: []Fault{quietAt(AgentKilled, PrimaryNode, 100, 10*time.Second)},
			Decisions: []Decision{retire(108, "mqtt-1/edge-broker-a")}}, want: []string{"a false action"}},
		{name: "a failover after an agent back within its guard's wait is a false action", h: History{Faults: []Fault{quietAt(AgentKilled, PrimaryNode, 100, time.Second)},
			Decisions: []Decision{retire(102, a)}}, want: []string{"a false action"}},
		{name: "a failover while a killed sidecar was silent beyond its grace is no false action", h: History{Faults: []Fault{quietAt(SidecarKilled, PrimaryNode, 100, 10*time.Second)},
			Decisions: []Decision{retire(106, a)}}},
		{name: "a failover after a sidecar back within its grace is a false action", h: History{Faults: []Fault{quietAt(SidecarKilled, PrimaryNode, 100, 2*time.Second)},
			Decisions: []Decision{retire(103, a)}}, want: []string{"a false action"}},
		{name: "a failover within a crash and an agent killed within it is no false action", h: History{Faults: []Fault{func() Fault {
			f := crashAt(100)
			f.Step.With, f.Back, f.WithDown = &Step{Kind: AgentKilled, On: StandbyNode}, at(120), 10*time.Second
			f.Nodes[StandbyNode] = "n1"
			return f
		}()}, Decisions: []Decision{retire(100.1, a), retire(110, "mqtt-1/edge-broker-a")}}},
		{name: "a failover just after a fault's settle", h: History{Faults: []Fault{crashAt(10)}, Decisions: []Decision{retire(10.1, a), retire(20.1, a)}},
			want: []string{"a false action"}},
		{name: "a crash never failed over", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.Pairs[0].Failover = time.Time{}; return f }()}},
			want: []string{"crash on pair 0's primary's node: mqtt: no failover"}},
		{name: "a pair never whole again", h: History{Faults: []Fault{{Step: Step{Kind: PowerCut}, Start: at(10), Err: "standby not Ready"}}},
			want: []string{"the pair not whole again: standby not Ready"}},
		{name: "too slow back", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.Back = at(50); return f }()}},
			want: []string{"whole again after 40.0 s"}},
		{name: "an overlap gives more time", h: History{Faults: []Fault{func() Fault {
			f := crashAt(10)
			f.Back, f.Step.With = at(50), &Step{Kind: KubeletRestart}
			return f
		}()}}},
		{name: "the probe stopped", h: History{Faults: []Fault{func() Fault { f := quietAt(SlowNode, ThirdNode, 10, 0); f.Pairs[1].SOT = 5 * time.Second; return f }()}},
			want: []string{"mqtt-1: the probe's messages stopped for 5.00 s"}},
		{name: "the probe of a pair a crash left alone stopped", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.Pairs[1].SOT = 3 * time.Second; return f }()}},
			want: []string{"mqtt-1: the probe's messages stopped for 3.00 s (bound 2s)"}},
		{name: "messages lost in a quiet fault", h: History{Faults: []Fault{func() Fault { f := quietAt(AgentKilled, ThirdNode, 10, time.Second); f.Pairs[0].Lost = 3; return f }()}},
			want: []string{"3 of the probe's messages lost"}},
		{name: "messages lost in a failover the product's rule let a quiet fault make are counted, not a violation", h: History{Faults: []Fault{func() Fault {
			f := quietAt(AgentKilled, PrimaryNode, 100, 10*time.Second)
			f.Pairs[0].Moved, f.Pairs[0].Lost = true, 8
			return f
		}()}, Decisions: []Decision{retire(108, a)}}},
		{name: "messages lost in a failover are counted, not a violation", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.Pairs[0].Lost = 3; return f }()}}},
		{name: "messages lost by the pair a crash left alone", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.Pairs[1].Lost = 2; return f }()}},
			want: []string{"mqtt-1: 2 of the probe's messages lost"}},
		{name: "two primaries too long", h: History{Primaries: []Primaries{{Namespace: "mqtt", Time: at(1), Count: 2, Pods: []string{"a", "b"}}, {Namespace: "mqtt", Time: at(2), Count: 2}, {Namespace: "mqtt", Time: at(4), Count: 1}}},
			want: []string{"mqtt: two primaries (a, b) for 3.0 s"}},
		{name: "a node-mode pair's old primary serving on its partitioned node until just after the heal", h: unfencedRun(contract.ModeNode, 1.5)},
		{name: "a node-mode pair's old primary serving long after the heal", h: unfencedRun(contract.ModeNode, 12),
			want: []string{"mqtt-1: two primaries (a, b) for 18.0 s, 12.0 s after the heal of its node-mode primary's partition (bound 10s)"}},
		{name: "a sidecar pair's partitioned primary is fenced: no such excuse", h: unfencedRun(contract.ModeSidecar, 1.5),
			want: []string{"mqtt-1: two primaries (a, b) for 7.5 s (bound 2s)"}},
		{name: "one primary in each of two pairs", h: History{Primaries: []Primaries{{Namespace: "mqtt", Time: at(1), Count: 1}, {Namespace: "mqtt-1", Time: at(1), Count: 1}, {Namespace: "mqtt", Time: at(4), Count: 1}, {Namespace: "mqtt-1", Time: at(4), Count: 1}}}},
		{name: "two primaries to the end", h: History{End: at(60), Primaries: []Primaries{{Namespace: "mqtt", Time: at(1), Count: 2, Pods: []string{"a", "b"}}}},
			want: []string{"two primaries (a, b) from"}},
		{name: "leftovers", h: History{End: at(60), Leftovers: []string{"pod mqtt/x Terminating"}},
			want: []string{"left over: pod mqtt/x Terminating"}},
		{name: "an agent that grew", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Threads: 10}, {Time: at(600), Node: "n0", RSS: 70 << 20, Threads: 30}}},
			want: []string{"grew from 40.0 MiB to 70.0 MiB", "grew from 10 threads to 30"}},
		{name: "an agent that stayed", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Threads: 10}, {Time: at(600), Node: "n0", RSS: 50 << 20, Threads: 12}}}},
		{name: "an agent whose goroutines grew", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Goroutines: 60}, {Time: at(300), Node: "n0", RSS: 40 << 20}, {Time: at(600), Node: "n0", RSS: 40 << 20, Goroutines: 160}}},
			want: []string{"grew from 60 goroutines to 160"}},
		{name: "an agent whose goroutines came and went", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Goroutines: 60}, {Time: at(300), Node: "n0", RSS: 40 << 20, Goroutines: 200}, {Time: at(600), Node: "n0", RSS: 40 << 20, Goroutines: 90}}}},
		{name: "a client not back", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.Pairs[0].ClientsNotBack = []string{"in-pod-n2-30s"}; return f }()}},
			want: []string{"client in-pod-n2-30s not served"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.h.Seed = 42
			vs, _ := Check(tc.h, DefaultBounds())
			if len(vs) != len(tc.want) {
				t.Fatalf("%d violations, want %d: %v", len(vs), len(tc.want), vs)
			}
			for i, w := range tc.want {
				if !strings.Contains(vs[i].What, w) || !strings.Contains(vs[i].What, "seed 42") {
					t.Errorf("violation %d = %q, want %q and the seed", i, vs[i].What, w)
				}
			}
		})
	}
}

// unfencedRun is a partition of pair 1's primary's node (mqtt-1, of
// mode m) at 10 s, its new primary serving from 14 s, the node healed at
// 20 s, and the old primary serving until afterHeal seconds after that.
func unfencedRun(m contract.Mode, afterHeal float64) History {
	f := quietAt(Partition, PrimaryNode, 10, 0)
	f.Nodes[PrimaryNode], f.Pairs[1].Acts, f.Pairs[1].Failover, f.Healed, f.Back = "n1", true, at(13), at(20), at(40)
	return History{Faults: []Fault{f}, Decisions: []Decision{retire(13, "mqtt-1/edge-broker-a")},
		Pairs:     []PairInfo{{Namespace: "mqtt", Mode: contract.ModeSidecar}, {Namespace: "mqtt-1", Mode: m}},
		Primaries: []Primaries{{Namespace: "mqtt-1", Time: at(14), Count: 2, Pods: []string{"a", "b"}}, {Namespace: "mqtt-1", Time: at(20 + afterHeal), Count: 1}}}
}

func TestAViolationSaysWhatCameAroundIt(t *testing.T) {
	h := History{Seed: 9, Faults: []Fault{crashAt(10)},
		Decisions: []Decision{{Time: at(10.1), Node: "n0", Action: "RetirePrimary", Deployment: "mqtt/a"}, {Time: at(40), Node: "n1", Action: "RetirePrimary", Deployment: "mqtt/b"}}}
	vs, fa := Check(h, DefaultBounds())
	if len(vs) != 1 || len(fa) != 1 {
		t.Fatalf("violations %v, false actions %v", vs, fa)
	}
	around := strings.Join(vs[0].Around, "\n")
	for _, w := range []string{"fault: crash", "whole again after crash", "the agent on n0: RetirePrimary mqtt/a", "the agent on n1: RetirePrimary mqtt/b"} {
		if !strings.Contains(around, w) {
			t.Errorf("around lacks %q:\n%s", w, around)
		}
	}
}

func TestFiguresSumTheRunUp(t *testing.T) {
	h := History{Seed: 1, Start: at(0), End: at(3600), BrokerPods: 4, Pairs: []PairInfo{{Namespace: "mqtt", Mode: "sidecar"}, {Namespace: "mqtt-1", Mode: "node"}},
		Faults: []Fault{crashAt(10), func() Fault {
			f := crashAt(100)
			f.Pairs[0].Lost, f.Pairs[1].Lost = 4, 1
			f.Pairs[1].SOT = time.Second
			f.Step.With = &Step{Kind: APIServerRestart}
			f.Pairs[0].Clients = []nodeloss.ClientCut{{Client: "a", ServedS: 0.5}, {Client: "b", ServedS: -1}}
			return f
		}()},
		Decisions: []Decision{{Time: at(10.1), Action: "RetirePrimary", Deployment: "mqtt/edge-broker-a"}, {Time: at(10.1), Action: "Event", Reason: "Failover", Deployment: "mqtt/edge-broker-a"},
			{Time: at(100.1), Action: "RetirePrimary", Deployment: "mqtt/edge-broker-a"}, {Time: at(100.1), Action: "Event", Reason: "Failover", Deployment: "mqtt/edge-broker-a"}},
		Alarms: []Alarm{{Time: at(10.5)}, {Time: at(1000)}},
		AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 30 << 20, Goroutines: 50}, {Time: at(3500), Node: "n0", RSS: 32 << 20, Goroutines: 55},
			{Time: at(1), Node: "n1", RSS: 31 << 20}, {Time: at(3500), Node: "n1", RSS: 31 << 20}}}
	vs, fa := Check(h, DefaultBounds())
	r := Figures(h, vs, fa, 2*time.Minute)
	if r.DurationS != 3600 || r.Faults[Crash] != 2 || r.Faults[APIServerRestart] != 1 || r.Overlapped != 1 || r.Lost[Crash] != 5 || len(r.Pairs) != 2 {
		t.Errorf("figures %+v", r)
	}
	if r.SOTP99[Crash] != 1 || r.BackP99[Crash] != 5 || r.ClientP99[Crash] != 120 || r.ClientsNotBack != 1 {
		t.Errorf("p99: sot %v, back %v, clients %v (%d not back)", r.SOTP99, r.BackP99, r.ClientP99, r.ClientsNotBack)
	}
	if r.AgentRSSStart != 31 || r.AgentRSSEnd != 32 || r.AgentGoroutinesStart != 50 || r.AgentGoroutinesEnd != 55 {
		t.Errorf("agent rss %v -> %v, goroutines %d -> %d", r.AgentRSSStart, r.AgentRSSEnd, r.AgentGoroutinesStart, r.AgentGoroutinesEnd)
	}
	if r.Retirements["Failover"] != 2 || len(r.Retirements) != 1 || r.FalseActions != 0 {
		t.Errorf("retirements %v, false actions %d", r.Retirements, r.FalseActions)
	}
	if r.PodHours != 4 || r.FalseAlarms != 1 {
		t.Errorf("pod-hours %v, false alarms %d (one alarm in a fault, one outside)", r.PodHours, r.FalseAlarms)
	}
	if r.UnfencedTwoPrimaries != 0 || r.StateHandovers != nil {
		t.Errorf("unfenced %v s, state handovers %v, in a run with neither", r.UnfencedTwoPrimaries, r.StateHandovers)
	}

	u := unfencedRun(contract.ModeNode, 1.5)
	u.End = at(100)
	u.Faults[0].Pairs[0].State = &StateCheck{Handover: "snapshot", Clock: at(9.2), QoS1Lost: 2, Duplicates: 1}
	vs, fa = Check(u, DefaultBounds())
	r = Figures(u, vs, fa, 2*time.Minute)
	if r.UnfencedTwoPrimaries != 7.5 {
		t.Errorf("unfenced two primaries %v s, want 7.5 (from 14 s to 1.5 s after the heal at 20 s)", r.UnfencedTwoPrimaries)
	}
	if r.StateHandovers["snapshot"] != 1 || r.StateLost["qos1"] != 2 || r.StateLost["duplicates"] != 1 || r.StateRetainedAgeMax != 0.8 {
		t.Errorf("state: handovers %v, lost %v, retained age %v s", r.StateHandovers, r.StateLost, r.StateRetainedAgeMax)
	}
}

// TestStateCheckHoldsTheBrokerStatePromises: a switchover keeps every value
// the old primary acknowledged; a failover a retained set no older than the
// bound; neither loses any of the plan, and a state given up is said.
func TestStateCheckHoldsTheBrokerStatePromises(t *testing.T) {
	start := at(100)
	for _, tc := range []struct {
		name    string
		c       StateCheck
		hubLost bool
		want    []string // a substring of each broken promise
	}{
		{"a switchover on the final state", StateCheck{Handover: "final", Acked: at(99.9), Clock: at(99.9)}, false, nil},
		{"a switchover that lost the last value", StateCheck{Handover: "final", Acked: at(99.9), Clock: at(99.8)}, false, []string{"the switchover lost retained values"}},
		{"a failover on a fresh snapshot", StateCheck{Handover: "snapshot", Acked: at(100), Clock: at(99.1)}, false, nil},
		{"a failover on a snapshot newer than the fault (cut one way)", StateCheck{Handover: "snapshot", Clock: at(101)}, false, nil},
		{"a failover on an old snapshot", StateCheck{Handover: "snapshot", Clock: at(97.5)}, false, []string{"2.50 s older than the fault"}},
		{"sessions and queued messages lost", StateCheck{Handover: "snapshot", Clock: at(99.5), SessionsLost: 1, QoS1Lost: 10}, false,
			[]string{"lost 0 retained messages, 1 sessions and 10 queued"}},
		{"duplicates are QoS 1's right", StateCheck{Handover: "snapshot", Clock: at(99.5), Duplicates: 3}, false, nil},
		{"the state given up", StateCheck{Handover: "not carried", Why: "no snapshot", Clock: at(99.5)}, false, []string{"not carried: no snapshot"}},
		{"no retained clock at all", StateCheck{Handover: "snapshot", RetainedLost: 100}, false, []string{"lost 100 retained", "no retained clock"}},
		{"nothing said", StateCheck{Handover: "none said", Clock: at(99.5)}, false, []string{"neither StateCarried nor StateNotCarried"}},
		{"not read", StateCheck{Handover: "snapshot", Err: "connection refused"}, false, []string{"not read: connection refused"}},
		{"given up with the standby's hub lost, said", StateCheck{Handover: "not carried", Why: "no snapshot", SessionsLost: 3, QoS1Lost: 30}, true, nil},
		{"a hub lost is no excuse for a carried state that lost", StateCheck{Handover: "snapshot", Clock: at(99.5), QoS1Lost: 1}, true, []string{"lost 0 retained messages, 0 sessions and 1 queued"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.c.broken(start, 2*time.Second, tc.hubLost)
			if len(got) != len(tc.want) {
				t.Fatalf("broken = %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("broken[%d] = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
