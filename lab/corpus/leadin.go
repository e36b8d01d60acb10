package corpus

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/amf-edge/amf/lab/stress"
)

// LeadIn is the quiet broker a run gets before its planned baseline, so the
// sidecar's windows have some age when the load begins: fixed (Min == Max),
// or drawn for each run uniformly from [Min, Max], in whole seconds from Min,
// so that a corpus holds windows of every age. The draw comes from the run's
// own seed, which depends only on the plan's seed, the family and the run
// number: the same plan gets the same lead-ins whichever families are
// recorded together, and an --append gets those one invocation would have
// drawn. The zero LeadIn is none.
type LeadIn struct{ Min, Max time.Duration }

// leadInStream keeps the lead-in's draw apart from the profile's (Plan seeds
// that one with the run's seed and its own constant), so adding a lead-in
// leaves the seeded profile as it was.
const leadInStream = 0x6c656164_2d696e00 // "lead-in"

// leadInForm is what a lead-in may look like, for errors.
const leadInForm = "want a duration (10m) or a range MIN-MAX (0-10m)"

// ParseLeadIn reads a lead-in as --lead-in takes it: a duration ("10m",
// fixed) or a range "MIN-MAX" ("0-10m", drawn per run).
func ParseLeadIn(s string) (LeadIn, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return LeadIn{}, fmt.Errorf("corpus: lead-in is empty: %s", leadInForm)
	}
	if strings.HasPrefix(s, "-") {
		return LeadIn{}, fmt.Errorf("corpus: lead-in %q is negative: %s", s, leadInForm)
	}
	lo, hi, isRange := strings.Cut(s, "-")
	parse := func(what, v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("corpus: lead-in %q: %s %q is not a duration: %s", s, what, v, leadInForm)
		}
		if d < 0 {
			return 0, fmt.Errorf("corpus: lead-in %q: %s %v is negative: %s", s, what, d, leadInForm)
		}
		return d, nil
	}
	if !isRange {
		d, err := parse("duration", s)
		return LeadIn{d, d}, err
	}
	var l LeadIn
	var err error
	if l.Min, err = parse("MIN", lo); err != nil {
		return LeadIn{}, err
	}
	if l.Max, err = parse("MAX", hi); err != nil {
		return LeadIn{}, err
	}
	if l.Min > l.Max {
		return LeadIn{}, fmt.Errorf("corpus: lead-in %q: MIN %v is more than MAX %v: %s", s, l.Min, l.Max, leadInForm)
	}
	return l, nil
}

// String is the lead-in as ParseLeadIn reads it back: "10m0s" when fixed,
// "0s-10m0s" when drawn, "0s" for none.
func (l LeadIn) String() string {
	if l.Min == l.Max {
		return l.Min.String()
	}
	return l.Min.String() + "-" + l.Max.String()
}

// Set makes a LeadIn a flag.Value.
func (l *LeadIn) Set(s string) error {
	v, err := ParseLeadIn(s)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "corpus: "))
	}
	*l = v
	return nil
}

// IsZero says there is no lead-in.
func (l LeadIn) IsZero() bool { return l.Max == 0 }

// Draw is the lead-in of run r: Min when fixed, else Min plus a whole number
// of seconds drawn uniformly from r's seed, at most Max.
func (l LeadIn) Draw(r Run) time.Duration {
	if l.Max <= l.Min {
		return l.Min
	}
	steps := int64((l.Max - l.Min) / time.Second)
	rng := rand.New(rand.NewPCG(r.Seed, r.Seed^leadInStream))
	return l.Min + time.Duration(rng.Int64N(steps+1))*time.Second
}

// Apply gives r its drawn lead-in (Run.WithLeadIn). It is applied after
// Run.Scale: the lead-in is quiet time, not part of the profile's shape.
func (l LeadIn) Apply(r Run) (Run, error) {
	return r.WithLeadIn(l.Draw(r))
}

// WithLeadIn lengthens the run's quiet baseline by d (timing the traffic
// bursts after it as before) and adds d to r.LeadIn, so the sidecar's windows
// are older when the profile's load begins, as on a broker that has been up
// for a while. The profile otherwise stays the one its seed planned.
func (r Run) WithLeadIn(d time.Duration) (Run, error) {
	if d < 0 {
		return Run{}, fmt.Errorf("corpus: lead-in %v is negative", d)
	}
	if d == 0 {
		return r, nil
	}
	if len(r.Profile.Phases) == 0 || r.Profile.Phases[0] != (stress.Phase{Duration: r.Profile.Phases[0].Duration}) {
		return Run{}, fmt.Errorf("corpus: run %s does not start with a quiet baseline to lengthen", r.ID)
	}
	r.Profile.Phases = append([]stress.Phase{{Duration: r.Profile.Phases[0].Duration + d}}, r.Profile.Phases[1:]...)
	if r.Traffic != nil {
		t := make(Traffic, len(r.Traffic))
		for i, b := range r.Traffic {
			b.Start += d
			t[i] = b
		}
		r.Traffic = t
	}
	r.LeadIn += d
	return r, nil
}
