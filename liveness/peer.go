package liveness

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// PeerConfig configures a Peer. All fields but Logger and Registerer are
// required.
type PeerConfig struct {
	Cluster   Cluster
	Namespace string // of the Leases
	Node      string // this agent's node
	// Listen is where peers' probes are answered; Advertise the host:port
	// they reach it at, written on this agent's Lease.
	Listen, Advertise string
	Timing            Timing
	Logger            *slog.Logger
	Registerer        prometheus.Registerer
}

// Peer is the node-loss part of one node's agent: its Lease heartbeat,
// the answers to its peers' probes, a guard of the nodes it is told to
// guard, and the fence of its own primaries when it is cut off from the
// API server and from every guard of its node. Whom it guards and who
// guards it come from the actuator (SetGuards); a lost node goes to
// Failover.
type Peer struct {
	cluster   Cluster
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

// Validate says what is wrong with c, if anything: the timing must be safe
// (Timing.Validate) and the fields but Logger and Registerer set. It is the
// one check of c's values: Listen makes it, and the agent calls it before
// it starts anything.
func (c PeerConfig) Validate() error {
	if err := c.Timing.Validate(); err != nil {
		return err
	}
	var missing []string
	for _, f := range []struct {
		name  string
		unset bool
	}{{"Cluster", c.Cluster == nil}, {"Namespace", c.Namespace == ""}, {"Node", c.Node == ""}, {"Listen", c.Listen == ""}, {"Advertise", c.Advertise == ""}} {
		if f.unset {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		// An empty Listen would bind a port of the kernel's choosing,
		// which no peer knows: Advertise names the port it must be.
		return fmt.Errorf("liveness: an agent needs a cluster, the Leases' namespace, its node, the address it answers probes at and the one it advertises (missing: %s)", strings.Join(missing, ", "))
	}
	return nil
}

// Listen checks cfg (Validate) and binds the probe address, so a taken port
// stops the agent at start with the address in the error.
func Listen(cfg PeerConfig) (*Peer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
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
	return &Peer{cluster: cfg.Cluster, namespace: cfg.Namespace, node: cfg.Node, advertise: cfg.Advertise, timing: cfg.Timing,
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
func (l *Peer) SetGuards(guard, guardedBy []string) {
	select {
	case <-l.guards:
	default:
	}
	l.guards <- guards{slices.Clone(guard), slices.Clone(guardedBy)}
}
