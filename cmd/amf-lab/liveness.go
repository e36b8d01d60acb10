package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/liveness"
)

// runLiveness is amf-lab liveness: package liveness's rules as an agent
// would run them, in a pod (in-cluster credentials).
func runLiveness(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab liveness", flag.ContinueOnError)
	fs.SetOutput(stderr)
	node := fs.String("node", "", "this agent's node (required)")
	ns := fs.String("namespace", "amf-system", "namespace of the agents' Leases")
	listen := fs.String("listen", "", "address to answer probes at, e.g. the node's IP:1885 (required)")
	guard := fs.String("guard", "", "nodes to guard with their agents' probe addresses: node=addr,...")
	guardedBy := fs.String("guarded-by", "", "probe addresses of this agent's guards: addr,...")
	period := fs.Duration("period", liveness.DefaultTiming.Period, "heartbeat period")
	fence := fs.Duration("fence", liveness.DefaultTiming.Fence, "fence after this long cut off")
	lost := fs.Duration("lost", liveness.DefaultTiming.Lost, "a guarded node is lost after this long silent")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if *node == "" || *listen == "" {
		fmt.Fprintln(stderr, "amf-lab liveness: --node and --listen are required")
		return 2
	}
	cfg := nodeloss.Config{Namespace: *ns, Node: *node, Listen: *listen, Guard: map[string]string{}, Out: stdout,
		Timing: liveness.Timing{Period: *period, Fence: *fence, Lost: *lost}}
	for _, kv := range strings.Split(*guard, ",") {
		if kv == "" {
			continue
		}
		n, a, ok := strings.Cut(kv, "=")
		if !ok {
			fmt.Fprintf(stderr, "amf-lab liveness: --guard %q: want node=addr\n", kv)
			return 2
		}
		cfg.Guard[n] = a
	}
	for _, a := range strings.Split(*guardedBy, ",") {
		if a != "" {
			cfg.GuardedBy = append(cfg.GuardedBy, a)
		}
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab liveness: %v\n", err)
		return 1
	}
	if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
		fmt.Fprintf(stderr, "amf-lab liveness: %v\n", err)
		return 1
	}
	if err := nodeloss.RunAgent(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "amf-lab liveness: %v\n", err)
		return 1
	}
	return 0
}
