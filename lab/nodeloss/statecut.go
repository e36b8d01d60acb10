package nodeloss

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/amf-edge/amf/lab/brokerstate"
)

// StateCutConfig configures RunStateCut.
type StateCutConfig struct {
	Repo    string // the AMF module, for the images
	WorkDir string // the control plane's files
	Plan    brokerstate.Plan
	// Phase is how long after the primary's snapshot of the whole plan was
	// taken in (and relayed, when an agent says so within 10 s) the power
	// is cut: late in the sidecar's snapshot interval is the worst phase.
	Phase    time.Duration
	Progress io.Writer
	Log      func(format string, args ...any)
}

// StateCut is what the new primary held after the power cut of the
// primary's node.
type StateCut struct {
	Result brokerstate.Result
	// Back is from the cut to the new primary's pod Ready.
	Back time.Duration
	// RetainedAge is how much older than the cut the new primary's
	// retained set is (a brokerstate.Clock published to the primary every
	// 100 ms up to the cut); -1: the clock was not carried.
	RetainedAge time.Duration
	// Carried is the agent's StateCarried line; NotCarried its line when
	// it gave the state up.
	Carried, NotCarried string
}

// RunStateCut starts a control plane, three lab nodes and the agent
// DaemonSet (StartStateRig), a stateful pair with its primary on node 0 and
// its standby on node 1, seeded with cfg.Plan, and cuts node 0's power
// cfg.Phase after a snapshot of the whole plan was taken in: the guard on
// node 1 must fail over onto the snapshot relayed before the cut.
func RunStateCut(ctx context.Context, cfg StateCutConfig) (_ StateCut, err error) {
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) }
	cp, cl, stop, err := LaunchCluster(ctx, cfg.Repo, filepath.Join(cfg.WorkDir, "cp-nodeloss"), say, cfg.Log)
	if err != nil {
		return StateCut{}, err
	}
	defer stop()
	rig, err := StartStateRig(ctx, cp, cl, cfg.Repo)
	if err != nil {
		return StateCut{}, err
	}
	defer rig.Stop()
	p, err := rig.StartStatePair(ctx, "state-nodeloss", "broker", cfg.Plan)
	if err != nil {
		return StateCut{}, err
	}
	node := rig.Nodes[0]
	defer func() {
		// The cut node back first, so that its pods can go with the
		// namespace.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer rcancel()
		if rerr := node.Restore(rctx); rerr != nil {
			cfg.Log("nodeloss: restoring %s: %v", node.Name, rerr)
		}
		if cerr := p.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := p.WaitGuarded(ctx); err != nil {
		return StateCut{}, err
	}
	type readyAt struct {
		at  time.Time
		err error
	}
	served := make(chan readyAt, 1)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() {
		at, err := p.AwaitServing(sctx)
		served <- readyAt{at, err}
	}()
	clock, err := p.StartClock(ctx)
	if err != nil {
		return StateCut{}, err
	}
	snap, err := p.AwaitClockSnapshotLine(ctx)
	if err != nil {
		clock.Stop()
		return StateCut{}, err
	}
	if _, by, ok := p.AwaitRelayed(ctx, snap, 10*time.Second); ok {
		say("the snapshot relayed by the agent on %s", by)
	}
	// A phase of the snapshot interval, not a wait for anything.
	if wait := cfg.Phase - time.Since(snap.Time); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			clock.Stop()
			return StateCut{}, ctx.Err()
		}
	}
	say("cutting the power of %s", node.Name)
	cut, err := node.PowerCut(ctx)
	clock.Stop()
	if err != nil {
		return StateCut{}, err
	}
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Minute)
	h, err := p.Handover(hctx)
	hcancel()
	if err != nil {
		return StateCut{}, err
	}
	ready := <-served
	if ready.err != nil {
		return StateCut{}, ready.err
	}
	res := StateCut{Back: ready.at.Sub(cut.At), Carried: h.Line, NotCarried: h.NotCarried, RetainedAge: -1}
	at, ok, err := p.ReadClock(ctx)
	if err != nil {
		return res, fmt.Errorf("the retained clock: %w", err)
	}
	if ok {
		res.RetainedAge = cut.At.Sub(at)
	}
	kctx, kcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer kcancel()
	res.Result, err = p.Check(kctx)
	return res, err
}
