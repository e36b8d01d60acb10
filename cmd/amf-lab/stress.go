package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/stress"
)

const stressUsage = `amf-lab stress --profile SPEC [--scale F] [--verbose]

Holds memory and burns CPU phase by phase: the load generator of the staged
fault injector. Start it inside the broker container's cgroup (as kubectl exec
does); it never touches cgroups and never recovers anything: a phase over the
container's memory limit ends with the kernel OOM-killing it, by design.

SPEC is phases separated by ';', each DURATION[:key=value,...]:
  mem=SIZE      memory held (60Mi, 1.5Gi, 100M; default 0 = release)
  ramp=SIZE/s   growth rate towards mem (default 0 = at once)
  cpu=CORES     CPU burnt (0.4 or 400m; default 0)
e.g. the paper's staged fault after a 60 s baseline:
  --profile '60s;120s:mem=60Mi,cpu=0.4;60s:mem=150Mi,ramp=10Mi/s'

Stdout: one JSON line per phase start, and one when the profile ends:
  {"event":"phase","time":"…","phase":2,"phases":3,"duration_s":120,"mem_bytes":62914560,"ramp_bytes_per_s":0,"cpu":0.4}
  {"event":"done","time":"…"}

Flags:
`

// phaseLine is the line `amf-lab stress` prints when a phase starts.
type phaseLine struct {
	Event    string    `json:"event"` // "phase"
	Time     time.Time `json:"time"`
	Phase    int       `json:"phase"` // 1-based
	Phases   int       `json:"phases"`
	Duration float64   `json:"duration_s"` // after --scale
	Memory   int64     `json:"mem_bytes"`
	Ramp     int64     `json:"ramp_bytes_per_s"`
	CPU      float64   `json:"cpu"`
}

// doneLine is the line printed when the profile has ended and everything is
// released.
type doneLine struct {
	Event string    `json:"event"` // "done"
	Time  time.Time `json:"time"`
}

// runStress implements `amf-lab stress`. It returns flag.ErrHelp for -h (usage
// already printed to stderr), ctx's error (wrapped) when ctx ends before the
// profile does, and otherwise errors meant to be printed after "amf-lab stress: "
// (a bad flag's error is already printed by the flag package).
func runStress(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("amf-lab stress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, stressUsage)
		fs.PrintDefaults()
	}
	spec := fs.String("profile", "", "the phases (syntax above); required")
	scale := fs.Float64("scale", 1, "multiply every phase's duration (0.1: ten times faster); sizes, rates and CPU are unchanged")
	verbose := fs.Bool("verbose", false, "print every change of the memory held to stderr")
	memfile := fs.Bool("memory-file", false, "hold the memory in a memory file (shmem: charged to the cgroup, outside this process's RSS), and lower this process's oom_score_adj as far as allowed, so that on cgroup v1 the kernel's OOM killer ends the container's main process, not the injector (as cgroup v2's memory.oom.group ends the whole container)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return exitcode.UsageErr(err)
	}
	if fs.NArg() > 0 {
		return exitcode.Usagef("unexpected argument %q (the profile goes in --profile)", fs.Arg(0))
	}
	if *spec == "" {
		return exitcode.Usagef("--profile is required, e.g. --profile '60s;120s:mem=60Mi,cpu=0.4;60s:mem=150Mi'")
	}
	p, err := stress.ParseProfile(*spec)
	if err != nil {
		return exitcode.Usagef("--profile: %w", err)
	}
	if p, err = p.Scale(*scale); err != nil {
		return exitcode.Usagef("--scale: %w", err)
	}

	enc := json.NewEncoder(stdout)
	// A lost stdout (the runner's exec stream gone) must not change the load:
	// keep going and report the write error at the end.
	var writeErr error
	emit := func(l any) {
		if err := enc.Encode(l); err != nil && writeErr == nil {
			writeErr = err
		}
	}
	phase := 0
	var opts []stress.Option
	if *memfile {
		opts = append(opts, stress.InMemoryFile())
		// The OOM killer ranks by RSS plus oom_score_adj: an exec'd injector
		// has the container's adj (≈ 999 when Burstable) and this binary's
		// pages outweigh a small broker's. Lowering is allowed down to the
		// floor the runtime set (0 where the runtime lacks CAP_SYS_RESOURCE,
		// as on this lab's VM); where it is refused, say so.
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0); err != nil {
			fmt.Fprintf(stderr, "amf-lab stress: lower oom_score_adj: %v (the OOM killer may end this process rather than the container's main one)\n", err)
		}
	}
	err = stress.Run(ctx, p, func(s stress.Status) {
		switch {
		case s.Done:
			emit(doneLine{Event: "done", Time: time.Now().UTC()})
			return
		case s.Phase != phase:
			phase = s.Phase
			ph := p.Phases[s.Phase-1]
			emit(phaseLine{Event: "phase", Time: s.PhaseStart.UTC(), Phase: s.Phase, Phases: s.Phases,
				Duration: ph.Duration.Seconds(), Memory: ph.Memory, Ramp: ph.Ramp, CPU: ph.CPU})
		}
		if *verbose {
			fmt.Fprintf(stderr, "%s phase %d/%d held %d of %d bytes, cpu %g\n",
				time.Now().UTC().Format(time.RFC3339Nano), s.Phase, s.Phases, s.Held, s.Target, s.CPU)
		}
	}, opts...)
	if err != nil {
		return err
	}
	if writeErr != nil {
		return fmt.Errorf("writing to stdout: %w", writeErr)
	}
	return nil
}
