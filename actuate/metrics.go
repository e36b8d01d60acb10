package actuate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the actuator's Prometheus metrics, registered on the
// Registerer of Config (the agent's own registry), never the global one.
type metrics struct {
	actions  *prometheus.CounterVec   // by action and result
	events   *prometheus.CounterVec   // decisions by reason (switchovers, failovers, aborts…)
	stepTime *prometheus.HistogramVec // API latency of each action
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_actuate_actions_total",
			Help: "Actions carried out on the cluster, by action (ScaleStandby, RetirePrimary, Event) and result (ok, error, dry_run).",
		}, []string{"action", "result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_actuate_decisions_total",
			Help: "Decisions by reason: SwitchoverDecided, SwitchoverConfirmed, Failover, SwitchoverAborted, StandbyNotReady, FlapGuard, RolesExchanged, InvalidPolicy.",
		}, []string{"reason"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "amf_actuate_action_seconds",
			Help:    "Time to carry out one action against the API server.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"action"}),
	}
	if reg != nil {
		reg.MustRegister(m.actions, m.events, m.stepTime)
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
