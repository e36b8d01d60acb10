package statehub

import "github.com/prometheus/client_golang/prometheus"

// metrics are the hub's: what an operator asks when a state did not come
// (was it handed in? refused, and why? handed on? fetched?) and how much
// of the agent's memory the states take.
type metrics struct {
	requests *prometheus.CounterVec // by op (hand_in, fetch) and outcome
	handed   prometheus.Counter     // states handed on to a pod
	bytes    prometheus.Gauge       // held, handed in and on together
}

// The outcomes of a request, as amf_statehub_requests_total labels them.
const (
	outcomeOK           = "ok"
	outcomeUnauthorized = "unauthenticated"
	outcomeForbidden    = "forbidden"
	outcomeRefused      = "refused" // not a whole state, not final, too large, bad kind
	outcomeNoRoom       = "no_room"
	outcomeEmpty        = "none" // a long poll that ended without a state
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amf_statehub_requests_total",
			Help: "Requests to the state hub by operation (hand_in, fetch) and outcome."}, []string{"op", "outcome"}),
		handed: prometheus.NewCounter(prometheus.CounterOpts{Name: "amf_statehub_handed_on_total",
			Help: "Broker states handed on to the pod that takes over."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "amf_statehub_bytes",
			Help: "Bytes of broker state the hub holds in memory."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.handed, m.bytes)
	}
	return m
}
