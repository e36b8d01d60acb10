package healthcheck

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amf-edge/amf/podsignal"
)

func TestMetrics(t *testing.T) {
	m := NewMetrics()
	cpu, mem := 42.5, 12.0
	m.SetFeatures(&podsignal.Features{CPUPercent: &cpu, MemoryPercent: &mem})
	if got := testutil.ToFloat64(m.feature.WithLabelValues("cpu_percent")); got != cpu {
		t.Errorf("cpu_percent = %v", got)
	}
	if n := testutil.CollectAndCount(m.feature); n != 2 {
		t.Errorf("%d feature series, want 2 (undefined ones absent)", n)
	}
	m.SetFeatures(nil)
	if n := testutil.CollectAndCount(m.feature); n != 0 {
		t.Errorf("%d feature series after nil, want 0", n)
	}

	m.SetState(podsignal.Anomalous)
	m.SetState(podsignal.Unhealthy)
	for _, s := range states {
		want := 0.0
		if s == podsignal.Unhealthy {
			want = 1
		}
		if got := testutil.ToFloat64(m.state.WithLabelValues(string(s))); got != want {
			t.Errorf("state %s = %v, want %v", s, got, want)
		}
	}

	m.SignalSent(podsignal.Unhealthy)
	m.SignalSent("bogus")
	if got := testutil.ToFloat64(m.signalsSent.WithLabelValues("invalid")); got != 1 {
		t.Errorf("invalid signals = %v", got)
	}
	m.ObserveProbe(Result{OK: true, RTT: 3 * time.Millisecond})
	m.ObserveProbe(Result{Reason: "x"})
	if got := testutil.ToFloat64(m.probeUp); got != 0 {
		t.Errorf("probe_up = %v after a failure", got)
	}
	if got := testutil.ToFloat64(m.errors.WithLabelValues(ErrorKindProbe)); got != 1 {
		t.Errorf("probe errors = %v", got)
	}

	if n := testutil.CollectAndCount(m.memoryRef); n != 0 {
		t.Errorf("%d memory reference series before the target is read, want 0", n)
	}
	m.SetMemoryReference(Reference{Value: 100 << 20, Source: "container_limit"})
	m.SetMemoryReference(Reference{Value: 2 << 30, Source: "parent_limit"})
	if n := testutil.CollectAndCount(m.memoryRef); n != 1 || testutil.ToFloat64(m.memoryRef.WithLabelValues("parent_limit")) != 2<<30 {
		t.Errorf("%d memory reference series, want only parent_limit = 2 GiB", n)
	}
	m.SetCPUReference(Reference{Value: 1, Source: "one_core"})
	if got := testutil.ToFloat64(m.cpuRef.WithLabelValues("one_core")); got != 1 {
		t.Errorf("cpu reference = %v", got)
	}
}
