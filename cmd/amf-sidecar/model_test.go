package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
)

// withoutModel is args without its --model flag and value.
func withoutModel(args []string) []string {
	i := slices.Index(args, "--model")
	if i < 0 {
		return args
	}
	return slices.Delete(slices.Clone(args), i, i+2)
}

func TestModelFlagTakesAnEmbeddedNameOrAPath(t *testing.T) {
	dir := t.TempDir()
	// A model trained on other windows as the file "leadtime" (no .txt), named
	// like the default embedded model, and as an ordinary path.
	short := modeltest.Files(t, dir, "short", modeltest.Windows("30s", "1m", "1s", "30s", "1s"))
	for _, f := range []struct{ from, to string }{{short, "leadtime"}, {model.ManifestPathFor(short), "leadtime.manifest.json"}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	features := filepath.Join(dir, "features.csv")
	if err := os.WriteFile(features, []byte("cpu_percent,memory_percent,network_io_bytes_per_sec,disk_io_bytes_per_sec,cpu_growth_rate,memory_growth_rate\n1,2,3,4,5,6\n95,2,3,4,5,6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	ramp := rampCSV()
	def, err := model.Default()
	if err != nil {
		t.Fatal(err)
	}
	defRate := model.FormatDuration(def.FeatureSpec().Windows.Rate)
	if defRate == "30s" {
		t.Fatal("the file model must differ from the embedded default: its rate window is 30s too")
	}
	tests := []struct {
		name    string
		args    []string
		code    int
		mention []string // in stderr
		// sameAsDefault: stdout equals that of the same command without --model.
		sameAsDefault bool
	}{
		{"score: the default model's name", []string{"score", "--in", features, "--model", "leadtime"}, 0, nil, true},
		{"score: a name is the embedded model even beside a file of that name", []string{"score", "--in", features, "--model", "leadtime", "--rate-window", "30s"}, 2,
			[]string{"(embedded leadtime) was trained with rate_window " + defRate}, false},
		{"score: ./leadtime is the file called leadtime", []string{"score", "--in", features, "--model", "./leadtime", "--rate-window", "30s"}, 0, nil, false},
		{"score: a path", []string{"score", "--in", features, "--model", short}, 0, nil, false},
		{"score: an unknown name names the embedded models", []string{"score", "--in", features, "--model", "nosuch"}, 2,
			[]string{"model nosuch: no such model", "embedded: leadtime, p1, predict-linear"}, false},
		{"score: a missing path is a file error", []string{"score", "--in", features, "--model", filepath.Join(dir, "nope.txt")}, 2,
			[]string{"nope.txt", "no such file"}, false},
		{"replay: the default model's name", []string{"replay", "--in", "-", "--model", "leadtime"}, 0, nil, true},
		{"replay: an unknown name names the embedded models", []string{"replay", "--in", "-", "--model", "nosuch"}, 2, []string{"embedded: leadtime"}, false},
		{"sample: the file's sample interval, not the embedded model's", []string{"sample", "--pid", "1", "--model", "./leadtime", "--interval", "2s"}, 2,
			[]string{"slower than the model's sample_interval 1s"}, false},
		{"sample: an unknown name names the embedded models", []string{"sample", "--pid", "1", "--model", "nosuch"}, 2, []string{"embedded: leadtime"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runCLI(t, ramp, tt.args...)
			wantExit(t, code, errs, tt.code, tt.mention...)
			if tt.sameAsDefault {
				_, want, _ := runCLI(t, ramp, withoutModel(tt.args)...)
				if out != want || out == "" {
					t.Errorf("stdout %q, want the default model's %q", out, want)
				}
			}
		})
	}
}

// run --model NAME runs the sidecar on that embedded model; an unknown name
// falls back to the default and says why, naming the embedded models.
func TestRunWithAModelName(t *testing.T) {
	tests := []struct {
		name    string
		model   string
		refusal string // "" = the model must be accepted
	}{
		{"the default model's name", "leadtime", ""},
		{"an unknown name", "nosuch", "neither an embedded model (embedded: leadtime, p1, predict-linear)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
			defer cancel()
			var out, errb strings.Builder
			code := run(ctx, []string{"run", "--pid", strconv.Itoa(os.Getpid()), "--http", "", "--model", tt.model}, stdio{strings.NewReader(""), &out, &errb})
			errs := errb.String()
			if strings.Contains(errs, "target:") {
				t.Skipf("cannot sample this process's cgroup here: %s", errs)
			}
			if code != exitOK {
				t.Fatalf("exit code %d (stderr %s)", code, errs)
			}
			if !strings.Contains(errs, `"msg":"sidecar started"`) || !strings.Contains(errs, `"model":"(embedded leadtime)"`) {
				t.Errorf("stderr does not say the sidecar started on (embedded leadtime):\n%s", errs)
			}
			refused := strings.Contains(errs, "model override refused")
			if refused != (tt.refusal != "") || !strings.Contains(errs, tt.refusal) {
				t.Errorf("refusal logged %v, want one saying %q:\n%s", refused, tt.refusal, errs)
			}
		})
	}
}
