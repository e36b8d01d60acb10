package healthcheck_test

import (
	"context"
	"log"
	"time"

	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/podsignal"
)

// How a sidecar wires the probe, the endpoint and its state machine together.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	prober, err := healthcheck.NewMQTTProber(healthcheck.MQTTConfig{Broker: "tcp://127.0.0.1:1883"})
	if err != nil {
		log.Fatal(err)
	}
	cfg := prober.Config()
	probe := healthcheck.NewProbeState(2*cfg.Interval + cfg.Timeout)
	metrics := healthcheck.NewMetrics()
	alive := healthcheck.NewHeartbeat(5 * time.Second) // the sample loop calls alive.Beat()

	// Transitions go to the state machine at once; every result feeds /readyz
	// and the RTT histogram.
	toStateMachine := healthcheck.OnChange(func(r healthcheck.Result) { /* sm.Probe(r) */ })
	go func() {
		_ = prober.Run(ctx, func(r healthcheck.Result) {
			probe.Report(r)
			metrics.ObserveProbe(r)
			toStateMachine(r)
		})
	}()

	srv, err := healthcheck.NewServer(healthcheck.ServerConfig{
		Addr:      healthcheck.DefaultAddr,
		Liveness:  alive.Check,
		Readiness: probe.Check,
		Status:    func() healthcheck.Status { return healthcheck.Status{State: podsignal.Starting} },
		Metrics:   metrics,
		OnAppReport: func(ctx context.Context, r healthcheck.AppReport) error {
			return nil // sm.AppReport(ctx, r): ErrConflict while stopping, say
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.ListenAndServe(ctx) }()
}
