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
		return slices.EqualFunc(x, y, func(p, q Run) bool {
			return p.ID == q.ID && p.Profile.String() == q.Profile.String() && p.Traffic.String() == q.Traffic.String()
		})
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
		checkTraffic(t, r)
		if r.Family == "mem-sawtooth" {
			checkSawtooth(t, r)
		}
	}
}

// checkSawtooth checks that every cycle's ramp reaches its peak within its
// phase and that the memory is then freed: ramps that stop short of the limit.
func checkSawtooth(t *testing.T, r Run) {
	t.Helper()
	ps := r.Profile.Phases[1:] // after the baseline
	if len(ps) < 6 || len(ps)%3 != 0 {
		t.Fatalf("%s: %d phases after the baseline, want 2–4 cycles of 3", r.ID, len(ps))
	}
	for i := 0; i < len(ps); i += 3 {
		ramp, hold, base := ps[i], ps[i+1], ps[i+2]
		from := int64(0)
		if i > 0 {
			from = ps[i-1].Memory
		}
		if ramp.Ramp <= 0 || float64(ramp.Duration)/float64(time.Second) < float64(ramp.Memory-from)/float64(ramp.Ramp) {
			t.Errorf("%s cycle %d: a ramp of %v at %d B/s does not reach %d MiB from %d MiB", r.ID, i/3, ramp.Duration, ramp.Ramp, ramp.Memory/mi, from/mi)
		}
		if hold.Memory != ramp.Memory || base.Memory >= ramp.Memory || base.Memory < 5*mi {
			t.Errorf("%s cycle %d: peak %d, hold %d, base %d MiB; want the peak held, then freed to the base", r.ID, i/3, ramp.Memory/mi, hold.Memory/mi, base.Memory/mi)
		}
	}
}

// checkTraffic checks a run's bursts: only healthy runs have them, with no
// stress load; they follow the baseline, one after the other, and end before
// the profile does, so the broker's settling is recorded; and they stay
// within what the broker's 500m and 100 Mi take.
func checkTraffic(t *testing.T, r Run) {
	t.Helper()
	if r.Family != "traffic-burst" {
		if len(r.Traffic) > 0 {
			t.Errorf("%s: %d bursts in a family without traffic", r.ID, len(r.Traffic))
		}
		return
	}
	if r.Failing || len(r.Traffic) < 3 || len(r.Traffic) > 4 {
		t.Fatalf("%s: failing %v, %d bursts; want a healthy run of 3–4", r.ID, r.Failing, len(r.Traffic))
	}
	for _, ph := range r.Profile.Phases {
		if ph.Memory != 0 || ph.CPU != 0 {
			t.Errorf("%s: stress phase %v under traffic", r.ID, ph)
		}
	}
	from := r.Profile.Phases[0].Duration // the baseline
	for i, b := range r.Traffic {
		if b.Start < from {
			t.Errorf("%s: burst %d starts at %v, before %v", r.ID, i+1, b.Start, from)
		}
		if b.Duration < 10*time.Second || b.Duration > 30*time.Second {
			t.Errorf("%s: burst %d lasts %v", r.ID, i+1, b.Duration)
		}
		// Mosquitto queues at most 1000 QoS 1 messages a subscriber
		// (max_queued_messages): full queues stay far under the memory limit.
		if b.Rate < 500 || b.Rate > 3000 || b.Size < 256 || b.Size > 4<<10 || b.QoS > 1 || b.Subscribers > 2 {
			t.Errorf("%s: burst %d is %v", r.ID, i+1, b)
		}
		from = b.Start + b.Duration + 20*time.Second
	}
	if end := r.Profile.Duration(); from > end {
		t.Errorf("%s: the last burst ends %v before the profile, want ≥ 20s", r.ID, end-(from-20*time.Second))
	}
}

