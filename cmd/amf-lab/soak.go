package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/soak"
	"github.com/amf-edge/amf/lab/testbed"
)

// runSoak is `amf-lab soak`: a seeded schedule of the lab's faults on
// three nodes, the history checked at the end. Its exit status is 1 if the
// checker found a violation.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var defaults []string
	for _, k := range soak.DefaultPairs() {
		defaults = append(defaults, string(k))
	}
	defaultPairs := strings.Join(defaults, ",")
	fs := flag.NewFlagSet("amf-lab soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 10*time.Minute, "how long faults are begun (the last one runs to its end)")
	seed := fs.Uint64("seed", 1, "the schedule's seed: the same seed gives the same faults in the same order")
	faults := fs.String("faults", "", "comma-separated kinds of fault to draw from (default: all of "+joinKinds()+")")
	pairs := fs.String("pairs", defaultPairs, "the broker pairs, comma-separated: sidecar (watched by its sidecars), node (node mode) or state (a sidecar pair handing its broker state over); each has its own namespace, remote brokers, probe and clients")
	clientWait := fs.Duration("client-wait", 2*time.Minute, "after a fault that takes the primary away, the longest wait for its clients to be served by the new one (negative: no clients)")
	out := fs.String("out", "", "write the run's history (history.json) and the agents' logs here (default: a temporary folder, removed unless the run failed)")
	verbose := fs.Bool("v", false, "log the nodes and the control plane to standard error")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	kinds, err := soak.ParseKinds(*faults)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab soak: --faults: %v\n", err)
		return 2
	}
	kindsOfPairs, err := soak.ParsePairs(*pairs)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab soak: --pairs: %v\n", err)
		return 2
	}
	if *duration <= 0 {
		fmt.Fprintf(stderr, "amf-lab soak: --duration %v: want a positive duration, e.g. 10m or 2h\n", *duration)
		return 2
	}
	if err := kubenode.Check(); err != nil {
		fmt.Fprintf(stderr, "amf-lab soak: cannot run lab nodes here: %v\n", err)
		return 1
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab soak: %v\n", err)
		return 1
	}
	dir, keep := *out, *out != ""
	if dir == "" {
		if dir, err = os.MkdirTemp("", "amf-lab-soak-"); err != nil {
			fmt.Fprintf(stderr, "amf-lab soak: %v\n", err)
			return 1
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "amf-lab soak: --out: %v\n", err)
		return 1
	}
	defer func() {
		if keep {
			fmt.Fprintf(stderr, "the run's files are in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	cfg := soak.Config{Duration: *duration, Seed: *seed, Kinds: kinds, Repo: repo, WorkDir: dir, Bounds: soak.DefaultBounds(), Pairs: kindsOfPairs,
		ClientWait: *clientWait, Progress: stderr}
	if *verbose {
		cfg.Log = func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }
	} else {
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	h, err := soak.Run(ctx, cfg)
	if err != nil && len(h.Faults) == 0 {
		fmt.Fprintf(stderr, "amf-lab soak: %v\n", err)
		keep = true
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab soak: the run was cut short (%v); what it saw is checked\n", err)
	}
	vs, falseActions := soak.Check(h, cfg.Bounds)
	rep := soak.Figures(h, vs, falseActions, *clientWait)
	if b, err := json.MarshalIndent(h, "", "  "); err == nil {
		if err := os.WriteFile(filepath.Join(dir, "history.json"), b, 0o644); err != nil {
			fmt.Fprintf(stderr, "amf-lab soak: the history: %v\n", err)
		}
	}
	for _, v := range vs {
		fmt.Fprintf(stdout, "VIOLATION %s\n", v)
		for _, a := range v.Around {
			fmt.Fprintf(stdout, "    %s\n", a)
		}
	}
	fmt.Fprintf(stdout, "replay: amf-lab soak --seed %d --duration %v", *seed, *duration)
	if *faults != "" {
		fmt.Fprintf(stdout, " --faults %s", *faults)
	}
	if *pairs != defaultPairs {
		fmt.Fprintf(stdout, " --pairs %s", *pairs)
	}
	fmt.Fprintln(stdout)
	b, _ := json.Marshal(rep)
	fmt.Fprintln(stdout, string(b))
	if len(vs) > 0 || err != nil {
		keep = true
		return 1
	}
	return 0
}

func joinKinds() string {
	s := ""
	for i, k := range soak.Kinds() {
		if i > 0 {
			s += ","
		}
		s += string(k)
	}
	return s
}
