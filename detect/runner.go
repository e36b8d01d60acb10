package detect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/healthcheck"
)

// Finder is where a Runner's target comes from: the sidecar's search of its
// pod's cgroups, or node mode's container of the pod status. The Runner
// calls it on its own goroutine when it has no target: at its first tick,
// at every tick until one is found, and at once after the last one ended.
type Finder interface {
	// Find returns the broker's target, or an error that says why there
	// is none (yet).
	Find(ctx context.Context) (*Target, error)
}

// Rechecker is a Finder that learns of its target's end by other means
// than the target's watches (node mode: the pod status names another
// container, whose predecessor's exit may not have been seen when no PID
// of it was visible). At each receive on RunnerConfig.Wake the Runner asks
// it whether the current target is stale.
type Rechecker interface {
	Finder
	// Stale says whether t no longer runs, and why.
	Stale(t *Target) (reason string, stale bool)
}

// Target is one broker found by a Finder, with what is pushed of its end.
type Target struct {
	// ID names it in logs and lets its finder tell it from the next one
	// (node mode: the runtime's container ID).
	ID     string
	Source Source
	// Exit, when set, is told when its process exits: a final end (the
	// runtime may keep its cgroup a moment, but this process is gone), said
	// with ExitReason (nil: "its process exited").
	Exit       <-chan time.Time
	ExitReason func() string
	// OOM, when set, is told each OOM kill in its memory cgroup: an end
	// that is not final (see End).
	OOM <-chan cgroup.OOMEvent
	// Running, when set, says whether its processes still run; nil where
	// they cannot be seen (another PID namespace).
	Running func() bool
	// Close ends its watches; nil when there are none. The Runner calls it
	// once, when it drops the target or stops.
	Close func()
}

// End is an end of a target: pushed by its watches (Target.Exit and OOM),
// or told by its finder's caller (Runner.End).
type End struct {
	Reason string
	// Final: its process exited, it is not read again and the Runner
	// finds the next. Otherwise (an OOM kill, which the runtime follows by
	// a new process, in the same cgroup or a new one) its cgroup, which
	// stays readable for a moment after its processes ended, is read again
	// only once its processes run, or, where they cannot be seen, not
	// before an interval has passed: a reading of the ended container must
	// not be taken for the broker back.
	Final bool
}

// Sink is where a Runner's verdicts go: the sidecar's status, metrics and
// signaller, or node mode's session with the agent's tracker. The Runner
// calls it on its own goroutine.
type Sink interface {
	// Emit takes every emission of the pipeline, in order; st is the
	// sample's step for a sample's verdict, nil for the others.
	Emit(e Emission, st *Step)
	// Target reports a search: a target found (err: what bounds its
	// memory could not be told) or none (t nil, err why).
	Target(t *Target, err error)
	// Sampled reports a tick, or a sample asked for (Runner.Sample): its
	// step, nil when no sample was taken (no target, or a pushed end
	// holds it back), and how long it took.
	Sampled(ctx context.Context, st *Step, took time.Duration)
}

// RunnerConfig wires a Runner. Pipeline, Finder and Sink are required.
type RunnerConfig struct {
	Pipeline *Pipeline
	Interval time.Duration
	Finder   Finder
	Sink     Sink
	// Probe, when set, is the app-logic probe: each change of its answer
	// becomes Pipeline.Probe on the Runner's goroutine.
	Probe healthcheck.Prober
	// OnProbe, when set, sees every probe result after the Runner has
	// taken it in (the prober's goroutine).
	OnProbe func(ctx context.Context, r healthcheck.Result)
	// OnOOM, when set, sees every OOM kill the target's watch reports, on
	// the Runner's goroutine, before it ends the target: the kill is worth
	// a line of its own even when the pod is unhealthy already (the model
	// or the probe saw the climb or the broker's death first), when it
	// changes no state.
	OnOOM func(ev cgroup.OOMEvent)
	// ProbeMuted, when set and true, has a probe result not taken in (the
	// sidecar's fence pauses the broker: its probe fails by design).
	ProbeMuted func() bool
	// Wake, when set, is received from by the Runner: at each receive it
	// ends a target its Finder (a Rechecker) calls stale, as a final end,
	// and looks for a target at once if it has none. It saves its owner a
	// goroutine that would hand the same work in with Do.
	Wake <-chan struct{}
}

