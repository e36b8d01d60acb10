package detect

import (
	"strings"
	"testing"

	"github.com/amf-edge/amf/podsignal"
)

// event is one input to the machine, with the verdict expected after it.
type event struct {
	do      func(m *Machine) Verdict
	state   podsignal.State
	publish bool
	reason  string // substring, optional
}

func score(p float64) func(*Machine) Verdict { return func(m *Machine) Verdict { return m.Score(p) } }
func probe(ok bool) func(*Machine) Verdict {
	return func(m *Machine) Verdict { return m.Probe(ok, "no echo within 1s") }
}
func app(s podsignal.State) func(*Machine) Verdict {
	return func(m *Machine) Verdict { v, _ := m.App(s, "db down"); return v }
}
func gone(reason string) func(*Machine) Verdict {
	return func(m *Machine) Verdict { return m.TargetGone(reason) }
}
func notFound(reason string) func(*Machine) Verdict {
	return func(m *Machine) Verdict { return m.TargetNotFound(reason) }
}
func restart(reason string) func(*Machine) Verdict {
	return func(m *Machine) Verdict { return m.Restart(reason) }
}
func stop() func(*Machine) Verdict { return func(m *Machine) Verdict { return m.Stop("SIGTERM") } }

func TestMachineTransitions(t *testing.T) {
	tests := []struct {
		name      string
		needProbe bool
		events    []event
	}{
		{"healthy after the first score without a probe", false, []event{
			{do: score(0.1), state: podsignal.Healthy, publish: true},
			{do: score(0.2), state: podsignal.Healthy, publish: false},
		}},
		{"starting until the probe passes when one is configured", true, []event{
			{do: score(0.1), state: podsignal.Starting, publish: false, reason: "probe"},
			{do: probe(true), state: podsignal.Healthy, publish: true},
		}},
		{"every sample at or above threshold is published", false, []event{
			{do: score(0.1), state: podsignal.Healthy, publish: true},
			{do: score(0.5), state: podsignal.Anomalous, publish: true, reason: "0.500 >= threshold"},
			{do: score(0.9), state: podsignal.Anomalous, publish: true},
			{do: score(0.7), state: podsignal.Anomalous, publish: true},
			{do: score(0.49), state: podsignal.Healthy, publish: true},
			{do: score(0.1), state: podsignal.Healthy, publish: false},
		}},
		{"probe failure beats anomaly and recovery returns to it", true, []event{
			{do: probe(true), state: podsignal.Starting},
			{do: score(0.8), state: podsignal.Anomalous, publish: true},
			{do: probe(false), state: podsignal.Unhealthy, publish: true, reason: "app-logic probe failed"},
			{do: score(0.8), state: podsignal.Unhealthy, publish: true},
			{do: probe(true), state: podsignal.Anomalous, publish: true},
		}},
		{"a broker that has not answered yet is starting, not unhealthy", true, []event{
			{do: probe(false), state: podsignal.Starting, reason: "waiting for the broker to answer"},
			{do: score(0.1), state: podsignal.Starting},
			{do: probe(true), state: podsignal.Healthy, publish: true},
		}},
		{"a failing probe after the broker answered is unhealthy at once", true, []event{
			{do: probe(true), state: podsignal.Starting},
			{do: probe(false), state: podsignal.Unhealthy, publish: true, reason: "app-logic probe failed"},
		}},
		{"the application's word holds until it takes it back", false, []event{
			{do: score(0.1), state: podsignal.Healthy, publish: true},
			{do: app(podsignal.Unhealthy), state: podsignal.Unhealthy, publish: true, reason: "application: db down"},
			{do: score(0.1), state: podsignal.Unhealthy, publish: false},
			{do: app(podsignal.Healthy), state: podsignal.Healthy, publish: true},
		}},
		{"a vanished container is unhealthy whatever the score", false, []event{
			{do: score(0.1), state: podsignal.Healthy, publish: true},
			{do: gone("cgroup removed"), state: podsignal.Unhealthy, publish: true, reason: "cgroup removed"},
			{do: score(0.1), state: podsignal.Unhealthy},
			{do: gone(""), state: podsignal.Healthy, publish: true},
		}},
		{"a target not found yet keeps it starting and says why", false, []event{
			{do: notFound(`no container "mosquito"`), state: podsignal.Starting, reason: `broker container not found yet: no container "mosquito"`},
			{do: notFound(""), state: podsignal.Starting, reason: "waiting for the first score"},
			{do: score(0.1), state: podsignal.Healthy, publish: true},
		}},
		{"a broker the sidecar restarts is starting, not unhealthy, until it answers again", true, []event{
			{do: probe(true), state: podsignal.Starting},
			{do: score(0.1), state: podsignal.Healthy, publish: true},
			{do: restart("restarting on a handed-over state"), state: podsignal.Starting, publish: true, reason: "handed-over state"},
			{do: gone("cgroup removed"), state: podsignal.Starting},
			{do: probe(false), state: podsignal.Starting},
			{do: gone(""), state: podsignal.Starting},
			{do: probe(true), state: podsignal.Starting},
			{do: restart(""), state: podsignal.Healthy, publish: true},
		}},
		{"a restarted broker that never came back is unhealthy once the restart is given up", true, []event{
			{do: probe(true), state: podsignal.Starting},
			{do: score(0.1), state: podsignal.Healthy, publish: true},
			{do: restart("restarting on a handed-over state"), state: podsignal.Starting, publish: true},
			{do: probe(false), state: podsignal.Starting},
			{do: restart(""), state: podsignal.Unhealthy, publish: true, reason: "app-logic probe failed"},
		}},
		{"stopping is terminal and published once", false, []event{
			{do: score(0.9), state: podsignal.Anomalous, publish: true},
			{do: stop(), state: podsignal.Stopping, publish: true},
			{do: score(0.95), state: podsignal.Stopping, publish: false},
			{do: probe(false), state: podsignal.Stopping, publish: false},
			{do: stop(), state: podsignal.Stopping, publish: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMachine(0.5, tt.needProbe)
			if s, _ := m.State(); s != podsignal.Starting {
				t.Fatalf("initial state %s", s)
			}
			for i, ev := range tt.events {
				v := ev.do(m)
				if v.State != ev.state || v.Publish != ev.publish {
					t.Fatalf("event %d: got %s publish=%v (%s), want %s publish=%v", i, v.State, v.Publish, v.Reason, ev.state, ev.publish)
				}
				if !strings.Contains(v.Reason, ev.reason) {
					t.Fatalf("event %d: reason %q does not mention %q", i, v.Reason, ev.reason)
				}
				if s, r := m.State(); s != v.State || r != v.Reason {
					t.Fatalf("event %d: State() = %s %q, verdict %s %q", i, s, r, v.State, v.Reason)
				}
			}
		})
	}
}

func TestApplicationMayNotClaimOtherStates(t *testing.T) {
	m := NewMachine(0.5, false)
	for _, s := range []podsignal.State{podsignal.Anomalous, podsignal.Stopping, podsignal.Gone, podsignal.Starting, "bogus"} {
		if _, err := m.App(s, ""); err == nil {
			t.Errorf("application report %q accepted", s)
		}
	}
}
