package model

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
)

// linearFiles returns the embedded predict_linear detector's text and its
// manifest decoded as a map, to derive variants from.
func linearFiles(t *testing.T) ([]byte, map[string]any) {
	t.Helper()
	mb, jb, err := EmbeddedFiles(PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	var man map[string]any
	if err := json.Unmarshal(jb, &man); err != nil {
		t.Fatal(err)
	}
	return mb, man
}

// loadLinear loads text with man, the manifest's sha256 set to the text's.
func loadLinear(t *testing.T, text []byte, man map[string]any) (*Model, error) {
	t.Helper()
	sum := sha256.Sum256(text)
	man["model_sha256"] = hex.EncodeToString(sum[:])
	jb, err := json.Marshal(man)
	if err != nil {
		t.Fatal(err)
	}
	return Load(text, jb)
}

func TestEmbeddedPredictLinearIsTheRuleItsManifestStates(t *testing.T) {
	m, err := Embedded(PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	mb, man := linearFiles(t)
	if got := strings.TrimSpace(string(mb)); got != m.Rule() {
		t.Errorf("model text %q, rule %q", got, m.Rule())
	}
	spec := man["predict_linear"].(map[string]any)
	w, _ := time.ParseDuration(spec["window"].(string))
	h, _ := time.ParseDuration(spec["horizon"].(string))
	if gw, gh := m.Projection(); gw != w || gh != h || w == 0 {
		t.Errorf("projection W %v H %v, manifest says %v %v", gw, gh, w, h)
	}
	if m.NumTrees() != 0 || !math.IsNaN(m.Score(&[contract.NumFeatures]float64{})) {
		t.Errorf("a rule has no trees: %d trees, Score %v", m.NumTrees(), m.Score(&[contract.NumFeatures]float64{}))
	}
	if _, err := m.Explain(&[contract.NumFeatures]float64{}); !errors.Is(err, ErrNoExplanation) {
		t.Errorf("Explain on the rule: %v, want ErrNoExplanation", err)
	}
	if tree, _ := Default(); tree.Rule() != "" {
		t.Errorf("a tree model has rule %q", tree.Rule())
	}
	if w, h := mustDefault(t).Projection(); w != 0 || h != 0 {
		t.Errorf("a tree model projects with W %v H %v", w, h)
	}
}

func mustDefault(t *testing.T) *Model {
	t.Helper()
	m, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// odds is f / (1 + f) in float64 arithmetic (a constant expression would be
// rounded once, not per operation).
func odds(f float64) float64 { return f / (1 + f) }

func TestPredictLinearScoresTheProjectionAgainstTheLimit(t *testing.T) {
	m, err := Embedded(PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	x := [contract.NumFeatures]float64{99, 99, 0, 0, 99, 99} // features do not count
	tests := []struct {
		name      string
		projected float64
		want      float64
		anomalous bool
	}{
		{"no projection yet does not fire", math.NaN(), 0, false},
		{"a line below zero is no nearer than none", -40, 0, false},
		{"half the limit", 50, odds(0.5), false},
		{"just under the limit", math.Nextafter(100, 0), odds(math.Nextafter(100, 0) / 100), false},
		{"at the limit fires at 0.5", 100, 0.5, true},
		{"past the limit fires", 130, odds(1.3), true},
		{"an unbounded line scores 1", math.Inf(1), 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := m.ScoreSample(&x, tt.projected)
			if got != tt.want || m.Anomalous(got) != tt.anomalous || !(got >= 0 && got <= 1) {
				t.Errorf("score %v (anomalous %v), want %v (%v)", got, m.Anomalous(got), tt.want, tt.anomalous)
			}
		})
	}
	// A tree model ignores the projection.
	def := mustDefault(t)
	if a, b := def.ScoreSample(&x, 500), def.Score(&x); a != b {
		t.Errorf("tree ScoreSample %v, Score %v", a, b)
	}
}

func TestPredictLinearManifestsThatDoNotStateTheRuleAreRefused(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(text *[]byte, man map[string]any)
		kind   error
		says   string
	}{
		{"the text is another rule", func(b *[]byte, _ map[string]any) {
			*b = []byte(strings.Replace(string(*b), ">= 100", ">= 90", 1))
		}, ErrFormat, "is not the rule its manifest states"},
		{"no predict_linear section", func(_ *[]byte, m map[string]any) { delete(m, "predict_linear") }, ErrManifest, "without a predict_linear section"},
		{"a tree objective", func(_ *[]byte, m map[string]any) { m["objective"] = ObjectiveBinarySigmoid }, ErrManifest, "objective"},
		{"a window that is no duration", func(_ *[]byte, m map[string]any) {
			m["predict_linear"].(map[string]any)["window"] = "five minutes"
		}, ErrManifest, "predict_linear.window"},
		{"a negative horizon", func(_ *[]byte, m map[string]any) {
			m["predict_linear"].(map[string]any)["horizon"] = "-1s"
		}, ErrManifest, "predict_linear.horizon"},
		{"a threshold of 0", func(_ *[]byte, m map[string]any) { m["threshold"] = 0 }, ErrManifest, "threshold"},
		{"an unknown field in the section", func(_ *[]byte, m map[string]any) {
			m["predict_linear"].(map[string]any)["cpu"] = true
		}, ErrManifest, "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, man := linearFiles(t)
			tt.mutate(&text, man)
			_, err := loadLinear(t, text, man)
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("error %v; want %v mentioning %q", err, tt.kind, tt.says)
			}
		})
	}
	// And the untouched files load through the same path.
	text, man := linearFiles(t)
	if _, err := loadLinear(t, text, man); err != nil {
		t.Fatalf("the embedded files: %v", err)
	}
}

func TestTreeManifestWithAPredictLinearSectionIsRefused(t *testing.T) {
	mb, jb := p1Bytes(t)
	var man map[string]any
	if err := json.Unmarshal(jb, &man); err != nil {
		t.Fatal(err)
	}
	man["predict_linear"] = map[string]any{"window": "1m", "horizon": "60s"}
	b, _ := json.Marshal(man)
	if _, err := Load(mb, b); !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), "predict_linear section") {
		t.Fatalf("error %v; want ErrManifest naming the section", err)
	}
}

func TestSecondsToLimitFollowsTheLine(t *testing.T) {
	m, err := Embedded(PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	_, h := m.Projection()
	H := h.Seconds()
	tests := []struct {
		name             string
		projected, slope float64
		want             float64
	}{
		// At 1 %/s, a line at 90 % H ahead meets 100 % 10 s after that.
		{"below the limit H ahead", 90, 1, H + 10},
		{"at the limit H ahead", 100, 0.5, H},
		{"past the limit H ago", 100 + 4*H, 2, -H},
		{"a flat line never meets it", 80, 0, math.Inf(1)},
		{"a falling line never meets it", 120, -1, math.Inf(1)},
		{"no projection, no time", math.NaN(), 1, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := m.SecondsToLimit(tt.projected, tt.slope)
			if !(got == tt.want || (math.IsNaN(got) && math.IsNaN(tt.want)) || math.Abs(got-tt.want) <= 1e-9*math.Abs(tt.want)) {
				t.Errorf("SecondsToLimit(%v, %v) = %v, want %v", tt.projected, tt.slope, got, tt.want)
			}
		})
	}
	if got := mustDefault(t).SecondsToLimit(90, 1); !math.IsNaN(got) {
		t.Errorf("a tree model's time to the limit: %v, want NaN", got)
	}
}
