package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/signal"
)

// Error kinds the sidecar counts in amf_errors_total, beside healthcheck's own.
const (
	ErrorKindSample = "sample"
	ErrorKindModel  = "model"
	ErrorKindSignal = "signal"
	// ErrorKindTarget counts failed searches for the broker container.
	ErrorKindTarget = "target"
	// ErrorKindState counts failures to carry the broker's state (state.go).
	ErrorKindState = "state"
)

// Config wires a sidecar. Model is required, and Source or Rediscover; Probe,
// Signaller and HTTPAddr are optional (a sidecar without a signaller only
// serves its endpoint).
type Config struct {
	// Source is the target; nil when it has not been found yet (then
	// Rediscover is required).
	Source detect.Source
	// Rediscover, when set, finds the target: at every sample until it is
	// found, and again after it vanished (a restarted container has a new
	// cgroup); without it the same Source is retried.
	Rediscover func(context.Context) (detect.Source, error)
	// TargetError says why the target has not been found, when Source is nil.
	TargetError string
	// MemoryReference, when set, is memory_percent's reference for a target
	// without a memory limit of its own, instead of what bounds it (see
	// detect.Pipeline.SetTarget). A target's own limit always wins: it is the
	// model's definition, and what OOM-kills the broker.
	MemoryReference *cgroup.MemoryReference
	Interval        time.Duration
	Model           *model.Model
	// ModelWarning is shown in /status and logged at start when the model in use
	// is a fallback (an override that failed to load).
	ModelWarning string
	Probe        healthcheck.Prober
	// Publisher sends the signals; nil sends none. *Signaller is the real
	// one (MQTT to the node agent), Recorder a fake.
	Publisher Publisher
	HTTPAddr  string
	Metrics   *healthcheck.Metrics
	Log       *slog.Logger
	// State, when set, carries the broker's state across a switchover
	// (state.go); nil: the broker's state stays where it is.
	State *StateConfig
}

// RefOneCore is cpu_percent's reference source (memory's are cgroup's and
// detect's).
const RefOneCore = "one_core"

// cpuReference is what cpu_percent is relative to, always: the model's
// feature is rate(cpu seconds) × 100, a percentage of one core, as in the
// paper's PromQL and in the training data of CPU-limited brokers. A CPU limit
// (or none) does not change it: dividing by the limit would give the model a
// feature it was not trained on. Without a limit a broker can exceed 100.
var cpuReference = healthcheck.Reference{Value: 1, Unit: "cores", Source: RefOneCore,
	Why: "cpu_percent is rate(CPU seconds) × 100, per core, as the model was trained; a CPU limit, or none, does not change it"}

// Sidecar runs one detect.Pipeline on a ticker, serves its health over HTTP
// and hands its signals to the Publisher.
type Sidecar struct {
	cfg Config
	// pipe is the pod's detection; memRef the memory reference last
	// reported (the loop goroutine owns both).
	pipe    *detect.Pipeline
	memRef  cgroup.MemoryReference
	probe   *healthcheck.ProbeState
	alive   *healthcheck.Heartbeat
	metrics *healthcheck.Metrics

	events chan func() // work for the loop goroutine, which owns pipe

	// The target's OOM notification (cgroup.WatchOOM), owned by the loop
	// goroutine: stopOOM ends the current watch; after a pushed OOM kill no
	// sample is taken until holdGone, so an ended container's cgroup, which
	// stays readable for a moment, is not read as the broker back.
	stopOOM  context.CancelFunc
	holdGone time.Time
	oomWarn  string // the last reason the watch could not be set up, logged once

	target   detect.Source // the current target, owned by the loop goroutine
	lastRead time.Time     // when a sample last read the target, idem
	// restart is a broker restart this sidecar asked for (state.go), owned
	// by the loop goroutine; restarting mirrors it for the probe's.
	restart    *restart
	restarting atomic.Bool
	fence      fence // the node agent's fence, owned by the loop goroutine

	mu     sync.Mutex // guards status
	status healthcheck.Status
}

