// Package corpus plans the lab's own training corpus for a lead-time model:
// seeded families of staged load profiles (package stress) run inside a real
// broker container by `amf-lab corpus`, some of which end in a real failure
// (OOM kill) and some of which are heavy but healthy. The families follow the
// public dataset's injection profile (steady ~80 % CPU + 60 MB, CPU ramp
// 20→80 %, memory ramp 20→80 MB, 3 × 90 % bursts, 80/20 % oscillation) and add
// what an operator must be warned about: memory ramps of several slopes and
// start levels, step allocations and leaks with pauses that cross the limit.
//
// Percentages are of the testbed's limits (100 MiB, 500m CPU). Test
// infrastructure; product code never imports it.
package corpus

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/amf-edge/amf/lab/stress"
)

const (
	mi = int64(1) << 20
	// limitCPU is the testbed's CPU limit in cores (500m).
	limitCPU = 0.5
	// overMemory is where failing profiles aim: well over the 100 MiB limit.
	overMemory = 160 * mi
)

// Family is a kind of profile.
type Family struct {
	Name string
	// Failing families cross the memory limit: the run ends in an OOM kill.
	Failing bool
	Doc     string
	// gen draws the phases after the baseline and any traffic bursts, timed
	// from the end of the baseline.
	gen func(r *rand.Rand) ([]stress.Phase, []Burst)
}

// loadOnly is a family of stress phases without traffic.
func loadOnly(gen func(r *rand.Rand) []stress.Phase) func(r *rand.Rand) ([]stress.Phase, []Burst) {
	return func(r *rand.Rand) ([]stress.Phase, []Burst) { return gen(r), nil }
}

// Families are the profile families, failing ones first.
var Families = []Family{
	{"mem-ramp", true, "memory from a start level (10–50 Mi) growing at 0.25–3 Mi/s past the limit", loadOnly(memRamp)},
	{"mem-step", true, "memory in steps of 8–25 Mi every 15–45 s past the limit", loadOnly(memStep)},
	{"leak-pause", true, "a leak of 0.5–2 Mi/s for 10–30 s (≥ 10 Mi), pausing 10–30 s, past the limit", loadOnly(leakPause)},
	{"paper", true, "the paper's fault: ~60 Mi + 80 % CPU for 60–120 s, then 10 Mi/s past the limit", loadOnly(paper)},
	{"spike", true, "a sudden allocation over the limit from a quiet baseline (no warning possible)", loadOnly(spike)},
	{"cpu-ramp", false, "CPU 20 % → 80 % of the limit over 60–180 s, memory 20–40 Mi", loadOnly(cpuRamp)},
	{"cpu-burst", false, "3 bursts at 90 % of the CPU limit, 10–20 s each, 20–40 s apart", loadOnly(cpuBurst)},
	{"cpu-oscillation", false, "CPU alternating 80 % / 20 % of the limit every 10–30 s", loadOnly(cpuOscillation)},
	{"steady-heavy", false, "60–79 % CPU and 50–70 Mi held for 3–5 min", loadOnly(steadyHeavy)},
	{"mem-high-hold", false, "memory ramped to 60–72 Mi and held for 2–4 min", loadOnly(memHighHold)},
	{"idle", false, "traffic only, no load", loadOnly(idle)},
	// Appended last: a family's seeds derive from its index, so new families go
	// at the end and leave every existing family's plan unchanged.
	{"traffic-burst", false, "3–4 MQTT bursts of 500–3000 msg/s (256 B–4 KiB, QoS 0/1, 0–2 subscribers), 10–30 s each, 20–60 s apart, no load", trafficBurst},
	{"mem-sawtooth", false, "2–4 cycles: memory from 5–20 Mi growing at 0.5–3 Mi/s to 40–72 Mi, held 10–40 s, freed, 10–30 s at the base", loadOnly(memSawtooth)},
}

// Run is one planned corpus run.
type Run struct {
	ID      string // <family>-<n>
	Family  string
	Failing bool
	Seed    uint64
	Profile stress.Profile
	// Traffic is the MQTT bursts the runner publishes through the broker,
	// timed from the onset (the profile's start); the profile's idle phases
	// cover them, so the profile's length is the run's.
	Traffic Traffic
	// LeadIn is the quiet broker added before the planned baseline
	// (WithLeadIn); Profile includes it.
	LeadIn time.Duration
}

// Scale multiplies every phase's and burst's duration and every burst's start
// by f (see stress.Profile.Scale); rates and sizes are kept.
func (r Run) Scale(f float64) (Run, error) {
	p, err := r.Profile.Scale(f)
	if err != nil {
		return Run{}, err
	}
	r.Profile = p
	if r.Traffic != nil {
		t := make(Traffic, len(r.Traffic))
		for i, b := range r.Traffic {
			b.Start = time.Duration(float64(b.Start) * f)
			b.Duration = time.Duration(float64(b.Duration) * f)
			t[i] = b
		}
		r.Traffic = t
	}
	return r, nil
}

