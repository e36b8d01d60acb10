package healthcheck

import (
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// states lists the contract's states, so every state series exists from the
// start: a missing series and a zero one mean different things in PromQL.
var states = []podsignal.State{
	podsignal.Starting, podsignal.Healthy, podsignal.Anomalous,
	podsignal.Unhealthy, podsignal.Stopping, podsignal.Gone,
}

// Error kinds this package counts itself in amf_errors_total.
const (
	// ErrorKindProbe counts failed app-logic probe results (see ObserveProbe).
	ErrorKindProbe = "probe"
	// ErrorKindAppReport counts refused POST /signal requests.
	ErrorKindAppReport = "app_report"
	// ErrorKindStatus counts /status snapshots that could not be encoded.
	ErrorKindStatus = "status"
)

// Metrics holds the sidecar's Prometheus metrics on a registry of its own, so
// that nothing registered globally by a dependency leaks into the exposition and
// tests can create as many as they like. The sidecar updates it; /metrics
// serves it. All methods are safe for concurrent use.
type Metrics struct {
	reg            *prometheus.Registry
	score          prometheus.Gauge
	feature        *prometheus.GaugeVec
	state          *prometheus.GaugeVec
	sampleDuration prometheus.Histogram
	probeRTT       prometheus.Histogram
	probeUp        prometheus.Gauge
	signalsSent    *prometheus.CounterVec
	errors         *prometheus.CounterVec
	memoryRef      *prometheus.GaugeVec
	cpuRef         *prometheus.GaugeVec
}

// NewMetrics returns metrics registered on a fresh registry, together with the
// Go runtime and process collectors (RSS and CPU are part of the sidecar's
// budget, so they must be observable).
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		score: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "amf_anomaly_score",
			Help: "Latest model probability that the workload is anomalous (0..1).",
		}),
		feature: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "amf_feature",
			Help: "Latest value of each model input; absent while undefined.",
		}, []string{"feature"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "amf_state",
			Help: "Sidecar state: 1 for the current state, 0 for the others.",
		}, []string{"state"}),
		sampleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "amf_sample_duration_seconds",
			Help:    "Time to read, featurise and score one sample.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14), // 100 µs .. 0.8 s
		}),
		probeRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "amf_probe_rtt_seconds",
			Help:    "Round-trip time of passing app-logic probes.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14), // 100 µs .. 0.8 s; the timeout is 1 s
		}),
		probeUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "amf_probe_up",
			Help: "1 while the latest app-logic probe passed, else 0.",
		}),
		signalsSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_signals_sent_total",
			Help: "Health signals published to the node agent, by state.",
		}, []string{"state"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "amf_errors_total",
			Help: "Errors by kind.",
		}, []string{"kind"}),
		memoryRef: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "amf_memory_reference_bytes",
			Help: "What memory_percent is relative to, by source (container_limit, parent_limit, machine_memory, flag, assumed); absent until the target is read.",
		}, []string{"source"}),
		cpuRef: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "amf_cpu_reference_cores",
			Help: "What cpu_percent is relative to, by source (one_core: per core, as the model was trained).",
		}, []string{"source"}),
	}
	m.reg.MustRegister(
		m.score, m.feature, m.state, m.sampleDuration, m.probeRTT, m.probeUp,
		m.signalsSent, m.errors, m.memoryRef, m.cpuRef,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	for _, s := range states {
		m.state.WithLabelValues(string(s))
		m.signalsSent.WithLabelValues(string(s))
	}
	for _, k := range []string{ErrorKindProbe, ErrorKindAppReport, ErrorKindStatus} {
		m.errors.WithLabelValues(k)
	}
	return m
}

// Registry returns the registry, for the caller's own collectors and for tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the Prometheus exposition of the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:          m.reg, // counts its own scrape errors
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

// SetScore records the latest model probability.
func (m *Metrics) SetScore(p float64) { m.score.Set(p) }

// SetFeatures records the latest features. A nil f, a nil field or a
// non-finite value removes that feature's series: undefined must look like
// no sample, as it does in PromQL, not like a number.
func (m *Metrics) SetFeatures(f *podsignal.Features) {
	var vals [contract.NumFeatures]*float64
	if f != nil {
		vals = f.Values()
	}
	names := contract.FeatureNames() // the feature label's values
	for i, v := range vals {
		if v == nil || math.IsNaN(*v) || math.IsInf(*v, 0) {
			m.feature.DeleteLabelValues(names[i])
			continue
		}
		m.feature.WithLabelValues(names[i]).Set(*v)
	}
}

// SetState makes s the current state. A state outside the contract sets all
// series to 0 rather than inventing a label value.
func (m *Metrics) SetState(s podsignal.State) {
	for _, st := range states {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(string(st)).Set(v)
	}
}

// ObserveSample records how long one sample took.
func (m *Metrics) ObserveSample(d time.Duration) { m.sampleDuration.Observe(d.Seconds()) }

// ObserveProbe records a probe result: its RTT when it passed, an error of kind
// ErrorKindProbe when it failed, and amf_probe_up either way.
func (m *Metrics) ObserveProbe(r Result) {
	if r.OK {
		m.probeUp.Set(1)
		m.probeRTT.Observe(r.RTT.Seconds())
		return
	}
	m.probeUp.Set(0)
	m.errors.WithLabelValues(ErrorKindProbe).Inc()
}

// SignalSent counts a signal published in state s. States outside the contract
// are counted as "invalid", which keeps the label set bounded.
func (m *Metrics) SignalSent(s podsignal.State) {
	if !s.Valid() {
		s = "invalid"
	}
	m.signalsSent.WithLabelValues(string(s)).Inc()
}

// SetMemoryReference makes r the one memory reference series, and SetCPUReference
// the CPU one: a reference that changes source replaces its series.
func (m *Metrics) SetMemoryReference(r Reference) { setOnly(m.memoryRef, r) }

// SetCPUReference: see SetMemoryReference.
func (m *Metrics) SetCPUReference(r Reference) { setOnly(m.cpuRef, r) }

func setOnly(g *prometheus.GaugeVec, r Reference) {
	g.Reset()
	g.WithLabelValues(r.Source).Set(r.Value)
}

// Error counts one error of the given kind. Kinds must come from a small fixed
// set (each is a time series), e.g. "cgroup_read", "signal_publish".
func (m *Metrics) Error(kind string) { m.errors.WithLabelValues(kind).Inc() }
