package model

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/amf-edge/amf/contract"
	"github.com/dmitryikh/leaves"
	"github.com/dmitryikh/leaves/transformation"
)

// Model is a loaded, validated model. It is immutable and safe for
// concurrent use.
type Model struct {
	ens      *leaves.Ensemble // raw-margin ensemble; sigmoid applied by Score; nil for predict_linear
	linear   *linearRule      // the predict_linear detector (linear.go); nil for trees
	trees    []lgbTree        // the trees as this package reads them, for Explain
	means    [][]float64      // per tree, its internal nodes' expected values (explain.go); nil if unknown
	meansErr error            // why means is nil
	manifest Manifest
	windows  Windows
	warnings []string
	source   string
	sha      string
	nTrees   int
	scratch  sync.Pool // *scratch: keeps Score free of allocations
}

type scratch struct {
	in  [contract.NumFeatures]float64
	out [1]float64
}

// Score returns the anomaly probability of one feature vector, in the order
// of FeatureNames. NaN entries are missing values. It does not allocate. The
// predict_linear detector scores a projection, not features: its Score is NaN
// (use ScoreSample).
func (m *Model) Score(x *[contract.NumFeatures]float64) float64 {
	return sigmoid(m.Raw(x))
}

// Raw returns the model's raw margin (log-odds) for x; Score = 1/(1+e^-Raw).
// NaN for the predict_linear detector, which has no trees.
func (m *Model) Raw(x *[contract.NumFeatures]float64) float64 {
	if m.ens == nil {
		return math.NaN()
	}
	s := m.scratch.Get().(*scratch)
	s.in = *x
	s.out[0] = 0
	// Cannot fail: the ensemble's feature count and output groups were
	// checked at load. NaN is returned rather than 0 if it ever did.
	err := m.ens.Predict(s.in[:], 0, s.out[:])
	r := s.out[0]
	m.scratch.Put(s)
	if err != nil {
		return math.NaN()
	}
	return r
}

// sigmoid is leaves' logistic transform (util.Sigmoid).
func sigmoid(x float64) float64 { return 1.0 / (1.0 + math.Exp(-x)) }

// Anomalous reports whether a probability is at or above the manifest's
// threshold.
func (m *Model) Anomalous(p float64) bool { return p >= m.manifest.Threshold }

// Threshold is the manifest's decision threshold.
func (m *Model) Threshold() float64 { return m.manifest.Threshold }

// Windows are the feature windows the model was trained with.
func (m *Model) Windows() Windows { return m.windows }

// FeatureSpec is what the model needs from the feature pipeline, from its
// manifest: feature order, windows, normalisation.
func (m *Model) FeatureSpec() FeatureSpec {
	return FeatureSpec{Names: contract.FeatureNames(), Windows: m.windows, Normalisation: m.manifest.Normalisation}
}

// Warnings are problems that did not stop the load but must be shown (log,
// stderr): a version-1 manifest whose missing windows were assumed.
func (m *Model) Warnings() []string { return slices.Clone(m.warnings) }

// Normalisation is the CPU/memory reference the features must use.
func (m *Model) Normalisation() Normalisation { return m.manifest.Normalisation }

// Manifest returns a copy of the model's manifest.
func (m *Model) Manifest() Manifest { return m.manifest.clone() }

// SHA256 is the hex sha256 of the model file.
func (m *Model) SHA256() string { return m.sha }

// Source is the model's file path, "(embedded NAME)" (e.g. "(embedded p1)")
// or "(from bytes)".
func (m *Model) Source() string { return m.source }

// NumTrees is the number of trees in the ensemble.
func (m *Model) NumTrees() int { return m.nTrees }

// CheckFeatureNames returns an error unless names equal
// contract.FeatureNames (the order Score expects), for a caller that brings
// its own list of columns (a CSV header, say).
func (m *Model) CheckFeatureNames(names []string) error {
	if err := checkNames(names); err != nil {
		return loadErr(m.source, ErrFeatures, "caller's feature names: %v", err)
	}
	return nil
}

// Load validates a model text and its manifest and returns a model ready to
// score. See the package documentation for the checks.
func Load(modelBytes, manifestBytes []byte) (*Model, error) {
	return load("(from bytes)", "(from bytes)", modelBytes, manifestBytes)
}

// ManifestPathFor is the rule for finding a model file's manifest: the
// model path without its ".txt" suffix, plus ".manifest.json"
// (models/m.txt -> models/m.manifest.json; a path without ".txt" just gets
// the suffix appended).
func ManifestPathFor(modelPath string) string {
	return strings.TrimSuffix(modelPath, ".txt") + ".manifest.json"
}

// LoadFiles loads the model at modelPath with its manifest at
// ManifestPathFor(modelPath).
func LoadFiles(modelPath string) (*Model, error) {
	return LoadFilePair(modelPath, ManifestPathFor(modelPath))
}

// LoadFilePair loads a model and a manifest from explicit paths.
func LoadFilePair(modelPath, manifestPath string) (*Model, error) {
	mb, err := readCapped(modelPath, MaxModelBytes)
	if err != nil {
		return nil, fileErr(modelPath, "model", err)
	}
	jb, err := readCapped(manifestPath, MaxManifestBytes)
	if err != nil {
		return nil, fileErr(modelPath, "manifest "+manifestPath+" (rule: NAME.txt -> NAME.manifest.json)", err)
	}
	return load(modelPath, manifestPath, mb, jb)
}

