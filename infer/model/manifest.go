package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/amf-edge/amf/contract"
)

// ManifestSchemaVersion is the manifest schema this package writes about and
// reads in full. Version 2 added feature_windows.lookback and made the whole
// feature spec (names, the five windows, normalisation) mandatory.
const ManifestSchemaVersion = 2

// oldestManifestSchemaVersion is the oldest schema still read. A version-1
// manifest may lack (part of) the feature spec: what it does not state is taken
// from P1Windows, and the model carries a warning naming the manifest
// (Model.Warnings), because those files were all written by the P1 pipeline.
const oldestManifestSchemaVersion = 1

// ObjectiveBinarySigmoid is the only objective accepted.
const ObjectiveBinarySigmoid = "binary sigmoid:1"

// Manifest describes a model file. It is the JSON written by
// infer/train/amftrain.py beside each model.
type Manifest struct {
	SchemaVersion  int            `json:"schema_version"`
	ModelFormat    string         `json:"model_format"` // "lightgbm-text-v3" or "lightgbm-text-v2"
	ModelSHA256    string         `json:"model_sha256"` // hex sha256 of the model file's bytes
	Objective      string         `json:"objective"`    // "binary sigmoid:1"
	FeatureNames   []string       `json:"feature_names"`
	Threshold      float64        `json:"threshold"` // probability at or above which a sample is anomalous
	Protocol       string         `json:"protocol"`  // training protocol, e.g. "P1"
	Seed           int64          `json:"seed"`
	TrainingRows   int64          `json:"training_rows"`
	Trainer        string         `json:"trainer,omitempty"`
	SklearnVersion string         `json:"sklearn_version,omitempty"`
	FeatureWindows FeatureWindows `json:"feature_windows"`
	Normalisation  Normalisation  `json:"normalisation"`
	Dataset        *Dataset       `json:"dataset,omitempty"`
	Validation     *Validation    `json:"validation,omitempty"`
	TrainedBy      string         `json:"trained_by,omitempty"`
	// PredictLinear is W and H of the predict_linear detector; present
	// exactly when ModelFormat is FormatPredictLinear.
	PredictLinear *PredictLinearSpec `json:"predict_linear,omitempty"`
}

// FeatureWindows are the PromQL windows the training features were computed
// with, and the sample interval of the training data, as Go duration strings
// ("5m", "10m", "5s"). In a manifest returned by this package, fields a
// version-1 file left out hold the P1 values that were assumed.
type FeatureWindows struct {
	RateWindow     string `json:"rate_window"`     // R of rate(x[R])
	DerivWindow    string `json:"deriv_window"`    // range of deriv(...[D:step])
	SubqueryStep   string `json:"subquery_step"`   // step of that subquery, aligned to the epoch
	Lookback       string `json:"lookback"`        // instant-selector lookback delta
	SampleInterval string `json:"sample_interval"` // time between samples of the training data
}

// Windows are FeatureWindows parsed.
type Windows struct {
	Rate, Deriv, SubqueryStep, Lookback, SampleInterval time.Duration
}

// P1Windows are the windows of the published Prometheus pipeline, with which
// the embedded default model was trained (ToD-K8s-OOD is sampled every 5 s):
// rate 5m, deriv 10m, subquery step 5s, lookback 5m (Prometheus' default),
// sample interval 5s. They fill what a version-1 manifest does not state.
func P1Windows() Windows {
	return Windows{
		Rate:           5 * time.Minute,
		Deriv:          10 * time.Minute,
		SubqueryStep:   5 * time.Second,
		Lookback:       5 * time.Minute,
		SampleInterval: 5 * time.Second,
	}
}

// Limits on a feature spec. The feature engine keeps every raw sample of the
// longest window and every subquery point of the deriv window, and refits the
// deriv over all those points at each sample: the limits bound that memory and
// work whatever a manifest says. The P1 spec uses 120 steps.
const (
	MaxWindow     = 24 * time.Hour
	MaxDerivSteps = 10000
)