// Burst is a spell of MQTT publishing to the edge broker from outside its
// container, on a topic the broker does not bridge, so only the broker works.
type Burst struct {
	Start    time.Duration // from the onset
	Duration time.Duration
	Rate     int  // messages per second
	Size     int  // payload bytes
	QoS      byte // 0 or 1, publisher and subscribers alike
	// Subscribers receive every message, so the broker delivers as well as
	// accepts.
	Subscribers int
}

// String is the burst as runs.json and --list show it.
func (b Burst) String() string {
	return fmt.Sprintf("at=%v,for=%v,rate=%d/s,size=%s,qos=%d,subs=%d",
		b.Start, b.Duration, b.Rate, stress.FormatSize(int64(b.Size)), b.QoS, b.Subscribers)
}

// Traffic is a run's bursts, in order.
type Traffic []Burst

// String is the bursts separated by ';', empty when there are none.
func (t Traffic) String() string {
	parts := make([]string, len(t))
	for i, b := range t {
		parts[i] = b.String()
	}
	return strings.Join(parts, ";")
}

// Plan returns perFamily runs of every family (of the named ones when only is
// not empty), each with its own seed derived from seed: the same arguments
// give the same plan.
func Plan(seed uint64, perFamily int, only ...string) ([]Run, error) {
	want := map[string]bool{}
	for _, f := range only {
		want[f] = true
	}
	var runs []Run
	for fi, f := range Families {
		if len(only) > 0 && !want[f.Name] {
			continue
		}
		delete(want, f.Name) // what is left names no family
		for i := 0; i < perFamily; i++ {
			s := seed*1_000_003 + uint64(fi)*10_007 + uint64(i)
			r := rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
			baseline := stress.Phase{Duration: dur(r, 30, 60)}
			phases, traffic := f.gen(r)
			p := stress.Profile{Phases: append([]stress.Phase{baseline}, phases...)}
			if err := p.Validate(); err != nil {
				return nil, fmt.Errorf("corpus: family %s run %d: %w", f.Name, i, err)
			}
			for j := range traffic {
				traffic[j].Start += baseline.Duration
			}
			runs = append(runs, Run{ID: fmt.Sprintf("%s-%d", f.Name, i+1), Family: f.Name, Failing: f.Failing, Seed: s,
				Profile: p, Traffic: traffic})
		}
	}
	for f := range want {
		return nil, fmt.Errorf("corpus: unknown family %q", f)
	}
	return runs, nil
}

func dur(r *rand.Rand, lo, hi int) time.Duration {
	return time.Duration(lo+r.IntN(hi-lo+1)) * time.Second
}

func mib(r *rand.Rand, lo, hi int) int64 { return int64(lo+r.IntN(hi-lo+1)) * mi }

func between(r *rand.Rand, lo, hi float64) float64 { return lo + r.Float64()*(hi-lo) }

// untilOver is how long growing from start at rate takes to reach overMemory,
// plus a margin for the kill.
func untilOver(start, rate int64) time.Duration {
	return (time.Duration(float64(overMemory-start)/float64(rate)*float64(time.Second)) + 20*time.Second).Round(time.Second)
}

func memRamp(r *rand.Rand) []stress.Phase {
	start := mib(r, 10, 50)
	rate := int64(between(r, 0.25, 3) * float64(mi))
	return []stress.Phase{
		{Duration: dur(r, 10, 30), Memory: start},
		{Duration: untilOver(start, rate), Memory: overMemory, Ramp: rate},
	}
}

func memStep(r *rand.Rand) []stress.Phase {
	step, every := mib(r, 8, 25), dur(r, 15, 45)
	var ps []stress.Phase
	for m := mib(r, 0, 30) + step; ; m += step {
		ps = append(ps, stress.Phase{Duration: every, Memory: m})
		if m > overMemory-40*mi {
			ps[len(ps)-1].Duration += 20 * time.Second
			return ps
		}
	}
}

func leakPause(r *rand.Rand) []stress.Phase {
	rate := int64(between(r, 0.5, 2) * float64(mi))
	// At least 10 Mi per cycle, so a run crosses the limit within minutes.
	grow, pause := max(dur(r, 10, 30), time.Duration(10*mi/rate+1)*time.Second), dur(r, 10, 30)
	var ps []stress.Phase
	m := mib(r, 5, 30)
	for m < overMemory-40*mi {
		m += int64(grow/time.Second) * rate
		ps = append(ps, stress.Phase{Duration: grow, Memory: m, Ramp: rate}, stress.Phase{Duration: pause, Memory: m})
	}
	ps[len(ps)-1].Duration += 20 * time.Second
	return ps
}

