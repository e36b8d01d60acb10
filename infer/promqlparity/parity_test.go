package promqlparity

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// -seed (or AMF_PARITY_SEED) replaces the fixed seeds, to explore:
//
//	go test -run TestFeaturesMatchPrometheus -seed=12345 -v
var seedFlag = flag.Uint64("seed", 0, "run the randomised comparisons with this seed instead of the fixed ones")

// fixedSeeds are the seeds run every time.
var fixedSeeds = []uint64{1, 20240917}

func seeds(t *testing.T) []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	if s := os.Getenv("AMF_PARITY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("AMF_PARITY_SEED=%q: %v", s, err)
		}
		return []uint64{n}
	}
	return fixedSeeds
}

// scenarios: each name says the behaviour of the series it generates.
var scenarios = []struct {
	name string
	sc   scenario
	// windows restricts the run to these entries of windowSets (nil: all).
	windows []int
}{
	{
		name: "regular_1s_on_whole_seconds_samples_on_window_edges",
		sc:   scenario{interval: time.Second, duration: 31 * time.Minute, wholeSecondStart: true},
	},
	{
		name: "jittered_1s_fractional_start_with_skipped_scrapes",
		sc: scenario{interval: time.Second, jitter: 150 * time.Millisecond, duration: 32 * time.Minute,
			pSkip: 0.03, pMissing: 0.02, pReset: 0.0005, pExtraEval: 0.02, pNoEval: 0.2},
	},
	{
		name: "jittered_5s_with_gaps_longer_than_lookback",
		sc: scenario{interval: 5 * time.Second, jitter: time.Second, duration: 60 * time.Minute,
			pSkip: 0.05, pLongGap: 0.01, longGap: [2]time.Duration{5*time.Minute + time.Second, 13 * time.Minute},
			pMissing: 0.02, pReset: 0.002, pExtraEval: 0.1},
	},
	{
		name: "partial_samples_most_series_missing_often",
		sc: scenario{interval: time.Second, jitter: 300 * time.Millisecond, duration: 30 * time.Minute,
			pMissing: 0.4, pExtraEval: 0.02, pNoEval: 0.5},
		windows: []int{0, 2},
	},
	{
		name: "frequent_counter_resets",
		sc: scenario{interval: 5 * time.Second, jitter: 500 * time.Millisecond, duration: 45 * time.Minute,
			pReset: 0.03, pNoEval: 0.5},
	},
	{
		name: "constant_series_rates_and_slopes_zero",
		sc: scenario{interval: 5 * time.Second, jitter: 40 * time.Millisecond, duration: 30 * time.Minute,
			constant: true, pSkip: 0.02, pMissing: 0.05},
	},
	{
		name: "samples_and_evaluations_on_step_boundaries",
		sc: scenario{interval: time.Second, jitter: 500 * time.Millisecond, duration: 30 * time.Minute,
			pAlignToStep: 0.3, pExtraEval: 0.1},
		windows: []int{0, 2},
	},
	{
		name: "sparse_15s_scrapes_several_steps_per_sample_gaps_up_to_hours",
		sc: scenario{interval: 15 * time.Second, jitter: 2 * time.Second, duration: 90 * time.Minute,
			pSkip: 0.05, pLongGap: 0.01, longGap: [2]time.Duration{4 * time.Minute, 3 * time.Hour},
			pMissing: 0.05, pReset: 0.005, pExtraEval: 0.3},
	},
	{
		name: "no_memory_limit_divides_by_the_memory_reference",
		sc: scenario{interval: 5 * time.Second, jitter: time.Second, duration: 30 * time.Minute,
			noLimit: true, pSkip: 0.05, pMissing: 0.05, pExtraEval: 0.05},
		windows: []int{0},
	},
}

// TestFeaturesMatchPrometheus compares infer.Engine with Prometheus' own engine over
// randomised series, at every sample time (but for samples a scenario adds without
// evaluating) and at evaluation-only times in between.
func TestFeaturesMatchPrometheus(t *testing.T) {
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			for wi, w := range windowSets {
				if s.windows != nil && !contains(s.windows, wi) {
					continue
				}
				for _, seed := range seeds(t) {
					t.Run(fmt.Sprintf("%s/seed=%d", w, seed), func(t *testing.T) {
						t.Parallel()
						events := generate(seed, s.sc, w.step, []time.Duration{w.rate, w.deriv, w.lookback})
						qs := w.queries()
						if s.sc.noLimit {
							qs = w.queriesNoLimit()
						}
						out := compareRun(t, w, qs, events)
						t.Logf("%d evaluations, %d defined values, max relative error %.3g", out.evals, out.defined, out.maxRelErr)
						report(t, out, fmt.Sprintf("seed %d; reproduce: go test -run '%s' -seed=%d -v", seed, t.Name(), seed))
					})
				}
			}
		})
	}
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
