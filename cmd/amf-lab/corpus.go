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
	leadIn := fs.Duration("lead-in", 0, "lengthen every run's quiet baseline by this, so the feature windows are full when the load begins (e.g. 10m for 5m/10m windows)")
	appendRuns := fs.Bool("append", false, "add the runs to the corpus already in --out (refuses run IDs it has, another header, seed or lead-in)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var only []string
	if *families != "" {
		only = strings.Split(*families, ",")
	}
	if *list {
		plan, err := corpus.Plan(*seed, *runs, only...)
		if err != nil {
			fmt.Fprintf(stderr, "amf-lab corpus: %v\n", err)
			return 2
		}
		for _, r := range plan {
			if r, err = r.LeadIn(*leadIn); err != nil {
				fmt.Fprintf(stderr, "amf-lab corpus: %v\n", err)
				return 2
			}
			fmt.Fprintf(stdout, "%s\t%v\t%s", r.ID, r.Profile.Duration(), r.Profile)
			if len(r.Traffic) > 0 {
				fmt.Fprintf(stdout, "\ttraffic %s", r.Traffic)
			}
			fmt.Fprintln(stdout)
		}
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
	res, err := experiment.Corpus(ctx, experiment.CorpusConfig{
		Seed: *seed, PerFamily: *runs, Families: only, Parallel: *parallel, Horizon: *horizon, LeadIn: *leadIn, Append: *appendRuns,
		Base: experiment.Config{Out: *out, Bin: bins, Progress: stderr,
			Log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))},
	})
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

func familyNames() string {
	var n []string
	for _, f := range corpus.Families {
		n = append(n, f.Name)
	}
	return strings.Join(n, ", ")
}
