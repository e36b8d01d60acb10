package infer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/amf-edge/amf/contract"
)

// DefaultMemoryReference is the memory reference used when a container has no
// limit: 100 MiB, the paper's testbed limit.
const DefaultMemoryReference = 100 << 20

// Config sets the PromQL windows. All are configuration because a model is only
// valid with the windows it was trained with.
type Config struct {
	RateWindow  time.Duration // R of rate(x[R]); Prometheus pipeline: 5m
	DerivWindow time.Duration // range of the deriv subquery; 10m
	Step        time.Duration // subquery resolution, aligned to the epoch; 5s
	Lookback    time.Duration // instant-selector lookback delta; Prometheus' 5m
	// MemoryReference is used as the memory limit for samples without one (bytes).
	MemoryReference float64
	// PredictWindow and PredictHorizon are W and H of the projection the
	// predict_linear detector reads (Vector.Projection); a zero PredictWindow
	// computes none. They are not feature windows: no tree model reads them.
	PredictWindow  time.Duration
	PredictHorizon time.Duration
}

// DefaultConfig returns the windows of the published Prometheus pipeline.
func DefaultConfig() Config {
	return Config{
		RateWindow:      5 * time.Minute,
		DerivWindow:     10 * time.Minute,
		Step:            5 * time.Second,
		Lookback:        5 * time.Minute,
		MemoryReference: DefaultMemoryReference,
	}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	check := func(name string, d time.Duration) error {
		if d < time.Millisecond || d%time.Millisecond != 0 {
			return fmt.Errorf("features: %s %v must be a positive whole number of milliseconds", name, d)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"rate window", c.RateWindow}, {"deriv window", c.DerivWindow}, {"step", c.Step}, {"lookback", c.Lookback}} {
		if err := check(f.name, f.d); err != nil {
			return err
		}
	}
	if c.PredictWindow != 0 {
		if err := check("predict window", c.PredictWindow); err != nil {
			return err
		}
	}
	if c.PredictHorizon < 0 || c.PredictHorizon%time.Millisecond != 0 || (c.PredictWindow == 0 && c.PredictHorizon != 0) {
		return fmt.Errorf("features: predict horizon %v must be a whole number of milliseconds >= 0, and needs a predict window", c.PredictHorizon)
	}
	if c.DerivWindow < c.Step {
		return fmt.Errorf("features: deriv window %v is shorter than the step %v", c.DerivWindow, c.Step)
	}
	if !(c.MemoryReference > 0) || math.IsInf(c.MemoryReference, 0) {
		return fmt.Errorf("features: memory reference %v must be a positive number of bytes", c.MemoryReference)
	}
	return nil
}

// Sample is one reading of a target. A NaN field means "not measured this time": the
// series simply has no point at T, as in Prometheus when a scrape lacks a series.
type Sample struct {
	T                int64   // Unix milliseconds
	CPUSeconds       float64 // counter
	MemoryBytes      float64 // gauge
	MemoryLimitBytes float64 // gauge; 0, NaN or +Inf = no limit (Config.MemoryReference is used)
	NetworkBytes     float64 // counter, rx+tx
	DiskBytes        float64 // counter, read+write
}

// Undefined says why a feature has no value.
type Undefined uint8

// Reasons a feature is undefined. Defined (zero) means it has a value.
const (
	Defined          Undefined = iota
	TooFewSamples              // a rate needs two samples in its window
	NoRecentSample             // no gauge sample within the lookback
	TooFewRatePoints           // deriv needs two subquery points
	NotConfigured              // the projection is only computed with Config.PredictWindow
)

func (u Undefined) String() string {
	switch u {
	case Defined:
		return "defined"
	case TooFewSamples:
		return "fewer than 2 samples in the rate window"
	case NoRecentSample:
		return "no sample within the lookback"
	case TooFewRatePoints:
		return "fewer than 2 subquery points in the deriv window"
	case NotConfigured:
		return "not configured"
	}
	return fmt.Sprintf("undefined(%d)", uint8(u))
}

