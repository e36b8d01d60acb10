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
	parallel := fs.Int("parallel", 2, "runs at once (one broker container each)")
	horizon := fs.Duration("horizon", 120*time.Second, "label a sample 1 when the failure comes within this")
	out := fs.String("out", "", "output folder: corpus.csv.gz, runs.json (required)")
	list := fs.Bool("list", false, "print the plan and exit")
	var leadIn corpus.LeadIn
	fs.Var(&leadIn, "lead-in", "lengthen each run's quiet baseline by this, so the feature windows have an age when the load begins: "+
		"D for every run (10m: full 5m/10m windows) or MIN-MAX drawn per run from its seed (0-10m: windows of every age)")
	scale := fs.Float64("scale", 1, "multiply every phase's and burst's duration by this (not the lead-in; ramp rates are kept, so a shortened ramp may stop short)")
	appendRuns := fs.Bool("append", false, "add the runs to the corpus already in --out (refuses run IDs it has, another header, seed or --lead-in)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var only []string
	if *families != "" {
		only = strings.Split(*families, ",")
	}
	if *scale <= 0 {
		fmt.Fprintf(stderr, "amf-lab corpus: --scale %g: want a factor above 0 (0.5 halves every phase)\n", *scale)
		return 2
	}
	cc := experiment.CorpusConfig{Seed: *seed, PerFamily: *runs, Families: only, Parallel: *parallel, Horizon: *horizon,
		Scale: *scale, LeadIn: leadIn, Append: *appendRuns}
	if *list {
		plan, err := cc.Plan()
		if err != nil {
			fmt.Fprintf(stderr, "amf-lab corpus: %v\n", err)
			return 2
		}
		printPlan(stdout, plan)
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
// lead-in, profile, traffic) and a last line with the totals, from which the
// recording's machine time follows: a run lasts its planned length (a failing
// one ends at its kill, sooner) plus the pod's start and 10 s.
func printPlan(w io.Writer, plan []corpus.Run) {
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
	}
}

func familyNames() string {
	var n []string
	for _, f := range corpus.Families {
		n = append(n, f.Name)
	}
	return strings.Join(n, ", ")
}
