package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/lab/proc"
)

// FeaturesConfig configures RunFeatures.
type FeaturesConfig struct {
	// Profile is the load, in lab/stress's SPEC (amf-lab stress --profile).
	Profile string
	// Interval is the sampling interval; default 1 s.
	Interval time.Duration
	// Limit is the load cgroup's memory limit in bytes, what memory_percent
	// is relative to; default 256 MiB.
	Limit int64
	// Model names the embedded model whose windows the features are
	// computed with; default model.DefaultName.
	Model string
	// Self is the amf-lab binary that runs the load (its stress command);
	// default this process's executable.
	Self string
	// Dir holds the load's log; default a temporary folder, removed.
	Dir string
}

// FeatureSample is one sample of RunFeatures: what the sidecar's readers
// made of the load's cgroup, and the load's own CPU time by another
// interface (/proc/<pid>/stat, 10 ms ticks), which the cgroup's CPU
// counter must agree with on any host.
type FeatureSample struct {
	Record  detect.Record
	LoadCPU time.Duration
}

// RunFeatures replays a load and samples it as the sidecar does: the load
// generator (amf-lab stress) in a cgroup of its own with a memory limit
// (cgroup v1: the cpuacct, memory and blkio hierarchies; v2: one
// directory), read by package cgroup every Interval and turned into the six
// features by detect.Sampler, until the profile ends. emit gets every
// record (detect.MarshalRecord renders it as amf-sidecar sample does). The
// same load on two hosts, a cgroup v1 node and a cgroup v2 one, gives what
// their readers make of it side by side. Root only; the cgroups and the
// load go when it returns, and with it if it is killed (Pdeathsig; the next
// run removes the empty cgroups).
func RunFeatures(ctx context.Context, cfg FeaturesConfig, emit func(FeatureSample) error) error {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 256 << 20
	}
	if cfg.Model == "" {
		cfg.Model = model.DefaultName
	}
	if cfg.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench features: %w", err)
		}
		cfg.Self = self
	}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "amf-bench-features-")
		if err != nil {
			return fmt.Errorf("bench features: %w", err)
		}
		defer os.RemoveAll(d)
		cfg.Dir = d
	}
	m, err := model.Embedded(cfg.Model)
	if err != nil {
		return fmt.Errorf("bench features: %w", err)
	}
	fc, err := detect.FeatureConfig(m, cfg.Interval)
	if err != nil {
		return fmt.Errorf("bench features: %w", err)
	}
	root, err := newBenchCgroupRoot()
	if err != nil {
		return err
	}
	root.memLimit = cfg.Limit
	defer root.remove()
	p := &nodeModePod{uid: "features"}
	// A shell moves itself into the cgroups before it becomes the load
	// generator, so that nothing of the load is charged elsewhere first.
	start := func(p *nodeModePod) (*proc.Proc, error) {
		args := []string{"-c", `p="$1"; shift; for f in "$@"; do echo $$ > "$f" || exit 1; done; exec "$0" stress --profile "$p"`, cfg.Self, cfg.Profile}
		for _, b := range root.bases {
			args = append(args, filepath.Join(b, root.containerRel(p), "cgroup.procs"))
		}
		return proc.Start("load", filepath.Join(cfg.Dir, "load.log"), nil, "/bin/sh", args...)
	}
	if err := root.addContainer(p, start); err != nil {
		return err
	}
	dir, _ := root.memoryDir(p)
	src, err := cgroup.Open(dir)
	if err != nil {
		return fmt.Errorf("bench features: %w", err)
	}
	s, err := detect.NewSampler(src, fc, slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("bench features: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.proc.Done(): // the profile ended (or the load failed)
		case <-sctx.Done():
		}
		cancel()
	}()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	err = s.Run(sctx, tick.C, func(rec detect.Record, err error) error {
		if err != nil {
			return err
		}
		cpu, _, err := proc.Usage(p.proc.PID())
		if err != nil {
			return fmt.Errorf("the load's /proc stat: %w", err)
		}
		return emit(FeatureSample{Record: rec, LoadCPU: cpu})
	})
	if err != nil && !errors.Is(err, cgroup.ErrGone) {
		return fmt.Errorf("bench features: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-p.proc.Done():
	default:
		return nil // the sampling ended first: the load is stopped with its cgroup
	}
	if perr := p.proc.Err(); perr != nil {
		return fmt.Errorf("bench features: the load (%s): %w\n%s", cfg.Profile, perr, proc.LogTail(filepath.Join(cfg.Dir, "load.log"), 4<<10))
	}
	return nil
}

// WriteFeatures is RunFeatures with each sample written to w as one JSON
// line: {"load_cpu_seconds": …, "sample": amf-sidecar sample's record}.
func WriteFeatures(ctx context.Context, cfg FeaturesConfig, w io.Writer) error {
	return RunFeatures(ctx, cfg, func(fs FeatureSample) error {
		b, err := MarshalFeatureSample(fs)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	})
}

// MarshalFeatureSample renders one sample as WriteFeatures writes it.
func MarshalFeatureSample(fs FeatureSample) ([]byte, error) {
	rec, err := detect.MarshalRecord(fs.Record)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		LoadCPU float64         `json:"load_cpu_seconds"`
		Sample  json.RawMessage `json:"sample"`
	}{fs.LoadCPU.Seconds(), rec})
}
