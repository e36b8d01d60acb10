package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/sidecar/cgroup"
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

// busyEnv makes this test binary a busy child instead of running the tests:
// a process to sample that needs nothing but the binary (no shell), so that
// it also runs in the initramfs of make test-cgroup2.
const busyEnv = "AMF_SIDECAR_TEST_BUSY"

func TestMain(m *testing.M) {
	if os.Getenv(busyEnv) == "1" {
		for n := 0; ; n++ { // burn CPU until killed
			runtime.KeepAlive(n)
		}
	}
	os.Exit(m.Run())
}

func TestSamplingARealProcess(t *testing.T) {
	// A busy child process, sampled from outside as the sidecar samples a broker.
	// AMF_TEST_EXEC_WRAPPER runs it under an emulator (make test-arm64).
	name, args := os.Args[0], []string{"-test.run=^$"}
	if w := os.Getenv("AMF_TEST_EXEC_WRAPPER"); w != "" {
		name, args = w, append([]string{os.Args[0]}, args...)
	}
	busy := exec.Command(name, args...)
	busy.Env = append(os.Environ(), busyEnv+"=1")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	src, err := cgroup.ForPID(busy.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSampler(src, infer.DefaultConfig(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	var last Record
	// Read until two readings are far enough apart in time for a rate; the
	// ticker only spaces them, the assertion does not depend on its period.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < 3; i++ {
		if last, err = s.Sample(t.Context()); err != nil {
			t.Fatal(err)
		}
		<-tick.C
	}
	v := last.Features
	if v.Why[contract.CPUPercent] != infer.Defined || !(v.Values[contract.CPUPercent] > 0) {
		t.Fatalf("cpu_percent of a busy process = %v (%v)", v.Values[contract.CPUPercent], v.Why[contract.CPUPercent])
	}
	if !(v.Values[contract.MemoryPercent] > 0) {
		t.Fatalf("memory_percent = %v", v.Values[contract.MemoryPercent])
	}
	line, err := MarshalRecord(last)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"cpu_percent":`, `"cpu_growth_rate":null`, `"undefined":{`, `"raw":{`} {
		if !strings.Contains(string(line), want) {
			t.Errorf("JSON line lacks %s: %s", want, line)
		}
	}
}
