package main

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
)

// rampCSV is 20 minutes of raw samples every 5 s with a CPU and memory ramp.
func rampCSV() string {
	var b strings.Builder
	b.WriteString(hdr)
	for i := 0; i < 240; i++ {
		t := 1_700_000_000 + 5*i
		b.WriteString(strings.Join([]string{strconv.Itoa(t), strconv.Itoa(i * i), strconv.Itoa(1_000_000 + 1000*i), "100000000", strconv.Itoa(7 * i), strconv.Itoa(3 * i)}, ","))
		b.WriteString("\n")
	}
	return b.String()
}

func TestWindowFlagsAgainstTheModel(t *testing.T) {
	dir := t.TempDir()
	p1 := modeltest.Files(t, dir, "p1", nil)
	short := modeltest.Files(t, dir, "short", modeltest.Windows("1m", "2m", "1s", "30s", "1s"))
	fast := modeltest.Files(t, dir, "fast", modeltest.Windows("1m", "2m", "500ms", "30s", "500ms"))
	old := modeltest.Files(t, dir, "old", func(man map[string]any) {
		man["schema_version"] = 1
		delete(man["feature_windows"].(map[string]any), "lookback")
	})
	badSpec := modeltest.Files(t, dir, "bad", modeltest.Windows("5m", "7s", "5s", "5m", "5s"))
	features := filepath.Join(dir, "features.csv")
	if err := os.WriteFile(features, []byte("cpu_percent,memory_percent,network_io_bytes_per_sec,disk_io_bytes_per_sec,cpu_growth_rate,memory_growth_rate\n1,2,3,4,5,6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ramp := rampCSV()
	// The embedded default's windows are the lab's choice (make leadtime):
	// the cases read them rather than restate them.
	def, err := model.Default()
	if err != nil {
		t.Fatal(err)
	}
	dw := def.FeatureSpec().Windows
	rate := model.FormatDuration(dw.Rate)
	other := "30s" // a rate window the default was not trained with
	if rate == other {
		other = "5m"
	}
	contradicts := "--rate-window " + other + ", the model's is " + rate
	tests := []struct {
		name    string
		args    []string
		code    int
		mention []string // in stderr
	}{
		{"score: no window flags", []string{"score", "--in", features}, 0, nil},
		{"score: a flag restating the model's window", []string{"score", "--in", features, "--rate-window", rate, "--step", model.FormatDuration(dw.SubqueryStep)}, 0, nil},
		{"score: a flag contradicting the embedded model", []string{"score", "--in", features, "--rate-window", other}, 2,
			[]string{contradicts, "(embedded leadtime) was trained with " + dw.String(), "drop the window flags"}},
		{"score: every contradiction listed", []string{"score", "--in", features, "--model", short, "--rate-window", "5m", "--lookback", "5m"}, 2,
			[]string{"--rate-window 5m, the model's is 1m", "--lookback 5m, the model's is 30s", short}},
		{"score: an older manifest is used with a warning naming it", []string{"score", "--in", features, "--model", old}, 0,
			[]string{"warning: manifest " + model.ManifestPathFor(old), "lookback 5m"}},
		{"score: a spec the engine cannot compute", []string{"score", "--in", features, "--model", badSpec}, 2,
			[]string{"unsupported feature spec", "deriv_window 7s is not a whole multiple of subquery_step 5s", model.ManifestPathFor(badSpec)}},
		{"replay: windows from the model", []string{"replay", "--in", "-", "--model", short}, 0, nil},
		{"replay: a flag contradicting the model", []string{"replay", "--in", "-", "--model", p1, "--deriv-window", "2m"}, 2, []string{"--deriv-window 2m, the model's is 10m"}},
		{"replay: no model, flags are settings", []string{"replay", "--in", "-", "--deriv-window", "2m"}, 0, nil},
		{"sample: interval slower than the model's training", []string{"sample", "--pid", "1", "--model", short, "--interval", "2s"}, 2,
			[]string{"sampling every 2s is slower than the model's sample_interval 1s", "sample every 1s or faster"}},
		{"run: interval slower than the embedded model's training", []string{"run", "--pid", "1", "--interval", "10s"}, 2,
			[]string{"sampling every 10s is slower than the model's sample_interval 1s"}},
		{"run: a flag contradicting the model in use", []string{"run", "--pid", "1", "--model", short, "--step", "5s"}, 2,
			[]string{"--step 5s, the model's is 1s"}},
		{"run: window flags for the fallback are checked too", []string{"run", "--pid", "1", "--model", fast, "--rate-window", other}, 2,
			[]string{contradicts, "(embedded leadtime)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errs := runCLI(t, ramp, tt.args...)
			wantExit(t, code, errs, tt.code, tt.mention...)
		})
	}
}

// replay --model computes what the flags of the same windows compute.
func TestReplayWithAModelUsesItsWindows(t *testing.T) {
	short := modeltest.Files(t, t.TempDir(), "short", modeltest.Windows("1m", "2m", "1s", "30s", "1s"))
	ramp := rampCSV()
	_, withModel, errs := runCLI(t, ramp, "replay", "--in", "-", "--model", short)
	_, withFlags, _ := runCLI(t, ramp, "replay", "--in", "-", "--rate-window", "1m", "--deriv-window", "2m", "--step", "1s", "--lookback", "30s")
	_, withDefaults, _ := runCLI(t, ramp, "replay", "--in", "-")
	if withModel != withFlags {
		t.Fatalf("replay --model differs from the same windows given as flags (stderr %q)", errs)
	}
	if withModel == withDefaults {
		t.Fatal("replay --model computed the default windows")
	}
}

func TestWindowFlagDefaultsAreTheEmbeddedModels(t *testing.T) {
	m, err := model.Default()
	if err != nil {
		t.Fatal(err)
	}
	w := registerWindowFlags(flag.NewFlagSet("t", flag.ContinueOnError))
	mw := m.Windows()
	if w.cfg.RateWindow != mw.Rate || w.cfg.DerivWindow != mw.Deriv || w.cfg.Step != mw.SubqueryStep || w.cfg.Lookback != mw.Lookback {
		t.Fatalf("flag defaults %+v, embedded model %+v", w.cfg, mw)
	}
}
