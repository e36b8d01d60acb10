package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/sidecar/cgroup"
	"github.com/amf-edge/amf/signal"
)

// Error kinds the sidecar counts in amf_errors_total, beside healthcheck's own.
const (
	ErrorKindSample = "sample"
	ErrorKindModel  = "model"
	ErrorKindSignal = "signal"
	// ErrorKindTarget counts failed searches for the broker container.
	ErrorKindTarget = "target"
)

// Config wires a sidecar. Model is required, and Source or Rediscover; Probe,
// Signaller and HTTPAddr are optional (a sidecar without a signaller only
// serves its endpoint).
type Config struct {
	// Source is the target; nil when it has not been found yet (then
	// Rediscover is required).
	Source Source
	// Rediscover, when set, finds the target: at every sample until it is
	// found, and again after it vanished (a restarted container has a new
	// cgroup); without it the same Source is retried.
	Rediscover func(context.Context) (Source, error)
	// TargetError says why the target has not been found, when Source is nil.
	TargetError string
	// MemoryReference, when set, is memory_percent's reference for a target
	// without a memory limit of its own, instead of what bounds it (see
	// memoryFallback). A target's own limit always wins: it is the model's
	// definition, and what OOM-kills the broker.
	MemoryReference *cgroup.MemoryReference
	Interval        time.Duration
	Model           *model.Model
	// ModelWarning is shown in /status and logged at start when the model in use
	// is a fallback (an override that failed to load).
	ModelWarning string
	Probe        healthcheck.Prober
	Signaller    *Signaller
	HTTPAddr     string
	Metrics      *healthcheck.Metrics
	Log          *slog.Logger
}

// Reference sources beside cgroup's (RefContainerLimit, RefParentLimit,
// RefMachineMemory): the operator's (Config.MemoryReference), one assumed
// when the source cannot tell, and cpu_percent's.
const (
	RefFlag    = "flag"
	RefAssumed = "assumed"
	RefOneCore = "one_core"
)

// cpuReference is what cpu_percent is relative to, always: the model's
// feature is rate(cpu seconds) × 100, a percentage of one core, as in the
// paper's PromQL and in the training data of CPU-limited brokers. A CPU limit
// (or none) does not change it: dividing by the limit would give the model a
// feature it was not trained on. Without a limit a broker can exceed 100.
var cpuReference = healthcheck.Reference{Value: 1, Unit: "cores", Source: RefOneCore,
	Why: "cpu_percent is rate(CPU seconds) × 100, per core, as the model was trained; a CPU limit, or none, does not change it"}

// Sidecar runs the sample → features → score → state → signal loop.
type Sidecar struct {
	cfg Config
	// memFallback is memory_percent's reference for readings without a
	// limit, found when the source was set; memRef the reference last
	// reported (the loop goroutine owns both).
	memFallback healthcheck.Reference
	memRef      healthcheck.Reference
	sampler     *Sampler
	machine     *Machine
	probe       *healthcheck.ProbeState
	alive       *healthcheck.Heartbeat
	metrics     *healthcheck.Metrics

	events chan func() // work for the loop goroutine, which owns machine and seq

	mu     sync.Mutex // guards status
	status healthcheck.Status
	seq    uint64
}

