package promqlparity

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"

	"github.com/amf-edge/amf/infer"
)

// projection is one predict_linear configuration: W and H of
// predict_linear(memory_bytes[W], H).
type projection struct {
	window, horizon time.Duration
}

// projections are compared under the published feature windows; the windows
// differ from the lookback on purpose (shorter, equal, longer), so that the
// left-open range and the limit's lookback are both exercised.
var projections = []projection{
	{window: 30 * time.Second, horizon: 60 * time.Second},
	{window: 2 * time.Minute, horizon: 30 * time.Second},
	{window: 5 * time.Minute, horizon: 0},
	{window: 7 * time.Minute, horizon: 120 * time.Second},
}

// queries is the PromQL that defines Vector.Projection: the projection, and
// its line's slope.
func (p projection) queries(limit string) [2]string {
	return [2]string{
		fmt.Sprintf("predict_linear(%s[%s], %s) / %s * 100", memName, promDuration(p.window),
			strconv.FormatFloat(p.horizon.Seconds(), 'f', -1, 64), limit),
		fmt.Sprintf("deriv(%s[%s]) / %s * 100", memName, promDuration(p.window), limit),
	}
}

// TestProjectionMatchesPrometheus compares infer's projection with Prometheus'
// predict_linear over the randomised series of the feature scenarios that
// vary memory and its limit (gaps, missing points, no limit).
func TestProjectionMatchesPrometheus(t *testing.T) {
	names := map[string]bool{
		"jittered_1s_fractional_start_with_skipped_scrapes":            true,
		"jittered_5s_with_gaps_longer_than_lookback":                   true,
		"constant_series_rates_and_slopes_zero":                        true,
		"sparse_15s_scrapes_several_steps_per_sample_gaps_up_to_hours": true,
		"no_memory_limit_divides_by_the_memory_reference":              true,
	}
	w := windowSets[0]
	for _, s := range scenarios {
		if !names[s.name] {
			continue
		}
		for _, p := range projections {
			for _, seed := range seeds(t) {
				t.Run(fmt.Sprintf("%s/W=%s,H=%s/seed=%d", s.name, promDuration(p.window), promDuration(p.horizon), seed), func(t *testing.T) {
					t.Parallel()
					events := generate(seed, s.sc, w.step, []time.Duration{p.window, w.lookback})
					cfg := w.config()
					cfg.PredictWindow, cfg.PredictHorizon = p.window, p.horizon
					limit := limitName
					if s.sc.noLimit {
						limit = strconv.FormatFloat(cfg.MemoryReference, 'f', -1, 64)
					}
					compareProjection(t, cfg, p.queries(limit), events)
				})
			}
		}
	}
}

func compareProjection(t *testing.T, cfg infer.Config, qs [2]string, events []event) {
	t.Helper()
	eng, err := infer.NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := loadPrometheus(t, events)
	pe := newPromEngine(cfg.Lookback)
	ctx := context.Background()
	var evals, defined, bad int
	maxRel := 0.0
	for k, e := range events {
		if !e.evalOnly {
			if err := eng.Add(e.sample); err != nil {
				t.Fatalf("event %d: %v", k, err)
			}
			if e.noEval {
				continue
			}
		}
		v, err := eng.Eval(e.t)
		if err != nil {
			t.Fatalf("event %d: %v", k, err)
		}
		evals++
		for j, ours := range [2]float64{v.Projection.MemoryPercent, v.Projection.PercentPerSecond} {
			q := qs[j]
			p, err := promInstant(ctx, pe, db, q, e.t)
			if err != nil {
				t.Fatalf("event %d: %v", k, err)
			}
			var msg string
			switch {
			case !p.ok && v.Projection.Why == infer.Defined:
				msg = fmt.Sprintf("prometheus: no sample; infer: %v", ours)
			case !p.ok && !math.IsNaN(ours):
				msg = fmt.Sprintf("both undefined, but infer's value is %v", ours)
			case p.ok && v.Projection.Why != infer.Defined:
				msg = fmt.Sprintf("prometheus: %v; infer: undefined (%v)", p.v, v.Projection.Why)
			case p.ok && relErr(ours, p.v) > relTolerance:
				msg = fmt.Sprintf("prometheus: %v; infer: %v (relative error %.3g)", p.v, ours, relErr(ours, p.v))
			case p.ok:
				defined++
				maxRel = max(maxRel, relErr(ours, p.v))
			}
			if msg != "" {
				bad++
				if bad <= maxReported {
					t.Errorf("t=%d (event %d, %s): %s: %s", e.t, k, kind(e), q, msg)
				}
			}
		}
	}
	if defined == 0 {
		t.Fatalf("%v: no defined value in %d evaluations: the comparison proves nothing", qs, evals)
	}
	t.Logf("%v: %d evaluations, %d defined values, %d differ, max relative error %.3g", qs, evals, defined, bad, maxRel)
}

// promInstant runs one instant query that returns at most one float sample.
func promInstant(ctx context.Context, eng *promql.Engine, db storage.Queryable, q string, ts int64) (promResult, error) {
	qry, err := eng.NewInstantQuery(ctx, db, nil, q, time.UnixMilli(ts))
	if err != nil {
		return promResult{}, fmt.Errorf("%s: %w", q, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return promResult{}, fmt.Errorf("%s at %d: %w", q, ts, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		return promResult{}, fmt.Errorf("%s at %d: %w", q, ts, err)
	}
	switch {
	case len(vec) == 0:
		return promResult{}, nil
	case len(vec) > 1 || vec[0].H != nil:
		return promResult{}, fmt.Errorf("%s at %d: %d series (or a histogram), want one float", q, ts, len(vec))
	}
	return promResult{v: vec[0].F, ok: true}, nil
}
