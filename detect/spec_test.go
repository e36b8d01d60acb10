package detect

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
)

// The embedded model's spec is the published pipeline's: the model-less
// defaults of replay and sample (infer.DefaultConfig) compute what it scores.
func TestEmbeddedModelSpecIsThePublishedPipeline(t *testing.T) {
	fc, err := FeatureConfig(p1Model(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if fc != infer.DefaultConfig() {
		t.Fatalf("embedded model's pipeline %+v, infer.DefaultConfig %+v", fc, infer.DefaultConfig())
	}
}

func TestFeatureConfigComesFromTheManifest(t *testing.T) {
	short := modeltest.Edited(t, modeltest.Windows("1m", "2m", "1s", "30s", "1s"))
	v1 := modeltest.Edited(t, func(man map[string]any) { man["schema_version"] = 1; delete(man, "feature_windows") })
	cases := []struct {
		name     string
		m        *model.Model
		interval time.Duration
		want     [4]time.Duration // rate, deriv, step, lookback
		kind     error
		contains string
	}{
		{"P1 model at the default 1 s", p1Model(t), time.Second, [4]time.Duration{5 * time.Minute, 10 * time.Minute, 5 * time.Second, 5 * time.Minute}, nil, ""},
		{"P1 model at its training interval", p1Model(t), 5 * time.Second, [4]time.Duration{5 * time.Minute, 10 * time.Minute, 5 * time.Second, 5 * time.Minute}, nil, ""},
		{"short-window model gets its own windows", short, 500 * time.Millisecond, [4]time.Duration{time.Minute, 2 * time.Minute, time.Second, 30 * time.Second}, nil, ""},
		{"older manifest gets the P1 windows", v1, time.Second, [4]time.Duration{5 * time.Minute, 10 * time.Minute, 5 * time.Second, 5 * time.Minute}, nil, ""},
		{"sampling slower than training", p1Model(t), 10 * time.Second, [4]time.Duration{}, model.ErrFeatureSpec, "sampling every 10s is slower than the model's sample_interval 5s"},
		{"sampling slower than a short model's training", short, 2 * time.Second, [4]time.Duration{}, model.ErrFeatureSpec, "sample every 1s or faster"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fc, err := FeatureConfig(c.m, c.interval)
			if c.kind != nil {
				if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.contains) || !strings.Contains(err.Error(), c.m.Source()) {
					t.Fatalf("error %v, want %v naming the model and saying %q", err, c.kind, c.contains)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := [4]time.Duration{fc.RateWindow, fc.DerivWindow, fc.Step, fc.Lookback}; got != c.want {
				t.Fatalf("windows %v, want %v", got, c.want)
			}
		})
	}
}

// The manifest rules are the ones that make every feature defined: sampled at
// the sample interval, a spec at the limits (rate = 2 sample intervals, deriv =
// 2 steps) yields all six features once its windows have filled.
func TestSpecAtTheLimitsDefinesEveryFeature(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(map[string]any)
	}{
		{"rate of 2 samples, deriv of 2 steps", modeltest.Windows("10s", "10s", "5s", "5s", "5s")},
		{"sample interval not dividing the step", modeltest.Windows("6s", "4s", "2s", "4s", "3s")},
		{"lookback of one sample interval", modeltest.Windows("2s", "2s", "1s", "1s", "1s")},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := modeltest.Edited(t, c.edit)
			w := m.Windows()
			fc, err := FeatureConfig(m, w.SampleInterval)
			if err != nil {
				t.Fatal(err)
			}
			e, err := infer.NewEngine(fc)
			if err != nil {
				t.Fatal(err)
			}
			start := int64(1_700_000_000_123) // not aligned to any step
			iv := w.SampleInterval.Milliseconds()
			warm := (w.Rate + w.Deriv + w.SubqueryStep).Milliseconds()
			for ts := start; ts < start+warm+20*iv; ts += iv {
				k := float64(ts-start) / 1000
				if err := e.Add(infer.Sample{T: ts, CPUSeconds: k * 0.5, MemoryBytes: 1e6 + k*k, MemoryLimitBytes: 1e8, NetworkBytes: 10 * k, DiskBytes: 3 * k}); err != nil {
					t.Fatal(err)
				}
				v, err := e.Eval(ts)
				if err != nil {
					t.Fatal(err)
				}
				if ts < start+warm {
					continue
				}
				for i, why := range v.Why {
					if why != infer.Defined {
						t.Fatalf("at +%d ms %s undefined: %v", ts-start, contract.FeatureNames()[i], why)
					}
				}
			}
		})
	}
}
