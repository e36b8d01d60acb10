package model

import (
	"encoding/csv"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/amf-edge/amf/contract"
)

// goldenRow is one row of a parity CSV written by infer/train/amftrain.py:
// source, the six features (empty = NaN), sklearn's raw score and
// predict_proba[:, 1], all as Python repr (round-trip exact).
type goldenRow struct {
	line   int
	source string
	x      [contract.NumFeatures]float64
	raw    float64
	proba  float64
}

func readGolden(t *testing.T, path string) []goldenRow {
	t.Helper()
	var rows []goldenRow
	for _, r := range readNumericCSV(t, path, "raw", "probability") {
		g := goldenRow{line: r.line, source: r.source, raw: r.v[contract.NumFeatures], proba: r.v[contract.NumFeatures+1]}
		copy(g.x[:], r.v)
		rows = append(rows, g)
	}
	return rows
}

// csvRow is one row of a golden CSV: its line, its source column, and the
// numbers after it (empty = NaN).
type csvRow struct {
	line   int
	source string
	v      []float64
}

// readNumericCSV reads a golden CSV written by infer/train's scripts, whose
// header is source, the six features, then the columns named in after; every
// value is a Python repr (round-trip exact) or empty for NaN.
func readNumericCSV(t *testing.T, path string, after ...string) []csvRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("golden file: %v", err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	want := append(append([]string{"source"}, featureNames[:]...), after...)
	if len(recs) == 0 || strings.Join(recs[0], ",") != strings.Join(want, ",") {
		t.Fatalf("%s: header %v, want %v", path, recs[:min(len(recs), 1)], want)
	}
	var rows []csvRow
	for i, r := range recs[1:] {
		row := csvRow{line: i + 2, source: r[0], v: make([]float64, len(r)-1)}
		for j, s := range r[1:] {
			row.v[j] = math.NaN()
			if s == "" {
				continue
			}
			if row.v[j], err = strconv.ParseFloat(s, 64); err != nil {
				t.Fatalf("%s:%d: %v", path, row.line, err)
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// checkParity scores every golden row: |Δ probability| <= 1e-9 is the
// requirement; the raw margin is expected to be bit-identical (same float64
// additions in the same order), which is checked too.
func checkParity(t *testing.T, m *Model, rows []goldenRow, name string) {
	t.Helper()
	maxDiff := 0.0
	rawExact := 0
	for _, g := range rows {
		p := m.Score(&g.x)
		d := math.Abs(p - g.proba)
		if !(d <= 1e-9) {
			t.Errorf("%s line %d (%s): x=%v: Go %.17g, sklearn %.17g, |Δ|=%.3g > 1e-9", name, g.line, g.source, g.x, p, g.proba, d)
		}
		maxDiff = math.Max(maxDiff, d)
		if r := m.Raw(&g.x); r == g.raw {
			rawExact++
		} else {
			t.Errorf("%s line %d (%s): raw margin Go %.17g != sklearn %.17g", name, g.line, g.source, r, g.raw)
		}
	}
	t.Logf("%s: %d rows, max |Δ probability| %.3g, raw bit-identical on %d", name, len(rows), maxDiff, rawExact)
}

func TestParityP1(t *testing.T) {
	m, err := Embedded(PaperName)
	if err != nil {
		t.Fatal(err)
	}
	rows := readGolden(t, filepath.Join("testdata", "parity_p1.csv"))
	if len(rows) < 300 {
		t.Fatalf("only %d golden rows", len(rows))
	}
	var nanRows, anomalous int
	for _, g := range rows {
		for _, v := range g.x {
			if math.IsNaN(v) {
				nanRows++
				break
			}
		}
		if g.proba >= 0.5 {
			anomalous++
		}
	}
	if nanRows < 10 || anomalous < 10 || anomalous == len(rows) {
		t.Fatalf("golden file lacks variety: %d rows with NaN, %d anomalous of %d", nanRows, anomalous, len(rows))
	}
	checkParity(t, m, rows, "parity_p1.csv")
}

// TestParityEmbedded checks every embedded model against its golden.
func TestParityEmbedded(t *testing.T) {
	for _, e := range embeddedModels() {
		if e.golden == "" {
			continue // a rule without trees (TestEmbeddedFilesAreRegistered)
		}
		t.Run(e.name, func(t *testing.T) {
			m, err := Embedded(e.name)
			if err != nil {
				t.Fatal(err)
			}
			rows := readGolden(t, filepath.Join("testdata", e.golden))
			if len(rows) == 0 {
				t.Fatalf("%s has no rows", e.golden)
			}
			checkParity(t, m, rows, e.golden)
		})
	}
}

// TestExporterParity checks models exported from freshly fitted sklearn
// models (make test-exporter generates them into $AMF_EXPORTER_PARITY_DIR).
func TestExporterParity(t *testing.T) {
	dir := os.Getenv("AMF_EXPORTER_PARITY_DIR")
	if dir == "" {
		t.Skip("AMF_EXPORTER_PARITY_DIR not set: run `make test-exporter` (needs /usr/bin/python3 with python3-sklearn)")
	}
	models, err := filepath.Glob(filepath.Join(dir, "*.manifest.json"))
	if err != nil || len(models) == 0 {
		t.Fatalf("no *.manifest.json in %s (err %v)", dir, err)
	}
	for _, man := range models {
		base := strings.TrimSuffix(man, ".manifest.json")
		name := filepath.Base(base)
		t.Run(name, func(t *testing.T) {
			m, err := LoadFiles(base + ".txt")
			if err != nil {
				t.Fatal(err)
			}
			checkParity(t, m, readGolden(t, base+".csv"), name)
			checkExplanations(t, m, readExplainGolden(t, base+".explain.csv"), name+".explain.csv")
		})
	}
}