// New checks cfg and builds a sidecar whose feature windows come from the model's
// manifest (FeatureConfig): a model is only valid with the windows it was trained
// with.
func New(cfg Config) (*Sidecar, error) {
	if (cfg.Source == nil && cfg.Rediscover == nil) || cfg.Model == nil {
		return nil, errors.New("sidecar: a target (or a way to find it) and a model are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = healthcheck.NewMetrics()
	}
	fc, err := FeatureConfig(cfg.Model, cfg.Interval)
	if err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	sampler, err := NewSampler(cfg.Source, fc, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	var probeState *healthcheck.ProbeState
	if cfg.Probe != nil {
		probeState = healthcheck.NewProbeState(0)
	}
	s := &Sidecar{
		cfg:     cfg,
		sampler: sampler,
		machine: NewMachine(cfg.Model.Threshold(), cfg.Probe != nil),
		probe:   probeState,
		alive:   healthcheck.NewHeartbeat(5*cfg.Interval + time.Second),
		metrics: cfg.Metrics,
		events:  make(chan func(), 16),
	}
	state, reason := s.machine.State()
	s.status = healthcheck.Status{
		State: state, TransitionReason: reason, LastTransition: time.Now(),
		Threshold: cfg.Model.Threshold(),
		Model:     fmt.Sprintf("%s sha256:%s", cfg.Model.Source(), cfg.Model.SHA256()),
	}
	if cfg.ModelWarning != "" {
		s.status.Model += " (fallback: " + cfg.ModelWarning + ")"
	}
	s.status.CPUReference = &cpuReference
	s.metrics.SetCPUReference(cpuReference)
	if cfg.Source != nil {
		s.status.Target = fmt.Sprint(cfg.Source)
		s.memoryFallback(cfg.Source)
	} else {
		s.targetNotFound(errors.New(cfg.TargetError))
	}
	s.metrics.SetState(state)
	return s, nil
}

// FeatureConfig is the feature pipeline m needs when sampling every interval:
// the windows of its manifest, nothing of the caller's, because a model is only
// valid on features computed the way its training features were. It refuses
// (errors.Is model.ErrFeatures or model.ErrFeatureSpec) a model whose features
// this build computes in another order, whose windows the engine cannot
// compute, or whose training data was sampled faster than interval (see
// model.Windows.CheckInterval for why faster sampling is fine and slower is
// not).
func FeatureConfig(m *model.Model, interval time.Duration) (infer.Config, error) {
	names := infer.FeatureNames()
	if err := m.CheckFeatureNames(names[:]); err != nil {
		return infer.Config{}, err
	}
	w := m.Windows()
	if err := w.CheckInterval(interval); err != nil {
		return infer.Config{}, fmt.Errorf("model %s: %w", m.Source(), err)
	}
	fc := infer.DefaultConfig()
	fc.RateWindow, fc.DerivWindow, fc.Step, fc.Lookback = w.Rate, w.Deriv, w.SubqueryStep, w.Lookback
	fc.PredictWindow, fc.PredictHorizon = m.Projection() // zero for tree models
	if err := fc.Validate(); err != nil {
		return infer.Config{}, fmt.Errorf("model %s: %w: %w", m.Source(), model.ErrFeatureSpec, err)
	}
	return fc, nil
}

// serverConfig is the health endpoint's wiring.
func (s *Sidecar) serverConfig() healthcheck.ServerConfig {
	return healthcheck.ServerConfig{
		Addr:        s.cfg.HTTPAddr,
		Liveness:    s.alive.Check,
		Readiness:   s.ready,
		Status:      s.Status,
		Metrics:     s.metrics,
		OnAppReport: s.appReport,
		Logger:      s.cfg.Log,
	}
}

// Status returns a snapshot for /status.
func (s *Sidecar) Status() healthcheck.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	if s.probe != nil {
		if r, ok := s.probe.Last(); ok {
			st.Probe = &r
		}
	}
	return st
}

// ready is /readyz: the application logic works. With a probe, the probe must
// pass; in any case the pod must not be unhealthy or stopping.
func (s *Sidecar) ready() error {
	if s.probe != nil {
		if err := s.probe.Check(); err != nil {
			return err
		}
	}
	st := s.Status()
	if st.State == signal.Unhealthy || st.State == signal.Stopping {
		return fmt.Errorf("%s: %s", st.State, st.TransitionReason)
	}
	return nil
}

// Run serves until ctx ends, then signals stopping and disconnects.
func (s *Sidecar) Run(ctx context.Context) error {
	if s.cfg.ModelWarning != "" {
		s.cfg.Log.Error("model override refused; running on the embedded model", "problem", s.cfg.ModelWarning)
		s.metrics.Error(ErrorKindModel)
	}
	for _, w := range s.cfg.Model.Warnings() {
		s.cfg.Log.Warn("model manifest", "model", s.cfg.Model.Source(), "problem", w)
	}
	s.logFeatureSpec()
	var wg sync.WaitGroup
	defer wg.Wait()
	inner, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()

	if s.cfg.HTTPAddr != "" {
		srv, err := healthcheck.NewServer(s.serverConfig())
		if err != nil {
			return err
		}
		wg.Go(func() {
			if err := srv.ListenAndServe(inner); err != nil {
				s.cfg.Log.Error("health endpoint stopped", "addr", s.cfg.HTTPAddr, "err", err)
			}
		})
	}
	if s.cfg.Signaller != nil {
		wg.Go(func() { _ = s.cfg.Signaller.Run(inner) })
	}
	if s.cfg.Probe != nil {
		toMachine := healthcheck.OnChange(func(r healthcheck.Result) {
			s.do(inner, func() { s.apply(s.machine.Probe(r.OK, r.Reason), nil) })
		})
		wg.Go(func() {
			_ = s.cfg.Probe.Run(inner, func(r healthcheck.Result) {
				s.probe.Report(r)
				s.metrics.ObserveProbe(r)
				toMachine(r)
			})
		})
	}

	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	s.sampleOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			s.shutdown()
			cancel()
			return nil
		case f := <-s.events:
			f()
		case <-tick.C:
			s.sampleOnce(ctx)
		}
	}
}

