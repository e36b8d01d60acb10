package model

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestEmbeddedByName(t *testing.T) {
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		arg     string
		want    *Model   // nil: an error is wanted
		mention []string // in the error
	}{
		{"the default name is the default model", DefaultName, def, nil},
		{"leadtime is the default model", "leadtime", def, nil},
		{"an unknown name lists the embedded models", "nosuch", nil, []string{"nosuch", "no embedded model", "embedded: leadtime, p1"}},
		{"the empty name is no model", "", nil, []string{"embedded: leadtime"}},
		{"a path is not a name", "./p1", nil, []string{"./p1", "embedded: leadtime"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Embedded(tt.arg)
			if tt.want != nil {
				if err != nil || m != tt.want {
					t.Fatalf("model %p, error %v; want %p (%s)", m, err, tt.want, tt.want.Source())
				}
				return
			}
			if m != nil || !errors.Is(err, ErrNoSuchModel) {
				t.Fatalf("model %v, error %v; want ErrNoSuchModel", m, err)
			}
			for _, s := range tt.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestEveryEmbeddedModelLoadsOnceUnderItsName(t *testing.T) {
	names := EmbeddedNames()
	if len(names) == 0 || names[0] != DefaultName {
		t.Fatalf("embedded names %q: want the default %q first", names, DefaultName)
	}
	// A name must never be readable as a path (LoadNameOrPath tries names first).
	valid := regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	for i, name := range names {
		if !valid.MatchString(name) || slices.Contains(names[:i], name) {
			t.Errorf("embedded name %q: want unique lower-case letters, digits, - and _", name)
		}
		t.Run(name, func(t *testing.T) {
			m, err := Embedded(name)
			if err != nil {
				t.Fatal(err)
			}
			if again, _ := Embedded(name); again != m {
				t.Error("not loaded once and shared")
			}
			if m.Source() != "(embedded "+name+")" || len(m.SHA256()) != 64 {
				t.Errorf("source %q, sha256 %q", m.Source(), m.SHA256())
			}
			if len(m.Warnings()) != 0 {
				t.Errorf("an embedded manifest must be current: warnings %q", m.Warnings())
			}
		})
	}
}

// The embed patterns take every model file pair of the folder: each must be a
// registered model's, with its parity golden.
func TestEmbeddedFilesAreRegistered(t *testing.T) {
	registered := map[string]bool{}
	for _, e := range embeddedModels() {
		registered[e.model], registered[e.manifest] = true, true
		if e.golden == "" {
			if m, err := Embedded(e.name); err != nil || m.Rule() == "" {
				t.Errorf("embedded model %s has no parity golden but is not a rule (error %v)", e.name, err)
			}
			continue
		}
		if _, err := os.Stat(filepath.Join("testdata", e.golden)); err != nil {
			t.Errorf("embedded model %s: parity golden: %v", e.name, err)
		}
	}
	files, err := fs.Glob(embedded, "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !registered[f] {
			t.Errorf("%s is embedded but no model of embeddedModels (embedded.go) uses it: add its entry", f)
		}
		delete(registered, f)
	}
	for f := range registered {
		t.Errorf("embeddedModels names %s, which is not embedded (NAME_model.txt, NAME_manifest.json)", f)
	}
}

func TestLoadNameOrPath(t *testing.T) {
	mb, jb, err := EmbeddedFiles(DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	// Relative paths, as a user types them, in a folder that also holds a
	// file called like the default model's name.
	t.Chdir(t.TempDir())
	writeFile(t, "good.txt", mb)
	writeFile(t, "good.manifest.json", jb)
	writeFile(t, "leadtime", mb)
	writeFile(t, "leadtime.manifest.json", jb)
	writeFile(t, "noman.txt", mb)
	tests := []struct {
		name    string
		arg     string
		source  string // of the model loaded; "" = an error is wanted
		kind    error
		mention []string
	}{
		{"empty is the default", "", def.Source(), nil, nil},
		{"an embedded name wins over a file of that name", "leadtime", def.Source(), nil, nil},
		{"a path", "good.txt", "good.txt", nil, nil},
		{"./leadtime is the file called leadtime", "./leadtime", "./leadtime", nil, nil},
		{"an unknown name lists the embedded models", "nosuch", "", ErrNoSuchModel, []string{"model nosuch", "neither an embedded model (embedded: leadtime, p1, predict-linear) nor a model file"}},
		{"a missing path is a file error", filepath.Join("models", "nosuch.txt"), "", ErrIO, []string{"nosuch.txt", "no such file"}},
		{"an existing file without its manifest is a file error", "noman.txt", "", ErrIO, []string{"noman.manifest.json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := LoadNameOrPath(tt.arg)
			if tt.source != "" {
				if err != nil {
					t.Fatal(err)
				}
				if m.Source() != tt.source || m.SHA256() != def.SHA256() {
					t.Fatalf("source %q sha256 %.12s, want %q %.12s", m.Source(), m.SHA256(), tt.source, def.SHA256())
				}
				if (tt.source == def.Source()) != (m == def) {
					t.Fatalf("model %p, default %p: an embedded name must give the shared model, a path its own", m, def)
				}
				return
			}
			if m != nil || !errors.Is(err, tt.kind) {
				t.Fatalf("model %v, error %v; want %v", m, err, tt.kind)
			}
			if tt.kind != ErrNoSuchModel && errors.Is(err, ErrNoSuchModel) {
				t.Fatalf("error %v: a path is not reported as an unknown name", err)
			}
			for _, s := range tt.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestLoadOverrideByName(t *testing.T) {
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		arg     string
		kind    error // of the fallback error; nil: none
		mention []string
	}{
		{"no override", "", nil, nil},
		{"the default's name", "leadtime", nil, nil},
		{"an unknown name falls back and says the embedded names", "nosuch", ErrNoSuchModel,
			[]string{"running on the embedded default model leadtime", "model nosuch", "embedded: leadtime"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := LoadOverride(tt.arg)
			if m != def {
				t.Fatalf("running on %v, want the default", m)
			}
			if tt.kind == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tt.kind) {
				t.Fatalf("error %v, want %v", err, tt.kind)
			}
			for _, s := range tt.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestEmbeddedFilesAreTheBytesTheModelLoadsFrom(t *testing.T) {
	for _, name := range EmbeddedNames() {
		mb, jb, err := EmbeddedFiles(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m, err := Embedded(name)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := Load(mb, jb); err != nil || got.SHA256() != m.SHA256() {
			t.Errorf("%s: the files load as %v (err %v), the embedded model is %s", name, got, err, m.SHA256())
		}
	}
	if _, _, err := EmbeddedFiles("nosuch"); !errors.Is(err, ErrNoSuchModel) {
		t.Errorf("unknown name: error %v, want ErrNoSuchModel", err)
	}
}

// The default is the lab's choice (make leadtime, infer/train/amfleadtime.py
// choose_default): the detector that does not lose to predict_linear on the
// held-out families. A retraining that changes the choice must change
// DefaultName with it, and this says so.
func TestDefaultIsTheLabsChoice(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "train", "report", "leadtime.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Default struct {
			Name string `json:"name"`
		} `json:"default"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("infer/train/report/leadtime.json: %v", err)
	}
	if rep.Default.Name != DefaultName {
		t.Fatalf("the lab chose %q as the default (infer/train/report/leadtime.md, \"The default\"); DefaultName is %q", rep.Default.Name, DefaultName)
	}
}
