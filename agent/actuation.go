package agent

import (
	"context"

	"github.com/amf-edge/amf/podsignal"
	"github.com/prometheus/client_golang/prometheus"
)

// MetricsRegisterer returns the registry behind the agent's /metrics, so the
// actuator's metrics (actuate.Config.Registerer) are served with the agent's.
func (a *Server) MetricsRegisterer() prometheus.Registerer { return a.m.reg }

// actuationBuffer is the tracker subscription's buffer for the actuator: a
// node's 110 pods sending one anomalous sample per second each fit many
// times over while the actuator waits for an API call.
const actuationBuffer = 1024

// Actuator is the decision logic fed by the tracker; *actuate.Actuator is
// the real one. It reads the tracker's observations as they are.
type Actuator interface {
	Run(ctx context.Context, in <-chan podsignal.Observation) error
}

// StartActuation subscribes act to every observation of t and runs it until
// ctx ends or the agent stops. It subscribes before it returns, so no signal
// accepted afterwards is missed; wait blocks until the actuator stopped and
// returns its error. The agent decides nothing itself: dry run
// (--observe-only) is the Actuator's own option.
func StartActuation(ctx context.Context, t *Tracker, act Actuator) (wait func() error) {
	ctx, cancel := context.WithCancel(ctx)
	events := t.Subscribe(ctx, actuationBuffer)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- act.Run(ctx, events)
	}()
	return func() error { return <-done }
}
