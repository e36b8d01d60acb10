package detect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
)

// Source reads a target's raw counters and gauges; cgroup.Reader is the real one.
type Source interface {
	Read(ctx context.Context) (cgroup.Stats, error)
}

// Record is one sample: what was read and the features it gives.
type Record struct {
	Stats    cgroup.Stats
	Features infer.Vector
}

// Sampler reads a Source and keeps the feature windows.
type Sampler struct {
	src Source
	eng *infer.Engine
	log *slog.Logger
	// memRef is memory_percent's reference for readings without a memory
	// limit (bytes; 0: the engine's Config.MemoryReference). See SetMemoryReference.
	memRef float64
}

// SetMemoryReference sets what memory_percent is relative to when a reading
// has no memory limit (cgroup.Reader's MemoryReference says what bounds the
// target then).
func (s *Sampler) SetMemoryReference(bytes float64) { s.memRef = bytes }

// SetSource makes src the target (a rediscovered container has a new
// cgroup); the windows are kept.
func (s *Sampler) SetSource(src Source) { s.src = src }

// HasSource reports whether there is a target to read.
func (s *Sampler) HasSource() bool { return s.src != nil }

// NewSampler returns a sampler with feature windows cfg.
func NewSampler(src Source, cfg infer.Config, log *slog.Logger) (*Sampler, error) {
	eng, err := infer.NewEngine(cfg)
	if err != nil {
		return nil, err
	}
	return &Sampler{src: src, eng: eng, log: log}, nil
}

// Sample reads once and evaluates the features at the reading's time. Errors from
// the source are returned as they are (errors.Is(err, cgroup.ErrGone) when the
// target vanished); the windows are kept, so sampling can go on after a failure.
func (s *Sampler) Sample(ctx context.Context) (Record, error) {
	st, err := s.src.Read(ctx)
	if err != nil {
		return Record{}, err
	}
	smp := ToSample(st)
	if !(smp.MemoryLimitBytes > 0) && s.memRef > 0 {
		smp.MemoryLimitBytes = s.memRef
	}
	if err := s.eng.Add(smp); errors.Is(err, infer.ErrOutOfOrder) {
		// The wall clock stepped back (NTP on a board without RTC): windows over
		// time that ran twice mean nothing, so start them again.
		s.log.Warn("clock stepped backwards; feature windows restart", "err", err)
		s.eng.Reset()
		if err := s.eng.Add(smp); err != nil {
			return Record{}, err
		}
	} else if err != nil {
		return Record{}, err
	}
	v, err := s.eng.Eval(smp.T)
	if err != nil {
		return Record{}, err
	}
	return Record{Stats: st, Features: v}, nil
}

// ToSample converts a cgroup reading to a feature sample. A network counter that
// could not be read becomes "no point" rather than a false zero.
func ToSample(st cgroup.Stats) infer.Sample {
	net := st.NetworkBytes
	if !st.HasNetwork {
		net = math.NaN()
	}
	return infer.Sample{
		T:                st.Time.UnixMilli(),
		CPUSeconds:       st.CPUSeconds,
		MemoryBytes:      st.MemoryBytes,
		MemoryLimitBytes: st.MemoryLimitBytes,
		NetworkBytes:     net,
		DiskBytes:        st.DiskBytes,
	}
}

// Run samples at once and then on every tick until ctx ends, handing each result
// to emit. A sampling error is handed to emit too; Run stops when emit returns an
// error, and returns it.
func (s *Sampler) Run(ctx context.Context, ticks <-chan time.Time, emit func(Record, error) error) error {
	for {
		rec, err := s.Sample(ctx)
		if ctx.Err() != nil {
			return nil // ended while reading: not a failed sample
		}
		if err := emit(rec, err); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
	}
}

// MarshalRecord renders a record as one JSON object: raw values, features (null when
// undefined) and why each undefined feature is undefined.
func MarshalRecord(rec Record) ([]byte, error) {
	type raw struct {
		CPUSeconds       float64  `json:"cpu_seconds_total"`
		MemoryBytes      float64  `json:"memory_bytes"`
		MemoryLimitBytes float64  `json:"memory_limit_bytes"`
		NetworkBytes     *float64 `json:"network_bytes_total"`
		DiskBytes        float64  `json:"disk_bytes_total"`
	}
	out := struct {
		Time      time.Time           `json:"time"`
		Raw       raw                 `json:"raw"`
		Features  map[string]*float64 `json:"features"`
		Undefined map[string]string   `json:"undefined,omitempty"`
	}{
		Time: rec.Stats.Time,
		Raw: raw{
			CPUSeconds:       rec.Stats.CPUSeconds,
			MemoryBytes:      rec.Stats.MemoryBytes,
			MemoryLimitBytes: rec.Stats.MemoryLimitBytes,
			DiskBytes:        rec.Stats.DiskBytes,
		},
		Features: make(map[string]*float64, contract.NumFeatures),
	}
	if rec.Stats.HasNetwork {
		out.Raw.NetworkBytes = &rec.Stats.NetworkBytes
	}
	for i, name := range contract.FeatureNames() {
		if rec.Features.Why[i] != infer.Defined {
			out.Features[name] = nil
			if out.Undefined == nil {
				out.Undefined = make(map[string]string)
			}
			out.Undefined[name] = rec.Features.Why[i].String()
			continue
		}
		v := rec.Features.Values[i]
		out.Features[name] = &v
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode sample: %w", err)
	}
	return b, nil
}
