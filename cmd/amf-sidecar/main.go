// Command amf-sidecar watches one broker container's cgroup, computes the six
// features of the published Prometheus pipeline, and scores them.
//
// This file only wires flags to the sidecar and infer packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/sidecar"
)

// Exit codes: 2 for bad input or usage, as the replay and score contracts say.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `amf-sidecar — per-pod availability sidecar

Usage:
  amf-sidecar run (--pod-uid UID | --pid N | --cgroup-path P) [--agent tcp://NODE:1884] [--probe-mqtt tcp://127.0.0.1:1883]
      the sidecar: sample, score, serve /healthz /readyz /status /metrics, signal the node agent
  amf-sidecar sample (--pid N | --cgroup-path P) [--interval 1s] [window flags]
      sample a target every interval; one JSON line per sample (raw values + features)
  amf-sidecar replay --in samples.csv [window flags]
      features from recorded raw samples (CSV in, CSV out), to check them against PromQL
  amf-sidecar score --in features.csv [--model m.txt]
      append probability and anomaly (0/1) to rows with the six feature columns

Window flags (defaults: the published pipeline):
  --rate-window 5m   --deriv-window 10m   --step 5s   --lookback 5m
`

type stdio struct {
	in       io.Reader
	out, err io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr})
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, io stdio) int {
	if len(args) == 0 {
		fmt.Fprint(io.err, usage)
		return exitUsage
	}
	cmds := map[string]func(context.Context, []string, stdio) int{
		"replay": runReplay,
		"sample": runSample,
		"run":    runRun,
		"score":  runScore,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Fprint(io.out, usage)
			return exitOK
		}
		fmt.Fprintf(io.err, "amf-sidecar: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	return cmd(ctx, args[1:], io)
}

// windowFlags registers the feature-window flags on fs and returns the config
// they fill.
func windowFlags(fs *flag.FlagSet) *infer.Config {
	cfg := infer.DefaultConfig()
	fs.DurationVar(&cfg.RateWindow, "rate-window", cfg.RateWindow, "range of rate()")
	fs.DurationVar(&cfg.DerivWindow, "deriv-window", cfg.DerivWindow, "range of the deriv() subquery")
	fs.DurationVar(&cfg.Step, "step", cfg.Step, "subquery resolution (aligned to the epoch)")
	fs.DurationVar(&cfg.Lookback, "lookback", cfg.Lookback, "instant-selector lookback")
	return &cfg
}

func newFlagSet(name string, io stdio) *flag.FlagSet {
	fs := flag.NewFlagSet("amf-sidecar "+name, flag.ContinueOnError)
	fs.SetOutput(io.err)
	return fs
}

func runReplay(_ context.Context, args []string, io stdio) int {
	fs := newFlagSet("replay", io)
	in := fs.String("in", "", "raw samples CSV (- for standard input)")
	cfg := windowFlags(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *in == "" || fs.NArg() > 0 {
		fmt.Fprintln(io.err, "amf-sidecar replay: --in FILE is required (- for standard input)")
		return exitUsage
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar replay: %v\n", err)
		return exitUsage
	}
	r, closeIn, err := openInput(*in, io.in)
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar replay: %v\n", err)
		return exitUsage
	}
	defer closeIn()
	if err := sidecar.Replay(r, io.out, *cfg); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar replay: %s: %v\n", *in, err)
		var ie *sidecar.InputError
		if errors.As(err, &ie) {
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}

func openInput(name string, stdin io.Reader) (io.Reader, func(), error) {
	if name == "-" {
		return stdin, func() {}, nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot open input: %w", err)
	}
	return f, func() { f.Close() }, nil
}
