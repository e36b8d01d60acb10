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
	"strings"
	"syscall"
	"time"

	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/internal/exitcode"
)

// Exit statuses: package exitcode's convention, shared by the three binaries.
const (
	exitOK    = exitcode.OK
	exitFail  = exitcode.Failure
	exitUsage = exitcode.Usage
)

const usage = `amf-sidecar — per-pod availability sidecar

Usage:
  amf-sidecar run (--pod-uid UID | --pid N | --cgroup-path P) [--agent tcp://NODE:1884] [--probe-mqtt tcp://127.0.0.1:1883] [--model NAME|PATH]
      the sidecar: sample, score, serve /healthz /readyz /status /metrics, signal the node agent
  amf-sidecar sample (--pid N | --cgroup-path P) [--interval 1s] [--model NAME|PATH | window flags]
      sample a target every interval; one JSON line per sample (raw values + features)
  amf-sidecar replay --in samples.csv [--model NAME|PATH | window flags]
      features from recorded raw samples (CSV in, CSV out), to check them against PromQL
  amf-sidecar score --in features.csv [--model NAME|PATH]
      append probability and anomaly (0/1) to rows with the six feature columns
  amf-sidecar state save|load [--file /mosquitto/data/mosquitto.db]
      Mosquitto's state (its persistence file) out to standard output, or in from
      standard input with the broker restarted on it (amf-sidecar state for more)

--model takes the name of an embedded model (%s; the default is %s)
or the path of a model file m.txt with its manifest m.manifest.json beside it.
An exact embedded name means that model, anything else is a path: ./%[2]s is a
file called %[2]s.

Feature windows come from the model's manifest (the default model's unless
--model is given): a model is only valid on features computed with the windows
it was trained with. The window flags
  --rate-window 5m   --deriv-window 10m   --step 5s   --lookback 5m
set the windows only for sample and replay without --model (defaults: the
default model's). Wherever a model is in use (run, score, sample/replay with
--model) they may only restate its windows: one that differs is refused.
`

// usageText is usage with the embedded models' names filled in.
func usageText() string {
	return fmt.Sprintf(usage, strings.Join(model.EmbeddedNames(), ", "), model.DefaultName)
}

// modelHelp starts every --model flag's help: what the flag accepts.
func modelHelp() string {
	return fmt.Sprintf("embedded model name (%s; default %s) or model file path (manifest beside it: <file>.manifest.json; ./NAME for a file named like an embedded model)",
		strings.Join(model.EmbeddedNames(), ", "), model.DefaultName)
}

type stdio struct {
	in       io.Reader
	out, err io.Writer
}

func main() {
	ctx, stop := signalContext()
	code := run(ctx, os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr})
	stop()
	os.Exit(code)
}

// signalContext ends at SIGTERM or SIGINT with the signal's name as its
// cause, so the sidecar's stopping signal says which one it got; a second
// signal then has its default effect.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			name := "SIGTERM"
			if s == syscall.SIGINT {
				name = "SIGINT"
			}
			signal.Stop(sigs)
			cancel(fmt.Errorf("received %s", name))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel(nil) }
}

func run(ctx context.Context, args []string, io stdio) int {
	if len(args) == 0 {
		fmt.Fprint(io.err, usageText())
		return exitUsage
	}
	cmds := map[string]func(context.Context, []string, stdio) int{
		"replay": runReplay,
		"sample": runSample,
		"run":    runRun,
		"score":  runScore,
		"state":  runState,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Fprint(io.out, usageText())
			return exitOK
		}
		fmt.Fprintf(io.err, "amf-sidecar: unknown command %q\n\n%s", args[0], usageText())
		return exitUsage
	}
	return cmd(ctx, args[1:], io)
}

// windowFlags are --rate-window, --deriv-window, --step and --lookback.
//
// The manifest of the model in use is authoritative for the windows, since a
// model is only valid on features computed the way its training features
// were. So where a model is in use (run, score, sample and replay with
// --model) the flags can only restate its windows, and one that differs is
// refused with the model's spec: silently ignoring it would let a user believe
// they changed the pipeline, and obeying it would feed the model features it
// was not trained on. Where no model is in use (sample and replay without
// --model: raw features, e.g. to check against PromQL) they set the windows;
// their defaults are the default embedded model's, so that by default every
// command computes the features the default model scores.
type windowFlags struct {
	cfg infer.Config
	fs  *flag.FlagSet
}

