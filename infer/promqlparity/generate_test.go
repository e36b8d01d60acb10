package promqlparity

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/amf-edge/amf/infer"
)

// scenario describes how a randomised run is generated. Every probability is per
// sample unless said otherwise.
type scenario struct {
	interval time.Duration // nominal sample interval
	jitter   time.Duration // each time is moved by a uniform amount in [-jitter, +jitter] (ms resolution)
	duration time.Duration // length of the run

	wholeSecondStart bool // start on a whole second; otherwise at a random millisecond

	pSkip    float64          // a scrape is missing altogether (short gap)
	pLongGap float64          // a gap drawn from longGap starts after this sample
	longGap  [2]time.Duration // range of long gaps

	pMissing float64 // each series independently has no point in a sample
	pReset   float64 // each counter independently resets (restarts near zero)

	constant bool // every series keeps one value for the whole run
	noLimit  bool // the container has no memory limit (0, +Inf or NaN in the sample)

	pAlignToStep float64 // a sample time is moved onto a multiple of the step
	pExtraEval   float64 // an evaluation-only time is added before the next sample
	pNoEval      float64 // a sample is added without an evaluation at its time
}

// Value model: realistic magnitudes of a broker container.
const (
	mib          = 1 << 20
	defaultLimit = 100 * mib
)

// generate builds the events of one run. step is the subquery step of the windows
// the run will be compared under (used to land some times exactly on steps), and
// boundaries are window lengths at which an evaluation just at, and just before, the
// edge of a window is interesting.
func generate(seed uint64, sc scenario, step time.Duration, boundaries []time.Duration) []event {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	stepMs := step.Milliseconds()
	intervalMs := sc.interval.Milliseconds()
	jitterMs := sc.jitter.Milliseconds()

	start := int64(1_700_000_000) * 1000 // 2023-11-14, a whole second
	start += rng.Int64N(86_400) * 1000
	if !sc.wholeSecondStart {
		start += 1 + rng.Int64N(999)
	}
	end := start + sc.duration.Milliseconds()

	// Counters and gauges.
	cpu := float64(rng.Int64N(1_000_000_000)) / 1e6 // seconds, from usage_usec
	cpuRate := rng.Float64() * 1.5                  // cores
	mem := float64(20*mib + rng.Int64N(60*mib))
	limit := float64(defaultLimit)
	net := float64(rng.Int64N(1 << 40))
	netRate := rng.Float64() * 2e6
	disk := float64(rng.Int64N(1 << 36))
	if sc.constant {
		cpuRate, netRate = 0, 0
	}

	// Evaluations before the first sample (a sidecar that starts before its target).
	var events []event
	prev := int64(math.MinInt64)
	if sc.pExtraEval > 0 {
		events, prev = appendEvals(events, prev, start-jitterMs, []int64{start - jitterMs - 2*stepMs, alignUp(start-jitterMs-stepMs, stepMs)})
	}
	nominal := start
	for nominal < end {
		ts := nominal
		if jitterMs > 0 {
			ts += rng.Int64N(2*jitterMs+1) - jitterMs
		}
		if sc.pAlignToStep > 0 && rng.Float64() < sc.pAlignToStep {
			ts = (ts + stepMs/2) / stepMs * stepMs
		}
		if ts <= prev {
			ts = prev + 1
		}
		nominal += intervalMs

		if sc.pSkip > 0 && rng.Float64() < sc.pSkip {
			continue
		}

		// Evolve the values over the time since the previous sample.
		dt := 0.0
		if prev != math.MinInt64 {
			dt = float64(ts-prev) / 1000
		}
		if !sc.constant {
			cpuRate = clamp(cpuRate+rng.NormFloat64()*0.05, 0, 2)
			cpu += math.Round(cpuRate*dt*1e6) / 1e6
			mem = clamp(mem+math.Round(rng.NormFloat64()*64)*4096+dt*2048, 4*mib, 190*mib)
			if rng.Float64() < 0.002 {
				limit = float64((64 + 64*rng.Int64N(4)) * mib) // resize
			}
			netRate = clamp(netRate+rng.NormFloat64()*5e4, 0, 1e7)
			net += math.Round(netRate * dt)
			if rng.Float64() < 0.1 { // disk writes come in bursts
				disk += float64(4096 * rng.Int64N(1024))
			}
			if sc.pReset > 0 {
				if rng.Float64() < sc.pReset {
					cpu = float64(rng.Int64N(2_000_000)) / 1e6
				}
				if rng.Float64() < sc.pReset {
					net = float64(rng.Int64N(10_000))
				}
				if rng.Float64() < sc.pReset {
					disk = 0
				}
			}
		}

		s := infer.Sample{T: ts, CPUSeconds: cpu, MemoryBytes: mem, MemoryLimitBytes: limit, NetworkBytes: net, DiskBytes: disk}
		if sc.noLimit {
			s.MemoryLimitBytes = []float64{0, math.Inf(1), math.NaN()}[rng.IntN(3)]
		}
		if sc.pMissing > 0 {
			for _, f := range []*float64{&s.CPUSeconds, &s.MemoryBytes, &s.NetworkBytes, &s.DiskBytes} {
				if rng.Float64() < sc.pMissing {
					*f = math.NaN()
				}
			}
			if math.IsNaN(s.MemoryBytes) {
				s.MemoryLimitBytes = math.NaN() // read together (see loadPrometheus)
			}
		}
		noEval := sc.pNoEval > 0 && rng.Float64() < sc.pNoEval
		events = append(events, event{t: ts, sample: s, noEval: noEval})
		prev = ts

		// Long gap: skip ahead; evaluate inside it around the window edges.
		if sc.pLongGap > 0 && rng.Float64() < sc.pLongGap {
			gap := sc.longGap[0].Milliseconds() + rng.Int64N((sc.longGap[1]-sc.longGap[0]).Milliseconds()+1)
			next := ts + gap
			var extra []int64
			for _, b := range boundaries {
				extra = append(extra, ts+b.Milliseconds()-1, ts+b.Milliseconds(), ts+b.Milliseconds()+1)
			}
			extra = append(extra, ts+gap/2, alignUp(ts+gap/3, stepMs))
			events, prev = appendEvals(events, prev, next, extra)
			nominal = next
			continue
		}
		// Evaluation-only times between this sample and the next nominal one.
		if sc.pExtraEval > 0 && rng.Float64() < sc.pExtraEval {
			next := nominal - jitterMs // no sample comes before this
			extra := []int64{ts + 1 + rng.Int64N(max(1, next-ts-1)), alignUp(ts+1, stepMs)}
			events, prev = appendEvals(events, prev, next, extra)
		}
	}
	return events
}

// appendEvals adds evaluation-only events at the times in ts that fall strictly
// between prev and next, in increasing order, without duplicates.
func appendEvals(events []event, prev, next int64, ts []int64) ([]event, int64) {
	for {
		best := int64(math.MaxInt64)
		for _, t := range ts {
			if t > prev && t < next && t < best {
				best = t
			}
		}
		if best == math.MaxInt64 {
			return events, prev
		}
		events = append(events, event{evalOnly: true, t: best})
		prev = best
	}
}

func alignUp(t, step int64) int64 {
	q := t / step
	if q*step < t {
		q++
	}
	return q * step
}

func clamp(v, lo, hi float64) float64 { return min(max(v, lo), hi) }
