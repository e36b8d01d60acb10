package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/experiment"
	"github.com/amf-edge/amf/lab/testbed"
)

func runExperiment(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab experiment", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modes := fs.String("mode", "amf", "comma-separated modes, run in order on one control plane: reactive, observe, amf (the full loop: the broker pair a stateful one, seeded before the fault with retained messages, persistent sessions and queued QoS 1 messages, the new primary checked for them after the switchover), amf-node (amf in node mode: no sidecar, the agent runs the pipeline), amf-resize (amf with a memory ceiling: resize in place first), amf-resize-leak (the same under a leak no ceiling absorbs), amf-resize-noroom (the same on a node without the room), healthy")
	runs := fs.Int("runs", 1, "runs per mode (reactive: consecutive injections into one Deployment, so the back-off grows)")
	reactiveRuns := fs.Int("reactive-runs", 0, "runs of the reactive mode, if not --runs")
	scale := fs.Float64("scale", 1, "multiply every phase of the fault (60 s / 120 s / 60 s) by this factor; the agent's gates are not scaled")
	healthy := fs.Duration("healthy", 30*time.Minute, "length of the healthy run")
	tail := fs.Duration("tail", 30*time.Second, "window after each outage event in which its largest gap is measured")
	keepalive := fs.Int("keepalive-interval", testbed.DefaultBridge.KeepaliveInterval, "edge bridges' keepalive_interval (s)")
	restart := fs.Int("restart-timeout", testbed.DefaultBridge.RestartTimeout, "edge bridges' restart_timeout (s)")
	modelFlag := fs.String("model", "", fmt.Sprintf("sidecars' model (observe, amf, healthy): an embedded model's name (%s) or a model file path, copied with its manifest where the pods can read it; default: the paper's, %s (the sidecar's own default is %s)",
		strings.Join(model.EmbeddedNames(), ", "), model.PaperName, model.DefaultName))
	ceiling := fs.String("resize-ceiling", "512Mi", "amf.io/memory-ceiling of the amf-resize modes")
	out := fs.String("out", "", "results folder (default results/<UTC time>; results/latest points to the newest)")
	verbose := fs.Bool("v", false, "log the node and control plane to standard error")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if fs.NArg() > 0 || *runs < 1 || *reactiveRuns < 0 || *scale <= 0 || *scale > 1 {
		fmt.Fprintln(stderr, "amf-lab experiment: --runs ≥ 1, --reactive-runs ≥ 0 and 0 < --scale ≤ 1, no arguments")
		return 2
	}
	var ms []experiment.Mode
	for _, s := range strings.Split(*modes, ",") {
		m, err := experiment.ParseMode(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(stderr, "amf-lab experiment: --mode: %v\n", err)
			return 2
		}
		ms = append(ms, m)
	}
	if _, err := contract.ParseMemoryQuantity(*ceiling); err != nil {
		fmt.Fprintf(stderr, "amf-lab experiment: --resize-ceiling: %v\n", err)
		return 2
	}
	if err := experiment.CheckModel(*modelFlag); err != nil {
		fmt.Fprintf(stderr, "amf-lab %v\n", err)
		return 2
	}
	if err := experiment.CanRun(); err != nil {
		fmt.Fprintf(stderr, "amf-lab experiment: cannot run here: %v\n", err)
		return 1
	}
	bins, err := bench.FindBinaries()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab experiment: %v\n", err)
		return 1
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("results", time.Now().UTC().Format("20060102T150405Z"))
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	} else {
		// client-go's watches log their cancellation at shutdown through klog.
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	res, err := experiment.Run(ctx, experiment.Config{
		Modes: ms, Runs: *runs, ReactiveRuns: *reactiveRuns, Fault: experiment.PaperFault.Scaled(*scale), Healthy: *healthy, Tail: *tail,
		Bridge: testbed.Bridge{KeepaliveInterval: *keepalive, RestartTimeout: *restart},
		Out:    dir, Bin: bins, Model: *modelFlag, ResizeCeiling: *ceiling,
		Log:      slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		Progress: stderr,
	})
	if *out == "" {
		latest := filepath.Join(filepath.Dir(dir), "latest")
		_ = os.Remove(latest)
		_ = os.Symlink(filepath.Base(dir), latest)
	}
	if res != nil {
		fmt.Fprintln(stdout)
		res.Summary(stdout)
		fmt.Fprintf(stdout, "results: %s (results.json, summary.md, plots)\n", dir)
	}
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab experiment: %v (logs in %s)\n", err, filepath.Join(dir, "work"))
		return 1
	}
	return 0
}

// runDemo is `make demo`: the experiment at a quarter of its length, or, where
// it cannot run, what can.
func runDemo(ctx context.Context, stdout, stderr io.Writer) int {
	if err := experiment.CanRun(); err != nil {
		fmt.Fprintf(stderr, "amf-lab demo: the availability experiment cannot run here: %v.\n"+
			"Running what can: the signal benchmark (broker crash → agent, signals vs a kubelet-style poller).\n\n", err)
		return benchSignal(ctx, []string{"--mode", "sidecar", "--runs", "3", "--steady", "0s"}, stdout, stderr)
	}
	// Three reactive crashes in a row, so the kubelet's growing back-off is on
	// screen beside AMF's one cut-over.
	fmt.Fprintln(stderr, "amf-lab demo: on a real node (kubelet + containerd), one AMF run and three reactive runs of the paper's staged fault at 1/4 length (≈ 6 min);\n"+
		"the AMF run's broker pair carries its state: what its primary held before the fault, and what the new primary held of it after the switchover")
	return runExperiment(ctx, []string{"--mode", "amf,reactive", "--runs", "1", "--reactive-runs", "3", "--scale", "0.25"}, stdout, stderr)
}
