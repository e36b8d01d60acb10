// Command amf-lab is AMF's testbed on one machine: benchmarks with real brokers,
// sidecars and agents on loopback, and the paper's availability experiment.
// This package only wires flags to lab packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/broker"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
)

const usage = `amf-lab — AMF's testbed on one machine

Usage:
  amf-lab demo
      one AMF run and three reactive runs of the paper's experiment at 1/4 length
      on a real node, compared; where no node can run, says why and runs the
      signal benchmark instead
  amf-lab bench signal [--mode sidecar,node] [--runs 5] [--keepalive 5s] [--steady 20s] [--keep]
      signal-based detection vs a kubelet-style poller, with real processes:
      the broker killed and OOM-killed, in sidecar mode (amf-sidecar beside it)
      and node mode (amf-agent --node-mode against a real API server; root,
      make k8s), one table; sidecar mode also the sidecar crashed and frozen
  amf-lab bench signal --node [--runs 5] [--load-cpu 2,64] [--load-for 60s] [--keep] [-v]
      the same against the real kubelet (root; make deps k8s first): broker
      pods with the sidecar on a real node, crashed, hung and loaded; the
      agent's signal vs the pod status and the kubelet's liveness probes
  amf-lab bench agent [--sidecars 110] [--period 1s] [--duration 30s] [--mode sidecar|node] [--pods 110]
      one real agent under the load of a full node's sidecars
  amf-lab bench flood [--sidecars 110] [--rounds 5] [--sources 48] [--per-source 16] [--agent PATH]
      sidecars reconnecting all at once to a real agent, quiet and then during a flood of
      idle sockets from several loopback addresses and one pod's stream of new sessions:
      connect time (dial to CONNACK) p50/p99/max and failures side by side; last line JSON
  amf-lab bench state [--retained 300] [--sessions 3] [--v5-sessions 1] [--queued 20] [--nodeloss=false] [--keep] [-v]
      a lab node, Mosquitto with its data on the pod's volume, state put in by paho and
      mosquitto_sub -V 5: what survives Kubernetes restarting the broker in place (a
      crash, default autosave and autosave_on_changes; a clean stop) and AMF's handover
      levers; last line JSON (root; make deps k8s first)
  amf-lab bench features --profile SPEC [--interval 1s] [--limit 256Mi] [--model NAME]
      a load (amf-lab stress's SPEC) replayed in a cgroup of its own and sampled as the
      sidecar samples: one JSON line per sample (amf-sidecar sample's record and the
      load's CPU seconds from /proc), on cgroup v1 or v2, to compare two hosts on one
      load (root)
  amf-lab bench node-loss [--cuts 10] [--k8s-toleration 300s] [--k8s-wait 10m] [--keep] [-v]
      three lab nodes, the agent DaemonSet, a hot broker pair bridging RDS and
      OBU: power cuts of the primary's node, the standby's failover and the
      probe's outage, then one plain broker as Kubernetes alone runs it; the
      last line is JSON (root; make deps k8s first)
  amf-lab experiment [--mode reactive,observe,amf,healthy] [--runs N] [--reactive-runs N] [--scale 0.25] [--out DIR] [--model NAME|PATH]
      the paper's availability experiment on a real control plane and a real
      node (kubelet + containerd; root; make deps k8s first); --model: the
      sidecars' model, an embedded name or a model file (default: the paper's, p1);
      amf's pair is stateful (persistence on, inject --state-dir): seeded before
      the fault, the new primary checked for what was lost after the switchover
  amf-lab soak [--duration 10m] [--seed 1] [--faults crash,power-cut,...] [--pairs sidecar,node,state] [--out DIR] [-v]
      three lab nodes, the agent DaemonSet, a hot pair and its clients under a seeded
      random schedule of every fault the lab makes (some within others), then a checker
      over the whole history: each violation with the seed and what came around it,
      the last line JSON; exit status 1 on any violation (root; make deps k8s first)
  amf-lab corpus --out DIR [--seed 1] [--runs 1] [--families a,b] [--parallel 2] [--lead-in 10m] [--append] [--list]
      staged load profiles run in real broker containers, raw counters recorded
      every second with the time of the failure (the lead-time model's corpus)
  amf-lab stress --profile SPEC [--scale f]
      the staged fault's load generator, run inside a container's cgroups
  amf-lab liveness --node N --listen ADDR [--guard node=addr,...] [--guarded-by addr,...] [--namespace amf-system]
      the node-loss rules (package liveness) alone, guards given by hand, in a
      pod: a Lease heartbeat, a guard of the given nodes, a fencer; one JSON
      line per decision (the agent runs them itself with --liveness)
  amf-lab broker --listen 127.0.0.1:1883
      a plain mochi MQTT broker process (used when Mosquitto is not installed)
  amf-lab cgroup2vm [--accel tcg|kvm] [--run REGEXP] [--timeout 4m]
      the sidecar's cgroup tests on a real cgroup v2 kernel: a qemu guest with
      a Debian cloud kernel, real v2 cgroups (make test-cgroup2)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) >= 2 && args[0] == "bench" && args[1] == "signal":
		return benchSignal(ctx, args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "bench" && args[1] == "agent":
		return benchAgent(ctx, args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "bench" && args[1] == "flood":
		return benchFlood(ctx, args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "bench" && args[1] == "state":
		return benchState(ctx, args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "bench" && args[1] == "features":
		return benchFeatures(ctx, args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "bench" && args[1] == "node-loss":
		return benchNodeLoss(ctx, args[2:], stdout, stderr)
	case len(args) >= 1 && args[0] == "demo":
		return runDemo(ctx, stdout, stderr)
	case len(args) >= 1 && args[0] == "experiment":
		return runExperiment(ctx, args[1:], stdout, stderr)
	case len(args) >= 1 && args[0] == "soak":
		return runSoak(ctx, args[1:], stdout, stderr)
	case len(args) >= 1 && args[0] == "corpus":
		return runCorpus(ctx, args[1:], stdout, stderr)
	case len(args) >= 1 && args[0] == "stress":
		err := runStress(ctx, args[1:], stdout, stderr)
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "amf-lab stress: %v\n", err)
		}
		return exitcode.Of(err)
	case len(args) >= 1 && args[0] == "cgroup2vm":
		return runCgroup2VM(ctx, args[1:], stdout, stderr)
	case len(args) >= 1 && args[0] == "liveness":
		return runLiveness(ctx, args[1:], stdout, stderr)
	case len(args) >= 1 && args[0] == "broker":
		return runBroker(ctx, args[1:], stderr)
	case len(args) >= 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help"):
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

// prepare finds the binaries and makes the folder for the run's logs, which done
// removes unless *keep (set by --keep, or on failure for inspection).
func prepare(keep *bool, stderr io.Writer) (bins bench.Binaries, dir string, done func(), err error) {
	if bins, err = bench.FindBinaries(); err != nil {
		return bins, "", nil, err
	}
	if dir, err = os.MkdirTemp("", "amf-lab-"); err != nil {
		return bins, "", nil, err
	}
	return bins, dir, func() {
		if *keep {
			fmt.Fprintf(stderr, "logs kept in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}, nil
}

func benchSignal(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab bench signal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	runs := fs.Int("runs", 5, "faults of each kind")
	modes := fs.String("mode", bench.ModeSidecar+","+bench.ModeNode, "comma-separated, in this order: sidecar (amf-sidecar beside the broker signals the agent), node (amf-agent --node-mode watches the broker's container; root, make k8s)")
	keepAlive := fs.Duration("keepalive", 5*time.Second, "sidecar → agent MQTT keep-alive (bounds the freeze case)")
	steady := fs.Duration("steady", 20*time.Second, "how long to measure the sidecar's steady-state CPU and RSS (0: skip)")
	keep := fs.Bool("keep", false, "keep the run's logs")
	node := fs.Bool("node", false, "against the real kubelet: broker pods on a real node (kubelet + containerd)")
	loadCPU := fs.String("load-cpu", "2,64", "--node: case (c)'s loads, comma-separated: busy threads (cores of demand) in the 500m broker container")
	loadFor := fs.Duration("load-for", bench.DefaultLoads[0].Duration, "--node: length of each load in case (c)")
	verbose := fs.Bool("v", false, "--node: log the node and the control plane to standard error")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	var modeList []string
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if m != bench.ModeSidecar && m != bench.ModeNode || slices.Contains(modeList, m) {
			fmt.Fprintf(stderr, "amf-lab bench signal: --mode %q: want sidecar, node or both, each once (e.g. sidecar,node)\n", *modes)
			return 2
		}
		modeList = append(modeList, m)
	}
	bins, dir, done, err := prepare(keep, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab: %v\n", err)
		return 1
	}
	defer done()
	if *node {
		var loads []bench.Load
		for _, f := range strings.Split(*loadCPU, ",") {
			cpu, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || cpu <= 0 {
				fmt.Fprintf(stderr, "amf-lab bench signal: --load-cpu %q: want positive numbers of cores, e.g. 2,64\n", *loadCPU)
				return 2
			}
			loads = append(loads, bench.Load{CPU: cpu, Duration: *loadFor, Traffic: bench.DefaultLoads[0].Traffic})
		}
		return benchNode(ctx, bench.NodeConfig{Runs: *runs, Loads: loads, BinDir: filepath.Dir(bins.Self), WorkDir: dir, Progress: stderr},
			*verbose, keep, stdout, stderr)
	}
	if slices.Contains(modeList, bench.ModeNode) {
		// client-go's watches log their cancellation at shutdown through klog.
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	rep, err := bench.RunSignal(ctx, bench.SignalConfig{Modes: modeList, Runs: *runs, KeepAlive: *keepAlive, Steady: *steady,
		Bin: bins, WorkDir: dir, Progress: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench signal: %v\n", err)
		*keep = true
		return 1
	}
	if err := bench.PrintSignal(stdout, rep); err != nil {
		return 1
	}
	return 0
}

// benchNode is `amf-lab bench signal --node`.
func benchNode(ctx context.Context, cfg bench.NodeConfig, verbose bool, keep *bool, stdout, stderr io.Writer) int {
	if err := kubenode.Check(); err != nil {
		fmt.Fprintf(stderr, "amf-lab bench signal --node: cannot run a node here: %v\n", err)
		return 1
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench signal --node: %v\n", err)
		return 1
	}
	cfg.Repo = repo
	if verbose {
		cfg.Log = func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }
	} else {
		// client-go's watches log their cancellation at shutdown through klog.
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	rep, err := bench.RunNode(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench signal --node: %v\n", err)
		*keep = true
		return 1
	}
	if err := bench.PrintNode(stdout, rep); err != nil {
		return 1
	}
	return 0
}

func benchAgent(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab bench agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sidecars := fs.Int("sidecars", 110, "simulated sidecars (110 = kubelet's default pods per node)")
	period := fs.Duration("period", time.Second, "each sidecar publishes once per period")
	duration := fs.Duration("duration", 30*time.Second, "length of the measurement")
	keep := fs.Bool("keep", false, "keep the run's logs")
	mode := fs.String("mode", "sidecar", "sidecar: simulated sidecars signal the agent; node: the agent runs a pipeline per pod itself (--node-mode), against a real API server and real cgroups with a real process each (root, make k8s)")
	pods := fs.Int("pods", 110, "--mode node: pods on the node")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	bins, dir, done, err := prepare(keep, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab: %v\n", err)
		return 1
	}
	defer done()
	switch *mode {
	case "sidecar":
	case "node":
		rep, err := bench.RunNodeMode(ctx, bench.NodeModeConfig{Pods: *pods, Duration: *duration, Bin: bins, WorkDir: dir, Progress: stderr})
		if err != nil {
			fmt.Fprintf(stderr, "amf-lab bench agent: %v\n", err)
			*keep = true
			return 1
		}
		if err := bench.PrintNodeMode(stdout, rep); err != nil {
			return 1
		}
		return 0
	default:
		fmt.Fprintf(stderr, "amf-lab bench agent: --mode %q: want sidecar or node\n", *mode)
		return 2
	}
	rep, err := bench.RunAgentLoad(ctx, bench.AgentLoadConfig{Sidecars: *sidecars, Period: *period, Duration: *duration,
		Bin: bins, WorkDir: dir, Progress: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench agent: %v\n", err)
		*keep = true
		return 1
	}
	bench.PrintAgentLoad(stdout, rep)
	return 0
}

func benchFlood(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab bench flood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sidecars := fs.Int("sidecars", 110, "sidecars reconnecting at once each round (at most 250), each from its own loopback address")
	rounds := fs.Int("rounds", 5, "rounds per phase")
	sources := fs.Int("sources", 48, "loopback addresses the idle-socket flood comes from (at most 250)")
	perSource := fs.Int("per-source", 16, "idle sockets per flood address, each reopened as soon as the agent closes it")
	agentBin := fs.String("agent", "", "the amf-agent binary to measure (default: the one beside amf-lab)")
	keep := fs.Bool("keep", false, "keep the run's logs")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	bins, dir, done, err := prepare(keep, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab: %v\n", err)
		return 1
	}
	defer done()
	if *agentBin != "" {
		bins.Agent = *agentBin
	}
	rep, err := bench.RunFlood(ctx, bench.FloodConfig{Sidecars: *sidecars, Rounds: *rounds, FloodSources: *sources,
		FloodPerSource: *perSource, Bin: bins, WorkDir: dir, Progress: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench flood: %v\n", err)
		*keep = true
		return 1
	}
	if err := bench.PrintFlood(stdout, rep); err != nil {
		return 1
	}
	return 0
}

func runBroker(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("listen", "127.0.0.1:1883", "MQTT listen address")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if err := broker.Run(ctx, *addr, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))); err != nil {
		fmt.Fprintf(stderr, "amf-lab broker: %v\n", err)
		return 1
	}
	return 0
}
