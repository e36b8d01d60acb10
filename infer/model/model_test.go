package model

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
)

// p1Bytes are the embedded P1 model's files, the tests' reference tree model
// (the ToD-K8s-OOD normalisation, golden rows with NaNs and both classes).
func p1Bytes(t testing.TB) (model, manifest []byte) {
	t.Helper()
	mb, jb, err := EmbeddedFiles(PaperName)
	if err != nil {
		t.Fatal(err)
	}
	return mb, jb
}

func mustP1(t testing.TB) *Model {
	t.Helper()
	m, err := Embedded(PaperName)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// manifestFor returns the default manifest edited by edit and with
// model_sha256 set to the sha256 of model.
func manifestFor(t testing.TB, model []byte, edit func(map[string]any)) []byte {
	t.Helper()
	_, jb := p1Bytes(t)
	var m map[string]any
	if err := json.Unmarshal(jb, &m); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(model)
	m["model_sha256"] = hex.EncodeToString(sum[:])
	if edit != nil {
		edit(m)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tinyModel is a valid two-tree model small enough to read.
const tinyModel = `tree
version=v3
num_class=1
num_tree_per_iteration=1
label_index=0
max_feature_idx=5
objective=binary sigmoid:1
feature_names=cpu_percent memory_percent network_io_bytes_per_sec disk_io_bytes_per_sec cpu_growth_rate memory_growth_rate
feature_infos=none none none none none none
tree_sizes=1 1

Tree=0
num_leaves=3
num_cat=0
split_feature=1 0
split_gain=1 1
threshold=80 80
decision_type=10 8
left_child=1 -1
right_child=-3 -2
leaf_value=-2.5 3 4
leaf_count=1 1 1
internal_value=0 0
internal_count=3 2
is_linear=0
shrinkage=1


Tree=1
num_leaves=1
num_cat=0
split_feature=
split_gain=
threshold=
decision_type=
left_child=
right_child=
leaf_value=0.25
leaf_count=1
internal_value=
internal_count=
is_linear=0
shrinkage=1


end of trees
`

func TestTinyModelSemantics(t *testing.T) {
	mb := []byte(tinyModel)
	m, err := Load(mb, manifestFor(t, mb, nil))
	if err != nil {
		t.Fatal(err)
	}
	nan := math.NaN()
	// Tree 0: memory <= 80 (NaN left) -> [cpu <= 80 (NaN right) -> -2.5 : 3] : 4; tree 1: +0.25.
	cases := []struct {
		name string
		x    [contract.NumFeatures]float64
		raw  float64
	}{
		{"both low", [6]float64{10, 10}, -2.25},
		{"cpu at threshold goes left", [6]float64{80, 10}, -2.25},
		{"cpu just above", [6]float64{math.Nextafter(80, 100), 10}, 3.25},
		{"memory above", [6]float64{10, 80.5}, 4.25},
		{"memory NaN goes left", [6]float64{10, nan}, -2.25},
		{"cpu NaN goes right", [6]float64{nan, 10}, 3.25},
		{"all NaN", [6]float64{nan, nan, nan, nan, nan, nan}, 3.25},
		{"+Inf memory", [6]float64{0, math.Inf(1)}, 4.25},
		{"-Inf cpu", [6]float64{math.Inf(-1), 0}, -2.25},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := m.Raw(&c.x); got != c.raw {
				t.Fatalf("raw %v, want %v", got, c.raw)
			}
			if got, want := m.Score(&c.x), 1/(1+math.Exp(-c.raw)); got != want {
				t.Fatalf("score %v, want %v", got, want)
			}
		})
	}
	if m.NumTrees() != 2 || m.Threshold() != 0.5 {
		t.Fatalf("trees %d threshold %v", m.NumTrees(), m.Threshold())
	}
}

func TestDefaultModel(t *testing.T) {
	m, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if m2, _ := Default(); m2 != m {
		t.Fatal("Default() is not cached")
	}
	if m.Source() != "(embedded "+DefaultName+")" {
		t.Fatalf("the default is %s, want the embedded %s", m.Source(), DefaultName)
	}
}

func TestP1Model(t *testing.T) {
	m := mustP1(t)
	man := m.Manifest()
	if man.Protocol != "P1" || man.Seed != 42 || man.Threshold != 0.5 {
		t.Fatalf("manifest %+v", man)
	}
	if man.Dataset == nil || man.Dataset.Licence != "CC BY 4.0" || len(man.Dataset.Authors) != 2 {
		t.Fatalf("dataset attribution missing: %+v", man.Dataset)
	}
	// The embedded P1 model was trained on ToD-K8s-OOD, sampled every 5 s.
	want := Windows{Rate: 5 * time.Minute, Deriv: 10 * time.Minute, SubqueryStep: 5 * time.Second, Lookback: 5 * time.Minute, SampleInterval: 5 * time.Second}
	if w := m.Windows(); w != want || P1Windows() != want {
		t.Fatalf("windows %+v, P1 %+v, want %+v", w, P1Windows(), want)
	}
	if spec := m.FeatureSpec(); spec.Windows != want || spec.Names != contract.FeatureNames() || spec.Normalisation != m.Normalisation() {
		t.Fatalf("feature spec %+v", spec)
	}
	if man.SchemaVersion != ManifestSchemaVersion || len(m.Warnings()) != 0 {
		t.Fatalf("embedded manifest schema %d, warnings %q: want the current schema and none", man.SchemaVersion, m.Warnings())
	}
	if n := m.Normalisation(); n.CPUReferenceFraction != 0.5 || n.MemoryReferenceFraction != 0.5 {
		t.Fatalf("normalisation %+v", n)
	}
	if m.Source() != "(embedded p1)" || len(m.SHA256()) != 64 || m.NumTrees() < 10 {
		t.Fatalf("source %q sha %q trees %d", m.Source(), m.SHA256(), m.NumTrees())
	}
	// The label of the dataset is cpu >= 80 or memory >= 80: the model must
	// have learnt that much.
	for _, c := range []struct {
		x    [contract.NumFeatures]float64
		anom bool
	}{
		{[6]float64{1, 10, 1000, 50, 0, 0}, false},
		{[6]float64{95, 10, 1000, 50, 0, 0}, true},
		{[6]float64{1, 150, 1000, 50, 0, 0}, true},
	} {
		if got := m.Anomalous(m.Score(&c.x)); got != c.anom {
			t.Errorf("x=%v: anomalous %v (p=%v), want %v", c.x, got, m.Score(&c.x), c.anom)
		}
	}
	// Manifest() is a copy.
	man.FeatureNames[0] = "x"
	if m.Manifest().FeatureNames[0] != "cpu_percent" {
		t.Fatal("Manifest() exposes internal state")
	}
}

func TestCheckFeatureNames(t *testing.T) {
	m, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckFeatureNames(featureNames[:]); err != nil {
		t.Fatal(err)
	}
	swapped := contract.FeatureNames()
	swapped[0], swapped[1] = swapped[1], swapped[0]
	for _, names := range [][]string{swapped[:], featureNames[:5], append(featureNames[:], "x")} {
		if err := m.CheckFeatureNames(names); !errors.Is(err, ErrFeatures) {
			t.Errorf("%v: err %v, want ErrFeatures", names, err)
		}
	}
}

func TestLoadRejects(t *testing.T) {
	mb, jb := p1Bytes(t)
	s := string(mb)
	replace := func(old, new string) []byte {
		if !strings.Contains(s, old) {
			t.Fatalf("default model has no %q", old)
		}
		return []byte(strings.Replace(s, old, new, 1))
	}
	same := func(b []byte) []byte { return manifestFor(t, b, nil) }
	editMan := func(edit func(map[string]any)) []byte { return manifestFor(t, mb, edit) }
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(rng.UintN(256))
	}
	huge := bytes.Repeat([]byte("x"), MaxModelBytes+1)
	truncated := mb[:len(mb)/2]
	cycle := []byte(strings.Replace(tinyModel, "left_child=1 -1", "left_child=1 1", 1))

	cases := []struct {
		name     string
		model    []byte
		manifest []byte
		kind     error
		contains string
	}{
		{"empty model", nil, same(nil), ErrEmpty, "empty"},
		{"empty manifest", mb, []byte{}, ErrManifest, "manifest is empty"},
		{"truncated, sha fixed", truncated, same(truncated), ErrFormat, "truncated?"},
		{"truncated, sha of original", truncated, jb, ErrChecksum, "sha256"},
		{"sha mismatch", replace("leaf_value=-1.87", "leaf_value=-1.97"), jb, ErrChecksum, "manifest says"},
		{"huge model", huge, same(huge), ErrTooLarge, "limit"},
		{"random bytes", random, same(random), ErrFormat, "not a text model"},
		{"xgboost-like binary", append([]byte{0, 0, 0, 0x3f, 'b', 'i', 'n', 'f'}, random[:64]...), nil, ErrFormat, ""},
		{"wrong objective", replace("objective=binary sigmoid:1", "objective=regression"), nil, ErrFormat, "objective"},
		{"sigmoid not 1", replace("objective=binary sigmoid:1", "objective=binary sigmoid:2"), nil, ErrFormat, "objective"},
		{"wrong version", replace("version=v3", "version=v4"), nil, ErrFormat, "version"},
		{"no version", replace("version=v3\n", ""), nil, ErrFormat, "no version"},
		{"multiclass", replace("num_class=1", "num_class=3"), nil, ErrFormat, "num_class"},
		{"five features", replace("max_feature_idx=5", "max_feature_idx=4"), nil, ErrFormat, "max_feature_idx"},
		{"header feature names", replace("feature_names=cpu_percent memory_percent", "feature_names=memory_percent cpu_percent"), nil, ErrFeatures, "feature"},
		{"average_output", replace("objective=binary sigmoid:1", "objective=binary sigmoid:1\naverage_output"), nil, ErrFormat, "average_output"},
		{"no tree header", replace("tree\n", "xtree\n"), nil, ErrFormat, "starts with"},
		{"split feature out of range", replace("split_feature=1 0", "split_feature=7 0"), nil, ErrFormat, "split_feature"},
		{"categorical split", replace("decision_type=10 10", "decision_type=9 10"), nil, ErrFormat, "categorical"},
		{"unknown missing type", replace("decision_type=10 10", "decision_type=14 10"), nil, ErrFormat, "missing type"},
		{"NaN leaf", replace("leaf_value=-1.8795263300463827 ", "leaf_value=NaN "), nil, ErrFormat, "leaf_value[0] \"NaN\""},
		{"Inf leaf", replace("leaf_value=-1.8795263300463827 ", "leaf_value=-Inf "), nil, ErrFormat, "leaf_value[0]"},
		{"huge leaf", replace("leaf_value=-1.8795263300463827 ", "leaf_value=-1e300 "), nil, ErrFormat, "leaf_value[0]"},
		{"NaN threshold", replace("threshold=82.51953125 ", "threshold=nan "), nil, ErrFormat, "threshold[0]"},
		{"num_leaves huge", replace("num_leaves=14", "num_leaves=2000000000"), nil, ErrFormat, "num_leaves"},
		{"num_leaves mismatch", replace("num_leaves=14", "num_leaves=15"), nil, ErrFormat, "values"},
		{"child out of range", replace("right_child=10 9", "right_child=99 9"), nil, ErrFormat, "outside"},
		{"cycle", cycle, nil, ErrFormat, "twice"},
		{"linear tree", replace("is_linear=0", "is_linear=1"), nil, ErrFormat, "linear"},
		{"categorical count", replace("num_cat=0", "num_cat=1"), nil, ErrFormat, "num_cat"},
		{"duplicate key", replace("num_cat=0", "num_cat=0\nnum_cat=0"), nil, ErrFormat, "twice"},
		{"two equals", replace("num_cat=0", "num_cat=0=0"), nil, ErrFormat, "key=value"},
		{"extra tree", replace("end of trees", "Tree=999\nnum_leaves=1\nnum_cat=0\nleaf_value=1\n\nend of trees"), nil, ErrFormat, "end of trees"},
		{"fewer tree sizes", replace("tree_sizes=", "tree_sizes=1 "), nil, ErrFormat, ""},
		{"three blank lines", replace("\n\n\nTree=1\n", "\n\n\n\nTree=1\n"), nil, ErrFormat, "blank lines"},
		{"double space in array", replace("split_feature=1 0", "split_feature=1  0"), nil, ErrFormat, ""},
		{"manifest feature names", mb, editMan(func(m map[string]any) {
			m["feature_names"] = []string{"memory_percent", "cpu_percent", "network_io_bytes_per_sec", "disk_io_bytes_per_sec", "cpu_growth_rate", "memory_growth_rate"}
		}), ErrFeatures, "feature 0"},
		{"manifest five features", mb, editMan(func(m map[string]any) {
			m["feature_names"] = featureNames[:5]
		}), ErrFeatures, "5 features"},
		{"manifest bad JSON", mb, []byte("{"), ErrManifest, "JSON"},
		{"manifest trailing data", mb, append(same(mb), []byte("{}")...), ErrManifest, "after"},
		{"manifest unknown field", mb, editMan(func(m map[string]any) { m["thresold"] = 0.4 }), ErrManifest, "unknown field"},
		{"manifest schema from the future", mb, editMan(func(m map[string]any) { m["schema_version"] = 3 }), ErrManifest, "schema_version 3"},
		{"manifest schema zero", mb, editMan(func(m map[string]any) { m["schema_version"] = 0 }), ErrManifest, "schema_version 0"},
		{"manifest threshold", mb, editMan(func(m map[string]any) { m["threshold"] = 1.5 }), ErrManifest, "threshold"},
		{"manifest window", mb, editMan(func(m map[string]any) {
			m["feature_windows"].(map[string]any)["rate_window"] = "5 minutes"
		}), ErrFeatureSpec, "rate_window"},
		{"manifest normalisation", mb, editMan(func(m map[string]any) {
			m["normalisation"].(map[string]any)["memory_reference_fraction"] = 0
		}), ErrFeatureSpec, "memory_reference_fraction"},
		{"manifest objective", mb, editMan(func(m map[string]any) { m["objective"] = "regression" }), ErrManifest, "objective"},
		{"manifest sha not hex", mb, editMan(func(m map[string]any) { m["model_sha256"] = "xyz" }), ErrManifest, "hex"},
		{"manifest format vs text", replace("version=v3", "version=v2"), nil, ErrManifest, "model_format"},
		{"manifest too large", mb, append(same(mb), bytes.Repeat([]byte(" "), MaxManifestBytes)...), ErrTooLarge, "manifest"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			man := c.manifest
			if man == nil {
				man = same(c.model)
			}
			m, err := Load(c.model, man)
			if err == nil {
				t.Fatalf("loaded (%d trees), want error", m.NumTrees())
			}
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %T %v is not a *LoadError", err, err)
			}
			if !errors.Is(err, c.kind) {
				t.Fatalf("error %q, want kind %v", err, c.kind)
			}
			if !strings.Contains(err.Error(), c.contains) {
				t.Fatalf("error %q does not mention %q", err, c.contains)
			}
			if m != nil {
				t.Fatal("non-nil model with an error")
			}
			t.Log(err)
		})
	}
}

