package model

import (
	"embed"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
)

// The patterns pick up every model file pair of this folder, so that adding
// an embedded model is one entry in embeddedModels (TestEmbeddedFilesAreRegistered
// fails on a file pair without an entry).
//
//go:embed *_model.txt *_manifest.json
var embedded embed.FS

// DefaultName is the embedded model Default returns and the sidecar runs
// when no --model is given: the lab's choice (make leadtime, report "The
// default"; TestDefaultIsTheLabsChoice holds it to the report).
const DefaultName = "leadtime"

// PaperName is the paper's P1 model, the default until the lab's detector met
// its goals; the paper's experiment (lab/experiment) still runs it.
const PaperName = "p1"

// embeddedModel is one model compiled into the binary.
type embeddedModel struct {
	name     string // what --model accepts; no path separator
	model    string // file in this folder
	manifest string // file in this folder
	golden   string // parity golden under testdata, checked by TestParityEmbedded; "" for a rule without trees
}

// embeddedModels is the registry, default first. To embed a model, put its
// files in this folder (NAME_model.txt, NAME_manifest.json,
// testdata/parity_NAME.csv) and add one entry.
func embeddedModels() []embeddedModel {
	return []embeddedModel{
		// Trained on the lab corpus to predict an OOM kill, failures labelled
		// only above what a healthy run holds (make leadtime;
		// infer/train/report/leadtime.md).
		{name: DefaultName, model: "leadtime_model.txt", manifest: "leadtime_manifest.json", golden: "parity_leadtime.csv"},
		// The paper's model, trained on ToD-K8s-OOD (make model).
		{name: PaperName, model: "p1_model.txt", manifest: "p1_manifest.json", golden: "parity_p1.csv"},
		// The rule a user would write instead, predict_linear of memory against
		// the limit, W and H chosen like leadtime's (make leadtime; linear.go).
		// No trees, so no parity golden: its projection is checked against
		// Prometheus (infer/promqlparity).
		{name: PredictLinearName, model: "predict-linear_model.txt", manifest: "predict-linear_manifest.json"},
	}
}

// embeddedLoads loads each embedded model once, on first use, and shares it:
// a model is immutable and the sidecar and its tools ask for it repeatedly.
var embeddedLoads = func() map[string]func() (*Model, error) {
	loads := map[string]func() (*Model, error){}
	for _, e := range embeddedModels() {
		loads[e.name] = sync.OnceValues(e.load)
	}
	return loads
}()

func (e embeddedModel) source() string { return "(embedded " + e.name + ")" }

func (e embeddedModel) load() (*Model, error) {
	mb, jb, err := EmbeddedFiles(e.name)
	if err != nil {
		return nil, err
	}
	return load(e.source(), e.manifest+" (embedded)", mb, jb)
}

// EmbeddedFiles returns the bytes of the embedded model of that name and of
// its manifest, as `NAME.txt` and `NAME.manifest.json` would hold them (to
// write one out, or derive a variant).
func EmbeddedFiles(name string) (modelText, manifest []byte, err error) {
	for _, e := range embeddedModels() {
		if e.name != name {
			continue
		}
		if modelText, err = embedded.ReadFile(e.model); err != nil {
			return nil, nil, loadErr(e.source(), ErrIO, "%v", err)
		}
		if manifest, err = embedded.ReadFile(e.manifest); err != nil {
			return nil, nil, loadErr(e.source(), ErrIO, "%v", err)
		}
		return modelText, manifest, nil
	}
	return nil, nil, loadErr(name, ErrNoSuchModel, "no embedded model of that name (embedded: %s)", strings.Join(EmbeddedNames(), ", "))
}

// EmbeddedNames are the names of the embedded models, DefaultName first.
func EmbeddedNames() []string {
	var names []string
	for _, e := range embeddedModels() {
		names = append(names, e.name)
	}
	return names
}

// Embedded returns the embedded model of that name (loaded once, then
// shared). An unknown name is an error of kind ErrNoSuchModel listing the
// embedded names.
func Embedded(name string) (*Model, error) {
	load, ok := embeddedLoads[name]
	if !ok {
		return nil, loadErr(name, ErrNoSuchModel, "no embedded model of that name (embedded: %s)", strings.Join(EmbeddedNames(), ", "))
	}
	return load()
}

// Default returns the embedded default model, DefaultName (loaded once, then
// shared).
func Default() (*Model, error) { return Embedded(DefaultName) }

// LoadNameOrPath loads the model a command line names: "" is the embedded
// default; an exact embedded name (EmbeddedNames) is that model; anything
// else is a model file path (LoadFiles), so "./p1" is a file called p1. An
// argument without a path separator that names neither an embedded model nor
// an existing file is an error of kind ErrNoSuchModel listing the embedded
// names, since it was most likely meant as a name.
func LoadNameOrPath(nameOrPath string) (*Model, error) {
	if nameOrPath == "" {
		return Default()
	}
	if _, ok := embeddedLoads[nameOrPath]; ok {
		return Embedded(nameOrPath)
	}
	m, err := LoadFiles(nameOrPath)
	if err != nil && !strings.ContainsAny(nameOrPath, "/"+string(os.PathSeparator)) {
		if _, serr := os.Stat(nameOrPath); errors.Is(serr, fs.ErrNotExist) {
			return nil, loadErr(nameOrPath, ErrNoSuchModel, "neither an embedded model (embedded: %s) nor a model file", strings.Join(EmbeddedNames(), ", "))
		}
	}
	return m, err
}