// Vector is the six features at one time. Values[i] is NaN exactly when Why[i] is
// not Defined.
type Vector struct {
	T      int64
	Values [contract.NumFeatures]float64
	Why    [contract.NumFeatures]Undefined
	// Projection is not a feature: it is what the predict_linear detector
	// reads, computed only when Config.PredictWindow is set.
	Projection Projection
	// MemorySlope is not a feature either: the memory's current slope,
	// bytes per second, what the agent judges an in-place resize by (see
	// memorySlope); NaN with fewer than MinSlopeSteps steps in SlopeWindow.
	MemorySlope float64
}

// SlopeWindow is the range of Vector.MemorySlope, (t − 6 s, t]: five steps
// at the sidecar's 1 s interval, an odd count, so that a step of memory
// spread over two samples is still outvoted.
const SlopeWindow = 6 * time.Second

// MinSlopeSteps is the fewest steps between samples that make a
// MemorySlope.
const MinSlopeSteps = 3

// ProjectionName is the projection's column name in replay and score CSVs.
const ProjectionName = "memory_percent_projected"

// Projection is the memory the straight line through the last W of memory
// samples reaches H after T, in percent of the memory limit:
//
//	predict_linear(memory_bytes[W], H) / memory_limit_bytes * 100
//
// with the limit as memory_percent takes it (the newest within the lookback,
// else Config.MemoryReference). 100 is the limit. MemoryPercent is NaN exactly
// when Why is not Defined.
//
// PercentPerSecond is that line's slope, deriv(memory_bytes[W]) /
// memory_limit_bytes * 100: with it the line's time to the limit follows.
type Projection struct {
	MemoryPercent    float64
	PercentPerSecond float64
	Why              Undefined
}

// ErrOutOfOrder is returned for a sample or evaluation time older than one already
// seen: the windows cannot be recomputed backwards.
var ErrOutOfOrder = errors.New("features: time went backwards")

// Engine keeps the samples the windows need and evaluates the features. It is not
// safe for concurrent use.
type Engine struct {
	cfg                                 Config
	rateMs, derivMs, stepMs, lookbackMs int64
	predictMs                           int64  // 0: no projection
	cpu, mem, memPct, net, disk         series // raw samples
	memRef                              series // the limit (or reference) each memory sample was divided by
	cpuRateSteps, memSteps              series // inner subquery values, one per step
	lastT                               int64  // newest sample or evaluation time
	started                             bool
	nextStep                            int64 // first step not yet evaluated
	scratch                             []Point
}