// fields lists the windows with their manifest names, in manifest order.
func (w *Windows) fields() [5]struct {
	name string
	d    *time.Duration
} {
	return [5]struct {
		name string
		d    *time.Duration
	}{
		{"rate_window", &w.Rate},
		{"deriv_window", &w.Deriv},
		{"subquery_step", &w.SubqueryStep},
		{"lookback", &w.Lookback},
		{"sample_interval", &w.SampleInterval},
	}
}

func (w *FeatureWindows) fields() [5]*string {
	return [5]*string{&w.RateWindow, &w.DerivWindow, &w.SubqueryStep, &w.Lookback, &w.SampleInterval}
}

// Check reports the first rule the windows break, as an error wrapping
// ErrFeatureSpec. The rules say what the feature engine can compute and what
// a model's training features can have been:
//   - every duration is a positive whole number of milliseconds (the engine's
//     clock) and at most MaxWindow;
//   - rate_window, deriv_window and lookback are whole multiples of
//     subquery_step: the pipeline evaluates on the step grid, and the trainer
//     states its windows in steps (a non-multiple is a unit mistake);
//   - deriv_window holds at least 2 steps, since deriv needs two points: with
//     fewer, cpu_growth_rate and memory_growth_rate are never defined; and at
//     most MaxDerivSteps;
//   - rate_window is at least 2 sample intervals: a left-open window (t-R, t]
//     evaluated between two samples holds two samples only if R >= 2 intervals,
//     and rate needs two, so with less the training data had no rates;
//   - lookback is at least 1 sample interval, for the same reason: the memory
//     instant selector at a subquery step needs a sample in (s-lookback, s].
//
// With these, every feature is defined once the windows have filled, sampling
// at sample_interval or faster (sidecar's TestSpecAtTheLimitsDefinesEveryFeature).
func (w Windows) Check() error {
	if err := w.check(); err != nil {
		return fmt.Errorf("%w: %w", ErrFeatureSpec, err)
	}
	return nil
}

func (w Windows) check() error {
	for _, f := range w.fields() {
		d := *f.d
		if d <= 0 || d%time.Millisecond != 0 {
			return fmt.Errorf("feature_windows.%s %s is not a positive whole number of milliseconds", f.name, FormatDuration(d))
		}
		if d > MaxWindow {
			return fmt.Errorf("feature_windows.%s %s is longer than %s", f.name, FormatDuration(d), FormatDuration(MaxWindow))
		}
	}
	step := w.SubqueryStep
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"rate_window", w.Rate}, {"deriv_window", w.Deriv}, {"lookback", w.Lookback}} {
		if f.d%step != 0 {
			return fmt.Errorf("feature_windows.%s %s is not a whole multiple of subquery_step %s", f.name, FormatDuration(f.d), FormatDuration(step))
		}
	}
	if w.Deriv < 2*step {
		return fmt.Errorf("feature_windows.deriv_window %s holds fewer than 2 subquery steps of %s: deriv needs two points, so the growth rates would never be defined",
			FormatDuration(w.Deriv), FormatDuration(step))
	}
	if n := w.Deriv / step; n > MaxDerivSteps {
		return fmt.Errorf("feature_windows.deriv_window %s holds %d subquery steps of %s, more than %d", FormatDuration(w.Deriv), n, FormatDuration(step), MaxDerivSteps)
	}
	if w.Lookback < w.SampleInterval {
		return fmt.Errorf("feature_windows.lookback %s is shorter than the sample_interval %s: memory at a subquery step between two samples would have no sample to look back to, so memory_growth_rate would be undefined there",
			FormatDuration(w.Lookback), FormatDuration(w.SampleInterval))
	}
	if w.Rate < 2*w.SampleInterval {
		return fmt.Errorf("feature_windows.rate_window %s is shorter than 2 sample intervals of %s: rate needs two samples in its window, so the training data cannot have had rates",
			FormatDuration(w.Rate), FormatDuration(w.SampleInterval))
	}
	return nil
}

