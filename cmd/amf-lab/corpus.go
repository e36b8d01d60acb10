package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/corpus"
	"github.com/amf-edge/amf/lab/experiment"
)

func runCorpus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab corpus", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Uint64("seed", 1, "seed of the plan: the same seed, runs and families give the same profiles")
	runs := fs.Int("runs", 1, "runs per family")
	families := fs.String("families", "", "comma-separated families (default all): "+familyNames())
	parallel := fs.Int("parallel", 2, "runs loading the machine at once (one broker container each)")
	pods := fs.Int("pods", 0, "brokers at once (default 4 × --parallel): the others are in their quiet lead-ins, each started so that its load begins as a --parallel slot comes free")
	horizon := fs.Duration("horizon", 120*time.Second, "label a sample 1 when the failure comes within this")
	out := fs.String("out", "", "output folder: corpus.csv.gz, runs.json (required)")
	list := fs.Bool("list", false, "print the plan and exit")
	var leadIn corpus.LeadIn
	fs.Var(&leadIn, "lead-in", "lengthen each run's quiet baseline by this, so the feature windows have an age when the load begins: "+
		"D for every run (10m: full 5m/10m windows) or MIN-MAX drawn per run from its seed (0-10m: windows of every age)")
	scale := fs.Float64("scale", 1, "multiply every phase's and burst's duration by this (not the lead-in; ramp rates are kept, so a shortened ramp may stop short)")
	appendRuns := fs.Bool("append", false, "add the runs to the corpus already in --out (refuses run IDs it has, another header, seed or --lead-in)")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	var only []string
	if *families != "" {
		only = strings.Split(*families, ",")
	}
	if *scale <= 0 {
		fmt.Fprintf(stderr, "amf-lab corpus: --scale %g: want a factor above 0 (0.5 halves every phase)\n", *scale)
		return 2
	}
	if *parallel <= 0 || *pods < 0 {
		fmt.Fprintf(stderr, "amf-lab corpus: --parallel %d, --pods %d: want at least 1 run at once (--pods 0: 4 × --parallel)\n", *parallel, *pods)
		return 2
	}
	if *pods == 0 {
		*pods = 4 * *parallel
	}
	cc := experiment.CorpusConfig{Seed: *seed, PerFamily: *runs, Families: only, Parallel: *parallel, Pods: *pods, Horizon: *horizon,
		Scale: *scale, LeadIn: leadIn, Append: *appendRuns}
	if *list {
		plan, err := cc.Plan()
		if err != nil {
			fmt.Fprintf(stderr, "amf-lab corpus: %v\n", err)
			return 2
		}
		printPlan(stdout, plan, *parallel, *pods)
		return 0
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "amf-lab corpus: --out DIR is required, no arguments")
		return 2
	}
	bins, err := bench.FindBinaries()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab corpus: %v\n", err)
		return 1
	}
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	cc.Base = experiment.Config{Out: *out, Bin: bins, Progress: stderr,
		Log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	res, err := experiment.Corpus(ctx, cc)
	failed := 0
	for _, r := range res {
		if r.Error != "" {
			failed++
		}
	}
	fmt.Fprintf(stdout, "%d runs (%d with errors) in %s\n", len(res), failed, *out)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab corpus: %v\n", err)
		return 1
	}
	return 0
}

// printPlan writes one line per run (id, planned length with the lead-in,
// lead-in, profile, traffic), a line with the totals, and one with the
// recording's time on parallel slots and pods brokers if every run lasts
// its planned length (a failing one ends at its kill, sooner) plus the
// pod's start.
func printPlan(w io.Writer, plan []corpus.Run, parallel, pods int) {
	var total, lead time.Duration
	for _, r := range plan {
		fmt.Fprintf(w, "%s\t%v\tlead-in %v\t%s", r.ID, r.Profile.Duration(), r.LeadIn, r.Profile)
		if len(r.Traffic) > 0 {
			fmt.Fprintf(w, "\ttraffic %s", r.Traffic)
		}
		fmt.Fprintln(w)
		total += r.Profile.Duration()
		lead += r.LeadIn
	}
	if len(plan) > 0 {
		fmt.Fprintf(w, "# %d runs, %v planned in all: %v of profiles, %v of lead-ins (mean %v a run)\n",
			len(plan), total, total-lead, lead, (lead / time.Duration(len(plan))).Round(time.Second))
		fmt.Fprintf(w, "# recording: about %v with --parallel %d --pods %d (a run's load is timed to begin as a slot comes free; %v with --pods %d, one after the other on each slot)\n",
			corpus.Estimate(plan, parallel, pods, podStart).Round(time.Minute), parallel, pods,
			corpus.Estimate(plan, parallel, parallel, podStart).Round(time.Minute), parallel)
	}
}

// podStart is a broker Deployment's usual time to Ready on the lab node,
// for printPlan's estimate.
const podStart = 15 * time.Second

func familyNames() string {
	var n []string
	for _, f := range corpus.Families {
		n = append(n, f.Name)
	}
	return strings.Join(n, ", ")
}