func paper(r *rand.Rand) []stress.Phase {
	return []stress.Phase{
		{Duration: dur(r, 60, 120), Memory: 60 * mi, CPU: 0.8 * limitCPU},
		{Duration: untilOver(60*mi, 10*mi), Memory: overMemory, Ramp: 10 * mi},
	}
}

func spike(r *rand.Rand) []stress.Phase {
	return []stress.Phase{
		{Duration: dur(r, 30, 90), Memory: mib(r, 0, 20)},
		{Duration: 30 * time.Second, Memory: overMemory},
	}
}

func cpuRamp(r *rand.Rand) []stress.Phase {
	m := mib(r, 20, 40)
	total := dur(r, 60, 180)
	const steps = 10
	ps := make([]stress.Phase, 0, steps+1)
	for i := 0; i <= steps; i++ {
		cpu := (0.2 + 0.6*float64(i)/steps) * limitCPU
		ps = append(ps, stress.Phase{Duration: total / steps, Memory: m, CPU: cpu})
	}
	return ps
}

func cpuBurst(r *rand.Rand) []stress.Phase {
	m := mib(r, 10, 40)
	var ps []stress.Phase
	for i := 0; i < 3; i++ {
		ps = append(ps, stress.Phase{Duration: dur(r, 10, 20), Memory: m, CPU: 0.9 * limitCPU},
			stress.Phase{Duration: dur(r, 20, 40), Memory: m})
	}
	return ps
}

func cpuOscillation(r *rand.Rand) []stress.Phase {
	m := mib(r, 10, 40)
	half := dur(r, 10, 30)
	var ps []stress.Phase
	for total := time.Duration(0); total < dur(r, 180, 300); total += 2 * half {
		ps = append(ps, stress.Phase{Duration: half, Memory: m, CPU: 0.8 * limitCPU},
			stress.Phase{Duration: half, Memory: m, CPU: 0.2 * limitCPU})
	}
	return ps
}

func steadyHeavy(r *rand.Rand) []stress.Phase {
	return []stress.Phase{{Duration: dur(r, 180, 300), Memory: mib(r, 50, 70), CPU: between(r, 0.6, 0.79) * limitCPU}}
}

func memHighHold(r *rand.Rand) []stress.Phase {
	m := mib(r, 60, 72)
	rate := int64(between(r, 0.5, 3) * float64(mi))
	return []stress.Phase{
		{Duration: (time.Duration(float64(m)/float64(rate)*float64(time.Second)) + time.Second).Round(time.Second), Memory: m, Ramp: rate},
		{Duration: dur(r, 120, 240), Memory: m},
	}
}

// memSawtooth fills and drains memory as a broker's queues or a cache do:
// ramps as steep as the failing families' that stop short of the limit and
// are freed. Without it, every memory ramp among the other train families
// ends in a kill, and a model learns that growing memory is a failure.
func memSawtooth(r *rand.Rand) []stress.Phase {
	base := mib(r, 5, 20)
	var ps []stress.Phase
	from := int64(0) // the first ramp grows from the baseline's nothing
	for range 2 + r.IntN(3) {
		peak := mib(r, 40, 72)
		rate := int64(between(r, 0.5, 3) * float64(mi))
		grow := (time.Duration(float64(peak-from)/float64(rate)*float64(time.Second)) + time.Second).Round(time.Second)
		from = base
		ps = append(ps,
			stress.Phase{Duration: grow, Memory: peak, Ramp: rate},
			stress.Phase{Duration: dur(r, 10, 40), Memory: peak},
			stress.Phase{Duration: dur(r, 10, 30), Memory: base})
	}
	return ps
}

func idle(r *rand.Rand) []stress.Phase {
	return []stress.Phase{{Duration: dur(r, 120, 240)}}
}

// trafficBurst publishes 3–4 bursts through an unloaded broker: its own CPU
// rises with no stress load, which a model must not mistake for a fault.
// Each burst is an idle phase of its length followed by an idle gap, so the
// profile's phases show where the bursts are.
func trafficBurst(r *rand.Rand) ([]stress.Phase, []Burst) {
	n := 3 + r.IntN(2)
	var (
		ps []stress.Phase
		bs []Burst
		at time.Duration
	)
	for range n {
		b := Burst{Start: at, Duration: dur(r, 10, 30), Rate: 500 + 100*r.IntN(26), Size: 256 << r.IntN(5),
			QoS: byte(r.IntN(2)), Subscribers: r.IntN(3)}
		gap := dur(r, 20, 60) // after the last burst: the broker settling
		ps = append(ps, stress.Phase{Duration: b.Duration}, stress.Phase{Duration: gap})
		bs = append(bs, b)
		at += b.Duration + gap
	}
	return ps, bs
}