// CheckInterval reports (wrapping ErrFeatureSpec) whether features for a model
// with these windows can be computed from samples taken every interval. Any
// interval up to the training data's sample interval is fine: rate and deriv
// over fixed windows estimate the same per-second quantities at any finer
// sampling (more samples per window only shrink rate's extrapolation), and the
// agent's gates count samples, so sampling faster than training (the sidecar's
// 1 s against the dataset's 5 s) confirms an anomaly sooner. A longer interval
// is refused: windows would hold fewer samples than the model learnt from, and
// a rate window may hold fewer than two.
func (w Windows) CheckInterval(interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: sampling interval %v is not positive", ErrFeatureSpec, interval)
	}
	if interval > w.SampleInterval {
		return fmt.Errorf("%w: sampling every %s is slower than the model's sample_interval %s: its windows would hold fewer samples than in its training data; sample every %s or faster (faster is fine)",
			ErrFeatureSpec, FormatDuration(interval), FormatDuration(w.SampleInterval), FormatDuration(w.SampleInterval))
	}
	return nil
}

// Format returns the windows as manifest strings.
func (w Windows) Format() FeatureWindows {
	var out FeatureWindows
	for i, f := range w.fields() {
		*out.fields()[i] = FormatDuration(*f.d)
	}
	return out
}

// String is the windows as one line, for logs and errors.
func (w Windows) String() string {
	return fmt.Sprintf("rate_window %s, deriv_window %s, subquery_step %s, lookback %s, sample_interval %s",
		FormatDuration(w.Rate), FormatDuration(w.Deriv), FormatDuration(w.SubqueryStep), FormatDuration(w.Lookback), FormatDuration(w.SampleInterval))
}

// FormatDuration writes a duration as a manifest states it: "5m", not Go's
// "5m0s" (time.ParseDuration reads both).
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// Parse parses the window strings and checks them (Windows.Check). Errors
// wrap ErrFeatureSpec.
func (w FeatureWindows) Parse() (Windows, error) {
	var out Windows
	strs := w.fields()
	for i, f := range out.fields() {
		s := *strs[i]
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return Windows{}, fmt.Errorf("%w: feature_windows.%s %q is not a positive duration such as \"5m\" or \"500ms\"", ErrFeatureSpec, f.name, s)
		}
		*f.d = d
	}
	if err := out.Check(); err != nil {
		return Windows{}, err
	}
	return out, nil
}

// FeatureSpec is what a model asks of the feature pipeline: the features in
// order, the windows they were computed with, and the scale they are on.
type FeatureSpec struct {
	Names         [contract.NumFeatures]string
	Windows       Windows
	Normalisation Normalisation
}

// Normalisation gives the CPU and memory reference as a fraction of the
// container's limit: cpu_percent = cpu cores / (fraction * cpu limit) * 100,
// likewise memory. 0.5 for models trained on ToD-K8s-OOD (its 100 % is about
// half the limit), 1.0 for models trained on plain-definition telemetry.
type Normalisation struct {
	CPUReferenceFraction    float64 `json:"cpu_reference_fraction"`
	MemoryReferenceFraction float64 `json:"memory_reference_fraction"`
}

// UnmarshalJSON refuses any other normalisation (a z-score, a log scale, ...):
// the sidecar applies exactly these two fractions, so a model asking for more
// would be fed features on the wrong scale.
func (n *Normalisation) UnmarshalJSON(b []byte) error {
	type plain Normalisation
	var p plain
	if err := strictDecode(b, &p); err != nil {
		return &specJSONError{fmt.Errorf("normalisation: %v (this binary supports only cpu_reference_fraction and memory_reference_fraction: the CPU and memory reference as a fraction of the container's limit)", err)}
	}
	*n = Normalisation(p)
	return nil
}