// New checks cfg and builds a sidecar whose feature windows come from the model's
// manifest (detect.FeatureConfig): a model is only valid with the windows it was
// trained with.
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
	pipe, err := detect.NewPipeline(detect.PipelineConfig{Model: cfg.Model, Interval: cfg.Interval,
		MemoryReference: cfg.MemoryReference, NeedProbe: cfg.Probe != nil, Log: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	var probeState *healthcheck.ProbeState
	if cfg.Probe != nil {
		probeState = healthcheck.NewProbeState(0)
	}
	s := &Sidecar{
		cfg:     cfg,
		pipe:    pipe,
		probe:   probeState,
		alive:   healthcheck.NewHeartbeat(5*cfg.Interval + time.Second),
		metrics: cfg.Metrics,
		events:  make(chan func(), 16),
	}
	state, reason := s.pipe.State()
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
		s.setTarget(cfg.Source)
	} else {
		s.targetNotFound(errors.New(cfg.TargetError))
	}
	s.metrics.SetState(state)
	return s, nil
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

	// The endpoint is bound before anything else starts: the kubelet's
	// readiness gate and the app's reports need it, so a sidecar that cannot
	// serve it stops with the reason (the kubelet restarts it) instead of
	// running on without one.
	httpErr := make(chan error, 1)
	if s.cfg.HTTPAddr != "" {
		srv, err := healthcheck.NewServer(s.serverConfig())
		if err != nil {
			return err
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", s.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("health endpoint: %w (another process holds the address: free it, or give the sidecar another --http)", err)
		}
		s.cfg.Log.Info("health endpoint serving", "addr", ln.Addr().String())
		wg.Go(func() {
			if err := srv.Serve(inner, ln); err != nil {
				httpErr <- err
			}
		})
	}
	if s.cfg.Publisher != nil {
		wg.Go(func() { _ = s.cfg.Publisher.Run(inner) })
	}
	if c, ok := s.cfg.Publisher.(Commanded); ok {
		wg.Go(func() {
			for {
				select {
				case <-inner.Done():
					return
				case cmd := <-c.Commands():
					s.do(inner, func() { s.command(cmd) })
				}
			}
		})
	}
	if s.cfg.Probe != nil {
		toMachine := healthcheck.OnChange(func(r healthcheck.Result) {
			s.do(inner, func() {
				if s.fence.on {
					return // the fence paused the broker: its probe fails by design
				}
				s.apply(s.pipe.Probe(r.OK, r.Reason), nil)
			})
		})
		wg.Go(func() {
			_ = s.cfg.Probe.Run(inner, func(r healthcheck.Result) {
				s.probe.Report(r)
				s.metrics.ObserveProbe(r)
				toMachine(r)
				if r.OK && s.restarting.Load() {
					s.do(inner, func() { s.restartAnswered(inner, &r) })
				}
			})
		})
	}

	s.runState(inner, &wg)
	if s.pipe.HasTarget() {
		s.watchOOM(inner, s.cfg.Source)
	}
	defer func() {
		if s.stopOOM != nil {
			s.stopOOM()
		}
	}()
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	s.sampleOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			reason := "sidecar stopping: its context ended"
			if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
				reason = "sidecar " + c.Error() // the cmd's cause: "received SIGINT"
			}
			s.shutdown(reason)
			cancel()
			return nil
		case err := <-httpErr:
			s.shutdown("sidecar stopping: its health endpoint stopped")
			cancel()
			return fmt.Errorf("health endpoint stopped: %w", err)
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
	w := spec.Windows.Format() // what the engine was built with (detect.FeatureConfig), as the manifest writes it
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