// Runner is the loop around one watched broker's Pipeline, the same in the
// sidecar and in node mode: it samples the target on a ticker (finding it
// first), turns a pushed end into Gone at once and holds the next reading
// back until the target runs again, takes the probe's answers in, and runs
// the work handed to it (Do) on its goroutine, which alone touches the
// Pipeline while Run runs.
type Runner struct {
	cfg  RunnerConfig
	work chan func()

	cur *Target
	// pushedAt: a non-final end was pushed for cur at that time, and no
	// reading of it has come since (zero: none).
	pushedAt time.Time
}

// NewRunner checks cfg and returns a Runner that has not started.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Pipeline == nil || cfg.Finder == nil || cfg.Sink == nil {
		return nil, errors.New("runner: a pipeline, a finder and a sink are required")
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("runner: interval %v is not positive", cfg.Interval)
	}
	return &Runner{cfg: cfg, work: make(chan func(), 16)}, nil
}

// Do hands f to the Runner's goroutine and returns once it is queued; f
// is not run if ctx ends first, or once Run has returned.
func (r *Runner) Do(ctx context.Context, f func()) {
	select {
	case r.work <- f:
	case <-ctx.Done():
	}
}

// Target is the current target, nil while there is none. Only on the
// Runner's goroutine (in a Do).
func (r *Runner) Target() *Target { return r.cur }

// Run samples at once and then every interval until ctx ends. The
// Pipeline is the caller's again once it returns (to Stop it, say).
func (r *Runner) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the probe
	defer r.drop()
	if p := r.cfg.Probe; p != nil {
		toPipeline := healthcheck.OnChange(func(res healthcheck.Result) {
			r.Do(ctx, func() {
				if r.cfg.ProbeMuted != nil && r.cfg.ProbeMuted() {
					return
				}
				r.cfg.Sink.Emit(r.cfg.Pipeline.Probe(res.OK, res.Reason), nil)
			})
		})
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			_ = p.Run(ctx, func(res healthcheck.Result) {
				toPipeline(res)
				if r.cfg.OnProbe != nil {
					r.cfg.OnProbe(ctx, res)
				}
			})
		}()
	}
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	r.Sample(ctx)
	for {
		var exit <-chan time.Time
		var oom <-chan cgroup.OOMEvent
		if r.cur != nil {
			exit, oom = r.cur.Exit, r.cur.OOM
		}
		select {
		case <-ctx.Done():
			return
		case f := <-r.work:
			f()
		case <-tick.C:
			r.Sample(ctx)
		case <-r.cfg.Wake:
			r.recheck(ctx)
		case _, ok := <-exit:
			if !ok {
				r.cur.Exit = nil
				continue
			}
			reason := "its process exited"
			if ev, ok := pending(oom); ok {
				// An OOM kill read before the exit and not yet taken is
				// its reason: ExitReason reads the cgroup, which its
				// runtime may have removed by now.
				if r.cfg.OnOOM != nil {
					r.cfg.OnOOM(ev)
				}
				reason = fmt.Sprintf("OOM kill in the broker container (%d so far): its process exited", ev.Kills)
			} else if r.cur.ExitReason != nil {
				reason = r.cur.ExitReason()
			}
			r.End(ctx, End{Reason: reason, Final: true})
		case ev, ok := <-oom:
			if !ok {
				r.cur.OOM = nil
				continue
			}
			if r.cfg.OnOOM != nil {
				r.cfg.OnOOM(ev)
			}
			r.End(ctx, End{Reason: fmt.Sprintf("OOM kill in the broker container (%d so far)", ev.Kills)})
		}
	}
}