// UnmarshalJSON refuses windows this binary does not know, so a model trained
// on a pipeline with another kind of window is not fed features without it.
func (w *FeatureWindows) UnmarshalJSON(b []byte) error {
	type plain FeatureWindows
	var p plain
	if err := strictDecode(b, &p); err != nil {
		return &specJSONError{fmt.Errorf("feature_windows: %v (this binary knows rate_window, deriv_window, subquery_step, lookback and sample_interval, each a duration string such as \"5m\")", err)}
	}
	*w = FeatureWindows(p)
	return nil
}

// specJSONError marks a decoding error inside the feature spec, so that it is
// reported as ErrFeatureSpec rather than as a malformed manifest.
type specJSONError struct{ err error }

func (e *specJSONError) Error() string { return e.err.Error() }
func (e *specJSONError) Unwrap() error { return e.err }

func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Dataset records where the training data came from (and its licence).
type Dataset struct {
	Name        string            `json:"name"`
	Authors     []string          `json:"authors,omitempty"`
	Licence     string            `json:"licence,omitempty"`
	URL         string            `json:"url,omitempty"`
	FilesSHA256 map[string]string `json:"files_sha256,omitempty"`
}

// Validation holds the trainer's held-out figures.
type Validation struct {
	TestRows  int64   `json:"test_rows"`
	Precision float64 `json:"precision"`
	Recall    float64 `json:"recall"`
	Threshold float64 `json:"threshold"`
}

// ParseManifest decodes and validates a manifest against the expected
// feature names. Unknown fields are refused. A version-1 manifest's missing
// windows are filled from P1Windows (the warning Load would attach is dropped).
func ParseManifest(b []byte) (*Manifest, error) {
	p, err := parseManifest("manifest", "(from bytes)", b)
	if err != nil {
		return nil, err
	}
	return &p.man, nil
}

// parsedManifest is a validated manifest with its windows parsed and the
// warnings a reader must show.
type parsedManifest struct {
	man      Manifest
	windows  Windows
	warnings []string
	linear   *linearRule // the predict_linear detector's rule; nil for trees
}

