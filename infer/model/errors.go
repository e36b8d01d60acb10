package model

import (
	"errors"
	"fmt"

	"github.com/amf-edge/amf/contract"
)

// Kinds of load failure, for errors.Is.
var (
	ErrEmpty    = errors.New("empty input")
	ErrTooLarge = errors.New("file too large")
	ErrIO       = errors.New("cannot read file")
	ErrManifest = errors.New("invalid manifest")
	ErrFeatures = errors.New("feature mismatch")
	// ErrFeatureSpec: the model's feature windows or normalisation are ones
	// the feature engine cannot compute (or not at the sampling interval
	// asked for), so its features would not be those it was trained on.
	ErrFeatureSpec = errors.New("unsupported feature spec")
	ErrChecksum    = errors.New("sha256 mismatch")
	ErrFormat      = errors.New("invalid or unsupported model text")
	ErrLeaves      = errors.New("model rejected by the leaves scorer")
	// ErrNoSuchModel: a name given for a model is neither an embedded
	// model's nor an existing file.
	ErrNoSuchModel = errors.New("no such model")
)

// LoadError describes why a model could not be loaded.
type LoadError struct {
	Source string // model file path, "(embedded NAME)", "(from bytes)", or the unknown name
	Kind   error  // one of the Err* values above
	Detail string // what exactly is wrong
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("model %s: %v: %s; %s", e.Source, e.Kind, e.Detail, hint(e.Kind))
}

// Unwrap lets errors.Is match the kind.
func (e *LoadError) Unwrap() error { return e.Kind }

func hint(kind error) string {
	switch kind {
	case ErrEmpty, ErrFormat:
		return "give a LightGBM v2/v3 text model with objective \"binary sigmoid:1\" and the six AMF features, as written by infer/train/amftrain.py (make model)"
	case ErrTooLarge:
		return fmt.Sprintf("AMF models are far smaller (limit %d bytes for a model, %d for a manifest); check that the right file was given", MaxModelBytes, MaxManifestBytes)
	case ErrIO:
		return "check the path and its permissions"
	case ErrManifest:
		return "the manifest must be the JSON that infer/train/amftrain.py writes beside the model (NAME.txt -> NAME.manifest.json)"
	case ErrFeatures:
		return fmt.Sprintf("this binary computes %v in that order; retrain/re-export the model on those features", contract.FeatureNames())
	case ErrFeatureSpec:
		return fmt.Sprintf("use a model whose manifest states a feature spec this binary computes (windows that are whole multiples of subquery_step, deriv_window >= 2 steps, rate_window >= 2 sample_intervals, lookback >= 1 sample_interval, each <= %s; normalisation fractions in (0, 10]), as infer/train/amftrain.py writes and checks it", FormatDuration(MaxWindow))
	case ErrChecksum:
		return "the model file is not the one its manifest describes; copy the model and its manifest together, or re-export both"
	case ErrNoSuchModel:
		return "give an embedded model's name, or the path of a model file NAME.txt with NAME.manifest.json beside it (./NAME for a file named like an embedded model)"
	case ErrLeaves:
		return "re-export the model with infer/train/amftrain.py; report a bug if this persists"
	}
	return "see infer/model documentation"
}

func loadErr(src string, kind error, format string, args ...any) *LoadError {
	return &LoadError{Source: src, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}
