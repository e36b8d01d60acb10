package detect

import (
	"fmt"

	"github.com/amf-edge/amf/podsignal"
)

// Machine is the sidecar's health state machine. It is pure: events in, a verdict
// out, no clock and no I/O, so every transition is table-testable.
//
// Precedence, strongest first: stopping (terminal) > unhealthy (the app-logic probe
// fails, the application said so, or the broker container is gone) > anomalous (the
// model's score is at or above the threshold) > healthy. The sidecar stays starting
// until it has both a score and, when a probe is configured, a passing probe; a
// probe that fails before the broker has ever answered keeps it starting.
type Machine struct {
	threshold float64
	needProbe bool

	state  podsignal.State
	reason string

	scored    bool
	anomalous bool
	score     float64

	probeKnown  bool
	probeOK     bool
	probeEverOK bool // the broker has answered a probe since the sidecar started
	probeReason string

	appUnhealthy string // reason the application gave; empty when it reports healthy
	targetGone   string // reason the target vanished; empty while it is there
	notFound     string // why the target has not been found yet; empty once it has
	restarting   string // why the sidecar restarted the broker itself; empty otherwise
}

// Verdict says what to signal after an event.
type Verdict struct {
	State   podsignal.State
	Reason  string
	Changed bool // the state differs from before the event: signal at once
	// Publish is true when a signal must be sent: on every change, and on every
	// sample while the score is at or above the threshold (the agent's debounce
	// counts consecutive anomalous samples).
	Publish bool
}

// NewMachine returns a machine in state starting. needProbe says whether an
// app-logic probe is configured and must pass before the pod is healthy.
func NewMachine(threshold float64, needProbe bool) *Machine {
	return &Machine{threshold: threshold, needProbe: needProbe, state: podsignal.Starting, reason: "sidecar started"}
}

// State returns the current state and why.
func (m *Machine) State() (podsignal.State, string) { return m.state, m.reason }

// Score records the model's probability for a new sample.
func (m *Machine) Score(p float64) Verdict {
	m.scored, m.score = true, p
	m.anomalous = p >= m.threshold
	v := m.settle()
	if m.anomalous && m.state != podsignal.Stopping {
		v.Publish = true
	}
	return v
}

// Probe records an app-logic probe result.
func (m *Machine) Probe(ok bool, reason string) Verdict {
	m.probeKnown, m.probeOK, m.probeReason = true, ok, reason
	m.probeEverOK = m.probeEverOK || ok
	return m.settle()
}

// App records a health report from the application beside the broker. Only
// healthy and unhealthy are the application's to say: anomalous is the model's
// verdict, and stopping/gone describe the sidecar itself.
func (m *Machine) App(state podsignal.State, reason string) (Verdict, error) {
	switch state {
	case podsignal.Unhealthy:
		if reason == "" {
			reason = "application reported unhealthy"
		}
		m.appUnhealthy = "application: " + reason
	case podsignal.Healthy:
		m.appUnhealthy = ""
	default:
		return Verdict{}, fmt.Errorf("an application may report healthy or unhealthy, not %q", state)
	}
	return m.settle(), nil
}

// TargetGone records that the broker container vanished (reason non-empty) or is
// back (reason empty).
func (m *Machine) TargetGone(reason string) Verdict {
	m.targetGone = reason
	return m.settle()
}

// TargetNotFound records why the broker container has not been found yet
// (reason non-empty), or that it has (empty). Before the first score it is
// the reason the sidecar is still starting; it is not unhealthy, because the
// agent would fail over to a standby that has the same problem (a container
// name that matches nothing), and because a native sidecar starts before the
// broker it looks for.
func (m *Machine) TargetNotFound(reason string) Verdict {
	m.notFound = reason
	return m.settle()
}

// Restart records that the sidecar itself restarted the broker (reason
// non-empty: a handed-over state put in, package handover), or that the
// restarted broker answers again (empty). Meanwhile the pod is starting,
// not unhealthy: the broker's end was asked for, and unhealthy would have
// the agent fail over from the very pod it is handing the state to.
func (m *Machine) Restart(reason string) Verdict {
	m.restarting = reason
	return m.settle()
}

// Gone reports whether the target is recorded as vanished.
func (m *Machine) Gone() bool { return m.targetGone != "" }

// Stop moves to stopping, for good.
func (m *Machine) Stop(reason string) Verdict {
	changed := m.state != podsignal.Stopping
	m.state, m.reason = podsignal.Stopping, reason
	return Verdict{State: m.state, Reason: m.reason, Changed: changed, Publish: changed}
}

// settle recomputes the state from what is known.
func (m *Machine) settle() Verdict {
	if m.state == podsignal.Stopping {
		return Verdict{State: m.state, Reason: m.reason}
	}
	state, reason := m.derive()
	changed := state != m.state
	m.state, m.reason = state, reason
	return Verdict{State: state, Reason: reason, Changed: changed, Publish: changed}
}

func (m *Machine) derive() (podsignal.State, string) {
	switch {
	case m.restarting != "":
		return podsignal.Starting, m.restarting
	case m.targetGone != "":
		return podsignal.Unhealthy, m.targetGone
	case m.appUnhealthy != "":
		return podsignal.Unhealthy, m.appUnhealthy
	case m.probeKnown && !m.probeOK && !m.probeEverOK:
		// A native sidecar starts before its broker: a broker that has not
		// answered yet is starting, not failed (the agent fails over on
		// unhealthy at once, and did so at every pod start on a real node).
		return podsignal.Starting, "waiting for the broker to answer its app-logic probe: " + m.probeReason
	case m.probeKnown && !m.probeOK:
		return podsignal.Unhealthy, "app-logic probe failed: " + m.probeReason
	case m.scored && m.anomalous:
		return podsignal.Anomalous, fmt.Sprintf("score %.3f >= threshold %.3f", m.score, m.threshold)
	case !m.scored && m.notFound != "":
		return podsignal.Starting, "broker container not found yet: " + m.notFound
	case !m.scored:
		return podsignal.Starting, "waiting for the first score"
	case m.needProbe && !m.probeKnown:
		return podsignal.Starting, "waiting for the first app-logic probe"
	}
	return podsignal.Healthy, fmt.Sprintf("score %.3f < threshold %.3f", m.score, m.threshold)
}