// pending takes an OOM event already waiting on oom, if one is; a closed
// or empty channel (or none) has none.
func pending(oom <-chan cgroup.OOMEvent) (cgroup.OOMEvent, bool) {
	select {
	case ev, ok := <-oom:
		return ev, ok
	default:
		return cgroup.OOMEvent{}, false
	}
}

// Sample takes one tick's sample now: the first of a target found anew, or
// of a broker that answers again before the next tick. Only on the
// Runner's goroutine.
func (r *Runner) Sample(ctx context.Context) {
	start := time.Now()
	st := r.sample(ctx)
	if ctx.Err() != nil {
		return
	}
	r.cfg.Sink.Sampled(ctx, st, time.Since(start))
}

func (r *Runner) sample(ctx context.Context) *Step {
	if r.cur != nil && !r.pushedAt.IsZero() && r.cur.Running != nil && !r.cur.Running() {
		r.drop() // a pushed kill ended its processes: the next is looked for now
	}
	if r.cur == nil {
		if r.Find(ctx); r.cur == nil {
			return nil
		}
	}
	if !r.pushedAt.IsZero() && r.cur.Running == nil && time.Since(r.pushedAt) < r.cfg.Interval {
		return nil
	}
	st := r.cfg.Pipeline.Sample(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if st.Read {
		r.pushedAt = time.Time{}
	}
	if st.Back != nil {
		r.cfg.Sink.Emit(*st.Back, nil)
	}
	switch {
	case errors.Is(st.Err, cgroup.ErrGone):
		r.cfg.Sink.Emit(st.Emission, nil)
		r.drop()
		r.Find(ctx)
	case st.Err == nil:
		r.cfg.Sink.Emit(st.Emission, &st)
	}
	return &st
}

// End takes in an end of the current target as if its watches had pushed
// it (node mode: the pod status names another container). Only on the
// Runner's goroutine.
func (r *Runner) End(ctx context.Context, e End) {
	r.cfg.Sink.Emit(r.cfg.Pipeline.Gone(e.Reason), nil)
	if !e.Final {
		r.pushedAt = time.Now()
		return
	}
	r.drop()
	r.Find(ctx)
}

// recheck ends the current target if its Finder calls it stale, and looks
// for one if there is none.
func (r *Runner) recheck(ctx context.Context) {
	if rc, ok := r.cfg.Finder.(Rechecker); ok && r.cur != nil {
		if reason, stale := rc.Stale(r.cur); stale {
			r.End(ctx, End{Reason: reason, Final: true})
			return // End looked for the next
		}
	}
	r.Find(ctx)
}

// Find looks for the target when there is none. Only on the Runner's
// goroutine.
func (r *Runner) Find(ctx context.Context) {
	if r.cur != nil {
		return
	}
	t, err := r.cfg.Finder.Find(ctx)
	if err != nil {
		if e, ok := r.cfg.Pipeline.TargetNotFound(err.Error()); ok {
			r.cfg.Sink.Emit(e, nil)
		}
		r.cfg.Sink.Target(nil, err)
		return
	}
	r.cur = t
	e, err := r.cfg.Pipeline.SetTarget(t.Source)
	r.cfg.Sink.Emit(e, nil)
	r.cfg.Sink.Target(t, err)
}

// Refind drops the current target and looks for the next one now, with
// nothing said of the one dropped: for a caller that ended it itself (the
// sidecar restarting the broker on a handed-over state), whose cgroup may
// still read for a moment. Only on the Runner's goroutine.
func (r *Runner) Refind(ctx context.Context) {
	r.drop()
	r.Find(ctx)
}

// drop ends the current target's watches; the next sample finds another.
func (r *Runner) drop() {
	if r.cur != nil && r.cur.Close != nil {
		r.cur.Close()
	}
	r.cur, r.pushedAt = nil, time.Time{}
}
