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
	"github.com/amf-edge/amf/podsignal"
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

	// runner owns pipe while Run runs: the loop of ticks, pushed ends and
	// probe answers (detect.Runner), the same as node mode's.
	runner  *detect.Runner
	oomWarn string // the last reason the OOM watch could not be set up, logged once
	found   bool   // the runner's first search has been answered (loop goroutine)

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

// Validate says what is wrong with c, if anything: a target (or a way to
// find it) and a model are required, and the model must be computable at
// Interval (detect.FeatureConfig; default 1 s). It is the one check of c's
// values: New makes it, and the command calls it before it starts
// anything.
func (c Config) Validate() error {
	if (c.Source == nil && c.Rediscover == nil) || c.Model == nil {
		return errors.New("sidecar: a target (or a way to find it) and a model are required")
	}
	if _, err := detect.FeatureConfig(c.Model, c.interval()); err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	if st := c.State; st != nil {
		switch {
		case st.Hub == nil:
			return errors.New("sidecar: State.Hub is required to carry the broker's state")
		case st.SnapshotEvery < 0:
			return fmt.Errorf("sidecar: State.SnapshotEvery %v is negative; 0 takes no snapshots", st.SnapshotEvery)
		case st.SnapshotRate < 0:
			return fmt.Errorf("sidecar: State.SnapshotRate %d bytes/s is negative; 0 sets no bound", st.SnapshotRate)
		}
	}
	return nil
}

// interval is Interval, or its default.
func (c Config) interval() time.Duration {
	if c.Interval <= 0 {
		return time.Second
	}
	return c.Interval
}

// New checks cfg (Validate) and builds a sidecar whose feature windows come
// from the model's manifest (detect.FeatureConfig): a model is only valid
// with the windows it was trained with.
func New(cfg Config) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Interval = cfg.interval()
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
	}
	l := loop{s}
	s.runner, err = detect.NewRunner(detect.RunnerConfig{Pipeline: pipe, Interval: cfg.Interval, Finder: l, Sink: l,
		Probe: cfg.Probe, OnProbe: s.probed, ProbeMuted: func() bool { return s.fence.on },
		OnOOM: func(ev cgroup.OOMEvent) {
			cfg.Log.Warn("OOM kill in the broker container", "kills", ev.Kills, "target", fmt.Sprint(s.target))
		}})
	if err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
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
	} else {
		// Said before the first search, so that /status tells why from
		// the start.
		s.targetNotFound(errors.New(cfg.TargetError))
		if e, ok := s.pipe.TargetNotFound(cfg.TargetError); ok {
			loop{s}.Emit(e, nil)
		}
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
	if st.State == podsignal.Unhealthy || st.State == podsignal.Stopping {
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
	s.runState(inner, &wg)

	// The runner stops when ctx ends or the health endpoint stops; then
	// the pipeline is this goroutine's again, to say stopping.
	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	wg.Go(func() {
		select {
		case err := <-httpErr:
			stop(&endpointStopped{err})
		case <-rctx.Done():
		}
	})
	s.runner.Run(rctx)
	if es, ok := errors.AsType[*endpointStopped](context.Cause(rctx)); ok {
		s.shutdown("sidecar stopping: its health endpoint stopped")
		cancel()
		return fmt.Errorf("health endpoint stopped: %w", es.err)
	}
	reason := "sidecar stopping: its context ended"
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		reason = "sidecar " + c.Error() // the cmd's cause: "received SIGINT"
	}
	s.shutdown(reason)
	cancel()
	return nil
}

// endpointStopped is the runner's cause to stop when the health endpoint did.
type endpointStopped struct{ err error }

func (e *endpointStopped) Error() string { return "health endpoint stopped: " + e.err.Error() }