// NewEngine returns an engine for cfg.
func NewEngine(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Engine{
		cfg:        cfg,
		rateMs:     cfg.RateWindow.Milliseconds(),
		derivMs:    cfg.DerivWindow.Milliseconds(),
		stepMs:     cfg.Step.Milliseconds(),
		lookbackMs: cfg.Lookback.Milliseconds(),
		predictMs:  cfg.PredictWindow.Milliseconds(),
	}, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Add records a sample. Its time must be later than every sample and evaluation
// before it.
func (e *Engine) Add(s Sample) error {
	if e.started && s.T <= e.lastT {
		return fmt.Errorf("sample at %d ms after %d ms: %w", s.T, e.lastT, ErrOutOfOrder)
	}
	if !e.started {
		e.started = true
		e.nextStep = alignUp(s.T, e.stepMs)
	}
	// Every sample at or before a step older than s.T is now known: close those steps.
	e.closeSteps(s.T - 1)
	e.lastT = s.T

	pushIf(&e.cpu, s.T, s.CPUSeconds)
	pushIf(&e.net, s.T, s.NetworkBytes)
	pushIf(&e.disk, s.T, s.DiskBytes)
	if !math.IsNaN(s.MemoryBytes) {
		ref := s.MemoryLimitBytes
		if !(ref > 0) || math.IsInf(ref, 0) {
			ref = e.cfg.MemoryReference
		}
		e.mem.push(Point{s.T, s.MemoryBytes})
		e.memPct.push(Point{s.T, s.MemoryBytes / ref * 100})
		if e.predictMs > 0 {
			e.memRef.push(Point{s.T, ref})
		}
	}
	e.evict()
	return nil
}

func pushIf(s *series, t int64, v float64) {
	if !math.IsNaN(v) {
		s.push(Point{t, v})
	}
}

// Eval returns the features at time t, which must not be older than the newest
// sample. Live callers pass the newest sample's time.
func (e *Engine) Eval(t int64) (Vector, error) {
	if e.started && t < e.lastT {
		return Vector{}, fmt.Errorf("evaluation at %d ms before sample at %d ms: %w", t, e.lastT, ErrOutOfOrder)
	}
	if !e.started {
		e.started = true
		e.nextStep = alignUp(t, e.stepMs)
	}
	e.closeSteps(t)
	e.lastT = t

	v := Vector{T: t}
	v.Values[contract.CPUPercent], v.Why[contract.CPUPercent] = e.rate(&e.cpu, t)
	if v.Why[contract.CPUPercent] == Defined {
		v.Values[contract.CPUPercent] *= 100
	}
	v.Values[contract.MemoryPercent], v.Why[contract.MemoryPercent] = e.instant(&e.memPct, t)
	v.Values[contract.NetworkIOBytesPerSec], v.Why[contract.NetworkIOBytesPerSec] = e.rate(&e.net, t)
	v.Values[contract.DiskIOBytesPerSec], v.Why[contract.DiskIOBytesPerSec] = e.rate(&e.disk, t)
	v.Values[contract.CPUGrowthRate], v.Why[contract.CPUGrowthRate] = e.deriv(&e.cpuRateSteps, t)
	v.Values[contract.MemoryGrowthRate], v.Why[contract.MemoryGrowthRate] = e.deriv(&e.memSteps, t)
	v.Projection = e.projection(t)
	e.scratch = e.mem.window(e.scratch[:0], t-SlopeWindow.Milliseconds(), t)
	v.MemorySlope = memorySlope(e.scratch)
	return v, nil
}

// memorySlope is the median of the slopes between successive samples of
// pts, (v[i] − v[i−1]) / (t[i] − t[i−1]) in units per second, NaN with fewer
// than MinSlopeSteps of them. It is not PromQL on purpose: the question it
// answers is "is memory climbing now, and how fast", asked at the moment
// an anomaly is confirmed, a few seconds after whatever began it. A line
// through a window (deriv) cannot tell a step from a ramp then: a broker that
// took 57 MiB at once (a burst of sessions, a retained set loaded) reads as
// climbing 2.3 MiB/s over 30 s, and a leak five seconds old as a tenth of its
// speed. The median of the last steps reads the step as 0 (one outlier among
// them) and the leak at its speed (every step climbs).
func memorySlope(pts []Point) float64 {
	n := len(pts) - 1
	if n < MinSlopeSteps {
		return math.NaN()
	}
	var buf [16]float64
	d := buf[:0]
	for i := 1; i < len(pts); i++ {
		d = append(d, (pts[i].V-pts[i-1].V)/(float64(pts[i].T-pts[i-1].T)/1000))
	}
	slices.Sort(d)
	if n%2 == 1 {
		return d[n/2]
	}
	return (d[n/2-1] + d[n/2]) / 2
}

// projection evaluates predict_linear(memory_bytes[W], H) / memory_limit_bytes * 100
// at t. Like PromQL it is undefined with fewer than two memory samples in the
// window, or without a limit sample within the lookback to divide by.
func (e *Engine) projection(t int64) Projection {
	if e.predictMs == 0 {
		return Projection{math.NaN(), math.NaN(), NotConfigured}
	}
	e.scratch = e.mem.window(e.scratch[:0], t-e.predictMs, t)
	bytesAhead, ok := predictLinear(e.scratch, t, e.cfg.PredictHorizon.Seconds())
	bytesPerSecond, _ := deriv(e.scratch)
	if !ok {
		return Projection{math.NaN(), math.NaN(), TooFewSamples}
	}
	limit, why := e.instant(&e.memRef, t)
	if why != Defined {
		return Projection{math.NaN(), math.NaN(), why}
	}
	return Projection{bytesAhead / limit * 100, bytesPerSecond / limit * 100, Defined}
}

// rate evaluates rate(s[R]) at t.
func (e *Engine) rate(s *series, t int64) (float64, Undefined) {
	e.scratch = s.window(e.scratch[:0], t-e.rateMs, t)
	r, ok := extrapolatedRate(e.scratch, t-e.rateMs, t, e.cfg.RateWindow.Seconds())
	if !ok {
		return math.NaN(), TooFewSamples
	}
	return r, Defined
}

// instant evaluates an instant selector at t: the newest sample within the lookback.
func (e *Engine) instant(s *series, t int64) (float64, Undefined) {
	p, ok := s.newest(t-e.lookbackMs, t)
	if !ok {
		return math.NaN(), NoRecentSample
	}
	return p.V, Defined
}

// deriv evaluates deriv(inner[D:step]) at t from the inner values kept per step.
func (e *Engine) deriv(steps *series, t int64) (float64, Undefined) {
	e.scratch = steps.window(e.scratch[:0], t-e.derivMs, t)
	d, ok := deriv(e.scratch)
	if !ok {
		return math.NaN(), TooFewRatePoints
	}
	return d, Defined
}

// closeSteps evaluates the subqueries' inner expressions at every step time <= t not
// yet evaluated. A step is only evaluated once all samples at or before it are known.
func (e *Engine) closeSteps(t int64) {
	// Steps older than any deriv window still to come will never be read: skip them,
	// so a long gap costs nothing.
	if oldest := alignUp(t-e.derivMs+1, e.stepMs); e.nextStep < oldest {
		e.nextStep = oldest
	}
	for ; e.nextStep <= t; e.nextStep += e.stepMs {
		s := e.nextStep
		if r, why := e.rate(&e.cpu, s); why == Defined {
			e.cpuRateSteps.push(Point{s, r})
		}
		if m, why := e.instant(&e.mem, s); why == Defined {
			e.memSteps.push(Point{s, m})
		}
	}
}

// evict drops what no future evaluation can read. Future evaluations happen at
// times >= lastT; future steps at times >= nextStep.
func (e *Engine) evict() {
	oldest := min(e.lastT, e.nextStep)
	rawHorizon := oldest - max(e.rateMs, e.lookbackMs, e.predictMs, SlopeWindow.Milliseconds())
	for _, s := range []*series{&e.cpu, &e.mem, &e.memPct, &e.memRef, &e.net, &e.disk} {
		s.dropThrough(rawHorizon)
	}
	e.cpuRateSteps.dropThrough(e.lastT - e.derivMs)
	e.memSteps.dropThrough(e.lastT - e.derivMs)
}

// alignUp returns the smallest multiple of step that is >= t.
func alignUp(t, step int64) int64 {
	q := t / step
	if q*step < t {
		q++
	}
	return q * step
}

// Reset forgets every sample, as after a restart: used when the wall clock steps
// backwards, since windows cannot be recomputed over time that ran twice.
func (e *Engine) Reset() {
	for _, s := range []*series{&e.cpu, &e.mem, &e.memPct, &e.memRef, &e.net, &e.disk, &e.cpuRateSteps, &e.memSteps} {
		s.head, s.n = 0, 0
	}
	e.started, e.lastT, e.nextStep = false, 0, 0
}
