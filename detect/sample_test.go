package detect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
)

// scriptedSource returns its readings in order, then ends the test's context.
type scriptedSource struct {
	steps  []func() (cgroup.Stats, error)
	i      int
	cancel context.CancelFunc
}

func (s *scriptedSource) Read(context.Context) (cgroup.Stats, error) {
	if s.i >= len(s.steps) {
		s.cancel()
		return cgroup.Stats{}, context.Canceled
	}
	s.i++
	return s.steps[s.i-1]()
}

func reading(sec int, cpu float64) func() (cgroup.Stats, error) {
	return func() (cgroup.Stats, error) {
		return cgroup.Stats{Time: time.Unix(int64(sec), 0), CPUSeconds: cpu, MemoryBytes: 1 << 20, DiskBytes: 0}, nil
	}
}

func failure(err error) func() (cgroup.Stats, error) {
	return func() (cgroup.Stats, error) { return cgroup.Stats{}, err }
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runScript runs a sampler over the script with an always-ready tick channel and
// returns what emit saw.
func runScript(t *testing.T, steps ...func() (cgroup.Stats, error)) (recs []Record, errs []error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	src := &scriptedSource{steps: steps, cancel: cancel}
	s, err := NewSampler(src, infer.DefaultConfig(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ticks := make(chan time.Time)
	close(ticks) // every receive succeeds at once: one sample per script step
	err = s.Run(ctx, ticks, func(r Record, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return recs, errs
}

func TestSamplingGoesOnAfterTheTargetVanishes(t *testing.T) {
	gone := fmt.Errorf("read /sys/fs/cgroup/x: %w", cgroup.ErrGone)
	recs, errs := runScript(t, reading(100, 1), failure(gone), reading(102, 2), reading(103, 3))
	if len(errs) != 1 || !errors.Is(errs[0], cgroup.ErrGone) {
		t.Fatalf("errors = %v, want one ErrGone", errs)
	}
	if len(recs) != 3 {
		t.Fatalf("records = %d, want 3", len(recs))
	}
	// The windows survived the failure: the rate spans all three readings.
	if v := recs[2].Features; v.Why[contract.CPUPercent] != infer.Defined {
		t.Fatalf("cpu_percent after the failure is undefined: %v", v.Why[contract.CPUPercent])
	}
}

func TestClockSteppingBackRestartsTheWindows(t *testing.T) {
	recs, errs := runScript(t, reading(1000, 1), reading(1001, 2), reading(500, 3), reading(501, 4))
	if len(errs) != 0 {
		t.Fatalf("errors = %v, want none", errs)
	}
	if why := recs[2].Features.Why[contract.CPUPercent]; why != infer.TooFewSamples {
		t.Fatalf("first sample after the step back: cpu_percent %v, want a fresh window", why)
	}
	if why := recs[3].Features.Why[contract.CPUPercent]; why != infer.Defined {
		t.Fatalf("second sample after the step back: cpu_percent %v", why)
	}
}
