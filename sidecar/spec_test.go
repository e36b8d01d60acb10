package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
)

func TestNewRefusesAModelItCannotFeed(t *testing.T) {
	_, err := New(Config{Source: &loadSource{}, Interval: time.Minute, Model: p1Model(t)})
	if !errors.Is(err, model.ErrFeatureSpec) {
		t.Fatalf("error %v, want ErrFeatureSpec", err)
	}
}

// `amf-sidecar run` shows at start the pipeline its scores come from, and what
// is wrong with an older manifest.
func TestRunLogsTheFeatureSpecAtStart(t *testing.T) {
	for _, c := range []struct {
		name    string
		m       *model.Model
		want    map[string]any
		warning string
	}{
		{"embedded P1 model", p1Model(t), map[string]any{"rate_window": "5m", "deriv_window": "10m", "subquery_step": "5s",
			"lookback": "5m", "trained_sample_interval": "5s", "interval": "1s", "cpu_reference_fraction": 0.5}, ""},
		{"short-window model", modeltest.Edited(t, modeltest.Windows("1m", "2m", "1s", "30s", "1s")), map[string]any{"rate_window": "1m",
			"deriv_window": "2m", "subquery_step": "1s", "lookback": "30s", "trained_sample_interval": "1s"}, ""},
		{"older manifest", modeltest.Edited(t, func(man map[string]any) {
			man["schema_version"] = 1
			delete(man["feature_windows"].(map[string]any), "lookback")
		}), map[string]any{"lookback": "5m"}, "does not state the feature windows lookback"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			sc, err := New(Config{Source: &loadSource{}, Interval: time.Second, Model: c.m, Log: slog.New(slog.NewJSONHandler(&buf, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // start, log, stop
			if err := sc.Run(ctx); err != nil {
				t.Fatal(err)
			}
			var spec map[string]any
			var warned bool
			for line := range strings.Lines(buf.String()) {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				if rec["msg"] == "feature pipeline from the model's manifest" {
					spec = rec
				}
				if p, _ := rec["problem"].(string); c.warning != "" && rec["level"] == "WARN" && strings.Contains(p, c.warning) {
					warned = true
				}
			}
			if spec == nil {
				t.Fatalf("no feature pipeline line in the log:\n%s", buf.String())
			}
			for k, v := range c.want {
				if spec[k] != v {
					t.Errorf("logged %s = %v, want %v", k, spec[k], v)
				}
			}
			if c.warning != "" && !warned {
				t.Errorf("no warning saying %q in the log:\n%s", c.warning, buf.String())
			}
		})
	}
}