// logFeatureSpec says at start which feature pipeline the scores come from, so
// a log shows whether the sidecar computes what the model was trained on.
func (s *Sidecar) logFeatureSpec() {
	spec := s.cfg.Model.FeatureSpec()
	w := spec.Windows.Format() // what the engine was built with (FeatureConfig), as the manifest writes it
	s.cfg.Log.Info("feature pipeline from the model's manifest",
		"model", s.cfg.Model.Source(),
		"rate_window", w.RateWindow, "deriv_window", w.DerivWindow, "subquery_step", w.SubqueryStep,
		"lookback", w.Lookback, "trained_sample_interval", w.SampleInterval, "interval", s.cfg.Interval.String(),
		"cpu_percent_reference", cpuReference.Why,
		"cpu_reference_fraction", spec.Normalisation.CPUReferenceFraction,
		"memory_reference_fraction", spec.Normalisation.MemoryReferenceFraction)
}

// do hands f to the loop goroutine, which owns the state machine.
func (s *Sidecar) do(ctx context.Context, f func()) {
	select {
	case s.events <- f:
	case <-ctx.Done():
	}
}

func (s *Sidecar) sampleOnce(ctx context.Context) {
	start := time.Now()
	s.alive.Beat()
	if s.sampler.src == nil && !s.rediscover(ctx) {
		return
	}
	rec, err := s.sampler.Sample(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		s.metrics.Error(ErrorKindSample)
		if errors.Is(err, cgroup.ErrGone) {
			s.apply(s.machine.TargetGone("broker container gone: "+err.Error()), nil)
			s.rediscover(ctx)
			return
		}
		s.cfg.Log.Warn("sample failed", "err", err)
		return
	}
	if s.machine.targetGone != "" {
		s.apply(s.machine.TargetGone(""), nil) // it is back
	}
	s.reportMemoryReference(rec.Stats.MemoryLimitBytes)
	x := rec.Features.Values
	normalise(&x, s.cfg.Model.Normalisation())
	p := s.cfg.Model.ScoreSample(&x, rec.Features.Projection.MemoryPercent)
	if math.IsNaN(p) {
		s.metrics.Error(ErrorKindModel)
		s.cfg.Log.Error("model returned no score", "model", s.cfg.Model.Source())
		return
	}
	feats := toSignalFeatures(&rec.Features)
	s.metrics.SetScore(p)
	s.metrics.SetFeatures(feats)
	sc := &scored{p: p, f: feats, at: rec.Stats.Time}
	if s.cfg.Model.Anomalous(p) {
		sc.why = s.cfg.Model.Why(&x, rec.Features.Projection.MemoryPercent, rec.Features.Projection.PercentPerSecond)
	}
	s.apply(s.machine.Score(p), sc)
	s.metrics.ObserveSample(time.Since(start))
}

