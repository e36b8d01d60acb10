package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/liveness"
)

// livenessFlags are the node-loss flags (DESIGN.md, "Losing a whole node"):
// the agent's own Lease heartbeat, the probes its peers send it, the guard
// of the nodes whose primaries it backs with a hot standby, and the fence of
// its own primaries when it is cut off.
type livenessFlags struct {
	on        bool
	namespace string
	listen    string
	advertise string
	timing    liveness.Timing
}

func addLivenessFlags(fs *flag.FlagSet) *livenessFlags {
	f := &livenessFlags{timing: liveness.DefaultTiming}
	fs.BoolVar(&f.on, "liveness", false, "with --actuate, survive the loss of a whole node: heartbeat this agent's Lease, answer peers' probes, guard the nodes of the primaries whose hot standby runs here and fail them over when their node is lost, fence when cut off (needs --node-name, --liveness-advertise and leases rights in --lease-namespace, liveness.Rules)")
	fs.StringVar(&f.namespace, "lease-namespace", "amf-system", "`namespace` of the agents' Leases (amf-agent-<node>)")
	fs.StringVar(&f.listen, "liveness-listen", ":1885", "`address` to answer the peers' probes at")
	fs.StringVar(&f.advertise, "liveness-advertise", "", "`host:port` at which peers reach --liveness-listen over the node network, written on this agent's Lease (the DaemonSet: $(HOST_IP):1885, a hostPort)")
	fs.DurationVar(&f.timing.Period, "liveness-period", liveness.DefaultTiming.Period, "how often the Lease is renewed and peers are probed")
	fs.DurationVar(&f.timing.Fence, "liveness-fence", liveness.DefaultTiming.Fence, "fence own primaries after this long without a renewal or an answer of any guard")
	fs.DurationVar(&f.timing.Lost, "liveness-lost", liveness.DefaultTiming.Lost, "a guarded node is lost after this long without heartbeats or answers (at least fence + period)")
	return f
}

// check says what is wrong with the flags, if anything.
func (f *livenessFlags) check(actuation bool, node string) error {
	if !f.on {
		return nil
	}
	if !actuation {
		return errors.New("--liveness needs --actuate (a lost node's primaries are failed over by the actuator)")
	}
	if node == "" {
		return errors.New("--liveness needs --node-name (the Lease is amf-agent-<node>)")
	}
	if f.advertise == "" {
		return errors.New("--liveness needs --liveness-advertise, the host:port peers probe (in the DaemonSet: $(HOST_IP):1885)")
	}
	host, port, err := net.SplitHostPort(f.advertise)
	if err != nil || host == "" {
		return fmt.Errorf("--liveness-advertise %q: want host:port, e.g. 10.0.0.5:1885", f.advertise)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("--liveness-advertise %q: port %q is not a TCP port", f.advertise, port)
	}
	if err := f.timing.Validate(); err != nil {
		return fmt.Errorf("--liveness-period/-fence/-lost: %w", err)
	}
	return nil
}

// nodeLiveness runs package liveness for the agent and tells the actuator
// what it decides. The actuator tells it whom to guard and who guards this
// node (setGuards, called from the actuator's goroutine).
type nodeLiveness struct {
	f      *livenessFlags
	client kubernetes.Interface
	node   string
	log    *slog.Logger
	ln     net.Listener
	guards chan actuate.Guards // the latest Guards, one at most

	lost, back, fenced, renewFailed prometheus.Counter
}

// listenLiveness binds the probe address, so a taken port stops the agent at
// start with the address in the error.
func listenLiveness(f *livenessFlags, client kubernetes.Interface, node string, log *slog.Logger, reg prometheus.Registerer) (*nodeLiveness, error) {
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, fmt.Errorf("--liveness-listen %s: %w", f.listen, err)
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		if reg != nil {
			reg.MustRegister(c)
		}
		return c
	}
	return &nodeLiveness{f: f, client: client, node: node, log: log, ln: ln, guards: make(chan actuate.Guards, 1),
		lost:        counter("amf_liveness_nodes_lost_total", "Guarded nodes declared lost."),
		back:        counter("amf_liveness_nodes_back_total", "Lost nodes that heartbeat again."),
		fenced:      counter("amf_liveness_fenced_total", "Times this agent fenced its primaries (cut off from the API server and every guard)."),
		renewFailed: counter("amf_liveness_renew_failures_total", "Lease renewals that failed."),
	}, nil
}

