package actuate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amf-edge/amf/podsignal"
)

// metrics are the actuator's Prometheus metrics, registered on the
// Registerer of Config (the agent's own registry), never the global one.
type metrics struct {
	actions  *prometheus.CounterVec   // by action and result
	events   *prometheus.CounterVec   // decisions by reason (switchovers, failovers, aborts…)
	stepTime *prometheus.HistogramVec // API latency of each action
	steps    *prometheus.HistogramVec // input → record written and actions done, by phase entered
	stages   *prometheus.HistogramVec // decision → standby Ready, decision → primary retired
	fence    *prometheus.CounterVec   // fence commands sent, by command
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_actuate_actions_total",
			Help: "Actions carried out on the cluster, by action (ScaleStandby, RetirePrimary, Event) and result (ok, error, dry_run).",
		}, []string{"action", "result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_actuate_decisions_total",
			Help: "Decisions by reason: SwitchoverDecided, SwitchoverConfirmed, Failover, SwitchoverAborted, StandbyNotReady, FlapGuard, RolesExchanged, OrphanedStandby, InvalidPolicy (each signal of a workload with one), InvalidRecord.",
		}, []string{"reason"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "amf_actuate_action_seconds",
			Help:    "Time to carry out one action against the API server.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"action"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "amf_actuate_step_seconds",
			Help:    "Latency of each switchover step: from the input (sample, standby readiness, deadline) to its record written and its actions carried out, by the phase the step entered (WaitReady, Confirm, Failover, Retiring, Aborted, Idle; Suspect for a flap-guard refusal).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"phase"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "amf_actuate_switchover_seconds",
			Help:    "Time from the decision (switchover or failover) to a stage: standby_ready (the standby observed Ready) and retired (the primary scaled to 0 and the roles exchanged).",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120},
		}, []string{"stage"}),
		fence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_actuate_fence_commands_total",
			Help: "Commands sent to the sidecars of this node's guarded primaries: fence (pause the broker, cut off from the API server and every guard) and lift (resume it, still the primary).",
		}, []string{"command"}),
	}
	m.fence.WithLabelValues(podsignal.CommandFence)
	m.fence.WithLabelValues(podsignal.CommandLift)
	if reg != nil {
		reg.MustRegister(m.actions, m.events, m.stepTime, m.steps, m.stages, m.fence)
	}
	return m
}

func (m *metrics) action(kind string, err error, dryRun bool, took time.Duration) {
	result := "ok"
	switch {
	case err != nil:
		result = "error"
	case dryRun:
		result = "dry_run"
	}
	m.actions.WithLabelValues(kind, result).Inc()
	m.stepTime.WithLabelValues(kind).Observe(took.Seconds())
}