// rediscover looks for the target (again, after it vanished) and reports
// whether it found it.
func (s *Sidecar) rediscover(ctx context.Context) bool {
	if s.cfg.Rediscover == nil {
		return s.sampler.src != nil
	}
	src, err := s.cfg.Rediscover(ctx)
	if err != nil {
		s.metrics.Error(ErrorKindTarget)
		s.targetNotFound(err)
		return false
	}
	s.sampler.src = src
	s.memoryFallback(src)
	s.mu.Lock()
	s.status.Target, s.status.TargetError = fmt.Sprint(src), ""
	s.mu.Unlock()
	s.noteTargetSearch(s.machine.TargetNotFound(""))
	s.cfg.Log.Info("target found", "target", fmt.Sprint(src))
	return true
}

// memoryFallback finds memory_percent's reference for readings of src
// without a memory limit: Config.MemoryReference, else what bounds src (the
// nearest limited cgroup above it, else the machine's memory: see
// cgroup.MemoryReference for why), else, for a source that cannot tell,
// infer.DefaultMemoryReference, said to be assumed.
func (s *Sidecar) memoryFallback(src Source) {
	ref := cgroup.MemoryReference{Bytes: infer.DefaultMemoryReference, Source: RefAssumed,
		Why: "no memory limit on the target and nothing known above it: the paper testbed's 100 MiB limit, assumed"}
	switch bounded, ok := src.(interface {
		MemoryReference() (cgroup.MemoryReference, error)
	}); {
	case s.cfg.MemoryReference != nil:
		ref = *s.cfg.MemoryReference
	case ok:
		r, err := bounded.MemoryReference()
		if err != nil {
			s.metrics.Error(ErrorKindSample)
			s.cfg.Log.Warn("cannot tell what bounds the target's memory", "err", err)
			ref.Why += " (" + err.Error() + ")"
			break
		}
		ref = r
	}
	s.memFallback = healthcheck.Reference{Value: ref.Bytes, Unit: "bytes", Source: ref.Source, Why: ref.Why}
	s.sampler.SetMemoryReference(ref.Bytes)
}

// reportMemoryReference says, when it changes, what the latest reading's
// memory_percent was relative to: the container's limit when the reading
// has one, else the fallback. A broker without a limit is worth a warning:
// its memory alarms come only near a limit it shares, or never.
func (s *Sidecar) reportMemoryReference(limit float64) {
	ref := s.memFallback
	if limit > 0 {
		ref = healthcheck.Reference{Value: limit, Unit: "bytes", Source: cgroup.RefContainerLimit, Why: "the container's memory limit"}
		if s.memFallback.Source == cgroup.RefContainerLimit {
			ref.Why = s.memFallback.Why // names the cgroup
		}
	}
	if ref == s.memRef {
		return
	}
	s.memRef = ref
	s.mu.Lock()
	s.status.MemoryReference = &ref
	s.mu.Unlock()
	s.metrics.SetMemoryReference(ref)
	args := []any{"bytes", ref.Value, "source", ref.Source, "why", ref.Why}
	if ref.Source == cgroup.RefContainerLimit {
		s.cfg.Log.Info("memory_percent is relative to the container's memory limit", args...)
		return
	}
	s.cfg.Log.Warn("the broker container has no memory limit: memory_percent is relative to another reference", args...)
}

// noteTargetSearch applies a verdict of the target search. While starting,
// the reason changes without a transition; /status shows the current one.
func (s *Sidecar) noteTargetSearch(v Verdict) {
	s.apply(v, nil)
	if !v.Changed && v.State == signal.Starting {
		s.mu.Lock()
		s.status.TransitionReason = v.Reason
		s.mu.Unlock()
	}
}

// targetNotFound records why the target is not found, in /status, in the
// state's reason while the sidecar starts, and in the log when the reason is
// new (a sidecar retries every sample).
func (s *Sidecar) targetNotFound(err error) {
	s.mu.Lock()
	changed := s.status.TargetError != err.Error()
	s.status.TargetError = err.Error()
	s.mu.Unlock()
	if s.sampler.src == nil {
		s.noteTargetSearch(s.machine.TargetNotFound(err.Error()))
	}
	if changed {
		s.cfg.Log.Warn("broker container not found; looking again at every sample", "err", err)
	}
}

type scored struct {
	p   float64
	f   *signal.Features
	at  time.Time
	why string // what drove an anomalous score (model.Model.Why); "" otherwise
}