func TestLoadAccepts(t *testing.T) {
	mb, _ := p1Bytes(t)
	def := mustP1(t)
	crlf := bytes.ReplaceAll(mb, []byte("\n"), []byte("\r\n"))
	v2 := []byte(strings.Replace(string(mb), "version=v3", "version=v2", 1))
	noTrailer := mb[:bytes.Index(mb, []byte("end of trees"))]
	for _, c := range []struct {
		name  string
		model []byte
		edit  func(map[string]any)
	}{
		{"CRLF line ends", crlf, nil},
		{"version v2", v2, func(m map[string]any) { m["model_format"] = "lightgbm-text-v2" }},
		{"no trailer after trees", noTrailer, nil},
		{"no dataset or validation", mb, func(m map[string]any) { delete(m, "dataset"); delete(m, "validation") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Load(c.model, manifestFor(t, c.model, c.edit))
			if err != nil {
				t.Fatal(err)
			}
			x := [contract.NumFeatures]float64{85, 20, 1000, 10, 0.001, 5}
			if m.Score(&x) != def.Score(&x) {
				t.Fatal("scores differ from the embedded p1 model")
			}
		})
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadFiles(t *testing.T) {
	mb, jb := p1Bytes(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.txt")
	writeFile(t, good, mb)
	writeFile(t, filepath.Join(dir, "good.manifest.json"), jb)

	if ManifestPathFor(good) != filepath.Join(dir, "good.manifest.json") || ManifestPathFor("m") != "m.manifest.json" {
		t.Fatal("ManifestPathFor rule")
	}
	m, err := LoadFiles(good)
	if err != nil {
		t.Fatal(err)
	}
	if m.Source() != good {
		t.Fatalf("source %q", m.Source())
	}
	if _, err := LoadFilePair(good, filepath.Join(dir, "good.manifest.json")); err != nil {
		t.Fatal(err)
	}

	noMan := filepath.Join(dir, "noman.txt")
	writeFile(t, noMan, mb)
	big := filepath.Join(dir, "big.txt")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil { // sparse: refused before reading
		t.Fatal(err)
	}
	f.Close()
	writeFile(t, filepath.Join(dir, "big.manifest.json"), jb)
	bad := filepath.Join(dir, "bad.txt")
	writeFile(t, bad, mb[:1000])
	writeFile(t, filepath.Join(dir, "bad.manifest.json"), jb)

	for _, c := range []struct {
		name, path string
		kind       error
		contains   []string
	}{
		{"missing file", filepath.Join(dir, "nope.txt"), ErrIO, []string{"nope.txt", "no such file"}},
		{"missing manifest", noMan, ErrIO, []string{"noman.manifest.json", "NAME.manifest.json"}},
		{"directory", dir, ErrIO, []string{"directory"}},
		{"huge file", big, ErrTooLarge, []string{"big.txt", "limit"}},
		{"corrupt", bad, ErrChecksum, []string{"bad.txt", "re-export"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadFiles(c.path)
			if !errors.Is(err, c.kind) {
				t.Fatalf("err %v, want %v", err, c.kind)
			}
			for _, s := range c.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}

	t.Run("override empty", func(t *testing.T) {
		m, err := LoadOverride("")
		def, _ := Default()
		if err != nil || m != def {
			t.Fatalf("m %p err %v", m, err)
		}
	})
	t.Run("override good", func(t *testing.T) {
		m, err := LoadOverride(good)
		if err != nil || m.Source() != good {
			t.Fatalf("m %v err %v", m, err)
		}
	})
	t.Run("override bad falls back", func(t *testing.T) {
		m, err := LoadOverride(bad)
		def, _ := Default()
		if err == nil || m != def {
			t.Fatalf("m %p err %v: want the default and an error", m, err)
		}
		if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "embedded default model "+DefaultName) || !strings.Contains(err.Error(), "bad.txt") {
			t.Fatalf("error %q", err)
		}
	})
}

func TestScoreNoAllocs(t *testing.T) {
	m, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	x := [contract.NumFeatures]float64{12, 34, 1000, 50, math.NaN(), 0.5}
	if a := testing.AllocsPerRun(1000, func() { m.Score(&x) }); a != 0 {
		t.Fatalf("Score allocates %v times per call", a)
	}
}

func TestScoreConcurrent(t *testing.T) {
	m := mustP1(t)
	rows := readGolden(t, filepath.Join("testdata", "parity_p1.csv"))
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				for _, r := range rows {
					if p := m.Score(&r.x); math.Abs(p-r.proba) > 1e-9 {
						t.Errorf("line %d: %v != %v", r.line, p, r.proba)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// featureNames is the schema the tests slice.
var featureNames = contract.FeatureNames()
