package detect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/podsignal"
)

// Reference sources beside cgroup's (RefContainerLimit, RefParentLimit,
// RefMachineMemory): the operator's (PipelineConfig.MemoryReference) and one
// assumed when the source cannot tell.
const (
	RefFlag    = "flag"
	RefAssumed = "assumed"
)

// ErrStopping refuses an application's report once the pipeline stopped.
var ErrStopping = errors.New("the sidecar is stopping")

// PipelineConfig sets up one pod's pipeline. Model is required.
type PipelineConfig struct {
	Model *model.Model
	// Interval is the sampling period; the model's windows must allow it
	// (FeatureConfig).
	Interval time.Duration
	// Source is the target; nil until it is found (SetTarget).
	Source Source
	// MemoryReference, when set, is memory_percent's reference for a target
	// without a memory limit of its own, instead of what bounds it. A
	// target's own limit always wins: it is the model's definition, and what
	// OOM-kills the broker.
	MemoryReference *cgroup.MemoryReference
	// NeedProbe says an app-logic probe runs and must pass before healthy.
	NeedProbe bool
	Log       *slog.Logger
}

// Emission is a verdict and, when it must be sent, its signal.
type Emission struct {
	Verdict Verdict
	Message *podsignal.Message // nil: nothing to send
}

// Step is what one sample gave.
type Step struct {
	// Back is the verdict of the target coming back after it vanished, which
	// comes before the sample's own; nil otherwise.
	Back *Emission
	Emission
	// Read is true when the target was read: MemoryReference is then set.
	Read bool
	// Scored is true when the sample was scored: Score and Features are then
	// set.
	Scored   bool
	Score    float64
	Features *podsignal.Features
	// Explanation says what drove an anomalous score (model.Model.Why):
	// the top features, or predict_linear's time to the limit; "" for a
	// score below the threshold.
	Explanation string
	// MemoryReference is what this reading's memory_percent is relative to.
	MemoryReference cgroup.MemoryReference
	// Err is why the sample gave no score: errors.Is cgroup.ErrGone when the
	// target vanished (Emission says so), ErrNoScore when the model gave none,
	// else the source's error.
	Err error
}

// ErrNoScore: the model returned no probability for a sample.
var ErrNoScore = errors.New("model returned no score")

// Pipeline is one pod's detection: sample → features (the manifest's
// windows) → normalisation → score → state machine → signal message. It is
// not safe for concurrent use; its owner serialises calls.
type Pipeline struct {
	model   *model.Model
	sampler *Sampler
	machine *Machine
	memFlag *cgroup.MemoryReference
	// memFallback is memory_percent's reference for readings without a
	// limit, found when the target was set.
	memFallback cgroup.MemoryReference

	seq      uint64
	score    *float64            // the last score, sent with every message
	features *podsignal.Features // the last features, idem
	why      string              // the last score's explanation, idem ("" below the threshold)
	handover string              // the state the sidecar last restarted the broker on (Restart)
	limit    *float64            // the container's memory limit at the last score; nil without one
	slope    *float64            // the memory's current slope at the last score (infer.Vector.MemorySlope); nil when undefined
}