// watchOOM watches src's memory cgroup for OOM kills, instead of any
// earlier target's. Each kill makes the pod unhealthy at once (the pipeline's
// Gone), without waiting for the next sample; the broker is back at the
// first sample at least one interval later that reads the target. Without
// a memory cgroup of its own (process mode), or where the kernel refuses the
// watch (cgroup v1's cgroup.event_control on a read-only mount), the kill is
// seen at the next sample, as before, and the reason is logged once.
func (s *Sidecar) watchOOM(ctx context.Context, src detect.Source) {
	if s.stopOOM != nil {
		s.stopOOM()
		s.stopOOM = nil
	}
	w, ok := src.(cgroup.Watched)
	if !ok || w.MemoryDir() == "" {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	events, err := cgroup.WatchOOM(wctx, w.MemoryDir())
	if err != nil {
		cancel()
		if err.Error() != s.oomWarn {
			s.oomWarn = err.Error()
			s.cfg.Log.Warn("no OOM notification: an OOM kill is seen at the next sample", "err", err)
		}
		return
	}
	s.stopOOM = cancel
	go func() {
		for ev := range events {
			s.do(wctx, func() {
				if wctx.Err() != nil {
					return // the target changed meanwhile
				}
				s.holdGone = time.Now().Add(s.cfg.Interval)
				s.apply(s.pipe.Gone(fmt.Sprintf("OOM kill in the broker container (%d so far)", ev.Kills)), nil)
			})
		}
	}()
}

func (s *Sidecar) sampleOnce(ctx context.Context) {
	start := time.Now()
	s.alive.Beat()
	defer s.holdFence()
	defer s.restartAnswered(ctx, nil)
	if time.Now().Before(s.holdGone) {
		return
	}
	if !s.pipe.HasTarget() && !s.rediscover(ctx) {
		return
	}
	st := s.pipe.Sample(ctx)
	if ctx.Err() != nil {
		return
	}
	if st.Back != nil {
		s.apply(*st.Back, nil) // it is back
	}
	if st.Read {
		s.lastRead = time.Now()
		s.reportMemoryReference(st.MemoryReference)
	}
	switch {
	case errors.Is(st.Err, detect.ErrNoScore):
		s.metrics.Error(ErrorKindModel)
		s.cfg.Log.Error("model returned no score", "model", s.cfg.Model.Source())
		return
	case errors.Is(st.Err, cgroup.ErrGone):
		s.metrics.Error(ErrorKindSample)
		s.apply(st.Emission, nil)
		if s.stopOOM != nil {
			s.stopOOM()
			s.stopOOM = nil
		}
		s.rediscover(ctx)
		return
	case st.Err != nil:
		s.metrics.Error(ErrorKindSample)
		s.cfg.Log.Warn("sample failed", "err", st.Err)
		return
	}
	s.metrics.SetScore(st.Score)
	s.metrics.SetFeatures(st.Features)
	s.apply(st.Emission, &st)
	s.metrics.ObserveSample(time.Since(start))
}

// rediscover looks for the target (again, after it vanished) and reports
// whether it found it.
func (s *Sidecar) rediscover(ctx context.Context) bool {
	if s.cfg.Rediscover == nil {
		return s.pipe.HasTarget()
	}
	src, err := s.cfg.Rediscover(ctx)
	if err != nil {
		s.metrics.Error(ErrorKindTarget)
		s.targetNotFound(err)
		return false
	}
	e := s.setTarget(src)
	s.watchOOM(context.WithoutCancel(ctx), src)
	s.mu.Lock()
	s.status.Target, s.status.TargetError = fmt.Sprint(src), ""
	s.mu.Unlock()
	s.noteTargetSearch(e)
	s.cfg.Log.Info("target found", "target", fmt.Sprint(src))
	return true
}

// setTarget hands src to the pipeline, which finds memory_percent's
// reference for its readings without a limit.
func (s *Sidecar) setTarget(src detect.Source) detect.Emission {
	s.target = src
	e, err := s.pipe.SetTarget(src)
	if err != nil {
		s.metrics.Error(ErrorKindSample)
		s.cfg.Log.Warn("cannot tell what bounds the target's memory", "err", err)
	}
	return e
}

// reportMemoryReference says, when it changes, what the latest reading's
// memory_percent was relative to: the container's limit when the reading
// has one, else the fallback. A broker without a limit is worth a warning:
// its memory alarms come only near a limit it shares, or never.
func (s *Sidecar) reportMemoryReference(r cgroup.MemoryReference) {
	if r == s.memRef {
		return
	}
	s.memRef = r
	ref := healthcheck.Reference{Value: r.Bytes, Unit: "bytes", Source: r.Source, Why: r.Why}
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
func (s *Sidecar) noteTargetSearch(e detect.Emission) {
	s.apply(e, nil)
	if v := e.Verdict; !v.Changed && v.State == signal.Starting {
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
	if e, ok := s.pipe.TargetNotFound(err.Error()); ok {
		s.noteTargetSearch(e)
	}
	if changed {
		s.cfg.Log.Warn("broker container not found; looking again at every sample", "err", err)
	}
}

// apply records an emission in the status (with the sample's score when st
// is set) and publishes its message when it has one.
func (s *Sidecar) apply(e detect.Emission, st *detect.Step) {
	v := e.Verdict
	s.mu.Lock()
	if st != nil {
		p := st.Score
		s.status.Score, s.status.Features, s.status.Explanation = &p, st.Features, st.Explanation
	}
	if v.Changed {
		s.status.State, s.status.TransitionReason, s.status.LastTransition = v.State, v.Reason, time.Now()
	}
	if e.Message != nil {
		s.status.Seq = e.Message.Seq
	}
	s.mu.Unlock()

	if v.Changed {
		s.metrics.SetState(v.State)
		s.cfg.Log.Info("health transition", "state", v.State, "reason", v.Reason)
	}
	if e.Message != nil && s.cfg.Publisher != nil {
		if err := s.cfg.Publisher.Publish(*e.Message); err != nil {
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
		e, err := s.pipe.App(r.State, r.Reason)
		switch {
		case errors.Is(err, detect.ErrStopping):
			errc <- fmt.Errorf("%w: %w", healthcheck.ErrConflict, err)
			return
		case err != nil:
			errc <- fmt.Errorf("%w: %v", healthcheck.ErrInvalidReport, err)
			return
		}
		s.apply(e, nil)
		errc <- nil
	})
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Sidecar) shutdown(reason string) {
	e := s.pipe.Stop(reason)
	s.apply(detect.Emission{Verdict: e.Verdict}, nil) // status only
	if s.cfg.Publisher == nil {
		return
	}
	if err := s.cfg.Publisher.Close(*e.Message, 2*time.Second); err != nil {
		s.cfg.Log.Warn("stopping state not acknowledged by the node agent", "err", err)
		return
	}
	s.metrics.SignalSent(signal.Stopping)
}
