package corpus

import (
	"slices"
	"testing"
	"time"
)

func TestPlanIsReproducibleFromItsSeed(t *testing.T) {
	a, err := Plan(7, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Plan(7, 3)
	c, _ := Plan(8, 3)
	if len(a) != 3*len(Families) {
		t.Fatalf("%d runs, want %d", len(a), 3*len(Families))
	}
	same := func(x, y []Run) bool {
		return slices.EqualFunc(x, y, func(p, q Run) bool { return p.ID == q.ID && p.Profile.String() == q.Profile.String() })
	}
	if !same(a, b) {
		t.Error("the same seed planned different runs")
	}
	if same(a, c) {
		t.Error("another seed planned the same runs")
	}
}

func TestFamiliesKeepTheirPromise(t *testing.T) {
	runs, err := Plan(1, 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		var peak int64
		var cpu float64
		for _, ph := range r.Profile.Phases {
			peak = max(peak, ph.Memory)
			cpu = max(cpu, ph.CPU)
		}
		if r.Failing && peak <= 100*mi {
			t.Errorf("%s: failing run peaks at %d MiB, under the 100 MiB limit", r.ID, peak/mi)
		}
		// Healthy runs stay under ~79 % of the limits, counting a few MiB for the
		// broker and the load generator's runtime.
		if !r.Failing && (peak > 72*mi || cpu > 0.9*limitCPU+1e-9) {
			t.Errorf("%s: healthy run peaks at %d MiB, %.2f cores", r.ID, peak/mi, cpu)
		}
		if d := r.Profile.Duration(); d < time.Minute || d > 15*time.Minute {
			t.Errorf("%s: %v long", r.ID, d)
		}
	}
}

func TestPlanRefusesUnknownFamilies(t *testing.T) {
	if _, err := Plan(1, 1, "mem-ramp", "nope"); err == nil {
		t.Error("unknown family accepted")
	}
	runs, err := Plan(1, 2, "mem-ramp")
	if err != nil || len(runs) != 2 || runs[0].Family != "mem-ramp" {
		t.Errorf("Plan(only mem-ramp) = %d runs, %v", len(runs), err)
	}
}
