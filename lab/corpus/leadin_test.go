package corpus

import (
	"strings"
	"testing"
	"time"
)

func TestParseLeadIn(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want LeadIn
		// err names what the error must say; empty: parses.
		err string
	}{
		{in: "10m", want: LeadIn{10 * time.Minute, 10 * time.Minute}},
		{in: "0", want: LeadIn{}},
		{in: "0s", want: LeadIn{}},
		{in: "0-10m", want: LeadIn{0, 10 * time.Minute}},
		{in: "30s-2m", want: LeadIn{30 * time.Second, 2 * time.Minute}},
		{in: " 1m-1m ", want: LeadIn{time.Minute, time.Minute}},
		{in: "0s-10m0s", want: LeadIn{0, 10 * time.Minute}}, // String's form
		{in: "", err: "empty"},
		{in: "-5m", err: "negative"},
		{in: "-1m-2m", err: "negative"},
		{in: "1m--2m", err: `MAX -2m0s is negative`},
		{in: "10m-2m", err: "MIN 10m0s is more than MAX 2m0s"},
		{in: "ten", err: `duration "ten" is not a duration`},
		{in: "0-10", err: `MAX "10" is not a duration`},
		{in: "x-10m", err: `MIN "x" is not a duration`},
		{in: "1m-", err: `MAX "" is not a duration`},
		{in: "1m-2m-3m", err: `MAX "2m-3m" is not a duration`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLeadIn(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), leadInForm) {
					t.Fatalf("ParseLeadIn(%q) = %v, %v; want an error saying %q and what to write", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseLeadIn(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			// What runs.json records parses back to the same spec.
			if again, err := ParseLeadIn(got.String()); err != nil || again != got {
				t.Errorf("ParseLeadIn(%q) = %v, %v; want %v back", got.String(), again, err, got)
			}
		})
	}
}

func TestLeadInSetReportsTheFlagsError(t *testing.T) {
	var l LeadIn
	if err := l.Set("10m-2m"); err == nil || strings.HasPrefix(err.Error(), "corpus:") {
		t.Errorf("Set: %v, want the error without the package's prefix (flag adds its own)", err)
	}
	if err := l.Set("0-10m"); err != nil || l != (LeadIn{0, 10 * time.Minute}) {
		t.Errorf("Set(0-10m): %v, %v", l, err)
	}
}

// drawn is each run's lead-in in a plan of the given families.
func drawn(t *testing.T, l LeadIn, seed uint64, perFamily int, only ...string) map[string]time.Duration {
	t.Helper()
	runs, err := Plan(seed, perFamily, only...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Duration{}
	for _, r := range runs {
		a, err := l.Apply(r)
		if err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
		if a.LeadIn != l.Draw(r) || a.Profile.Duration() != r.Profile.Duration()+a.LeadIn {
			t.Errorf("%s: applied %v (%v long), drew %v for a %v profile", r.ID, a.LeadIn, a.Profile.Duration(), l.Draw(r), r.Profile.Duration())
		}
		out[r.ID] = a.LeadIn
	}
	return out
}

func TestLeadInRangeIsDrawnPerRunWithinIt(t *testing.T) {
	l := LeadIn{0, 10 * time.Minute}
	got := drawn(t, l, 1, 20)
	var lo, hi, sum time.Duration = l.Max, l.Min, 0
	for id, d := range got {
		if d < l.Min || d > l.Max || d%time.Second != 0 {
			t.Errorf("%s: lead-in %v, want whole seconds in [%v, %v]", id, d, l.Min, l.Max)
		}
		lo, hi, sum = min(lo, d), max(hi, d), sum+d
	}
	// 240 uniform draws: the plan is seeded, so this is a fact about it, not
	// a chance; a draw that ignored the run (one value) or the range fails it.
	if lo > time.Minute || hi < 9*time.Minute {
		t.Errorf("lead-ins span %v–%v, want most of %v", lo, hi, l)
	}
	if mean := sum / time.Duration(len(got)); mean < 4*time.Minute || mean > 6*time.Minute {
		t.Errorf("mean lead-in %v, want ≈ %v", mean, (l.Min+l.Max)/2)
	}
	if fixed := drawn(t, LeadIn{time.Minute, time.Minute}, 1, 3); len(fixed) == 0 {
		t.Fatal("no runs")
	} else {
		for id, d := range fixed {
			if d != time.Minute {
				t.Errorf("%s: fixed lead-in 1m drew %v", id, d)
			}
		}
	}
}

func TestLeadInDrawIsReproducible(t *testing.T) {
	l := LeadIn{0, 10 * time.Minute}
	a := drawn(t, l, 1, 5)
	for _, tc := range []struct {
		name     string
		seed     uint64
		families []string
		same     bool
	}{
		{"the same plan draws the same lead-ins", 1, nil, true},
		{"a subset of the families draws what the whole plan does (--append)", 1, []string{"traffic-burst", "idle"}, true},
		{"the families' order does not matter", 1, []string{"idle", "mem-ramp", "spike"}, true},
		{"another seed draws other lead-ins", 2, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := drawn(t, l, tc.seed, 5, tc.families...)
			differ := 0
			for id, d := range b {
				if ad, ok := a[id]; !ok {
					t.Fatalf("%s not in the seed-1 plan", id)
				} else if ad != d {
					differ++
				}
			}
			if tc.same && differ > 0 {
				t.Errorf("%d of %d runs drew another lead-in", differ, len(b))
			}
			if !tc.same && differ < len(b)/2 {
				t.Errorf("only %d of %d runs drew another lead-in", differ, len(b))
			}
		})
	}
}

func TestLeadInLeavesTheSeededProfile(t *testing.T) {
	runs, err := Plan(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		a, err := LeadIn{0, 10 * time.Minute}.Apply(r)
		if err != nil {
			t.Fatal(err)
		}
		if a.Profile.Phases[0].Duration != r.Profile.Phases[0].Duration+a.LeadIn ||
			len(a.Profile.Phases) != len(r.Profile.Phases) {
			t.Fatalf("%s: %s with lead-in %v, was %s", r.ID, a.Profile, a.LeadIn, r.Profile)
		}
		for i := 1; i < len(r.Profile.Phases); i++ {
			if a.Profile.Phases[i] != r.Profile.Phases[i] {
				t.Errorf("%s: phase %d %v, was %v", r.ID, i, a.Profile.Phases[i], r.Profile.Phases[i])
			}
		}
	}
}
