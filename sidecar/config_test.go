package sidecar

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/statehub"
)

// TestValidateNeedsATargetAModelAndAnIntervalTheModelRunsAt: the interval
// defaults to 1 s, and the model's windows must be computable at it.
func TestValidateNeedsATargetAModelAndAnIntervalTheModelRunsAt(t *testing.T) {
	m := p1Model(t) // sample_interval 5s
	find := func(context.Context) (detect.Source, error) { return nil, errors.New("not yet") }
	hub := &statehub.Client{URL: "http://127.0.0.1:1886"}
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // in the error; "" passes
	}{
		{"a target, the interval defaulted", Config{Source: &loadSource{}, Model: m}, ""},
		{"a way to find the target", Config{Rediscover: find, TargetError: "not yet", Model: m, Interval: 5 * time.Second}, ""},
		{"no target", Config{Model: m}, "a target (or a way to find it) and a model are required"},
		{"no model", Config{Source: &loadSource{}}, "a target (or a way to find it) and a model are required"},
		{"an interval slower than the model's", Config{Source: &loadSource{}, Model: m, Interval: 10 * time.Second}, "sample_interval 5s"},
		{"a state carried, snapshots rate-bound", Config{Source: &loadSource{}, Model: m, State: &StateConfig{Hub: hub, SnapshotEvery: time.Second, SnapshotRate: 1 << 20}}, ""},
		{"a state carried without a hub", Config{Source: &loadSource{}, Model: m, State: &StateConfig{}}, "State.Hub is required"},
		{"a negative snapshot interval", Config{Source: &loadSource{}, Model: m, State: &StateConfig{Hub: hub, SnapshotEvery: -time.Second}}, "SnapshotEvery -1s is negative"},
		{"a negative snapshot rate", Config{Source: &loadSource{}, Model: m, State: &StateConfig{Hub: hub, SnapshotRate: -1}}, "SnapshotRate -1 bytes/s is negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if strings.Contains(tt.want, "sample_interval") && !errors.Is(err, model.ErrFeatureSpec) {
				t.Errorf("error %v, want ErrFeatureSpec", err)
			}
			if _, nerr := New(tt.cfg); (nerr == nil) != (err == nil) {
				t.Errorf("New: %v, Validate: %v; want both to pass or both to refuse", nerr, err)
			}
		})
	}
}
