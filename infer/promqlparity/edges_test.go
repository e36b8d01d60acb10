package promqlparity

import (
	"math"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer"
)

var nan = math.NaN()

// b is a time on a multiple of every step used below (1.7e12 ms).
const b = int64(1_700_000_000_000)

// smp is a sample at t with a 100 MiB limit; NaN = the series has no point at t.
func smp(t int64, cpu, mem, net, disk float64) event {
	limit := float64(defaultLimit)
	if math.IsNaN(mem) {
		limit = nan
	}
	return event{t: t, sample: infer.Sample{T: t, CPUSeconds: cpu, MemoryBytes: mem, MemoryLimitBytes: limit, NetworkBytes: net, DiskBytes: disk}}
}

// evalAt is an evaluation alone at t.
func evalAt(t int64) event { return event{evalOnly: true, t: t} }

// regular returns samples every interval ms from start, n of them, with counters
// growing by inc per sample and memory by memInc.
func regular(start, interval int64, n int, cpu0, inc, mem0, memInc float64) []event {
	var out []event
	for i := range n {
		f := float64(i)
		out = append(out, smp(start+int64(i)*interval, cpu0+f*inc, mem0+f*memInc, 1000+f*inc*1e6, 50+f*inc*1e3))
	}
	return out
}

func concat(parts ...[]event) []event {
	var out []event
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// small windows: every edge is a few samples away.
var small = windows{rate: 10 * time.Second, deriv: 20 * time.Second, step: 5 * time.Second, lookback: 15 * time.Second}

// TestEdgeCasesMatchPrometheus pins hand-made cases at the edges of the windows.
func TestEdgeCasesMatchPrometheus(t *testing.T) {
	cases := []struct {
		name   string
		w      windows
		events []event
	}{
		{
			name:   "rate_window_is_left_open_sample_exactly_R_old_is_excluded",
			w:      small,
			events: regular(b, 5000, 5, 10, 1, 50*mib, 4096),
		},
		{
			name:   "one_sample_in_the_rate_window_is_undefined",
			w:      small,
			events: []event{smp(b, 1, mib, 1, 1), smp(b+20_000, 2, mib, 2, 2), evalAt(b + 20_001)},
		},
		{
			name: "gauge_exactly_lookback_old_is_gone_one_ms_younger_is_kept",
			w:    small,
			events: []event{smp(b, 1, 10*mib, 1, 1), evalAt(b + 14_999), evalAt(b + 15_000),
				smp(b+15_001, 2, 11*mib, 2, 2), evalAt(b + 30_000), evalAt(b + 30_001)},
		},
		{
			name:   "evaluations_before_the_first_sample_are_undefined",
			w:      small,
			events: concat([]event{evalAt(b - 60_000), evalAt(b - 5000), evalAt(b - 1)}, regular(b, 1000, 30, 5, 0.5, 20*mib, 1000)),
		},
		{
			name: "counter_reset_to_zero_inside_the_window_adds_the_value_before_it",
			w:    small,
			events: []event{smp(b, 10, mib, 5000, 700), smp(b+2000, 11, mib, 6000, 800), smp(b+4000, 0, mib, 100, 0),
				smp(b+6000, 1, mib, 200, 100), smp(b+8000, 0.5, mib, 150, 50), smp(b+10_000, 1.5, mib, 250, 150)},
		},
		{
			name:   "counter_starting_near_zero_is_not_extrapolated_below_zero",
			w:      small,
			events: regular(b+1500, 1000, 20, 0.1, 0.9, 0, 1),
		},
		{
			name:   "subquery_step_on_a_sample_time_sees_that_sample",
			w:      small,
			events: regular(b, 5000, 12, 3, 2, 30*mib, 1<<16),
		},
		{
			name:   "subquery_steps_between_one_ms_jittered_samples",
			w:      small,
			events: regular(b+1, 5000, 12, 3, 2, 30*mib, 1<<16),
		},
		{
			name: "deriv_needs_two_subquery_points",
			w:    small,
			events: []event{smp(b+1, 1, 5*mib, 1, 1), evalAt(b + 5000), evalAt(b + 9999), evalAt(b + 10_000),
				smp(b+10_001, 2, 6*mib, 2, 2), evalAt(b + 15_000)},
		},
		{
			name:   "constant_series_give_zero_rates_and_zero_slopes",
			w:      small,
			events: regular(b+333, 1000, 40, 7, 0, 42*mib, 0),
		},
		{
			name: "only_network_present_others_undefined",
			w:    small,
			events: []event{smp(b, nan, nan, 1e6, nan), smp(b+1000, nan, nan, 2e6, nan), smp(b+2000, nan, nan, 2.5e6, nan),
				evalAt(b + 5000)},
		},
		{
			name: "sample_with_every_series_missing_only_moves_time",
			w:    small,
			events: concat(regular(b, 1000, 10, 1, 1, mib, 1), []event{smp(b+9500, nan, nan, nan, nan)},
				regular(b+10_000, 1000, 10, 11, 1, 11*mib, 1)),
		},
		{
			name: "gap_longer_than_every_window_then_samples_resume",
			w:    small,
			events: concat(regular(b, 1000, 30, 1, 1, mib, 4096), []event{evalAt(b + 45_000), evalAt(b + 3_600_000)},
				regular(b+3_600_500, 1000, 30, 100, 1, 2*mib, -4096)),
		},
		{
			name:   "published_windows_first_minutes_of_a_container",
			w:      windowSets[0],
			events: regular(b+250, 1000, 700, 0, 0.25, 8*mib, 512),
		},
		{
			name:   "windows_not_whole_seconds",
			w:      windows{rate: 2500 * time.Millisecond, deriv: 7300 * time.Millisecond, step: 1500 * time.Millisecond, lookback: 3100 * time.Millisecond},
			events: concat(regular(b+7, 700, 40, 1, 0.3, mib, 100), regular(b+40_000, 2900, 10, 20, 0.3, mib, -50)),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out := compareRun(t, c.w, c.w.queries(), c.events)
			report(t, out, c.w.String())
		})
	}
}