// NewPipeline checks cfg and builds a pipeline whose feature windows come
// from the model's manifest (FeatureConfig).
func NewPipeline(cfg PipelineConfig) (*Pipeline, error) {
	if cfg.Model == nil {
		return nil, errors.New("detect: a model is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	fc, err := FeatureConfig(cfg.Model, cfg.Interval)
	if err != nil {
		return nil, err
	}
	sampler, err := NewSampler(nil, fc, cfg.Log)
	if err != nil {
		return nil, err
	}
	p := &Pipeline{
		model:   cfg.Model,
		sampler: sampler,
		machine: NewMachine(cfg.Model.Threshold(), cfg.NeedProbe),
		memFlag: cfg.MemoryReference,
	}
	if cfg.Source != nil {
		// The verdict is "still starting": nothing to send yet.
		if _, err := p.SetTarget(cfg.Source); err != nil {
			cfg.Log.Warn("cannot tell what bounds the target's memory", "err", err)
		}
	}
	return p, nil
}

// Model is the model the pipeline scores with.
func (p *Pipeline) Model() *model.Model { return p.model }

// State is the current state and why.
func (p *Pipeline) State() (podsignal.State, string) { return p.machine.State() }

// HasTarget reports whether the target has been found.
func (p *Pipeline) HasTarget() bool { return p.sampler.HasSource() }

// MemoryFallback is memory_percent's reference for readings without a
// memory limit of their own.
func (p *Pipeline) MemoryFallback() cgroup.MemoryReference { return p.memFallback }

// SetTarget makes src the target and finds memory_percent's reference for
// its readings without a limit: PipelineConfig.MemoryReference, else what
// bounds src (the nearest limited cgroup above it, else the machine's
// memory: see cgroup.MemoryReference), else, for a source that cannot tell
// or when that fails (the error, which is not fatal),
// infer.DefaultMemoryReference, said to be assumed.
func (p *Pipeline) SetTarget(src Source) (Emission, error) {
	p.sampler.SetSource(src)
	ref := cgroup.MemoryReference{Bytes: infer.DefaultMemoryReference, Source: RefAssumed,
		Why: "no memory limit on the target and nothing known above it: the paper testbed's 100 MiB limit, assumed"}
	var err error
	switch bounded, ok := src.(interface {
		MemoryReference() (cgroup.MemoryReference, error)
	}); {
	case p.memFlag != nil:
		ref = *p.memFlag
	case ok:
		r, rerr := bounded.MemoryReference()
		if rerr != nil {
			err = fmt.Errorf("what bounds the target's memory: %w", rerr)
			ref.Why += " (" + rerr.Error() + ")"
			break
		}
		ref = r
	}
	p.memFallback = ref
	p.sampler.SetMemoryReference(ref.Bytes)
	return p.emit(p.machine.TargetNotFound(""), time.Time{}), err
}

// TargetNotFound records why the target is not found (while it has not
// been: a target found and lost again is Step's business).
func (p *Pipeline) TargetNotFound(reason string) (Emission, bool) {
	if p.sampler.HasSource() {
		return Emission{}, false
	}
	return p.emit(p.machine.TargetNotFound(reason), time.Time{}), true
}

// Sample reads the target once and takes the reading through the pipeline.
// The target must have been set. A ctx that ends while reading gives a zero
// Step with Err = ctx.Err().
func (p *Pipeline) Sample(ctx context.Context) Step {
	rec, err := p.sampler.Sample(ctx)
	if ctx.Err() != nil {
		return Step{Err: ctx.Err()}
	}
	if err != nil {
		if errors.Is(err, cgroup.ErrGone) {
			return Step{Emission: p.emit(p.machine.TargetGone("broker container gone: "+err.Error()), time.Time{}), Err: err}
		}
		return Step{Err: err}
	}
	st := Step{Read: true}
	if p.machine.Gone() {
		back := p.emit(p.machine.TargetGone(""), time.Time{})
		st.Back = &back
	}
	st.MemoryReference = p.memFallback
	if limit := rec.Stats.MemoryLimitBytes; limit > 0 {
		st.MemoryReference = cgroup.MemoryReference{Bytes: limit, Source: cgroup.RefContainerLimit, Why: "the container's memory limit"}
		if p.memFallback.Source == cgroup.RefContainerLimit {
			st.MemoryReference.Why = p.memFallback.Why // names the cgroup
		}
	}
	x := rec.Features.Values
	Normalise(&x, p.model.Normalisation())
	proj := rec.Features.Projection
	score := p.model.ScoreSample(&x, proj.MemoryPercent)
	if math.IsNaN(score) {
		st.Err = ErrNoScore
		return st
	}
	st.Scored, st.Score, st.Features = true, score, SignalFeatures(&rec.Features)
	if p.model.Anomalous(score) {
		st.Explanation = p.model.Why(&x, proj.MemoryPercent, proj.PercentPerSecond)
	}
	last := score
	p.score, p.features, p.why = &last, st.Features, podsignal.ShortExplanation(st.Explanation)
	p.limit, p.slope = nil, nil
	if v := rec.Features.MemorySlope; !math.IsNaN(v) {
		p.slope = &v
	}
	if limit := rec.Stats.MemoryLimitBytes; limit > 0 && !math.IsInf(limit, 0) {
		p.limit = &limit
	}
	st.Emission = p.emit(p.machine.Score(score), rec.Stats.Time)
	return st
}

// Gone records that the target ended, as a push notification told (the
// broker process's exit, an OOM kill in its container) before a sample
// could see it: the pod is unhealthy at once. The next sample that reads a
// target says it is back (Step.Back), so a caller whose old target may stay
// readable after the end (an exited container's cgroup, until the runtime
// removes it) sets a new target first.
func (p *Pipeline) Gone(reason string) Emission {
	return p.emit(p.machine.TargetGone(reason), time.Time{})
}

// Restart records that the sidecar restarted the broker on the handed-over
// state id (Machine.Restart): starting until Restarted, and every message
// from now on names id (podsignal.Message.Handover).
func (p *Pipeline) Restart(reason, id string) Emission {
	p.handover = id
	return p.emit(p.machine.Restart(reason), time.Time{})
}

// Restarted records that the broker restarted by Restart answers again.
func (p *Pipeline) Restarted() Emission {
	return p.emit(p.machine.Restart(""), time.Time{})
}

// Vanished reports whether the target is recorded as gone (Machine.Gone).
func (p *Pipeline) Vanished() bool { return p.machine.Gone() }

// Probe records an app-logic probe result.
func (p *Pipeline) Probe(ok bool, reason string) Emission {
	return p.emit(p.machine.Probe(ok, reason), time.Time{})
}

// App records a health report from the application beside the broker.
func (p *Pipeline) App(state podsignal.State, reason string) (Emission, error) {
	if st, _ := p.machine.State(); st == podsignal.Stopping {
		return Emission{}, ErrStopping
	}
	v, err := p.machine.App(state, reason)
	if err != nil {
		return Emission{}, err
	}
	return p.emit(v, time.Time{}), nil
}

// Stop moves to stopping for good. Its verdict is for the status only; the
// message is the last one to send (as the signaller's Close), always set.
func (p *Pipeline) Stop(reason string) Emission {
	v := p.machine.Stop(reason)
	msg := p.message(v, time.Time{})
	v.Publish = false
	return Emission{Verdict: v, Message: msg}
}

// emit turns a verdict into an emission, with a message when it must be
// sent. at is the sample's time; zero means now.
func (p *Pipeline) emit(v Verdict, at time.Time) Emission {
	e := Emission{Verdict: v}
	if v.Publish {
		e.Message = p.message(v, at)
	}
	return e
}

func (p *Pipeline) message(v Verdict, at time.Time) *podsignal.Message {
	if at.IsZero() {
		at = time.Now()
	}
	p.seq++
	return &podsignal.Message{State: v.State, Reason: podsignal.ShortReason(v.Reason), Seq: p.seq, Time: at,
		Probability: p.score, Features: p.features, Explanation: p.why, MemoryLimitBytes: p.limit,
		MemorySlopeBytesPerSecond: p.slope, Handover: p.handover}
}
