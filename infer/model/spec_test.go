package model

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// p1 returns the P1 windows with edit applied.
func p1(edit func(*Windows)) Windows {
	w := P1Windows()
	if edit != nil {
		edit(&w)
	}
	return w
}

func TestWindowsCheck(t *testing.T) {
	cases := []struct {
		name     string
		w        Windows
		contains string // "" = accepted
	}{
		{"P1 pipeline is computable", p1(nil), ""},
		{"short windows for a lead-time model", Windows{Rate: time.Minute, Deriv: 2 * time.Minute, SubqueryStep: time.Second, Lookback: time.Minute, SampleInterval: time.Second}, ""},
		{"rate of exactly 2 sample intervals", p1(func(w *Windows) { w.Rate = 10 * time.Second }), ""},
		{"deriv of exactly 2 steps", p1(func(w *Windows) { w.Deriv = 10 * time.Second }), ""},
		{"sample interval need not divide the step", p1(func(w *Windows) { w.SampleInterval = 3 * time.Second }), ""},
		{"a day is the longest window", p1(func(w *Windows) { w.Rate = MaxWindow; w.Lookback = MaxWindow }), ""},
		{"zero step", p1(func(w *Windows) { w.SubqueryStep = 0 }), "subquery_step 0s is not a positive"},
		{"negative lookback", p1(func(w *Windows) { w.Lookback = -time.Minute }), "lookback -1m is not a positive"},
		{"sub-millisecond sample interval", p1(func(w *Windows) { w.SampleInterval = 1500 * time.Microsecond }), "sample_interval 1.5ms is not a positive whole number of milliseconds"},
		{"longer than a day", p1(func(w *Windows) { w.Rate = 25 * time.Hour }), "rate_window 25h is longer than 24h"},
		{"rate not a multiple of the step", p1(func(w *Windows) { w.Rate = 302 * time.Second }), "rate_window 5m2s is not a whole multiple of subquery_step 5s"},
		{"deriv not a multiple of the step", p1(func(w *Windows) { w.Deriv = 7 * time.Second }), "deriv_window 7s is not a whole multiple"},
		{"lookback not a multiple of the step", p1(func(w *Windows) { w.Lookback = 62 * time.Second }), "lookback 1m2s is not a whole multiple"},
		{"deriv of one step", p1(func(w *Windows) { w.Deriv = 5 * time.Second }), "fewer than 2 subquery steps"},
		{"deriv of too many steps", p1(func(w *Windows) {
			w.SubqueryStep = time.Millisecond
			w.Rate = time.Minute
			w.Lookback = time.Minute
			w.SampleInterval = time.Second
		}), "more than 10000"},
		{"rate under 2 sample intervals", p1(func(w *Windows) { w.Rate = 5 * time.Second }), "shorter than 2 sample intervals of 5s"},
		{"rate under 2 slow sample intervals", p1(func(w *Windows) { w.SampleInterval = 3 * time.Minute; w.Lookback = 3 * time.Minute }), "rate_window 5m is shorter than 2 sample intervals of 3m"},
		{"lookback under a sample interval", p1(func(w *Windows) { w.Lookback = 5 * time.Second; w.SampleInterval = 10 * time.Second }), "lookback 5s is shorter than the sample_interval 10s"},
		{"lookback of exactly one sample interval", p1(func(w *Windows) { w.Lookback = 5 * time.Second }), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.w.Check()
			if c.contains == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrFeatureSpec) {
				t.Fatalf("error %v, want ErrFeatureSpec", err)
			}
			if !strings.Contains(err.Error(), c.contains) {
				t.Fatalf("error %q does not say %q", err, c.contains)
			}
		})
	}
}

