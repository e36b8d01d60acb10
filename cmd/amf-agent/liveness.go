package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/liveness"
	"github.com/amf-edge/amf/podsignal"
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

// config is the node-loss peer's configuration (checked by its Validate).
func (f *livenessFlags) config(client kubernetes.Interface, node string, log *slog.Logger, reg prometheus.Registerer) *liveness.PeerConfig {
	return &liveness.PeerConfig{Cluster: cluster.NewKube(client), Namespace: f.namespace, Node: node, Listen: f.listen, Advertise: f.advertise,
		Timing: f.timing, Logger: log, Registerer: reg}
}

// nodeLiveness is package liveness's Peer wired to the actuator: nil
// without --liveness, and then every method does nothing.
type nodeLiveness struct {
	agent *liveness.Peer
	node  string
	log   *slog.Logger
}

// listenLiveness binds the probe address, so a taken port stops the agent at
// start with the address in the error. Without --liveness (cfg nil) it
// binds nothing and returns nil.
func listenLiveness(cfg *liveness.PeerConfig) (*nodeLiveness, error) {
	if cfg == nil {
		return nil, nil
	}
	a, err := liveness.Listen(*cfg)
	if err != nil {
		return nil, fmt.Errorf("--liveness: %w", err)
	}
	return &nodeLiveness{agent: a, node: cfg.Node, log: cfg.Logger}, nil
}

// configure sets the actuator's part of node loss (nothing without
// --liveness): command is the fence's lever, the agent's commands to the
// sidecars.
func (l *nodeLiveness) configure(c *actuate.Config, command func(podsignal.Command) error) {
	if l == nil {
		return
	}
	c.Node, c.OnGuards = l.node, func(g actuate.Guards) { l.agent.SetGuards(g.Guard, g.GuardedBy) }
	c.Command = command
}

// start runs l beside act until ctx ends; wait returns its error. Without
// --liveness (l nil) it does nothing.
func (l *nodeLiveness) start(ctx context.Context, act *actuate.Actuator) (wait func() error) {
	if l == nil {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		err := l.agent.Run(ctx, act)
		if err != nil {
			l.log.Error("liveness stopped: this node is neither guarded nor guarding", slog.String("error", err.Error()))
		}
		done <- err
	}()
	return func() error { return <-done }
}
