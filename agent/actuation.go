package agent

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amf-edge/amf/actuate"
)

// MetricsRegisterer returns the registry behind the agent's /metrics, so the
// actuator's metrics (actuate.Config.Registerer) are served with the agent's.
func (a *Agent) MetricsRegisterer() prometheus.Registerer { return a.m.reg }

// actuationBuffer is the tracker subscription's buffer for the actuator: a
// node's 110 pods sending one anomalous sample per second each fit many
// times over while the actuator waits for an API call.
const actuationBuffer = 1024

// StartActuation subscribes act, the decision logic, to every observation
// of t and runs it until ctx ends or the agent stops. It subscribes before it
// returns, so no signal accepted afterwards is missed; wait blocks until the
// actuator stopped and returns its error. The agent decides nothing itself:
// dry run (--observe-only) is the Actuator's own option.
func StartActuation(ctx context.Context, t *Tracker, act *actuate.Actuator, log *slog.Logger) (wait func() error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	events := t.Subscribe(ctx, actuationBuffer)
	signals := make(chan actuate.Signal)
	go func() {
		defer close(signals)
		for ev := range events {
			if ev.Missed > 0 {
				// A lost sample only delays a debounce (counts restart at the
				// next clear sample); a lost transition is repaired by the next
				// one. Say so loudly: the actuator is too slow for the load.
				log.Warn("actuation missed signals", slog.Uint64("missed", ev.Missed))
			}
			s := actuate.Signal{
				Namespace: ev.Namespace, Pod: ev.Pod, State: ev.State,
				Transition: ev.Transition, At: ev.Received,
			}
			if ev.Message != nil {
				s.Probability = ev.Message.Probability
			}
			select {
			case signals <- s:
			case <-ctx.Done():
				return
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- act.Run(ctx, signals)
	}()
	return func() error { return <-done }
}
