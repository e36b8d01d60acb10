package agent

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/amf-edge/amf/podsignal"
)

// Reasons a connection is refused (label "reason" of
// amf_agent_connections_refused_total).
const (
	refuseCapacity       = "capacity"        // MaxClients sessions of other pods, or MaxPending connections none of which is idle
	refuseSourceLimit    = "source_limit"    // MaxPendingPerSource unauthenticated connections from this address
	refuseEvicted        = "evicted"         // idle (no CONNECT yet) and the oldest, when a new connection needed its place
	refuseConnectTimeout = "connect_timeout" // no CONNECT within ConnectTimeout
	refuseNoToken        = "no_token"        // empty password
	refuseBadToken       = "bad_token"       // ErrUnauthenticated
	refuseUnbound        = "unbound"         // ErrNotPodBound
	refuseAuthError      = "auth_error"      // ErrAuthUnavailable or any other authenticator error
	refuseUsername       = "username"        // username is not <namespace>/<pod> of the token
	refuseClientID       = "client_id"       // client identifier not under <namespace>/<pod>
	refuseKeepalive      = "keepalive"       // keepalive 0 or above the maximum (MQTT 3.1.1)
	refuseWill           = "will"            // Last Will not a valid "gone" on the own topic
	refuseUnsupported    = "unsupported"     // connection not from the agent's listener
	refuseShutdown       = "shutting_down"
)

// Reasons a payload is refused (label "reason" of amf_agent_malformed_payloads_total).
const (
	malformedTooLarge       = "too_large"        // podsignal.ErrTooLarge
	malformedInvalid        = "invalid"          // podsignal.ErrInvalid
	malformedIdentity       = "identity"         // podsignal.ErrIdentity
	malformedTopic          = "topic"            // podsignal.ErrTopic
	malformedPacketTooLarge = "packet_too_large" // above the broker's packet limit: connection closed
)

// metrics are the agent's Prometheus metrics, on a registry of its own so that
// two agents in one process (tests) do not collide.
type metrics struct {
	reg *prometheus.Registry

	connAccepted  prometheus.Counter
	connRefused   *prometheus.CounterVec
	aclDenied     *prometheus.CounterVec
	malformed     *prometheus.CounterVec
	messages      *prometheus.CounterVec
	ignored       *prometheus.CounterVec
	disconnects   *prometheus.CounterVec
	sessions      prometheus.Gauge
	pods          *prometheus.GaugeVec
	intake        prometheus.Histogram
	eventsDropped prometheus.Counter
	commands      *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		connAccepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "amf_agent_connections_accepted_total",
			Help: "MQTT connections authenticated and accepted.",
		}),
		connRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_connections_refused_total",
			Help: "MQTT connections refused, by reason.",
		}, []string{"reason"}),
		aclDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_acl_denials_total",
			Help: "Publishes and subscriptions refused by the per-pod ACL, by action.",
		}, []string{"action"}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_malformed_payloads_total",
			Help: "Payloads refused by the signal contract, by reason; never recorded.",
		}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_messages_total",
			Help: "Signals accepted, by state and source (publish, will, or node: the agent's own pipeline in node mode).",
		}, []string{"state", "source"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_messages_ignored_total",
			Help: "Valid signals ignored: duplicate seq within a session, or from a session a newer one replaced.",
		}, []string{"reason"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_disconnects_total",
			Help: "Ends of authenticated sessions: clean (DISCONNECT), unclean (connection lost), superseded (a newer session of the pod exists).",
		}, []string{"kind"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "amf_agent_sessions",
			Help: "Authenticated MQTT sessions open.",
		}),
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "amf_agent_pods",
			Help: "Pods known to the agent, by their latest state.",
		}, []string{"state"}),
		intake: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "amf_agent_intake_seconds",
			Help:    "Time to check the ACL, decode and record one published signal.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 12), // 5 µs … 10 ms
		}),
		eventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "amf_agent_events_dropped_total",
			Help: "Events not delivered because a subscriber's buffer was full.",
		}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_agent_commands_total",
			Help: "Commands published to sidecars, by command (fence, lift).",
		}, []string{"command"}),
	}
	m.reg.MustRegister(m.connAccepted, m.connRefused, m.aclDenied, m.malformed, m.messages,
		m.ignored, m.disconnects, m.sessions, m.pods, m.intake, m.eventsDropped, m.commands,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Every series exists from the start, so a rate() over a counter that has
	// never moved is 0 instead of absent.
	for _, r := range []string{refuseCapacity, refuseSourceLimit, refuseEvicted, refuseConnectTimeout, refuseNoToken, refuseBadToken, refuseUnbound, refuseAuthError,
		refuseUsername, refuseClientID, refuseKeepalive, refuseWill, refuseUnsupported, refuseShutdown} {
		m.connRefused.WithLabelValues(r)
	}
	for _, a := range []string{"publish", "subscribe"} {
		m.aclDenied.WithLabelValues(a)
	}
	for _, r := range []string{malformedTooLarge, malformedInvalid, malformedIdentity, malformedTopic, malformedPacketTooLarge} {
		m.malformed.WithLabelValues(r)
	}
	for _, s := range []podsignal.State{podsignal.Starting, podsignal.Healthy, podsignal.Anomalous, podsignal.Unhealthy, podsignal.Stopping, podsignal.Gone} {
		m.pods.WithLabelValues(string(s))
		for _, src := range []podsignal.Source{podsignal.SourcePublish, podsignal.SourceWill} {
			m.messages.WithLabelValues(string(s), string(src))
		}
	}
	for _, r := range []string{ignoredDuplicate, ignoredSuperseded} {
		m.ignored.WithLabelValues(r)
	}
	for _, k := range []string{"clean", "unclean", "superseded"} {
		m.disconnects.WithLabelValues(k)
	}
	for _, c := range []string{podsignal.CommandFence, podsignal.CommandLift} {
		m.commands.WithLabelValues(c)
	}
	return m
}

// malformedReason maps a podsignal.Decode error to its metric label.
func malformedReason(err error) string {
	switch {
	case errors.Is(err, podsignal.ErrTooLarge):
		return malformedTooLarge
	case errors.Is(err, podsignal.ErrIdentity):
		return malformedIdentity
	case errors.Is(err, podsignal.ErrTopic):
		return malformedTopic
	default:
		return malformedInvalid
	}
}

// refuseReason maps an Authenticator error to its metric label.
func refuseReason(err error) string {
	switch {
	case errors.Is(err, ErrNotPodBound):
		return refuseUnbound
	case errors.Is(err, ErrUnauthenticated):
		return refuseBadToken
	default:
		return refuseAuthError
	}
}