// probed sees every probe result, after the runner took it in.
func (s *Sidecar) probed(ctx context.Context, r healthcheck.Result) {
	s.probe.Report(r)
	s.metrics.ObserveProbe(r)
	if r.OK && s.restarting.Load() {
		s.do(ctx, func() { s.restartAnswered(ctx, &r) })
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

// do hands f to the runner's goroutine, which owns the pipeline.
func (s *Sidecar) do(ctx context.Context, f func()) { s.runner.Do(ctx, f) }

// sampleOnce takes a sample now, on the runner's goroutine.
func (s *Sidecar) sampleOnce(ctx context.Context) { s.runner.Sample(ctx) }

// loop is the sidecar's side of its detect.Runner: where the target comes
// from (Finder) and where the verdicts go (Sink). Its methods run on the
// runner's goroutine.
type loop struct{ s *Sidecar }

// Find returns the configured target the first time, and after that what
// Rediscover finds (a restarted container has a new cgroup), or the same
// target again without it; with its OOM kills pushed where the kernel
// tells them.
func (l loop) Find(ctx context.Context) (*detect.Target, error) {
	s := l.s
	src := s.cfg.Source
	if s.cfg.Rediscover != nil && (src == nil || l.s.found) {
		var err error
		if src, err = s.cfg.Rediscover(ctx); err != nil {
			return nil, err
		}
	}
	s.found = true
	t := &detect.Target{ID: fmt.Sprint(src), Source: src}
	t.OOM, t.Close = l.watchOOM(ctx, src)
	return t, nil
}

// watchOOM watches src's OOM kills, which the runner takes as ends that
// are not final: each makes the pod unhealthy at once (the pipeline's
// Gone) without waiting for the next sample, and the broker is back at the
// first sample at least one interval later that reads the target. Without
// a memory cgroup of its own (process mode), or where the kernel refuses
// the watch (cgroup v1's cgroup.event_control on a read-only mount), the
// kill is seen at the next sample, and the reason is logged once.
func (l loop) watchOOM(ctx context.Context, src detect.Source) (<-chan cgroup.OOMEvent, func()) {
	w, ok := src.(cgroup.Watched)
	if !ok || w.MemoryDir() == "" {
		return nil, nil
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	events, err := cgroup.WatchOOM(wctx, w.MemoryDir())
	if err != nil {
		cancel()
		if err.Error() != l.s.oomWarn {
			l.s.oomWarn = err.Error()
			l.s.cfg.Log.Warn("no OOM notification: an OOM kill is seen at the next sample", "err", err)
		}
		return nil, nil
	}
	return events, cancel
}

// Emit records an emission in the status and publishes its message.
func (l loop) Emit(e detect.Emission, st *detect.Step) {
	l.s.apply(e, st)
	// While the sidecar starts (its target searched for, the first samples
	// awaited) the reason changes without a transition; /status shows the
	// current one.
	if v := e.Verdict; st == nil && !v.Changed && v.State == podsignal.Starting {
		l.s.mu.Lock()
		l.s.status.TransitionReason = v.Reason
		l.s.mu.Unlock()
	}
}

// Target records a search: the target found, or why not (in /status, in
// the log when the reason is new: the runner looks at every sample).
func (l loop) Target(t *detect.Target, err error) {
	s := l.s
	if t == nil {
		s.metrics.Error(ErrorKindTarget)
		s.targetNotFound(err)
		return
	}
	if err != nil {
		s.metrics.Error(ErrorKindSample)
		s.cfg.Log.Warn("cannot tell what bounds the target's memory", "err", err)
	}
	s.target = t.Source
	s.mu.Lock()
	changed := s.status.Target != t.ID || s.status.TargetError != ""
	s.status.Target, s.status.TargetError = t.ID, ""
	s.mu.Unlock()
	if changed {
		s.cfg.Log.Info("target found", "target", t.ID)
	}
}

// targetNotFound records why the target is not found, in /status and in
// the log when the reason is new (the runner looks at every sample).
func (s *Sidecar) targetNotFound(err error) {
	s.mu.Lock()
	changed := s.status.TargetError != err.Error()
	s.status.TargetError = err.Error()
	s.mu.Unlock()
	if changed {
		s.cfg.Log.Warn("broker container not found; looking again at every sample", "err", err)
	}
}

// Sampled counts a tick's sample and keeps what hangs on it: the
// heartbeat, the fence, a restart the sidecar asked for.
func (l loop) Sampled(ctx context.Context, st *detect.Step, took time.Duration) {
	s := l.s
	s.alive.Beat()
	defer s.holdFence()
	defer s.restartAnswered(ctx, nil)
	if st == nil {
		return
	}
	if st.Read {
		s.lastRead = time.Now()
		s.reportMemoryReference(st.MemoryReference)
	}
	switch {
	case errors.Is(st.Err, detect.ErrNoScore):
		s.metrics.Error(ErrorKindModel)
		s.cfg.Log.Error("model returned no score", "model", s.cfg.Model.Source())
	case errors.Is(st.Err, cgroup.ErrGone):
		s.metrics.Error(ErrorKindSample)
	case st.Err != nil:
		s.metrics.Error(ErrorKindSample)
		s.cfg.Log.Warn("sample failed", "err", st.Err)
	default:
		s.metrics.SetScore(st.Score)
		s.metrics.SetFeatures(st.Features)
		s.metrics.ObserveSample(took)
	}
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
	s.metrics.SignalSent(podsignal.Stopping)
}
