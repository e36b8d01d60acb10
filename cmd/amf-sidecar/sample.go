package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/internal/exitcode"
)

func runSample(ctx context.Context, args []string, io stdio) int {
	fs := newFlagSet("sample", io)
	pid := fs.Int("pid", 0, "sample the cgroup of this process")
	path := fs.String("cgroup-path", "", "sample this cgroup directory")
	interval := fs.Duration("interval", time.Second, intervalHelp)
	modelPath := fs.String("model", "", modelHelp()+": compute the features with the windows of its manifest, refusing an --interval slower than its sample_interval; plain scale, without its normalisation")
	windows := registerWindowFlags(fs)
	memoryRef := registerMemoryReference(fs)
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if (*pid == 0) == (*path == "") || fs.NArg() > 0 {
		fmt.Fprintln(io.err, "amf-sidecar sample: give exactly one of --pid N or --cgroup-path P")
		return exitUsage
	}
	if *interval <= 0 {
		fmt.Fprintln(io.err, "amf-sidecar sample: --interval must be positive")
		return exitUsage
	}
	cfg := windows.cfg
	if *modelPath != "" {
		m, err := loadGivenModel("sample", *modelPath, io.err)
		if err == nil {
			cfg, err = windows.forModel(m, *interval)
		}
		if err != nil {
			fmt.Fprintf(io.err, "amf-sidecar sample: %v\n", err)
			return exitUsage
		}
	}
	log := slog.New(slog.NewTextHandler(io.err, nil))

	var src cgroup.Reader
	var err error
	if *pid != 0 {
		src, err = cgroup.ForPID(*pid)
	} else {
		src, err = cgroup.Open(*path)
	}
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar sample: %v\n", err)
		return exitFail
	}
	s, err := detect.NewSampler(src, cfg, log)
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar sample: %v\n", err)
		return exitUsage
	}
	// As run does: without a limit of its own, memory_percent is relative to
	// what bounds the target (sidecar.Config.MemoryReference); a reading with
	// a limit uses it.
	ref := memoryRef.ref
	if ref == nil {
		r, err := src.MemoryReference()
		if err != nil {
			fmt.Fprintf(io.err, "amf-sidecar sample: %v\n", err)
			return exitFail
		}
		ref = &r
	}
	s.SetMemoryReference(ref.Bytes)
	log.Info("memory_percent reference", "bytes", ref.Bytes, "source", ref.Source, "why", ref.Why)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	err = s.Run(ctx, tick.C, func(rec detect.Record, err error) error {
		if err != nil {
			// A process never comes back; a cgroup path may be recreated by a restart.
			if errors.Is(err, cgroup.ErrGone) && *pid != 0 {
				return err
			}
			log.Error("sample failed; retrying at the next interval", "target", src, "err", err)
			return nil
		}
		line, err := detect.MarshalRecord(rec)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(io.out, "%s\n", line)
		return err
	})
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar sample: %v\n", err)
		return exitFail
	}
	return exitOK
}
