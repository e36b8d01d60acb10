package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// NumFeatures is the length of the feature vector Score takes.
const NumFeatures = 6

// FeatureNames are the model inputs in the order Score expects them: the
// dataset's column names, computed by package infer (infer.FeatureNames must
// equal this list; callers can assert it with (*Model).CheckFeatureNames).
var FeatureNames = [NumFeatures]string{
	"cpu_percent",
	"memory_percent",
	"network_io_bytes_per_sec",
	"disk_io_bytes_per_sec",
	"cpu_growth_rate",
	"memory_growth_rate",
}

// ManifestSchemaVersion is the manifest schema this package reads.
const ManifestSchemaVersion = 1

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
}

// FeatureWindows are the PromQL windows the training features were computed
// with, as Go/PromQL duration strings ("5m", "10m", "5s").
type FeatureWindows struct {
	RateWindow     string `json:"rate_window"`
	DerivWindow    string `json:"deriv_window"`
	SubqueryStep   string `json:"subquery_step"`
	SampleInterval string `json:"sample_interval"`
}

// Windows are FeatureWindows parsed.
type Windows struct {
	Rate, Deriv, SubqueryStep, SampleInterval time.Duration
}

// Normalisation gives the CPU and memory reference as a fraction of the
// container's limit: cpu_percent = cpu cores / (fraction * cpu limit) * 100,
// likewise memory. 0.5 for models trained on ToD-K8s-OOD (its 100 % is about
// half the limit), 1.0 for models trained on plain-definition telemetry.
type Normalisation struct {
	CPUReferenceFraction    float64 `json:"cpu_reference_fraction"`
	MemoryReferenceFraction float64 `json:"memory_reference_fraction"`
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
// feature names. Unknown fields are refused.
func ParseManifest(b []byte) (*Manifest, error) {
	return parseManifest("manifest", b)
}

func parseManifest(src string, b []byte) (*Manifest, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, loadErr(src, ErrManifest, "manifest is empty")
	}
	if len(b) > MaxManifestBytes {
		return nil, loadErr(src, ErrTooLarge, "manifest is %d bytes, limit %d", len(b), MaxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, loadErr(src, ErrManifest, "manifest JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, loadErr(src, ErrManifest, "manifest JSON: data after the object")
	}
	if m.SchemaVersion != ManifestSchemaVersion {
		return nil, loadErr(src, ErrManifest, "schema_version %d, this binary reads %d", m.SchemaVersion, ManifestSchemaVersion)
	}
	if m.ModelFormat != "lightgbm-text-v3" && m.ModelFormat != "lightgbm-text-v2" {
		return nil, loadErr(src, ErrManifest, "model_format %q, want \"lightgbm-text-v3\" or \"lightgbm-text-v2\"", m.ModelFormat)
	}
	if m.Objective != ObjectiveBinarySigmoid {
		return nil, loadErr(src, ErrManifest, "objective %q, want %q", m.Objective, ObjectiveBinarySigmoid)
	}
	if !isHex64(m.ModelSHA256) {
		return nil, loadErr(src, ErrManifest, "model_sha256 %q is not 64 lower-case hex digits", m.ModelSHA256)
	}
	if err := checkNames(m.FeatureNames); err != nil {
		return nil, loadErr(src, ErrFeatures, "manifest feature_names: %v", err)
	}
	if math.IsNaN(m.Threshold) || m.Threshold <= 0 || m.Threshold >= 1 {
		return nil, loadErr(src, ErrManifest, "threshold %v is not in (0, 1)", m.Threshold)
	}
	if _, err := m.FeatureWindows.Parse(); err != nil {
		return nil, loadErr(src, ErrManifest, "%v", err)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"cpu_reference_fraction", m.Normalisation.CPUReferenceFraction}, {"memory_reference_fraction", m.Normalisation.MemoryReferenceFraction}} {
		if math.IsNaN(f.v) || f.v <= 0 || f.v > 10 {
			return nil, loadErr(src, ErrManifest, "normalisation.%s %v is not in (0, 10]", f.name, f.v)
		}
	}
	return &m, nil
}

// Parse parses and checks the window strings.
func (w FeatureWindows) Parse() (Windows, error) {
	var out Windows
	for _, f := range []struct {
		name string
		s    string
		d    *time.Duration
	}{
		{"rate_window", w.RateWindow, &out.Rate},
		{"deriv_window", w.DerivWindow, &out.Deriv},
		{"subquery_step", w.SubqueryStep, &out.SubqueryStep},
		{"sample_interval", w.SampleInterval, &out.SampleInterval},
	} {
		d, err := time.ParseDuration(f.s)
		if err != nil || d <= 0 {
			return Windows{}, fmt.Errorf("feature_windows.%s %q is not a positive duration such as \"5m\"", f.name, f.s)
		}
		*f.d = d
	}
	return out, nil
}

func checkNames(names []string) error {
	if len(names) != NumFeatures {
		return fmt.Errorf("%d features %q, this binary computes %d", len(names), names, NumFeatures)
	}
	for i, n := range names {
		if n != FeatureNames[i] {
			return fmt.Errorf("feature %d is %q, this binary computes %q there", i, n, FeatureNames[i])
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
	return c
}