func TestCheckIntervalAllowsFasterSamplingOnly(t *testing.T) {
	w := P1Windows()
	cases := []struct {
		name     string
		interval time.Duration
		contains string
	}{
		{"the sidecar's 1 s default", time.Second, ""},
		{"the training interval itself", 5 * time.Second, ""},
		{"much finer", 10 * time.Millisecond, ""},
		{"slower than training", 10 * time.Second, "sampling every 10s is slower than the model's sample_interval 5s"},
		{"zero", 0, "not positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := w.CheckInterval(c.interval)
			if c.contains == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrFeatureSpec) || !strings.Contains(err.Error(), c.contains) {
				t.Fatalf("error %v, want ErrFeatureSpec saying %q", err, c.contains)
			}
		})
	}
}

func TestWindowsFormatRoundTrips(t *testing.T) {
	for _, w := range []Windows{P1Windows(), {Rate: 90 * time.Minute, Deriv: time.Hour, SubqueryStep: 500 * time.Millisecond, Lookback: time.Hour, SampleInterval: 250 * time.Millisecond}} {
		f := w.Format()
		got, err := f.Parse()
		if err != nil || got != w {
			t.Fatalf("%+v -> %+v -> %+v, %v", w, f, got, err)
		}
	}
	if f := P1Windows().Format(); f != (FeatureWindows{"5m", "10m", "5s", "5m", "5s"}) {
		t.Fatalf("P1 formats as %+v", f)
	}
}

// The feature spec of a manifest is validated at load, with the manifest named
// in the error.
func TestLoadRejectsFeatureSpecs(t *testing.T) {
	mb, _ := p1Bytes(t)
	windows := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) {
			fw := m["feature_windows"].(map[string]any)
			if v == nil {
				delete(fw, key)
				return
			}
			fw[key] = v
		}
	}
	cases := []struct {
		name     string
		edit     func(map[string]any)
		kind     error
		contains string
	}{
		{"unknown feature name", func(m map[string]any) {
			m["feature_names"] = []string{"cpu_percent", "memory_percent", "network_io_bytes_per_sec", "disk_io_bytes_per_sec", "cpu_growth_rate", "swap_percent"}
		}, ErrFeatures, `feature 5 is "swap_percent"`},
		{"features in another order", func(m map[string]any) {
			m["feature_names"] = []string{"cpu_percent", "memory_percent", "disk_io_bytes_per_sec", "network_io_bytes_per_sec", "cpu_growth_rate", "memory_growth_rate"}
		}, ErrFeatures, "feature 2"},
		{"schema 2 without lookback", windows("lookback", nil), ErrFeatureSpec, "feature_windows does not state lookback"},
		{"schema 2 without feature windows", func(m map[string]any) { delete(m, "feature_windows") }, ErrFeatureSpec, "does not state rate_window, deriv_window, subquery_step, lookback, sample_interval"},
		{"unknown window", windows("smoothing_window", "1m"), ErrFeatureSpec, `unknown field "smoothing_window"`},
		{"window as a number", windows("rate_window", 300), ErrFeatureSpec, "feature_windows"},
		{"Prometheus day unit", windows("rate_window", "1d"), ErrFeatureSpec, `rate_window "1d" is not a positive duration`},
		{"deriv not a multiple of the step", windows("deriv_window", "7s"), ErrFeatureSpec, "deriv_window 7s is not a whole multiple of subquery_step 5s"},
		{"deriv shorter than 2 steps", windows("deriv_window", "5s"), ErrFeatureSpec, "fewer than 2 subquery steps"},
		{"rate shorter than 2 sample intervals", windows("rate_window", "5s"), ErrFeatureSpec, "shorter than 2 sample intervals"},
		{"lookback shorter than a sample interval", windows("sample_interval", "10m"), ErrFeatureSpec, "lookback 5m is shorter than the sample_interval 10m"},
		{"unsupported normalisation method", func(m map[string]any) {
			m["normalisation"].(map[string]any)["method"] = "zscore"
		}, ErrFeatureSpec, "supports only cpu_reference_fraction and memory_reference_fraction"},
		{"normalisation missing", func(m map[string]any) { delete(m, "normalisation") }, ErrFeatureSpec, "cpu_reference_fraction 0 is not in (0, 10]"},
		{"normalisation too large", func(m map[string]any) {
			m["normalisation"].(map[string]any)["cpu_reference_fraction"] = 11
		}, ErrFeatureSpec, "cpu_reference_fraction 11"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Load(mb, manifestFor(t, mb, c.edit))
			if err == nil {
				t.Fatalf("loaded with windows %v, want an error", m.Windows())
			}
			var le *LoadError
			if !errors.As(err, &le) || !errors.Is(err, c.kind) {
				t.Fatalf("error %T %v, want a *LoadError of kind %v", err, err, c.kind)
			}
			if !strings.Contains(err.Error(), c.contains) || !strings.Contains(le.Detail, "manifest") {
				t.Fatalf("error %q does not name the manifest or say %q", err, c.contains)
			}
		})
	}
}

