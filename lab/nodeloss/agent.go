// Package nodeloss is the multi-node lab's node-loss rig, test
// infrastructure that product code never imports: RunAgent runs package
// liveness's heartbeat, guard and fencer alone, with guards given by hand, as
// a process in a pod on a lab node (amf-lab liveness), printing one JSON line
// per decision; Pair runs the agent DaemonSet itself (--liveness) with a hot
// pair of edge brokers and the E2E probe on three lab nodes, for the tests
// and for RunBench (amf-lab bench node-loss).
package nodeloss

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/liveness"
)

// Line is one JSON line of RunAgent: Event is up (the first renewal), lost
// or back (Node, by this agent's guard), fence (this agent), renew-failed
// (the first failure after a success).
type Line struct {
	Event string    `json:"event"`
	Node  string    `json:"node,omitempty"`
	Self  string    `json:"self"`
	At    time.Time `json:"at"`
	Err   string    `json:"err,omitempty"`
}

// Config configures RunAgent.
type Config struct {
	Client    kubernetes.Interface
	Namespace string // of the Leases
	Node      string // this agent's node
	// Listen is where this agent answers probes (TCP accept, then close).
	Listen string
	// Guard maps the nodes this agent guards to their agents' probe
	// addresses; GuardedBy are the probe addresses of this agent's guards.
	Guard     map[string]string
	GuardedBy []string
	Timing    liveness.Timing
	Out       io.Writer
}

// RunAgent runs until ctx ends.
func RunAgent(ctx context.Context, cfg Config) error {
	if err := cfg.Timing.Validate(); err != nil {
		return err
	}
	var outMu sync.Mutex
	say := func(l Line) {
		l.Self = cfg.Node
		if l.At.IsZero() {
			l.At = time.Now()
		}
		b, _ := json.Marshal(l)
		outMu.Lock()
		fmt.Fprintln(cfg.Out, string(b))
		outMu.Unlock()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("nodeloss: listen for probes: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		ln.Close()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	probe := func(ctx context.Context, addr string) bool {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	fencer, err := liveness.NewFencer(cfg.Timing, time.Now())
	if err != nil {
		return err
	}
	var fmu sync.Mutex
	var up, failing bool
	hb := &liveness.Heartbeat{Cluster: cluster.NewKube(cfg.Client), Namespace: cfg.Namespace, Node: cfg.Node, Timing: cfg.Timing,
		OnRenew: func(sent time.Time) {
			fmu.Lock()
			fencer.Renewed(sent)
			first := !up
			up, failing = true, false
			fmu.Unlock()
			if first {
				say(Line{Event: "up"})
			}
		},
		OnError: func(err error) {
			fmu.Lock()
			first := !failing
			failing = true
			fmu.Unlock()
			if first {
				say(Line{Event: "renew-failed", Err: err.Error()})
			}
		},
	}
	errs := make(chan error, 3)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- hb.Run(ctx) }()
	for _, a := range cfg.GuardedBy { // the fencer's probes of the guards
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(cfg.Timing.Period)
			defer tick.Stop()
			for {
				sent := time.Now()
				pctx, pcancel := context.WithTimeout(ctx, cfg.Timing.Period)
				ok := probe(pctx, a)
				pcancel()
				if ok {
					fmu.Lock()
					fencer.Vouched(a, sent)
					fmu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the fencer's check, five times a period: it fences within a fifth of a period of the bound
		defer wg.Done()
		tick := time.NewTicker(cfg.Timing.Period / 5)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				errs <- ctx.Err()
				return
			case now := <-tick.C:
				fmu.Lock()
				silent := fencer.Silent(now, cfg.GuardedBy)
				fmu.Unlock()
				if len(silent) > 0 {
					say(Line{Event: "fence", At: now})
				}
			}
		}
	}()
	if len(cfg.Guard) > 0 {
		var nodes []string
		for n := range cfg.Guard {
			nodes = append(nodes, n)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- liveness.RunGuard(ctx, liveness.GuardConfig{
				Cluster: cluster.NewKube(cfg.Client), Namespace: cfg.Namespace, Self: cfg.Node, Nodes: nodes, Timing: cfg.Timing,
				Probe:  func(ctx context.Context, node string) bool { return probe(ctx, cfg.Guard[node]) },
				OnLost: func(node string, at time.Time) { say(Line{Event: "lost", Node: node, At: at}) },
				OnBack: func(node string, at time.Time) { say(Line{Event: "back", Node: node, At: at}) },
			})
		}()
	}
	err = <-errs
	cancel()
	if ctx.Err() != nil {
		return nil
	}
	return err
}
