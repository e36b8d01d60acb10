package detect

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/podsignal"
)

// FeatureConfig is the feature pipeline m needs when sampling every interval:
// the windows of its manifest, nothing of the caller's, because a model is only
// valid on features computed the way its training features were. It refuses
// (errors.Is model.ErrFeatures or model.ErrFeatureSpec) a model whose features
// this build computes in another order, whose windows the engine cannot
// compute, or whose training data was sampled faster than interval (see
// model.Windows.CheckInterval for why faster sampling is fine and slower is
// not).
func FeatureConfig(m *model.Model, interval time.Duration) (infer.Config, error) {
	names := contract.FeatureNames()
	if err := m.CheckFeatureNames(names[:]); err != nil {
		return infer.Config{}, err
	}
	w := m.Windows()
	if err := w.CheckInterval(interval); err != nil {
		return infer.Config{}, fmt.Errorf("model %s: %w", m.Source(), err)
	}
	fc := infer.DefaultConfig()
	fc.RateWindow, fc.DerivWindow, fc.Step, fc.Lookback = w.Rate, w.Deriv, w.SubqueryStep, w.Lookback
	fc.PredictWindow, fc.PredictHorizon = m.Projection() // zero for tree models
	if err := fc.Validate(); err != nil {
		return infer.Config{}, fmt.Errorf("model %s: %w: %w", m.Source(), model.ErrFeatureSpec, err)
	}
	return fc, nil
}

// ErrWindowGiven is a feature window the user gave that differs from the
// model's manifest.
var ErrWindowGiven = errors.New("window flag differs from the model's feature windows")

// Window names one of the feature windows a manifest sets.
type Window int

// The windows of a manifest (model.Windows), as a user may give them.
const (
	RateWindow Window = iota
	DerivWindow
	SubqueryStep
	Lookback
)

// GivenWindow is a feature window the user gave: Name is how it was given
// (a flag, "--rate-window"), for the refusal to say.
type GivenWindow struct {
	Name   string
	Window Window
	Value  time.Duration
}

// FeatureConfigGiven is FeatureConfig, refusing (errors.Is ErrWindowGiven)
// any given window that differs from the model's: its manifest sets them,
// so a window the user gives can only agree with it, and one that does not
// is said rather than ignored or obeyed.
func FeatureConfigGiven(m *model.Model, interval time.Duration, given []GivenWindow) (infer.Config, error) {
	fc, err := FeatureConfig(m, interval)
	if err != nil {
		return infer.Config{}, err
	}
	var diffs []string
	for _, g := range given {
		want := map[Window]time.Duration{RateWindow: fc.RateWindow, DerivWindow: fc.DerivWindow, SubqueryStep: fc.Step, Lookback: fc.Lookback}[g.Window]
		if g.Value != want {
			diffs = append(diffs, fmt.Sprintf("%s %s, the model's is %s", g.Name, model.FormatDuration(g.Value), model.FormatDuration(want)))
		}
	}
	if len(diffs) > 0 {
		return infer.Config{}, fmt.Errorf("%w: %s. Model %s was trained with %v, and its manifest sets the windows; drop the window flags, or give a model trained with the windows you want (--model)",
			ErrWindowGiven, strings.Join(diffs, "; "), m.Source(), m.Windows())
	}
	return fc, nil
}

// Normalise puts features on the scale the model was trained on. The manifest's
// fractions say which share of the plain value the training data's 100 % was (0.5
// for ToD-K8s-OOD, whose pod sums count each container twice), so CPU (percent and
// growth, against one core) and memory (percent and growth) are divided by them.
func Normalise(x *[contract.NumFeatures]float64, n model.Normalisation) {
	if f := n.CPUReferenceFraction; f > 0 && f != 1 {
		x[contract.CPUPercent] /= f
		x[contract.CPUGrowthRate] /= f
	}
	if f := n.MemoryReferenceFraction; f > 0 && f != 1 {
		x[contract.MemoryPercent] /= f
		x[contract.MemoryGrowthRate] /= f
	}
}

// SignalFeatures converts a feature vector to the wire form, nil for undefined.
func SignalFeatures(v *infer.Vector) *podsignal.Features {
	var p [contract.NumFeatures]*float64
	for i := range v.Values {
		if v.Why[i] == infer.Defined {
			x := v.Values[i]
			p[i] = &x
		}
	}
	return &podsignal.Features{
		CPUPercent: p[contract.CPUPercent], MemoryPercent: p[contract.MemoryPercent],
		NetworkIOBytesPerSec: p[contract.NetworkIOBytesPerSec], DiskIOBytesPerSec: p[contract.DiskIOBytesPerSec],
		CPUGrowthRate: p[contract.CPUGrowthRate], MemoryGrowthRate: p[contract.MemoryGrowthRate],
	}
}
