// Package modeltest writes model files for tests: an embedded model with its
// manifest edited, as a user's --model file would be. Tests only; product code
// never imports it.
package modeltest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/amf-edge/amf/infer/model"
)

// Files writes the embedded default model as dir/name.txt with its manifest
// beside it (model.ManifestPathFor), the manifest edited by edit (nil:
// unchanged), and returns the model's path.
func Files(t testing.TB, dir, name string, edit func(man map[string]any)) string {
	t.Helper()
	mb, jb, err := model.EmbeddedFiles(model.DefaultName)
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