// parseManifest validates b. src names the model for the error's Source;
// where names the manifest (a path, or how it was given) in details and
// warnings.
func parseManifest(src, where string, b []byte) (*parsedManifest, error) {
	bad := func(kind error, format string, args ...any) (*parsedManifest, error) {
		return nil, loadErr(src, kind, "manifest %s: %s", where, fmt.Sprintf(format, args...))
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return bad(ErrManifest, "manifest is empty")
	}
	if len(b) > MaxManifestBytes {
		return nil, loadErr(src, ErrTooLarge, "manifest is %d bytes, limit %d", len(b), MaxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		var se *specJSONError
		if errors.As(err, &se) {
			return bad(ErrFeatureSpec, "%v", se)
		}
		return bad(ErrManifest, "manifest JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad(ErrManifest, "manifest JSON: data after the object")
	}
	if m.SchemaVersion < oldestManifestSchemaVersion || m.SchemaVersion > ManifestSchemaVersion {
		return bad(ErrManifest, "schema_version %d, this binary reads %d to %d", m.SchemaVersion, oldestManifestSchemaVersion, ManifestSchemaVersion)
	}
	var linear *linearRule
	switch m.ModelFormat {
	case "lightgbm-text-v3", "lightgbm-text-v2":
		if m.Objective != ObjectiveBinarySigmoid {
			return bad(ErrManifest, "objective %q, want %q", m.Objective, ObjectiveBinarySigmoid)
		}
		if m.PredictLinear != nil {
			return bad(ErrManifest, "a predict_linear section in a %s manifest", m.ModelFormat)
		}
	case FormatPredictLinear:
		if m.Objective != ObjectivePredictLinear {
			return bad(ErrManifest, "objective %q, want %q", m.Objective, ObjectivePredictLinear)
		}
		if m.PredictLinear == nil {
			return bad(ErrManifest, "model_format %s without a predict_linear section (window, horizon)", m.ModelFormat)
		}
		r, err := m.PredictLinear.parse(m.Threshold)
		if err != nil {
			return bad(ErrManifest, "%v", err)
		}
		linear = r
	default:
		return bad(ErrManifest, "model_format %q, want \"lightgbm-text-v3\", \"lightgbm-text-v2\" or %q", m.ModelFormat, FormatPredictLinear)
	}
	// Both kinds score on the probability scale the gates and the signal use.
	if math.IsNaN(m.Threshold) || m.Threshold <= 0 || m.Threshold >= 1 {
		return bad(ErrManifest, "threshold %v is not in (0, 1)", m.Threshold)
	}
	if !isHex64(m.ModelSHA256) {
		return bad(ErrManifest, "model_sha256 %q is not 64 lower-case hex digits", m.ModelSHA256)
	}
	if err := checkNames(m.FeatureNames); err != nil {
		return bad(ErrFeatures, "feature_names: %v", err)
	}
	var warnings []string
	if missing := m.FeatureWindows.missing(); len(missing) > 0 {
		if m.SchemaVersion >= 2 {
			return bad(ErrFeatureSpec, "feature_windows does not state %s; a schema_version %d manifest states all five windows", strings.Join(missing, ", "), m.SchemaVersion)
		}
		assumed := m.FeatureWindows.fillFrom(P1Windows().Format())
		warnings = append(warnings, fmt.Sprintf("manifest %s (schema_version %d) does not state the feature windows %s; assuming the P1 pipeline's %s. Re-export the model with infer/train/amftrain.py to record the windows it was trained with",
			where, m.SchemaVersion, strings.Join(missing, ", "), assumed))
	}
	w, err := m.FeatureWindows.Parse()
	if err != nil {
		return bad(ErrFeatureSpec, "%v", strings.TrimPrefix(err.Error(), ErrFeatureSpec.Error()+": "))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"cpu_reference_fraction", m.Normalisation.CPUReferenceFraction}, {"memory_reference_fraction", m.Normalisation.MemoryReferenceFraction}} {
		if math.IsNaN(f.v) || f.v <= 0 || f.v > 10 {
			return bad(ErrFeatureSpec, "normalisation.%s %v is not in (0, 10]", f.name, f.v)
		}
	}
	return &parsedManifest{man: m, windows: w, warnings: warnings, linear: linear}, nil
}

// missing names the windows the manifest leaves empty.
func (w *FeatureWindows) missing() []string {
	var out []string
	names := (&Windows{}).fields()
	for i, s := range w.fields() {
		if *s == "" {
			out = append(out, names[i].name)
		}
	}
	return out
}

// fillFrom sets the empty windows from def and describes what it set.
func (w *FeatureWindows) fillFrom(def FeatureWindows) string {
	var set []string
	names := (&Windows{}).fields()
	for i, s := range w.fields() {
		if *s == "" {
			*s = *def.fields()[i]
			set = append(set, names[i].name+" "+*s)
		}
	}
	return strings.Join(set, ", ")
}

func checkNames(names []string) error {
	if len(names) != contract.NumFeatures {
		return fmt.Errorf("%d features %q, this binary computes %d", len(names), names, contract.NumFeatures)
	}
	want := contract.FeatureNames()
	for i, n := range names {
		if n != want[i] {
			return fmt.Errorf("feature %d is %q, this binary computes %q there", i, n, want[i])
		}
	}
	return nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return (r < '0' || r > '9') && (r < 'a' || r > 'f')
	})
}

func (m *Manifest) clone() Manifest {
	c := *m
	c.FeatureNames = slices.Clone(m.FeatureNames)
	if m.Dataset != nil {
		d := *m.Dataset
		d.Authors = slices.Clone(d.Authors)
		if d.FilesSHA256 != nil {
			d.FilesSHA256 = make(map[string]string, len(m.Dataset.FilesSHA256))
			for k, v := range m.Dataset.FilesSHA256 {
				d.FilesSHA256[k] = v
			}
		}
		c.Dataset = &d
	}
	if m.Validation != nil {
		v := *m.Validation
		c.Validation = &v
	}
	if m.PredictLinear != nil {
		p := *m.PredictLinear
		c.PredictLinear = &p
	}
	return c
}