// setGuards is actuate.Config.OnGuards: it keeps only the latest value and
// never blocks (its one caller is the actuator's goroutine).
func (l *nodeLiveness) setGuards(g actuate.Guards) {
	select {
	case <-l.guards:
	default:
	}
	l.guards <- g
}

// run heartbeats, answers probes, guards and fences until ctx ends.
func (l *nodeLiveness) run(ctx context.Context, act *actuate.Actuator) error {
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, so run first)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := l.f.timing
	errs := make(chan error, 2)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- liveness.ServeProbes(ctx, l.ln) }()

	// The fencer's state: its guards' probe addresses and the rule.
	var mu sync.Mutex
	var fencer *liveness.Fencer // nil while nothing guards this node: nobody would take over, so nothing to fence
	guardAddrs := map[string]string{}
	failing := false
	hb := &liveness.Heartbeat{Client: l.client, Namespace: l.f.namespace, Node: l.node, Timing: t, ProbeAddr: l.f.advertise,
		OnRenew: func(sent time.Time) {
			mu.Lock()
			if fencer != nil {
				fencer.Renewed(sent)
			}
			was := failing
			failing = false
			mu.Unlock()
			if was {
				l.log.Info("lease renewed again", slog.String("lease", liveness.LeaseName(l.node)))
			}
		},
		OnError: func(err error) {
			l.renewFailed.Inc()
			mu.Lock()
			first := !failing
			failing = true
			mu.Unlock()
			if first {
				l.log.Warn("lease not renewed", slog.String("lease", liveness.LeaseName(l.node)), slog.String("error", err.Error()))
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
				var err error
				if fencer != nil {
					err = fencer.Check(now)
				}
				mu.Unlock()
				if errors.Is(err, liveness.ErrFence) {
					l.fenced.Inc()
					l.log.Error("fence", slog.String("node", l.node), slog.Duration("cut_off_for", t.Fence),
						slog.String("why", "no Lease renewal and no answer of any guard: a guard may be taking over this node's hot primaries"))
				}
			case <-probeTick.C:
				mu.Lock()
				addrs := make([]string, 0, len(guardAddrs))
				for _, a := range guardAddrs {
					if a != "" {
						addrs = append(addrs, a)
					}
				}
				mu.Unlock()
				for _, a := range addrs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sent := time.Now()
						pctx, pcancel := context.WithTimeout(ctx, t.Period)
						ok := liveness.Probe(pctx, a)
						pcancel()
						if ok {
							mu.Lock()
							if fencer != nil {
								fencer.ReachedGuard(sent)
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
				err := liveness.RunGuard(gctx, liveness.GuardConfig{
					Client: l.client, Namespace: l.f.namespace, Self: l.node, Nodes: nodes, Timing: t,
					ProbeAt: liveness.Probe,
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
			a, err := liveness.ProbeAddrOf(rctx, l.client, l.f.namespace, n)
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
			if !slices.Equal(g.Guard, guarding) {
				startGuard(g.Guard)
			}
			if !slices.Equal(g.GuardedBy, guardedBy) {
				guardedBy = g.GuardedBy
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
					fencer, _ = liveness.NewFencer(t, time.Now()) // t was validated by check
				}
				mu.Unlock()
				l.log.Info("guarded by", slog.Any("nodes", guardedBy))
				readAddrs()
			}
		}
	}
}

// configure sets the actuator's part of node loss (nothing without --liveness).
func (l *nodeLiveness) configure(c *actuate.Config, node string) {
	if l == nil {
		return
	}
	c.Node, c.OnGuards = node, l.setGuards
}

// start runs l beside act until ctx ends; wait returns its error. Without
// --liveness (l nil) it does nothing.
func (l *nodeLiveness) start(ctx context.Context, act *actuate.Actuator) (wait func() error) {
	if l == nil {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		err := l.run(ctx, act)
		if err != nil {
			l.log.Error("liveness stopped: this node is neither guarded nor guarding", slog.String("error", err.Error()))
		}
		done <- err
	}()
	return func() error { return <-done }
}
