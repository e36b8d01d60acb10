package sidecar_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
	"github.com/amf-edge/amf/sidecar"
)

// TestChooseModelFallsBackToTheDefaultRatherThanCrashLoop: an override the
// sidecar cannot use at its interval, or cannot load, gives way to the
// default model with a warning saying why; only an interval no model can be
// fed at is refused.
func TestChooseModelFallsBackToTheDefaultRatherThanCrashLoop(t *testing.T) {
	dir := t.TempDir()
	short := modeltest.Files(t, dir, "short", modeltest.Windows("1m", "2m", "1s", "30s", "1s"))
	fast := modeltest.Files(t, dir, "fast", modeltest.Windows("1m", "2m", "500ms", "30s", "500ms"))
	def, err := model.Default()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		path     string
		interval time.Duration
		source   string // of the model in use
		warning  string // "" = none
		kind     error  // non-nil: refused
	}{
		{"embedded model", "", time.Second, def.Source(), "", nil},
		{"embedded model by name", "leadtime", time.Second, def.Source(), "", nil},
		{"unknown name falls back naming the embedded models", "nosuch", time.Second, def.Source(), "model nosuch: no such model: neither an embedded model (embedded: leadtime, p1, predict-linear)", nil},
		{"override usable at the interval", short, time.Second, short, "", nil},
		{"override trained on faster samples falls back", fast, time.Second, def.Source(), "sampling every 1s is slower than the model's sample_interval 500ms", nil},
		{"override usable at a finer interval", fast, 250 * time.Millisecond, fast, "", nil},
		{"missing override falls back", filepath.Join(dir, "nope.txt"), time.Second, def.Source(), "nope.txt", nil},
		{"interval no model can be fed at", "", 10 * time.Second, "", "", model.ErrFeatureSpec},
		{"fallback that cannot be fed at the interval", filepath.Join(dir, "nope.txt"), 10 * time.Second, "", "", model.ErrFeatureSpec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, warning, err := sidecar.ChooseModel(tt.path, tt.interval)
			if tt.kind != nil {
				if !errors.Is(err, tt.kind) || m != nil {
					t.Fatalf("model %v, error %v; want %v", m, err, tt.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Source() != tt.source {
				t.Fatalf("running on %s, want %s", m.Source(), tt.source)
			}
			if (tt.warning == "") != (warning == "") || !strings.Contains(warning, tt.warning) {
				t.Fatalf("warning %q, want one saying %q", warning, tt.warning)
			}
		})
	}
}
