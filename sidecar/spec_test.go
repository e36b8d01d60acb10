package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer/model"
)

// modelWith loads the embedded default model's trees with its manifest edited:
// the same scores, another feature spec.
func modelWith(t *testing.T, edit func(man map[string]any)) *model.Model {
	t.Helper()
	mb, jb, err := model.EmbeddedFiles(model.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	var man map[string]any
	if err := json.Unmarshal(jb, &man); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(mb)
	man["model_sha256"] = hex.EncodeToString(sum[:])
	edit(man)
	if jb, err = json.Marshal(man); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(mb, jb)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func setWindows(rate, deriv, step, lookback, sample string) func(map[string]any) {
	return func(man map[string]any) {
		man["feature_windows"] = map[string]any{"rate_window": rate, "deriv_window": deriv,
			"subquery_step": step, "lookback": lookback, "sample_interval": sample}
	}
}

func TestNewRefusesAModelItCannotFeed(t *testing.T) {
	_, err := New(Config{Source: &loadSource{}, Interval: time.Minute, Model: defaultModel(t)})
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
		{"embedded P1 model", defaultModel(t), map[string]any{"rate_window": "5m", "deriv_window": "10m", "subquery_step": "5s",
			"lookback": "5m", "trained_sample_interval": "5s", "interval": "1s", "cpu_reference_fraction": 0.5}, ""},
		{"short-window model", modelWith(t, setWindows("1m", "2m", "1s", "30s", "1s")), map[string]any{"rate_window": "1m",
			"deriv_window": "2m", "subquery_step": "1s", "lookback": "30s", "trained_sample_interval": "1s"}, ""},
		{"older manifest", modelWith(t, func(man map[string]any) {
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