// Manifests written before the feature spec was complete (schema 1) still
// load: what they do not state is the P1 pipeline's, and the model says so.
func TestOlderManifestsLoadWithP1WindowsAndAWarning(t *testing.T) {
	mb, _ := p1Bytes(t)
	v1 := func(edit func(fw map[string]any)) func(map[string]any) {
		return func(m map[string]any) {
			m["schema_version"] = 1
			if edit == nil {
				delete(m, "feature_windows")
				return
			}
			edit(m["feature_windows"].(map[string]any))
		}
	}
	cases := []struct {
		name    string
		edit    func(map[string]any)
		want    Windows
		warning string // "" = no warning
	}{
		{"schema 1 as amftrain.py wrote it (no lookback)", v1(func(fw map[string]any) { delete(fw, "lookback") }), P1Windows(), "does not state the feature windows lookback; assuming the P1 pipeline's lookback 5m"},
		{"schema 1 without feature windows", v1(nil), P1Windows(), "rate_window 5m, deriv_window 10m, subquery_step 5s, lookback 5m, sample_interval 5s"},
		{"schema 1 keeps the windows it states", v1(func(fw map[string]any) { delete(fw, "lookback"); fw["rate_window"] = "1m" }), p1(func(w *Windows) { w.Rate = time.Minute }), "lookback"},
		{"schema 1 with a full spec needs no warning", v1(func(map[string]any) {}), P1Windows(), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Load(mb, manifestFor(t, mb, c.edit))
			if err != nil {
				t.Fatal(err)
			}
			if m.Windows() != c.want {
				t.Fatalf("windows %v, want %v", m.Windows(), c.want)
			}
			if got := m.Manifest().FeatureWindows; got != c.want.Format() {
				t.Fatalf("manifest windows %+v, want the assumed ones %+v", got, c.want.Format())
			}
			ws := m.Warnings()
			if c.warning == "" {
				if len(ws) != 0 {
					t.Fatalf("warnings %q, want none", ws)
				}
				return
			}
			if len(ws) != 1 || !strings.Contains(ws[0], c.warning) || !strings.Contains(ws[0], "re-export") && !strings.Contains(ws[0], "Re-export") {
				t.Fatalf("warnings %q, want one saying %q and what to do", ws, c.warning)
			}
		})
	}
	t.Run("schema 1 still refuses windows it states wrongly", func(t *testing.T) {
		_, err := Load(mb, manifestFor(t, mb, v1(func(fw map[string]any) { fw["deriv_window"] = "7s" })))
		if !errors.Is(err, ErrFeatureSpec) {
			t.Fatalf("error %v, want ErrFeatureSpec", err)
		}
	})
}

// The warning names the manifest file, so an operator knows which to re-export.
func TestOlderManifestWarningNamesTheFile(t *testing.T) {
	mb, _ := p1Bytes(t)
	dir := t.TempDir()
	path := dir + "/old.txt"
	writeFile(t, path, mb)
	writeFile(t, dir+"/old.manifest.json", manifestFor(t, mb, func(m map[string]any) {
		m["schema_version"] = 1
		delete(m["feature_windows"].(map[string]any), "lookback")
	}))
	m, err := LoadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	if ws := m.Warnings(); len(ws) != 1 || !strings.Contains(ws[0], dir+"/old.manifest.json") {
		t.Fatalf("warnings %q do not name %s", ws, dir+"/old.manifest.json")
	}
}
