package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/bench"
)

// benchFeatures is `amf-lab bench features`: a load replayed in a cgroup
// of its own and sampled as the sidecar samples (lab/bench.RunFeatures).
func benchFeatures(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab bench features", flag.ContinueOnError)
	fs.SetOutput(stderr)
	profile := fs.String("profile", "", "the load, as amf-lab stress --profile takes it (required)")
	interval := fs.Duration("interval", time.Second, "sampling interval")
	limit := fs.String("limit", "256Mi", "the load cgroup's memory limit (memory_percent is relative to it)")
	modelName := fs.String("model", "", "the embedded model whose windows the features use (default: the default model's)")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	q, err := resource.ParseQuantity(*limit)
	if *profile == "" || *interval <= 0 || err != nil || q.Value() <= 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "amf-lab bench features: --profile SPEC is required; --interval and --limit (e.g. 256Mi) must be positive; no arguments")
		return exitcode.Usage
	}
	err = bench.WriteFeatures(ctx, bench.FeaturesConfig{Profile: *profile, Interval: *interval, Limit: q.Value(), Model: *modelName}, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench features: %v\n", err)
		return exitcode.Failure
	}
	return exitcode.OK
}
