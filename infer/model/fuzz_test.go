package model

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
)

// FuzzLoad feeds arbitrary model text and manifests to Load. With fixSHA
// the manifest is the default one carrying the input's sha256, so the
// fuzzer reaches the text validator and leaves. Load must never panic; a
// model it accepts must score every probe in [0, 1], and its feature spec
// must obey the rules (Windows.Check) and be what its manifest says.
//
// Seeds live in testdata/fuzz/FuzzLoad (run as regression cases by plain
// `go test`). Fuzz with: go test ./infer/model/ -run '^$' -fuzz FuzzLoad -fuzztime 30s
func FuzzLoad(f *testing.F) {
	mb, jb := p1Bytes(f)
	f.Add([]byte(tinyModel), []byte(nil), true)
	f.Add(mb[:2048], jb, false)
	f.Add([]byte("tree\nversion=v3\n"), []byte("{}"), true)
	tiny := []byte(tinyModel)
	f.Add(tiny, manifestFor(f, tiny, func(m map[string]any) {
		m["schema_version"] = 1
		delete(m["feature_windows"].(map[string]any), "lookback")
	}), false)
	f.Add(tiny, manifestFor(f, tiny, func(m map[string]any) {
		m["feature_windows"].(map[string]any)["deriv_window"] = "7s"
	}), false)
	// The predict_linear detector: its files, and its manifest over another text.
	pt, pm, err := EmbeddedFiles(PredictLinearName)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(pt, pm, false)
	f.Add(tiny, pm, false)
	f.Fuzz(func(t *testing.T, model, manifest []byte, fixSHA bool) {
		if fixSHA {
			manifest = manifestFor(t, model, nil)
		}
		m, err := Load(model, manifest)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || le.Kind == nil || err.Error() == "" {
				t.Fatalf("error %T %q is not a *LoadError with a kind", err, err)
			}
			if m != nil {
				t.Fatal("model and error both returned")
			}
			return
		}
		nan := math.NaN()
		for _, x := range [][contract.NumFeatures]float64{{}, {nan, nan, nan, nan, nan, nan}, {1e300, -1e300, 5, 80, 80.0000001, -3}} {
			if m.Rule() != "" {
				// A rule scores the projection: 0.5 at the limit, 0 without one.
				if p := m.ScoreSample(&x, 100); p != 0.5 || m.ScoreSample(&x, nan) != 0 {
					t.Fatalf("rule %q scores 100 %% as %v", m.Rule(), p)
				}
				continue
			}
			if p := m.Score(&x); !(p >= 0 && p <= 1) {
				t.Fatalf("score %v for %v", p, x)
			}
			// An explanation, where the text allows one, adds up to the raw score.
			if e, err := m.Explain(&x); err == nil {
				if r := m.Raw(&x); !(math.Abs(e.Raw()-r) <= 1e-9*math.Max(1, math.Abs(r))) {
					t.Fatalf("bias + contributions %v, raw %v for %v", e.Raw(), r, x)
				}
			} else if !errors.Is(err, ErrNoExplanation) {
				t.Fatalf("Explain: %v", err)
			}
		}
		w := m.Windows()
		if err := w.Check(); err != nil {
			t.Fatalf("accepted windows the rules refuse: %v", err)
		}
		if got, err := m.Manifest().FeatureWindows.Parse(); err != nil || got != w {
			t.Fatalf("manifest windows %+v parse to %+v, %v; the model uses %+v", m.Manifest().FeatureWindows, got, err, w)
		}
		if err := w.CheckInterval(w.SampleInterval); err != nil {
			t.Fatalf("sampling at the model's own interval refused: %v", err)
		}
	})
}

// FuzzFeatureWindows feeds arbitrary window strings to the parser. It must
// never panic, and whatever it accepts the feature engine must be able to
// compute: the loader's rules are at least as strict as infer.Config's.
//
// Seeds live in testdata/fuzz/FuzzFeatureWindows. Fuzz with:
// go test ./infer/model/ -run '^$' -fuzz FuzzFeatureWindows -fuzztime 30s
func FuzzFeatureWindows(f *testing.F) {
	f.Add("5m", "10m", "5s", "5m", "5s")
	f.Add("1m", "2m", "1s", "1m", "1s")
	f.Add("5m", "7s", "5s", "5m", "5s")
	f.Add("1.5s", "3s", "1500ms", "3s", "500us")
	f.Add("24h", "24h", "1h", "24h0m0s", "12h")
	f.Add("-5m", "1d", "0", "", "+5s")
	f.Fuzz(func(t *testing.T, rate, deriv, step, lookback, sample string) {
		w, err := FeatureWindows{rate, deriv, step, lookback, sample}.Parse()
		if err != nil {
			if !errors.Is(err, ErrFeatureSpec) {
				t.Fatalf("error %v is not ErrFeatureSpec", err)
			}
			return
		}
		cfg := infer.Config{RateWindow: w.Rate, DerivWindow: w.Deriv, Step: w.SubqueryStep, Lookback: w.Lookback, MemoryReference: infer.DefaultMemoryReference}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted %+v, which the feature engine refuses: %v", w, err)
		}
		if w.Deriv < 2*w.SubqueryStep || w.Rate < 2*w.SampleInterval || w.Lookback < w.SampleInterval || w.Rate%w.SubqueryStep != 0 || w.Rate > 24*time.Hour {
			t.Fatalf("accepted %+v against the rules", w)
		}
		if again, err := w.Format().Parse(); err != nil || again != w {
			t.Fatalf("%+v formats as %+v, which parses to %+v, %v", w, w.Format(), again, err)
		}
	})
}