// LoadOverride is for a model given on the sidecar's command line: an
// embedded model's name or a file path, as LoadNameOrPath reads it. With an
// empty argument it returns the embedded default and a nil error. If the
// model cannot be loaded it returns the embedded default model together with
// a non-nil error saying why the override was rejected: the caller keeps
// running on the returned model and must report the error loudly (log,
// status endpoint, metric). The returned model is nil only if the embedded
// default itself cannot load (a build defect, caught by this package's
// tests); the error then carries both failures.
func LoadOverride(nameOrPath string) (m *Model, fallbackErr error) {
	m, err := LoadNameOrPath(nameOrPath)
	if err == nil {
		return m, nil
	}
	def, derr := Default()
	if derr != nil {
		return nil, errors.Join(err, derr)
	}
	return def, FallbackError(def, err)
}

// FallbackError is the error of a rejected override: it names the default
// model the caller runs on instead and wraps why.
func FallbackError(def *Model, why error) error {
	return fmt.Errorf("model override rejected, running on the embedded default model %s (sha256 %.12s): %w", DefaultName, def.SHA256(), why)
}

func fileErr(src, what string, err error) error {
	var le *LoadError
	if errors.As(err, &le) {
		le.Source = src
		le.Detail = what + ": " + le.Detail
		return le
	}
	return loadErr(src, ErrIO, "%s: %v", what, err)
}

// readCapped reads at most limit bytes, refusing larger files before
// reading them where the size is known.
func readCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s is a directory", path)
	}
	if st.Mode().IsRegular() && st.Size() > limit {
		return nil, &LoadError{Kind: ErrTooLarge, Detail: fmt.Sprintf("%d bytes, limit %d", st.Size(), limit)}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &LoadError{Kind: ErrTooLarge, Detail: fmt.Sprintf("more than %d bytes", limit)}
	}
	return b, nil
}

// load checks and loads a model; src names it, manifestName its manifest.
func load(src, manifestName string, modelBytes, manifestBytes []byte) (*Model, error) {
	parsed, err := parseManifest(src, manifestName, manifestBytes)
	if err != nil {
		return nil, err
	}
	man := &parsed.man
	if len(modelBytes) == 0 {
		return nil, loadErr(src, ErrEmpty, "model file is empty")
	}
	if len(modelBytes) > MaxModelBytes {
		return nil, loadErr(src, ErrTooLarge, "model is %d bytes, limit %d", len(modelBytes), MaxModelBytes)
	}
	sum := sha256.Sum256(modelBytes)
	sha := hex.EncodeToString(sum[:])
	if sha != man.ModelSHA256 {
		return nil, loadErr(src, ErrChecksum, "model sha256 is %s, manifest says %s", sha, man.ModelSHA256)
	}
	if parsed.linear != nil {
		if err := parsed.linear.checkText(modelBytes); err != nil {
			return nil, loadErr(src, ErrFormat, "%v", err)
		}
		return &Model{linear: parsed.linear, manifest: *man, windows: parsed.windows, warnings: parsed.warnings, source: src, sha: sha}, nil
	}
	txt, err := parseLGBText(modelBytes)
	if err != nil {
		var kind error = ErrFormat
		for _, k := range []error{ErrEmpty, ErrTooLarge, ErrFeatures} {
			if errors.Is(err, k) {
				kind = k
			}
		}
		return nil, &LoadError{Source: src, Kind: kind, Detail: strings.TrimPrefix(err.Error(), kind.Error()+": ")}
	}
	if want := "lightgbm-text-" + txt.version; man.ModelFormat != want {
		return nil, loadErr(src, ErrManifest, "manifest model_format %q but the model text is version=%s", man.ModelFormat, txt.version)
	}
	ens, err := leavesLoad(modelBytes)
	if err != nil {
		return nil, loadErr(src, ErrLeaves, "%v", err)
	}
	if ens.NEstimators() != len(txt.trees) || ens.NFeatures() != contract.NumFeatures || ens.NOutputGroups() != 1 ||
		ens.Transformation().Type() != transformation.Logistic {
		return nil, loadErr(src, ErrLeaves, "leaves read %d trees, %d features, %d outputs, transform %s; want %d, %d, 1, logistic",
			ens.NEstimators(), ens.NFeatures(), ens.NOutputGroups(), ens.Transformation().Name(), len(txt.trees), contract.NumFeatures)
	}
	m := &Model{
		ens:      ens.EnsembleWithRawPredictions(),
		manifest: *man,
		windows:  parsed.windows,
		warnings: parsed.warnings,
		source:   src,
		sha:      sha,
		nTrees:   len(txt.trees),
		trees:    txt.trees,
	}
	m.means, m.meansErr = treeMeans(txt.trees)
	m.scratch.New = func() any { return new(scratch) }
	// leaves and this package's reading of the text must agree exactly.
	for _, x := range txt.probes() {
		want := txt.raw(&x)
		if got := m.Raw(&x); got != want {
			return nil, loadErr(src, ErrLeaves, "leaves scores probe %v as %v, the validator as %v", x, got, want)
		}
	}
	return m, nil
}

// leavesLoad runs leaves' parser on validated bytes, turning a panic into
// an error.
func leavesLoad(b []byte) (ens *leaves.Ensemble, err error) {
	defer func() {
		if r := recover(); r != nil {
			ens, err = nil, fmt.Errorf("leaves panicked: %v", r)
		}
	}()
	ens, err = leaves.LGEnsembleFromReader(bufio.NewReader(bytes.NewReader(b)), true)
	if err == nil && ens == nil {
		err = errors.New("leaves returned no model")
	}
	return ens, err
}