// apply records a verdict in the status and signals it when it must be.
func (s *Sidecar) apply(v Verdict, sc *scored) {
	s.mu.Lock()
	if sc != nil {
		p := sc.p
		s.status.Score, s.status.Features, s.status.Explanation = &p, sc.f, sc.why
	}
	if v.Changed {
		s.status.State, s.status.TransitionReason, s.status.LastTransition = v.State, v.Reason, time.Now()
	}
	var msg signal.Message
	if v.Publish {
		s.seq++
		s.status.Seq = s.seq
		msg = signal.Message{State: v.State, Reason: signal.ShortReason(v.Reason), Seq: s.seq, Time: time.Now(),
			Probability: s.status.Score, Features: s.status.Features}
		if sc != nil {
			msg.Time = sc.at
		}
	}
	s.mu.Unlock()

	if v.Changed {
		s.metrics.SetState(v.State)
		s.cfg.Log.Info("health transition", "state", v.State, "reason", v.Reason)
	}
	if v.Publish && s.cfg.Signaller != nil {
		if err := s.cfg.Signaller.Publish(msg); err != nil {
			s.metrics.Error(ErrorKindSignal)
			s.cfg.Log.Error("signal not sent", "err", err)
			return
		}
		s.metrics.SignalSent(v.State)
	}
}

// appReport handles POST /signal from the application beside the broker.
func (s *Sidecar) appReport(ctx context.Context, r healthcheck.AppReport) error {
	errc := make(chan error, 1)
	s.do(ctx, func() {
		if st, _ := s.machine.State(); st == signal.Stopping {
			errc <- fmt.Errorf("%w: the sidecar is stopping", healthcheck.ErrConflict)
			return
		}
		v, err := s.machine.App(r.State, r.Reason)
		if err != nil {
			errc <- fmt.Errorf("%w: %v", healthcheck.ErrInvalidReport, err)
			return
		}
		s.apply(v, nil)
		errc <- nil
	})
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Sidecar) shutdown() {
	v := s.machine.Stop("sidecar received SIGTERM")
	s.apply(Verdict{State: v.State, Reason: v.Reason, Changed: v.Changed}, nil) // status only
	if s.cfg.Signaller == nil {
		return
	}
	s.mu.Lock()
	s.seq++
	msg := signal.Message{State: signal.Stopping, Reason: signal.ShortReason(v.Reason), Seq: s.seq, Time: time.Now(),
		Probability: s.status.Score, Features: s.status.Features}
	s.mu.Unlock()
	if err := s.cfg.Signaller.Close(msg, 2*time.Second); err != nil {
		s.cfg.Log.Warn("stopping state not acknowledged by the node agent", "err", err)
		return
	}
	s.metrics.SignalSent(signal.Stopping)
}

// normalise puts features on the scale the model was trained on. The manifest's
// fractions say which share of the plain value the training data's 100 % was (0.5
// for ToD-K8s-OOD, whose pod sums count each container twice), so CPU (percent and
// growth, against one core) and memory (percent and growth) are divided by them.
func normalise(x *[infer.NumFeatures]float64, n model.Normalisation) {
	if f := n.CPUReferenceFraction; f > 0 && f != 1 {
		x[infer.CPUPercent] /= f
		x[infer.CPUGrowthRate] /= f
	}
	if f := n.MemoryReferenceFraction; f > 0 && f != 1 {
		x[infer.MemoryPercent] /= f
		x[infer.MemoryGrowthRate] /= f
	}
}

// toSignalFeatures converts a feature vector to the wire form, nil for undefined.
func toSignalFeatures(v *infer.Vector) *signal.Features {
	var p [infer.NumFeatures]*float64
	for i := range v.Values {
		if v.Why[i] == infer.Defined {
			x := v.Values[i]
			p[i] = &x
		}
	}
	return &signal.Features{
		CPUPercent: p[infer.CPUPercent], MemoryPercent: p[infer.MemoryPercent],
		NetworkIOBytesPerSec: p[infer.NetworkIOBytesPerSec], DiskIOBytesPerSec: p[infer.DiskIOBytesPerSec],
		CPUGrowthRate: p[infer.CPUGrowthRate], MemoryGrowthRate: p[infer.MemoryGrowthRate],
	}
}
