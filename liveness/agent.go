package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
)

// Failover is what an agent does about the nodes it guards and about its
// own fence (actuate.Actuator): it fails over the primaries of a lost node;
// cut off, it pauses the primaries that the given guards may be taking over
// (Fence, which must not need the API server), and once renewals succeed
// again it resumes
// those still primary (Lift, returning how many it could not settle yet: it
// is called again a period later).
type Failover interface {
	NodeLost(ctx context.Context, node string, at time.Time)
	NodeBack(ctx context.Context, node string, at time.Time)
	Fence(ctx context.Context, why string, guards []string)
	Lift(ctx context.Context) (unsettled int)
}

// AgentConfig configures an Agent. All fields but Logger and Registerer are
// required.
type AgentConfig struct {
	Client    kubernetes.Interface
	Namespace string // of the Leases
	Node      string // this agent's node
	// Listen is where peers' probes are answered; Advertise the host:port
	// they reach it at, written on this agent's Lease.
	Listen, Advertise string
	Timing            Timing
	Logger            *slog.Logger
	Registerer        prometheus.Registerer
}

// Agent is the node-loss part of one node's agent: its Lease heartbeat,
// the answers to its peers' probes, a guard of the nodes it is told to
// guard, and the fence of its own primaries when it is cut off from the
// API server and from every guard of its node. Whom it guards and who
// guards it come from the actuator (SetGuards); a lost node goes to
// Failover.
type Agent struct {
	client    kubernetes.Interface
	namespace string
	node      string
	advertise string
	timing    Timing
	log       *slog.Logger
	ln        net.Listener
	guards    chan guards // the latest guards, one at most

	lost, back, fenced, renewFailed prometheus.Counter
}

type guards struct{ guard, guardedBy []string }

// Listen checks cfg and binds the probe address, so a taken port stops the
// agent at start with the address in the error.
func Listen(cfg AgentConfig) (*Agent, error) {
	if err := cfg.Timing.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Node == "" || cfg.Advertise == "" {
		return nil, errors.New("liveness: an agent needs a client, the Leases' namespace, its node and the address it advertises")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("liveness: answer probes at %s: %w", cfg.Listen, err)
	}
	reg := cfg.Registerer
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		if reg != nil {
			reg.MustRegister(c)
		}
		return c
	}
	return &Agent{client: cfg.Client, namespace: cfg.Namespace, node: cfg.Node, advertise: cfg.Advertise, timing: cfg.Timing,
		log: cfg.Logger, ln: ln, guards: make(chan guards, 1),
		lost:        counter("amf_liveness_nodes_lost_total", "Guarded nodes declared lost."),
		back:        counter("amf_liveness_nodes_back_total", "Lost nodes that heartbeat again."),
		fenced:      counter("amf_liveness_fenced_total", "Times this agent fenced its primaries (cut off from the API server and every guard)."),
		renewFailed: counter("amf_liveness_renew_failures_total", "Lease renewals that failed."),
	}, nil
}

// SetGuards says which nodes this agent guards and which nodes guard it. It
// keeps only the latest value and never blocks, so the actuator's
// goroutine can call it (actuate.Config.OnGuards).
func (l *Agent) SetGuards(guard, guardedBy []string) {
	select {
	case <-l.guards:
	default:
	}
	l.guards <- guards{slices.Clone(guard), slices.Clone(guardedBy)}
}

