package liveness

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Run heartbeats, answers probes, guards and fences until ctx ends; a
// failed probe listener or heartbeat ends it with the error. Each role is a
// method of run below; this loop only hands them the actuator's guards.
func (l *Peer) Run(ctx context.Context, act Failover) error {
	r := &run{Peer: l, act: act, t: l.timing, sights: NewSights(), guardAddrs: map[string]string{}, stopGuard: func() {}}
	defer r.wg.Wait() // after cancel (deferred later, so run first)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	r.wg.Go(func() { errs <- ServeProbes(ctx, l.ln, r.vouches) })
	r.wg.Go(func() { errs <- r.heartbeat().Run(ctx) })
	r.wg.Go(func() { r.fence(ctx) })
	defer func() { r.stopGuard() }()

	resolve := time.NewTicker(10 * r.t.Period) // addresses not read yet are read again
	defer resolve.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			if ctx.Err() != nil {
				return nil
			}
			return err
		case <-resolve.C:
			r.readAddrs(ctx)
		case g := <-l.guards:
			if !slices.Equal(g.guard, r.guarding) {
				r.guard(ctx, g.guard)
			}
			if !slices.Equal(g.guardedBy, r.guardedBy) {
				r.setGuardedBy(ctx, g.guardedBy)
			}
		}
	}
}

// run is one Run's state, shared by its roles.
type run struct {
	*Peer
	act Failover
	t   Timing
	wg  sync.WaitGroup
	// sights are the guard's sights of the nodes it guards: its probe
	// answers vouch for their agents by them (an agent its guard cannot
	// see must fence).
	sights *Sights

	// Of the loop goroutine only: the nodes guarded, the guard that
	// watches them, the nodes that guard this one.
	guarding  []string
	stopGuard func()
	guardedBy []string

	mu sync.Mutex // guards the rest
	// fencer is nil while nothing guards this node: nobody would take
	// over, so nothing to fence. It checks fenceGuards, whose probe
	// addresses are guardAddrs.
	fencer      *Fencer
	fenceGuards []string
	guardAddrs  map[string]string
	failing     bool // the last renewal failed
	// The fence carried out: fences counts them, settled is the count the
	// last successful Lift settled (a fence during a Lift is not); liftDue
	// once a renewal succeeded after an unsettled fence; lifting while a
	// Lift runs.
	fences, settled  int
	liftDue, lifting bool
}

// vouches answers a peer's probe: whether this guard sees node.
func (r *run) vouches(node string) bool { return r.sights.Vouches(node, time.Now(), r.t.Vouch()) }

// heartbeat is this node's Lease renewal; each renewal tells the fencer,
// and makes a lift due after an unsettled fence.
func (r *run) heartbeat() *Heartbeat {
	return &Heartbeat{Cluster: r.cluster, Namespace: r.namespace, Node: r.node, Timing: r.t, ProbeAddr: r.advertise,
		OnRenew: func(sent time.Time) {
			r.mu.Lock()
			if r.fencer != nil {
				r.fencer.Renewed(sent)
			}
			if r.fences > r.settled {
				r.liftDue = true
			}
			was := r.failing
			r.failing = false
			r.mu.Unlock()
			if was {
				r.log.Info("lease renewed again", slog.String("lease", LeaseName(r.node)))
			}
		},
		OnError: func(err error) {
			r.renewFailed.Inc()
			r.mu.Lock()
			first := !r.failing
			r.failing = true
			r.mu.Unlock()
			if first {
				r.log.Warn("lease not renewed", slog.String("lease", LeaseName(r.node)), slog.String("error", err.Error()))
			}
		},
	}
}

// fence is the fencer: its probes of the guards every period, its check
// five times a period.
func (r *run) fence(ctx context.Context) {
	probeTick := time.NewTicker(r.t.Period)
	defer probeTick.Stop()
	checkTick := time.NewTicker(r.t.Period / 5)
	defer checkTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-checkTick.C:
			r.checkFence(ctx, now)
		case <-probeTick.C:
			r.probeGuards(ctx)
		}
	}
}

// checkFence fences when the rule says this node is cut off, and starts a
// lift when one is due.
func (r *run) checkFence(ctx context.Context, now time.Time) {
	r.mu.Lock()
	var silent []string
	if r.fencer != nil {
		silent = r.fencer.Silent(now, r.fenceGuards)
	}
	r.mu.Unlock()
	if len(silent) > 0 {
		r.fenced.Inc()
		const why = "no Lease renewal and no guard vouching for this node: a guard may be taking over its hot primaries"
		r.log.Error("fence", slog.String("node", r.node), slog.Any("guards", silent), slog.Duration("cut_off_for", r.t.Fence), slog.String("why", why))
		r.act.Fence(ctx, why, silent)
		r.mu.Lock()
		r.liftDue = false
		r.fences++
		r.mu.Unlock()
	}
	r.mu.Lock()
	lift := r.liftDue && !r.lifting
	r.lifting = r.lifting || lift
	gen := r.fences
	r.mu.Unlock()
	if lift {
		r.wg.Go(func() { r.lift(ctx, gen) }) // off the check's goroutine: Lift reads the API server
	}
}