// Seeds derive from a family's index: families added at the end must leave
// the plans of the corpus already recorded (lab/corpus/real-node, seed 1) as they
// were.
func TestAddingFamiliesKeepsExistingPlans(t *testing.T) {
	want := map[string]string{
		"mem-ramp-1":  "55s;25s:mem=19Mi;1m25s:mem=160Mi,ramp=2279487/s",
		"cpu-burst-1": "45s;15s:mem=13Mi,cpu=0.45;25s:mem=13Mi;19s:mem=13Mi,cpu=0.45;21s:mem=13Mi;17s:mem=13Mi,cpu=0.45;38s:mem=13Mi",
		"idle-1":      "41s;3m5s",
	}
	runs, err := Plan(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if w, ok := want[r.ID]; ok && r.Profile.String() != w {
			t.Errorf("%s: %s, was %s", r.ID, r.Profile, w)
		}
	}
}

func TestScaleShortensBurstsWithThePhases(t *testing.T) {
	runs, err := Plan(1, 1, "traffic-burst")
	if err != nil {
		t.Fatal(err)
	}
	r := runs[0]
	half, err := r.Scale(0.5)
	if err != nil {
		t.Fatal(err)
	}
	if half.Profile.Duration() != r.Profile.Duration()/2 {
		t.Errorf("profile %v, want %v", half.Profile.Duration(), r.Profile.Duration()/2)
	}
	for i, b := range half.Traffic {
		o := r.Traffic[i]
		if b.Start != o.Start/2 || b.Duration != o.Duration/2 || b.Rate != o.Rate || b.Size != o.Size {
			t.Errorf("burst %d: %v scaled to %v", i+1, o, b)
		}
	}
	if r.Traffic[0] == half.Traffic[0] {
		t.Error("Scale changed the plan it was called on")
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

func TestLeadInLengthensOnlyTheBaseline(t *testing.T) {
	runs, err := Plan(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	const d = 10 * time.Minute
	for _, r := range runs {
		l, err := r.WithLeadIn(d)
		if err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
		if got, want := l.Profile.Duration(), r.Profile.Duration()+d; got != want {
			t.Errorf("%s: %v long with the lead-in, want %v", r.ID, got, want)
		}
		if got, want := l.Profile.Phases[0].Duration, r.Profile.Phases[0].Duration+d; got != want {
			t.Errorf("%s: baseline %v, want %v", r.ID, got, want)
		}
		if !slices.Equal(l.Profile.Phases[1:], r.Profile.Phases[1:]) {
			t.Errorf("%s: the profile after the baseline changed: %s, was %s", r.ID, l.Profile, r.Profile)
		}
		for i, b := range l.Traffic {
			if b.Start != r.Traffic[i].Start+d || b.Duration != r.Traffic[i].Duration {
				t.Errorf("%s: burst %d %v, was %v", r.ID, i, b, r.Traffic[i])
			}
		}
		checkTraffic(t, l)
		if l.LeadIn != d {
			t.Errorf("%s: records a lead-in of %v, want %v", r.ID, l.LeadIn, d)
		}
		if r.Profile.Phases[0].Duration == l.Profile.Phases[0].Duration {
			t.Errorf("%s: the planned run was changed in place", r.ID)
		}
	}
}

func TestLeadInRefusesWhatItCannotLengthen(t *testing.T) {
	runs, err := Plan(1, 1, "mem-ramp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runs[0].WithLeadIn(-time.Second); err == nil {
		t.Error("a negative lead-in was accepted")
	}
	loaded := runs[0]
	loaded.Profile.Phases = loaded.Profile.Phases[1:] // starts with the load
	if _, err := loaded.WithLeadIn(time.Minute); err == nil {
		t.Error("a profile without a quiet baseline was lengthened")
	}
	if same, err := runs[0].WithLeadIn(0); err != nil || same.Profile.String() != runs[0].Profile.String() {
		t.Errorf("lead-in 0 changed the run: %v %v", same.Profile, err)
	}
}