// Run heartbeats, answers probes, guards and fences until ctx ends; a
// failed probe listener or heartbeat ends it with the error.
func (l *Agent) Run(ctx context.Context, act Failover) error {
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, so run first)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := l.timing
	errs := make(chan error, 2)
	wg.Add(1)
	// The guard's sights of the nodes it guards: its probe answers vouch for
	// their agents by them (an agent its guard cannot see must fence).
	sights := NewSights()
	go func() {
		defer wg.Done()
		errs <- ServeProbes(ctx, l.ln, func(node string) bool { return sights.Vouches(node, time.Now(), t.Vouch()) })
	}()

	// The fencer's state: its guards' probe addresses and the rule.
	var mu sync.Mutex
	var fencer *Fencer // nil while nothing guards this node: nobody would take over, so nothing to fence
	guardAddrs := map[string]string{}
	var fenceGuards []string // the guards the fencer checks, under mu
	failing := false
	// The fence carried out: fences counts them, settled is the count the
	// last successful Lift settled (a fence during a Lift is not); liftDue
	// once a renewal succeeded after an unsettled fence; lifting while a
	// Lift runs.
	fences, settled := 0, 0
	liftDue, lifting := false, false
	hb := &Heartbeat{Client: l.client, Namespace: l.namespace, Node: l.node, Timing: t, ProbeAddr: l.advertise,
		OnRenew: func(sent time.Time) {
			mu.Lock()
			if fencer != nil {
				fencer.Renewed(sent)
			}
			if fences > settled {
				liftDue = true
			}
			was := failing
			failing = false
			mu.Unlock()
			if was {
				l.log.Info("lease renewed again", slog.String("lease", LeaseName(l.node)))
			}
		},
		OnError: func(err error) {
			l.renewFailed.Inc()
			mu.Lock()
			first := !failing
			failing = true
			mu.Unlock()
			if first {
				l.log.Warn("lease not renewed", slog.String("lease", LeaseName(l.node)), slog.String("error", err.Error()))
			}
		},
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs <- hb.Run(ctx) }()

	wg.Add(1)
	go func() { // the fencer: its probes of the guards, its check five times a period
		defer wg.Done()
		probeTick := time.NewTicker(t.Period)
		defer probeTick.Stop()
		checkTick := time.NewTicker(t.Period / 5)
		defer checkTick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-checkTick.C:
				mu.Lock()
				var silent []string
				if fencer != nil {
					silent = fencer.Silent(now, fenceGuards)
				}
				mu.Unlock()
				if len(silent) > 0 {
					l.fenced.Inc()
					const why = "no Lease renewal and no guard vouching for this node: a guard may be taking over its hot primaries"
					l.log.Error("fence", slog.String("node", l.node), slog.Any("guards", silent), slog.Duration("cut_off_for", t.Fence), slog.String("why", why))
					act.Fence(ctx, why, silent)
					mu.Lock()
					liftDue = false
					fences++
					mu.Unlock()
				}
				mu.Lock()
				lift := liftDue && !lifting
				lifting = lifting || lift
				gen := fences
				mu.Unlock()
				if lift {
					wg.Add(1)
					go func() { // off the check's goroutine: Lift reads the API server
						defer wg.Done()
						n := act.Lift(ctx)
						if n > 0 {
							select { // read again a period later, not a synchronisation
							case <-time.After(t.Period):
							case <-ctx.Done():
							}
						}
						mu.Lock()
						lifting = false
						done := n == 0 && gen == fences
						if done {
							settled, liftDue = gen, false
						}
						mu.Unlock()
						if done {
							l.log.Info("fence settled", slog.String("node", l.node))
						}
					}()
				}
			case <-probeTick.C:
				mu.Lock()
				addrs := make(map[string]string, len(guardAddrs))
				for n, a := range guardAddrs {
					if a != "" {
						addrs[n] = a
					}
				}
				mu.Unlock()
				for n, a := range addrs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sent := time.Now()
						pctx, pcancel := context.WithTimeout(ctx, t.Period)
						ok := ProbeVouched(pctx, a, l.node)
						pcancel()
						if ok {
							mu.Lock()
							if fencer != nil {
								fencer.Vouched(n, sent)
							}
							mu.Unlock()
						}
					}()
				}
			}
		}
	}()

	// The guard, run again whenever the nodes to guard change; the guards'
	// addresses, read from their Leases whenever they change.
	var guarding []string
	stopGuard := func() {}
	defer func() { stopGuard() }()
	startGuard := func(nodes []string) {
		stopGuard()
		guarding = nodes
		sights.Keep(nodes, time.Now())
		if len(nodes) == 0 {
			stopGuard = func() {}
			return
		}
		gctx, gcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		stopGuard = func() { gcancel(); <-done }
		go func() {
			defer close(done)
			for gctx.Err() == nil {
				err := RunGuard(gctx, GuardConfig{
					Client: l.client, Namespace: l.namespace, Self: l.node, Nodes: nodes, Timing: t,
					ProbeAt: func(ctx context.Context, addr string) bool { return Probe(ctx, addr, l.node) }, Sights: sights,
					OnLost: func(node string, at time.Time) {
						l.lost.Inc()
						l.log.Warn("guarded node lost", slog.String("node", node), slog.Time("at", at))
						act.NodeLost(gctx, node, at)
					},
					OnBack: func(node string, at time.Time) {
						l.back.Inc()
						l.log.Info("guarded node back", slog.String("node", node))
						act.NodeBack(gctx, node, at)
					},
				})
				if gctx.Err() != nil {
					return
				}
				l.log.Warn("guard stopped; starting it again", slog.Any("nodes", nodes), slog.String("error", fmt.Sprint(err)))
				select { // a back-off after a failed watch, not a synchronisation
				case <-time.After(t.Period):
				case <-gctx.Done():
				}
			}
		}()
		l.log.Info("guarding", slog.Any("nodes", nodes))
	}
	var guardedBy []string
	resolve := time.NewTicker(10 * t.Period) // addresses not read yet are read again
	defer resolve.Stop()
	readAddrs := func() {
		for _, n := range guardedBy {
			mu.Lock()
			known := guardAddrs[n] != ""
			mu.Unlock()
			if known {
				continue
			}
			rctx, rcancel := context.WithTimeout(ctx, t.Period)
			a, err := ProbeAddrOf(rctx, l.client, l.namespace, n)
			rcancel()
			if err != nil || a == "" {
				l.log.Warn("probe address of a guard not known yet", slog.String("guard", n), slog.String("error", fmt.Sprint(err)))
				continue
			}
			mu.Lock()
			guardAddrs[n] = a
			mu.Unlock()
		}
	}
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
			readAddrs()
		case g := <-l.guards:
			if !slices.Equal(g.guard, guarding) {
				startGuard(g.guard)
			}
			if !slices.Equal(g.guardedBy, guardedBy) {
				guardedBy = g.guardedBy
				mu.Lock()
				for n := range guardAddrs {
					if !slices.Contains(guardedBy, n) {
						delete(guardAddrs, n)
					}
				}
				switch {
				case len(guardedBy) == 0:
					fencer = nil
				case fencer == nil:
					fencer, _ = NewFencer(t, time.Now()) // t was validated by check
				}
				fenceGuards = slices.Clone(guardedBy)
				mu.Unlock()
				l.log.Info("guarded by", slog.Any("nodes", guardedBy))
				readAddrs()
			}
		}
	}
}
