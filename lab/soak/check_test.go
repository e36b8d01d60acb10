package soak

import (
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/nodeloss"
)

var t0 = time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// crashAt is a crash at s seconds, failed over 0.1 s later, whole 5 s later.
func crashAt(s float64) Fault {
	return Fault{Step: Step{Kind: Crash, On: PrimaryNode}, Start: at(s), Failover: at(s + 0.1), Back: at(s + 5), SOT: 300 * time.Millisecond}
}

func TestCheckerFindsWhatARunBroke(t *testing.T) {
	quiet := Fault{Step: Step{Kind: KubeletRestart, On: StandbyNode}, Start: at(100), Back: at(110), SOT: 200 * time.Millisecond}
	retire := func(s float64) Decision {
		return Decision{Time: at(s), Node: "n1", Action: "RetirePrimary", Deployment: "mqtt/edge-broker-a"}
	}
	for _, tc := range []struct {
		name string
		h    History
		want []string // a substring of each violation, in time order
	}{
		{name: "a clean run", h: History{Faults: []Fault{crashAt(10), quiet},
			Decisions: []Decision{retire(10.1), {Time: at(12), Action: "ScaleStandby"}},
			Primaries: []Primaries{{Time: at(10.1), Count: 2}, {Time: at(10.5), Count: 1}}}},
		{name: "a failover outside every fault", h: History{Faults: []Fault{crashAt(10), quiet}, Decisions: []Decision{retire(10.1), retire(105)}},
			want: []string{"a false action: RetirePrimary of mqtt/edge-broker-a"}},
		{name: "a failover while a killed agent was away longer than its guard waits is no false action", h: History{Faults: []Fault{{Step: Step{Kind: AgentKilled, On: PrimaryNode}, Start: at(100), Back: at(112), Down: 10 * time.Second}},
			Decisions: []Decision{retire(110)}}},
		{name: "a failover after an agent back within its guard's wait is a false action", h: History{Faults: []Fault{{Step: Step{Kind: AgentKilled, On: PrimaryNode}, Start: at(100), Back: at(103), Down: time.Second}},
			Decisions: []Decision{retire(102)}}, want: []string{"a false action"}},
		{name: "a failover while a killed sidecar was silent beyond its grace is no false action", h: History{Faults: []Fault{{Step: Step{Kind: SidecarKilled, On: PrimaryNode}, Start: at(100), Back: at(112), Down: 10 * time.Second}},
			Decisions: []Decision{retire(106)}}},
		{name: "a failover after a sidecar back within its grace is a false action", h: History{Faults: []Fault{{Step: Step{Kind: SidecarKilled, On: PrimaryNode}, Start: at(100), Back: at(104), Down: 2 * time.Second}},
			Decisions: []Decision{retire(103)}}, want: []string{"a false action"}},
		{name: "a failover within a crash and an agent killed within it is no false action", h: History{Faults: []Fault{{Step: Step{Kind: Crash, With: &Step{Kind: AgentKilled}}, Start: at(100), Failover: at(100.1), Back: at(120), WithDown: 10 * time.Second}},
			Decisions: []Decision{retire(100.1), retire(110)}}},
		{name: "a failover just after a fault's settle", h: History{Faults: []Fault{crashAt(10)}, Decisions: []Decision{retire(10.1), retire(20.1)}},
			want: []string{"a false action"}},
		{name: "a crash never failed over", h: History{Faults: []Fault{{Step: Step{Kind: Crash}, Start: at(10), Back: at(12)}}},
			want: []string{"crash: no failover"}},
		{name: "a pair never whole again", h: History{Faults: []Fault{{Step: Step{Kind: PowerCut}, Start: at(10), Err: "standby not Ready"}}},
			want: []string{"the pair not whole again: standby not Ready"}},
		{name: "too slow back", h: History{Faults: []Fault{{Step: Step{Kind: Crash}, Start: at(10), Failover: at(11), Back: at(50)}}},
			want: []string{"whole again after 40.0 s"}},
		{name: "an overlap gives more time", h: History{Faults: []Fault{{Step: Step{Kind: Crash, With: &Step{Kind: KubeletRestart}}, Start: at(10), Failover: at(11), Back: at(50)}}}},
		{name: "the probe stopped", h: History{Faults: []Fault{{Step: Step{Kind: SlowNode}, Start: at(10), Back: at(20), SOT: 5 * time.Second}}},
			want: []string{"stopped for 5.00 s"}},
		{name: "messages lost in a quiet fault", h: History{Faults: []Fault{{Step: Step{Kind: AgentKilled}, Start: at(10), Back: at(20), Lost: 3}}},
			want: []string{"3 of the probe's messages lost"}},
		{name: "messages lost in a failover are counted, not a violation", h: History{Faults: []Fault{{Step: Step{Kind: Crash}, Start: at(10), Failover: at(10.1), Back: at(15), Lost: 3}}}},
		{name: "two primaries too long", h: History{Primaries: []Primaries{{Time: at(1), Count: 2, Pods: []string{"a", "b"}}, {Time: at(2), Count: 2}, {Time: at(4), Count: 1}}},
			want: []string{"two primaries (a, b) for 3.0 s"}},
		{name: "two primaries to the end", h: History{End: at(60), Primaries: []Primaries{{Time: at(1), Count: 2, Pods: []string{"a", "b"}}}},
			want: []string{"two primaries (a, b) from"}},
		{name: "leftovers", h: History{End: at(60), Leftovers: []string{"pod mqtt/x Terminating"}},
			want: []string{"left over: pod mqtt/x Terminating"}},
		{name: "an agent that grew", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Threads: 10}, {Time: at(600), Node: "n0", RSS: 70 << 20, Threads: 30}}},
			want: []string{"grew from 40.0 MiB to 70.0 MiB", "grew from 10 threads to 30"}},
		{name: "an agent that stayed", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Threads: 10}, {Time: at(600), Node: "n0", RSS: 50 << 20, Threads: 12}}}},
		{name: "an agent whose goroutines grew", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Goroutines: 60}, {Time: at(300), Node: "n0", RSS: 40 << 20}, {Time: at(600), Node: "n0", RSS: 40 << 20, Goroutines: 160}}},
			want: []string{"grew from 60 goroutines to 160"}},
		{name: "an agent whose goroutines came and went", h: History{AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 40 << 20, Goroutines: 60}, {Time: at(300), Node: "n0", RSS: 40 << 20, Goroutines: 200}, {Time: at(600), Node: "n0", RSS: 40 << 20, Goroutines: 90}}}},
		{name: "a client not back", h: History{Faults: []Fault{func() Fault { f := crashAt(10); f.ClientsNotBack = []string{"in-pod-n2-30s"}; return f }()}},
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
	h := History{Seed: 1, Start: at(0), End: at(3600), BrokerPods: 2,
		Faults: []Fault{crashAt(10), func() Fault {
			f := crashAt(100)
			f.Lost = 4
			f.SOT = time.Second
			f.Step.With = &Step{Kind: APIServerRestart}
			f.Clients = []nodeloss.ClientCut{{Client: "a", ServedS: 0.5}, {Client: "b", ServedS: -1}}
			return f
		}()},
		Alarms: []Alarm{{Time: at(10.5)}, {Time: at(1000)}},
		AgentUse: []AgentUse{{Time: at(1), Node: "n0", RSS: 30 << 20}, {Time: at(3500), Node: "n0", RSS: 32 << 20},
			{Time: at(1), Node: "n1", RSS: 31 << 20}, {Time: at(3500), Node: "n1", RSS: 31 << 20}}}
	vs, fa := Check(h, DefaultBounds())
	r := Figures(h, vs, fa, 2*time.Minute)
	if r.DurationS != 3600 || r.Faults[Crash] != 2 || r.Faults[APIServerRestart] != 1 || r.Overlapped != 1 || r.Lost[Crash] != 4 {
		t.Errorf("figures %+v", r)
	}
	if r.SOTP99[Crash] != 1 || r.BackP99[Crash] != 5 || r.ClientP99[Crash] != 120 || r.ClientsNotBack != 1 {
		t.Errorf("p99: sot %v, back %v, clients %v (%d not back)", r.SOTP99, r.BackP99, r.ClientP99, r.ClientsNotBack)
	}
	if r.AgentRSSStart != 31 || r.AgentRSSEnd != 32 {
		t.Errorf("agent rss %v -> %v", r.AgentRSSStart, r.AgentRSSEnd)
	}
	if r.PodHours != 2 || r.FalseAlarms != 1 {
		t.Errorf("pod-hours %v, false alarms %d (one alarm in a fault, one outside)", r.PodHours, r.FalseAlarms)
	}
}