func registerWindowFlags(fs *flag.FlagSet) *windowFlags {
	w := &windowFlags{cfg: infer.DefaultConfig(), fs: fs}
	// The embedded model cannot fail to load in a tested build; if it did, the
	// published pipeline's windows (infer.DefaultConfig) are the same ones.
	if m, err := model.Default(); err == nil {
		mw := m.Windows()
		w.cfg.RateWindow, w.cfg.DerivWindow, w.cfg.Step, w.cfg.Lookback = mw.Rate, mw.Deriv, mw.SubqueryStep, mw.Lookback
	}
	const withModel = "; with a model, only its manifest's %s (a differing value is refused)"
	fs.DurationVar(&w.cfg.RateWindow, "rate-window", w.cfg.RateWindow, "range of rate()"+fmt.Sprintf(withModel, "rate_window"))
	fs.DurationVar(&w.cfg.DerivWindow, "deriv-window", w.cfg.DerivWindow, "range of the deriv() subquery"+fmt.Sprintf(withModel, "deriv_window"))
	fs.DurationVar(&w.cfg.Step, "step", w.cfg.Step, "subquery resolution (aligned to the epoch)"+fmt.Sprintf(withModel, "subquery_step"))
	fs.DurationVar(&w.cfg.Lookback, "lookback", w.cfg.Lookback, "instant-selector lookback"+fmt.Sprintf(withModel, "lookback"))
	return w
}

// forModel returns the feature pipeline m needs when sampling every interval
// (0 = the model's own sample interval, for commands that do not sample):
// detect.FeatureConfigGiven with the window flags given on the command line.
func (w *windowFlags) forModel(m *model.Model, interval time.Duration) (infer.Config, error) {
	if interval == 0 {
		interval = m.Windows().SampleInterval
	}
	var given []detect.GivenWindow
	w.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "rate-window":
			given = append(given, detect.GivenWindow{Name: "--" + f.Name, Window: detect.RateWindow, Value: w.cfg.RateWindow})
		case "deriv-window":
			given = append(given, detect.GivenWindow{Name: "--" + f.Name, Window: detect.DerivWindow, Value: w.cfg.DerivWindow})
		case "step":
			given = append(given, detect.GivenWindow{Name: "--" + f.Name, Window: detect.SubqueryStep, Value: w.cfg.Step})
		case "lookback":
			given = append(given, detect.GivenWindow{Name: "--" + f.Name, Window: detect.Lookback, Value: w.cfg.Lookback})
		}
	})
	return detect.FeatureConfigGiven(m, interval, given)
}

// loadGivenModel loads the model a tool (score, replay, sample) was given, an
// embedded name or a path (model.LoadNameOrPath), without the sidecar's
// fallback: the user asked for that model. "" is the default one. The model's
// warnings go to stderr.
func loadGivenModel(cmd, nameOrPath string, stderr io.Writer) (*model.Model, error) {
	m, err := model.LoadNameOrPath(nameOrPath)
	if err != nil {
		return nil, err
	}
	for _, w := range m.Warnings() {
		fmt.Fprintf(stderr, "amf-sidecar %s: warning: %s\n", cmd, w)
	}
	return m, nil
}

func newFlagSet(name string, io stdio) *flag.FlagSet {
	fs := flag.NewFlagSet("amf-sidecar "+name, flag.ContinueOnError)
	fs.SetOutput(io.err)
	return fs
}

func runReplay(_ context.Context, args []string, io stdio) int {
	fs := newFlagSet("replay", io)
	in := fs.String("in", "", "raw samples CSV (- for standard input)")
	modelPath := fs.String("model", "", modelHelp()+": compute the features with the windows of its manifest; the output stays on the plain scale, without the model's normalisation")
	windows := registerWindowFlags(fs)
	predictWindow := fs.Duration("predict-window", 0, "W of the memory projection predict_linear(memory_bytes[W], H) / limit * 100, written as a last column "+infer.ProjectionName+" (0: none); with a model, only its own (--model predict-linear)")
	predictHorizon := fs.Duration("predict-horizon", 0, "H of that projection")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if *in == "" || fs.NArg() > 0 {
		fmt.Fprintln(io.err, "amf-sidecar replay: --in FILE is required (- for standard input)")
		return exitUsage
	}
	cfg := windows.cfg
	cfg.PredictWindow, cfg.PredictHorizon = *predictWindow, *predictHorizon
	if *modelPath != "" {
		m, err := loadGivenModel("replay", *modelPath, io.err)
		if err == nil {
			cfg, err = windows.forModel(m, 0)
		}
		if err == nil && (*predictWindow != 0 || *predictHorizon != 0) && (*predictWindow != cfg.PredictWindow || *predictHorizon != cfg.PredictHorizon) {
			err = fmt.Errorf("%w: --predict-window %s --predict-horizon %s, model %s projects with %s and %s", detect.ErrWindowGiven,
				model.FormatDuration(*predictWindow), model.FormatDuration(*predictHorizon), m.Source(), model.FormatDuration(cfg.PredictWindow), model.FormatDuration(cfg.PredictHorizon))
		}
		if err != nil {
			fmt.Fprintf(io.err, "amf-sidecar replay: %v\n", err)
			return exitUsage
		}
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
	if err := detect.Replay(r, io.out, cfg); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar replay: %s: %v\n", *in, err)
		var ie *detect.InputError
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
