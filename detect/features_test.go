package detect

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer/model"
)

func TestNormaliseScalesOnlyCPUAndMemory(t *testing.T) {
	x := [6]float64{40, 30, 1000, 2000, 0.1, 50}
	Normalise(&x, model.Normalisation{CPUReferenceFraction: 0.5, MemoryReferenceFraction: 0.25})
	want := [6]float64{80, 120, 1000, 2000, 0.2, 200}
	if x != want {
		t.Fatalf("normalised %v, want %v", x, want)
	}
}

func TestFeatureConfigGivenTakesOnlyTheModelsWindows(t *testing.T) {
	m := p1Model(t)
	w := m.Windows()
	for _, tc := range []struct {
		name  string
		given []GivenWindow
		want  []string // in the refusal; none: taken
	}{
		{name: "nothing given", given: nil},
		{name: "the model's own windows", given: []GivenWindow{{"--rate-window", RateWindow, w.Rate}, {"--lookback", Lookback, w.Lookback}}},
		{name: "another rate window",
			given: []GivenWindow{{"--rate-window", RateWindow, w.Rate + time.Minute}},
			want:  []string{"--rate-window " + model.FormatDuration(w.Rate+time.Minute) + ", the model's is " + model.FormatDuration(w.Rate), "drop the window flags"}},
		{name: "each window that differs is named",
			given: []GivenWindow{{"--deriv-window", DerivWindow, 2 * time.Minute}, {"--step", SubqueryStep, w.SubqueryStep}, {"step", SubqueryStep, w.SubqueryStep + time.Second}},
			want:  []string{"--deriv-window 2m", "step " + model.FormatDuration(w.SubqueryStep+time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc, err := FeatureConfigGiven(m, time.Second, tc.given)
			if len(tc.want) == 0 {
				if err != nil || fc.RateWindow != w.Rate || fc.Lookback != w.Lookback {
					t.Fatalf("got %+v, %v; want the model's windows", fc, err)
				}
				return
			}
			if !errors.Is(err, ErrWindowGiven) {
				t.Fatalf("err %v; want ErrWindowGiven", err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q lacks %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "--step") {
				t.Errorf("%q names a window given as the model's", err)
			}
		})
	}
}
