package experiment

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
)

// The sidecars' --model: a name passes through, a path is replaced by a copy
// in the pods' folder, a model the sidecar would refuse stops the experiment
// before it starts.
func TestSidecarModelArgument(t *testing.T) {
	// The paper's model: the experiment's default and modeltest's base.
	def, err := model.Embedded(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := modeltest.Files(t, dir, "m", nil)
	fast := modeltest.Files(t, dir, "fast", func(man map[string]any) {
		man["feature_windows"] = map[string]any{"rate_window": "1m", "deriv_window": "2m", "subquery_step": "500ms", "lookback": "30s", "sample_interval": "500ms"}
	})
	tests := []struct {
		name     string
		given    string
		recorded string // Name in the results
		arg      string // the sidecars' --model after staging; "<copy>": the copy in the pods' folder
		mention  []string
	}{
		{"default: no --model, the paper's model", "", "p1", "p1", nil},
		{"an embedded name passes through", "p1", "p1", "p1", nil},
		{"a path is copied where the pods can read it", file, file, "<copy>", nil},
		{"an unknown name names the embedded models", "nosuch", "", "", []string{"--model", "embedded: leadtime, p1"}},
		{"a missing file", filepath.Join(dir, "nope.txt"), "", "", []string{"nope.txt"}},
		{"a model the sidecars cannot feed at 1 s", fast, "", "", []string{"sample_interval 500ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sm, err := resolveModel(tt.given)
			if tt.mention != nil {
				if err == nil {
					t.Fatalf("accepted %q", tt.given)
				}
				for _, s := range tt.mention {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				if CheckModel(tt.given) == nil {
					t.Error("CheckModel accepts what Run refuses")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			podDir := t.TempDir()
			if err := sm.stage(podDir); err != nil {
				t.Fatal(err)
			}
			if sm.Name != tt.recorded || sm.SHA256 != def.SHA256() {
				t.Errorf("recorded %q sha256 %.12s, want %q %.12s", sm.Name, sm.SHA256, tt.recorded, def.SHA256())
			}
			want := tt.arg
			if want == "<copy>" {
				want = filepath.Join(podDir, "models", "m.txt")
				for _, f := range []string{want, model.ManifestPathFor(want)} {
					st, err := os.Stat(f)
					if err != nil {
						t.Fatal(err)
					}
					if st.Mode().Perm()&0o004 == 0 {
						t.Errorf("%s: mode %v: the pods' users must read it", f, st.Mode())
					}
				}
			}
			if sm.arg != want {
				t.Errorf("sidecar --model %q, want %q", sm.arg, want)
			}
		})
	}
}

func TestSummaryNamesEachModesModel(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	res := Results{Runs: []RunResult{
		{Mode: Reactive, Index: 1},
		{Mode: AMF, Index: 1, Model: "p1", ModelSHA256: sha, SidecarModel: "(embedded p1) sha256:" + sha},
		{Mode: AMF, Index: 2, Model: "p1", ModelSHA256: sha, SidecarModel: "(embedded p1) sha256:" + sha,
			Explanation: "memory_percent +15 (Saabas, log-odds)"},
		{Mode: Observe, Index: 1, Model: "leadtime", ModelSHA256: sha,
			SidecarModel: "(embedded p1) sha256:cd (fallback: model override rejected)"},
	}}
	var b bytes.Buffer
	res.Summary(&b)
	out := b.String()
	for _, want := range []string{
		"AMF (make-before-break switchover; times in s after the fault's onset):\n\nModel: p1 (sha256 abababababab).\n\n",
		"Model: leadtime (sha256 abababababab).\nRun 1: the sidecar reported (embedded p1) sha256:cd (fallback: model override rejected).\n",
		"What drove each switchover (the agent's decision line):\n\n- run 2: memory_percent +15 (Saabas, log-odds)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "Model:"); n != 2 {
		t.Errorf("%d model lines, want one per mode with a sidecar (2):\n%s", n, out)
	}
	if strings.Contains(out, "Run 1: the sidecar reported (embedded p1) sha256:"+sha) {
		t.Errorf("a sidecar that runs the model asked for is reported as a difference:\n%s", out)
	}
}
