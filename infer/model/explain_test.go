package model

import (
	"errors"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/amf-edge/amf/contract"
)

// explainRow is one row of an explanation golden written by
// infer/train/amfexplain.py from scikit-learn's tree arrays: the features,
// the Saabas bias and per-feature contributions, and sklearn's raw score.
type explainRow struct {
	line    int
	source  string
	x       [contract.NumFeatures]float64
	bias    float64
	contrib [contract.NumFeatures]float64
	raw     float64
}

func readExplainGolden(t *testing.T, path string) []explainRow {
	t.Helper()
	after := []string{"bias"}
	for _, n := range featureNames {
		after = append(after, "contribution_"+n)
	}
	var rows []explainRow
	for _, r := range readNumericCSV(t, path, append(after, "raw")...) {
		g := explainRow{line: r.line, source: r.source, bias: r.v[contract.NumFeatures], raw: r.v[2*contract.NumFeatures+1]}
		copy(g.x[:], r.v)
		copy(g.contrib[:], r.v[contract.NumFeatures+1:])
		rows = append(rows, g)
	}
	return rows
}

// close reports |a-b| <= 1e-9 * max(1, |b|): Go and Python add the same
// terms in another order (the baseline is folded into tree 0's leaves here).
func closeTo(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// checkExplanations requires Go's Saabas attribution to equal the Python
// reference on every golden row, and to add up to the model's raw score.
func checkExplanations(t *testing.T, m *Model, rows []explainRow, name string) {
	t.Helper()
	nonzero := 0
	for _, g := range rows {
		e, err := m.Explain(&g.x)
		if err != nil {
			t.Fatalf("%s line %d: %v", name, g.line, err)
		}
		if !closeTo(e.Bias, g.bias) {
			t.Errorf("%s line %d (%s): bias Go %.17g, sklearn %.17g", name, g.line, g.source, e.Bias, g.bias)
		}
		for j := range contract.NumFeatures {
			if !closeTo(e.Contributions[j], g.contrib[j]) {
				t.Errorf("%s line %d (%s): %s contribution Go %.17g, sklearn %.17g", name, g.line, g.source, featureNames[j], e.Contributions[j], g.contrib[j])
			}
			if g.contrib[j] != 0 {
				nonzero++
			}
		}
		if r := m.Raw(&g.x); !closeTo(e.Raw(), r) || !closeTo(e.Raw(), g.raw) {
			t.Errorf("%s line %d (%s): bias + contributions %.17g, Go raw %.17g, sklearn raw %.17g", name, g.line, g.source, e.Raw(), r, g.raw)
		}
	}
	// A model of single leaves is all bias; any split must credit some row.
	splits := false
	for k := range m.trees {
		splits = splits || len(m.trees[k].left) > 0
	}
	if len(rows) == 0 || (splits && nonzero == 0) {
		t.Fatalf("%s: %d rows, %d nonzero contributions: the comparison proves nothing", name, len(rows), nonzero)
	}
}

func TestExplanationsMatchSklearnOnTheLeadtimeGolden(t *testing.T) {
	m, err := Embedded("leadtime")
	if err != nil {
		t.Fatal(err)
	}
	checkExplanations(t, m, readExplainGolden(t, filepath.Join("testdata", "explain_leadtime.csv")), "explain_leadtime.csv")
}

// P1 has no explanation golden (its rows are the dataset's), but its
// attribution must still add up to its raw score on its parity rows.
func TestExplanationsOfP1AddUpToTheRawScore(t *testing.T) {
	m := mustP1(t)
	for _, g := range readGolden(t, filepath.Join("testdata", "parity_p1.csv")) {
		e, err := m.Explain(&g.x)
		if err != nil {
			t.Fatal(err)
		}
		if !closeTo(e.Raw(), g.raw) {
			t.Errorf("line %d: bias + contributions %.17g, raw %.17g", g.line, e.Raw(), g.raw)
		}
	}
}

func TestTopNamesTheFeaturesThatPushedTheScoreUp(t *testing.T) {
	e := Explanation{Bias: -3, Contributions: [contract.NumFeatures]float64{0.5, 2, 0, -1, 0.5, 1}}
	tests := []struct {
		name string
		n    int
		want string
	}{
		{"three largest, ties in feature order", 3, "memory_percent +2, memory_growth_rate +1, cpu_percent +0.5"},
		{"more than push up: only those that do", 6, "memory_percent +2, memory_growth_rate +1, cpu_percent +0.5, cpu_growth_rate +0.5"},
		{"none asked", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FormatTop(e.Top(tt.n)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	if got := FormatTop((Explanation{Contributions: [contract.NumFeatures]float64{15, 1.39e-17, 0, 0, 0, 2e-8}}).Top(3)); got != "cpu_percent +15, memory_growth_rate +2e-08" {
		t.Errorf("rounding noise is not a push: got %q", got)
	}
	if got := (Explanation{Contributions: [contract.NumFeatures]float64{-1, -2}}).Top(3); len(got) != 0 {
		t.Errorf("a score pushed only down: %v, want none", got)
	}
}

func TestExplainNeedsLeafCounts(t *testing.T) {
	mb, _ := p1Bytes(t)
	// Strip leaf_count: the model still scores, but cannot be explained.
	var kept []string
	for _, ln := range strings.Split(string(mb), "\n") {
		if !strings.HasPrefix(ln, "leaf_count=") {
			kept = append(kept, ln)
		}
	}
	text := []byte(strings.Join(kept, "\n"))
	m, err := Load(text, manifestFor(t, text, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Explain(&[contract.NumFeatures]float64{}); !errors.Is(err, ErrNoExplanation) || !strings.Contains(err.Error(), "leaf_count") {
		t.Fatalf("error %v; want ErrNoExplanation naming leaf_count", err)
	}
}

func TestWhyNamesTheTopThreeOrTheTimeToTheLimit(t *testing.T) {
	lead, err := Embedded("leadtime")
	if err != nil {
		t.Fatal(err)
	}
	rule, err := Embedded(PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	_, h := rule.Projection()
	// The anomalous golden rows: their explanation is the top three of Explain.
	anomalous := 0
	for _, g := range readExplainGolden(t, filepath.Join("testdata", "explain_leadtime.csv")) {
		if !lead.Anomalous(lead.Score(&g.x)) {
			continue
		}
		anomalous++
		e, _ := lead.Explain(&g.x)
		top := e.Top(3)
		if len(top) == 0 || top[0].Value <= 0 {
			t.Fatalf("line %d: an anomalous score with nothing pushing it up: %+v", g.line, e)
		}
		if got, want := lead.Why(&g.x, math.NaN(), math.NaN()), FormatTop(top)+" (Saabas, log-odds)"; got != want {
			t.Fatalf("line %d: Why %q, want %q", g.line, got, want)
		}
	}
	if anomalous == 0 {
		t.Fatal("no anomalous golden row")
	}
	tests := []struct {
		name             string
		projected, slope float64
		want             string
	}{
		{"climbing towards the limit", 90, 1, "meets the limit in " + strconv.FormatFloat(h.Seconds()+10, 'f', 1, 64) + " s"},
		{"flat", 90, 0, "flat or falling"},
		{"past the limit already", 100 + 2*h.Seconds()*1, 1, "met the limit " + strconv.FormatFloat(h.Seconds(), 'f', 1, 64) + " s ago"},
		{"no projection yet", math.NaN(), math.NaN(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rule.Why(&[contract.NumFeatures]float64{}, tt.projected, tt.slope)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) || (got != "" && !strings.Contains(got, rule.Rule())) {
				t.Errorf("Why = %q, want it to say %q and name the rule", got, tt.want)
			}
		})
	}
}
