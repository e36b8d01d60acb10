package model

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/amf-edge/amf/contract"
)

// The predict_linear detector is the rule an operator writes instead of a
// model: alarm when the straight line through the last W of memory meets the
// limit within H,
//
//	predict_linear(memory_bytes[W], H) / memory_limit_bytes * 100 >= 100
//
// It is embedded beside the trees (name PredictLinearName) so that it runs
// through the same --model flag, gates and report. Its manifest has
// model_format FormatPredictLinear, objective ObjectivePredictLinear and a
// predict_linear section (W and H); its "model file" is that PromQL line, so
// that the file's sha256 pins the rule as it pins a tree model, and the loader
// requires the text to be exactly the rule the manifest states.
//
// Its score must go through the same gates as a probability (the agent
// compares it with its own threshold, 0.5 by default, and the signal carries
// it as a probability in [0, 1]), so with f the projection as a fraction of
// the limit (clamped at 0) the score is the odds form
//
//	score = f / (1 + f)
//
// monotone in f, in [0, 1], and 0.5 exactly when the line meets the limit.
// The manifest's threshold τ is on that scale, so the rule alarms at
// f >= τ / (1 - τ): the user's `> limit` is τ = 0.5.

// Manifest values of the predict_linear detector.
const (
	FormatPredictLinear    = "predict-linear-v1"
	ObjectivePredictLinear = "f = predict_linear(memory_bytes[W], H) / memory_limit_bytes; score f/(1+f) >= threshold"
	// PredictLinearName is the embedded detector's name (--model predict-linear).
	PredictLinearName = "predict-linear"
)

// PredictLinearSpec is a manifest's predict_linear section: W and H as
// duration strings ("2m", "60s").
type PredictLinearSpec struct {
	Window  string `json:"window"`
	Horizon string `json:"horizon"`
}

// linearRule is a parsed predict_linear section with its threshold.
type linearRule struct {
	window, horizon time.Duration
	threshold       float64
}

// parse checks the section: W a positive whole number of milliseconds of at
// most MaxWindow (the engine keeps W of raw samples), H a whole number of
// milliseconds in [0, MaxWindow].
func (s PredictLinearSpec) parse(threshold float64) (*linearRule, error) {
	w, err := time.ParseDuration(s.Window)
	if err != nil || w <= 0 || w%time.Millisecond != 0 || w > MaxWindow {
		return nil, fmt.Errorf("predict_linear.window %q is not a positive whole number of milliseconds up to %s", s.Window, FormatDuration(MaxWindow))
	}
	h, err := time.ParseDuration(s.Horizon)
	if err != nil || h < 0 || h%time.Millisecond != 0 || h > MaxWindow {
		return nil, fmt.Errorf("predict_linear.horizon %q is not a whole number of milliseconds in [0, %s]", s.Horizon, FormatDuration(MaxWindow))
	}
	return &linearRule{window: w, horizon: h, threshold: threshold}, nil
}

// limitFraction is the fraction of the limit the rule alarms at: the f with
// f / (1 + f) = threshold.
func (r *linearRule) limitFraction() float64 { return r.threshold / (1 - r.threshold) }

// Expr is the rule as PromQL, as the model file holds it (one line).
func (r *linearRule) Expr() string {
	return fmt.Sprintf("predict_linear(memory_bytes[%s], %s) / memory_limit_bytes * 100 >= %s",
		FormatDuration(r.window), strconv.FormatFloat(r.horizon.Seconds(), 'f', -1, 64),
		strconv.FormatFloat(r.limitFraction()*100, 'f', -1, 64))
}

// checkText requires the model file to be the rule's PromQL line.
func (r *linearRule) checkText(b []byte) error {
	if got, want := string(bytes.TrimSpace(b)), r.Expr(); got != want {
		return fmt.Errorf("predict_linear model text %q is not the rule its manifest states, %q", got, want)
	}
	return nil
}

// score is the rule's score, f / (1 + f) with f the projection as a fraction
// of the limit, clamped at 0 (a line heading below zero memory is no nearer
// the limit than an empty one). An undefined projection (too few samples yet)
// scores 0, as a Prometheus alert whose expression returns nothing does not
// fire.
func (r *linearRule) score(projectedMemoryPercent float64) float64 {
	if math.IsNaN(projectedMemoryPercent) {
		return 0
	}
	f := max(projectedMemoryPercent/100, 0)
	if math.IsInf(f, 1) {
		return 1 // the limit of f / (1 + f), not Inf/Inf
	}
	return f / (1 + f)
}

// Projection is the predict_linear window W and horizon H the model reads
// (the feature engine's Config.PredictWindow and PredictHorizon); both zero
// for a tree model, which reads no projection.
func (m *Model) Projection() (window, horizon time.Duration) {
	if m.linear == nil {
		return 0, 0
	}
	return m.linear.window, m.linear.horizon
}

// Rule is the predict_linear rule as PromQL, "" for a tree model.
func (m *Model) Rule() string {
	if m.linear == nil {
		return ""
	}
	return m.linear.Expr()
}

// ScoreSample scores one sample: x, the six features on the model's scale,
// and the engine's memory projection (infer.Projection.MemoryPercent, NaN
// when undefined or not computed). A tree model scores x (Score) and ignores
// the projection; the predict_linear detector scores the projection alone.
// It does not allocate.
func (m *Model) ScoreSample(x *[contract.NumFeatures]float64, projectedMemoryPercent float64) float64 {
	if m.linear != nil {
		return m.linear.score(projectedMemoryPercent)
	}
	return m.Score(x)
}
