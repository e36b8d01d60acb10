// Package modeltest makes models for tests from the embedded P1 model, whose
// behaviour the tests rely on (anomalous at high CPU or memory, whatever the
// trend; trained at 5 s samples, normalisation 0.5): as it is (P1), with its
// manifest edited, loaded (Edited) or written as a user's --model file would
// be (Files). Not the default model: that is the lab's choice and may change
// with a retraining. Tests only; product code never imports it.
package modeltest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/amf-edge/amf/infer/model"
)

// Files writes the embedded P1 model as dir/name.txt with its manifest
// beside it (model.ManifestPathFor), the manifest edited by edit (nil:
// unchanged), and returns the model's path.
func Files(t testing.TB, dir, name string, edit func(man map[string]any)) string {
	t.Helper()
	mb, jb, err := model.EmbeddedFiles(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		var man map[string]any
		if err := json.Unmarshal(jb, &man); err != nil {
			t.Fatal(err)
		}
		edit(man)
		if jb, err = json.Marshal(man); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, name+".txt")
	if err := os.WriteFile(path, mb, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(model.ManifestPathFor(path), jb, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// P1 is the embedded P1 model.
func P1(t testing.TB) *model.Model {
	t.Helper()
	m, err := model.Embedded(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Edited loads the embedded P1 model's trees with its manifest edited
// by edit: the same scores, another feature spec.
func Edited(t testing.TB, edit func(man map[string]any)) *model.Model {
	t.Helper()
	mb, jb, err := model.EmbeddedFiles(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	var man map[string]any
	if err := json.Unmarshal(jb, &man); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(mb)
	man["model_sha256"] = hex.EncodeToString(sum[:])
	edit(man)
	if jb, err = json.Marshal(man); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(mb, jb)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Windows is a manifest edit that sets every feature window.
func Windows(rate, deriv, step, lookback, sample string) func(man map[string]any) {
	return func(man map[string]any) {
		man["feature_windows"] = map[string]any{"rate_window": rate, "deriv_window": deriv,
			"subquery_step": step, "lookback": lookback, "sample_interval": sample}
	}
}