// lift resumes the fenced primaries still primary; the fence of generation
// gen is settled once Lift leaves none and no fence came meanwhile.
func (r *run) lift(ctx context.Context, gen int) {
	n := r.act.Lift(ctx)
	if n > 0 {
		select { // read again a period later, not a synchronisation
		case <-time.After(r.t.Period):
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	r.lifting = false
	done := n == 0 && gen == r.fences
	if done {
		r.settled, r.liftDue = gen, false
	}
	r.mu.Unlock()
	if done {
		r.log.Info("fence settled", slog.String("node", r.node))
	}
}

// probeGuards asks each guard whose address is known whether it vouches
// for this node, and tells the fencer when it does.
func (r *run) probeGuards(ctx context.Context) {
	r.mu.Lock()
	addrs := make(map[string]string, len(r.guardAddrs))
	for n, a := range r.guardAddrs {
		if a != "" {
			addrs[n] = a
		}
	}
	r.mu.Unlock()
	for n, a := range addrs {
		r.wg.Go(func() {
			sent := time.Now()
			pctx, pcancel := context.WithTimeout(ctx, r.t.Period)
			ok := ProbeVouched(pctx, a, r.node)
			pcancel()
			if ok {
				r.mu.Lock()
				if r.fencer != nil {
					r.fencer.Vouched(n, sent)
				}
				r.mu.Unlock()
			}
		})
	}
}

// guard runs the guard of nodes, instead of the one before, again after
// each failure; none for no nodes.
func (r *run) guard(ctx context.Context, nodes []string) {
	r.stopGuard()
	r.guarding = nodes
	r.sights.Keep(nodes, time.Now())
	if len(nodes) == 0 {
		r.stopGuard = func() {}
		return
	}
	gctx, gcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	r.stopGuard = func() { gcancel(); <-done }
	go func() {
		defer close(done)
		for gctx.Err() == nil {
			err := RunGuard(gctx, GuardConfig{
				Cluster: r.cluster, Namespace: r.namespace, Self: r.node, Nodes: nodes, Timing: r.t,
				ProbeAt: func(ctx context.Context, addr string) bool { return Probe(ctx, addr, r.node) }, Sights: r.sights,
				OnLost: func(node string, at time.Time) {
					r.lost.Inc()
					r.log.Warn("guarded node lost", slog.String("node", node), slog.Time("at", at))
					r.act.NodeLost(gctx, node, at)
				},
				OnBack: func(node string, at time.Time) {
					r.back.Inc()
					r.log.Info("guarded node back", slog.String("node", node))
					r.act.NodeBack(gctx, node, at)
				},
			})
			if gctx.Err() != nil {
				return
			}
			r.log.Warn("guard stopped; starting it again", slog.Any("nodes", nodes), slog.String("error", fmt.Sprint(err)))
			select { // a back-off after a failed watch, not a synchronisation
			case <-time.After(r.t.Period):
			case <-gctx.Done():
			}
		}
	}()
	r.log.Info("guarding", slog.Any("nodes", nodes))
}

// setGuardedBy takes the nodes that guard this one: the fencer checks
// them (none: no fencer), and their probe addresses are read.
func (r *run) setGuardedBy(ctx context.Context, nodes []string) {
	r.guardedBy = nodes
	r.mu.Lock()
	for n := range r.guardAddrs {
		if !slices.Contains(nodes, n) {
			delete(r.guardAddrs, n)
		}
	}
	switch {
	case len(nodes) == 0:
		r.fencer = nil
	case r.fencer == nil:
		r.fencer, _ = NewFencer(r.t, time.Now()) // t was validated by Listen
	}
	r.fenceGuards = slices.Clone(nodes)
	r.mu.Unlock()
	r.log.Info("guarded by", slog.Any("nodes", nodes))
	r.readAddrs(ctx)
}

// readAddrs reads the probe address of each guard not known yet from its
// Lease.
func (r *run) readAddrs(ctx context.Context) {
	for _, n := range r.guardedBy {
		r.mu.Lock()
		known := r.guardAddrs[n] != ""
		r.mu.Unlock()
		if known {
			continue
		}
		rctx, rcancel := context.WithTimeout(ctx, r.t.Period)
		a, err := ProbeAddrOf(rctx, r.cluster, r.namespace, n)
		rcancel()
		if err != nil || a == "" {
			r.log.Warn("probe address of a guard not known yet", slog.String("guard", n), slog.String("error", fmt.Sprint(err)))
			continue
		}
		r.mu.Lock()
		r.guardAddrs[n] = a
		r.mu.Unlock()
	}
}
