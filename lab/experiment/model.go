package experiment

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/amf-edge/amf/infer/model"
)

// sidecarInterval is the sidecars' sampling interval in the experiment (the
// injected sidecar's --interval default).
const sidecarInterval = time.Second

// sidecarModel is the model the experiment's sidecars run (Config.Model).
type sidecarModel struct {
	// Name is what the results record: the embedded model's name, or the
	// model file's path as given.
	Name string
	// SHA256 is the model's sha256 as this build loads it; the sidecar's own
	// report is in each run's /status (RunResult.SidecarModel).
	SHA256 string
	file   string // the model file to copy where the pods can read it; "" for an embedded model
	arg    string // the sidecars' --model
}

// resolveModel checks Config.Model before anything starts: "" is the paper's
// model (model.PaperName), an embedded name that model, anything else a model
// file path (model.LoadNameOrPath). A model the sidecar would refuse (an
// unknown name, a bad file, one that cannot be fed at the sidecars' interval)
// is an error here, not a silent fallback to the default in every pod.
//
// The paper's experiment runs the paper's model unless told otherwise, not
// the product's default: P1 warns of the staged fault from its saturation
// (60 Mi and 80 % CPU), which the default, trained to stay quiet on healthy
// loads that look the same, leaves to the crash failover (README, "The
// lead-time model").
func resolveModel(given string) (sidecarModel, error) {
	if given == "" {
		given = model.PaperName
	}
	m, err := model.LoadNameOrPath(given)
	if err == nil {
		err = m.Windows().CheckInterval(sidecarInterval)
	}
	if err != nil {
		return sidecarModel{}, fmt.Errorf("experiment: --model: %w", err)
	}
	sm := sidecarModel{Name: given, SHA256: m.SHA256(), arg: given}
	if !slices.Contains(model.EmbeddedNames(), given) {
		sm.file = given
	}
	return sm, nil
}

// CheckModel says whether Run would accept Config.Model, for a command line
// to refuse a bad --model before it starts anything.
func CheckModel(nameOrPath string) error {
	_, err := resolveModel(nameOrPath)
	return err
}

// stage makes a model file readable by the pods: the sidecar runs as its own
// user and sees only what the lab node maps, so the file and its manifest are
// copied into the pods' folder (beside the sidecar program) and the sidecars'
// --model names the copy. An embedded model needs nothing.
func (sm *sidecarModel) stage(podDir string) error {
	if sm.file == "" {
		return nil
	}
	dst := filepath.Join(podDir, "models", filepath.Base(sm.file))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	for _, f := range []struct{ from, to string }{{sm.file, dst}, {model.ManifestPathFor(sm.file), model.ManifestPathFor(dst)}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return fmt.Errorf("experiment: copy the model for the pods: %w", err)
		}
		if err := os.WriteFile(f.to, b, 0o644); err != nil {
			return fmt.Errorf("experiment: copy the model for the pods: %w", err)
		}
	}
	// The copy is what the sidecars load: it must be the model checked.
	m, err := model.LoadFiles(dst)
	if err != nil {
		return fmt.Errorf("experiment: the model copied for the pods: %w", err)
	}
	if m.SHA256() != sm.SHA256 {
		return fmt.Errorf("experiment: %s changed while it was copied (sha256 %.12s, was %.12s)", sm.file, m.SHA256(), sm.SHA256)
	}
	sm.arg = dst
	return nil
}
