package kubenode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/amf-edge/amf/lab/controlplane"
)

// ClusterConfig configures LaunchCluster.
type ClusterConfig struct {
	// ControlPlane is the cluster to join (its certificate valid for
	// ServingIPs(), which include LANGateway).
	ControlPlane *controlplane.ControlPlane
	// Nodes is how many nodes to start (default 3).
	Nodes int
	// Node is every node's Config (ControlPlane, LAN and Name are set here;
	// the nodes are named amf-node-<slot>).
	Node Config
	// Log receives progress lines (default: Node.Log).
	Log func(format string, args ...any)
}

// Cluster is several real nodes on one LAN, against one control plane.
type Cluster struct {
	LAN   *LAN
	Nodes []*Node
}

// LaunchCluster creates a LAN and starts the nodes on it side by side, and
// returns once every node is Ready. The caller calls Stop; if the caller
// dies, the janitors of the nodes and of the LAN tear everything down.
func LaunchCluster(ctx context.Context, cfg ClusterConfig) (_ *Cluster, err error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.Log == nil {
		cfg.Log = cfg.Node.Log
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	t0 := time.Now()
	lan, err := NewLAN(ctx, cfg.ControlPlane, cfg.Log)
	if err != nil {
		return nil, err
	}
	c := &Cluster{LAN: lan}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for range cfg.Nodes {
		nc := cfg.Node
		nc.ControlPlane, nc.LAN, nc.Name = cfg.ControlPlane, lan, ""
		if nc.Log == nil {
			nc.Log = cfg.Log
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := Launch(ctx, nc)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			c.Nodes = append(c.Nodes, n)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("kubenode cluster: %w", err)
	}
	// In slot order, so that Nodes[0] is the lowest slot.
	for i := 1; i < len(c.Nodes); i++ {
		for j := i; j > 0 && c.Nodes[j].Index < c.Nodes[j-1].Index; j-- {
			c.Nodes[j], c.Nodes[j-1] = c.Nodes[j-1], c.Nodes[j]
		}
	}
	cfg.Log("kubenode: cluster of %d nodes on LAN %d Ready in %v", len(c.Nodes), lan.Index, time.Since(t0).Round(time.Millisecond))
	return c, nil
}

// Stop tears down every node (side by side), then the LAN, and waits.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.Stop() }()
	}
	wg.Wait()
	if c.LAN != nil {
		c.LAN.Stop()
	}
}

// DumpLogs logs the end of each node's daemons' logs.
func (c *Cluster) DumpLogs() {
	for _, n := range c.Nodes {
		n.DumpLogs()
	}
}
