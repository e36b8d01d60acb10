package detect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/podsignal"
)

// synthSource is a target on a synthetic clock: one reading per second from
// t0, memory fixed, CPU ticking along. Gone makes the next reads fail as a
// vanished container's.
type synthSource struct {
	memory float64
	ramp   float64 // bytes added to memory at every read
	limit  float64 // 0: 100 MiB
	t0     time.Time
	n      int
	gone   bool
}

func (s *synthSource) Read(context.Context) (cgroup.Stats, error) {
	if s.gone {
		return cgroup.Stats{}, fmt.Errorf("read x: %w", cgroup.ErrGone)
	}
	s.n++
	s.memory += s.ramp
	limit := s.limit
	if limit == 0 {
		limit = 100 << 20
	}
	return cgroup.Stats{Time: s.t0.Add(time.Duration(s.n) * time.Second), CPUSeconds: 0.01 * float64(s.n),
		MemoryBytes: s.memory, MemoryLimitBytes: limit, HasNetwork: true}, nil
}

func newPipeline(t *testing.T, src Source) *Pipeline {
	t.Helper()
	p, err := NewPipeline(PipelineConfig{Model: p1Model(t), Interval: time.Second, Source: src})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run samples p n times and returns the messages it would send.
func run(t *testing.T, p *Pipeline, n int) []podsignal.Message {
	var out []podsignal.Message
	for range n {
		st := p.Sample(t.Context())
		if st.Err != nil {
			t.Errorf("sample: %v", st.Err)
			return out
		}
		if st.Message != nil {
			out = append(out, *st.Message)
		}
	}
	return out
}

// TestPipelinesSideBySide runs many pods' pipelines in one process, as node
// mode will: on one goroutine interleaved and on one goroutine each, every
// pipeline sends exactly what it sends alone.
func TestPipelinesSideBySide(t *testing.T) {
	const pods, samples = 16, 8
	t0 := time.Unix(1_700_000_000, 0)
	memory := func(i int) float64 {
		if i%2 == 1 {
			return 60 << 20 // 120 on the dataset's scale: anomalous
		}
		return 10 << 20
	}
	alone := make([][]podsignal.Message, pods)
	for i := range pods {
		alone[i] = run(t, newPipeline(t, &synthSource{memory: memory(i), t0: t0}), samples)
		want := podsignal.Healthy
		if i%2 == 1 {
			want = podsignal.Anomalous
		}
		if len(alone[i]) == 0 || alone[i][len(alone[i])-1].State != want {
			t.Fatalf("pod %d alone sent %+v, want it to end %s", i, alone[i], want)
		}
	}
	for _, tt := range []struct {
		name string
		run  func(ps []*Pipeline) [][]podsignal.Message
	}{
		{"interleaved on one goroutine", func(ps []*Pipeline) [][]podsignal.Message {
			got := make([][]podsignal.Message, len(ps))
			for range samples {
				for i, p := range ps {
					got[i] = append(got[i], run(t, p, 1)...)
				}
			}
			return got
		}},
		{"one goroutine each", func(ps []*Pipeline) [][]podsignal.Message {
			got := make([][]podsignal.Message, len(ps))
			var wg sync.WaitGroup
			for i, p := range ps {
				wg.Go(func() { got[i] = run(t, p, samples) })
			}
			wg.Wait()
			return got
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ps := make([]*Pipeline, pods)
			for i := range ps {
				ps[i] = newPipeline(t, &synthSource{memory: memory(i), t0: t0})
			}
			got := tt.run(ps)
			for i := range pods {
				if !reflect.DeepEqual(got[i], alone[i]) {
					t.Errorf("pod %d sent\n%+v\nbeside the others, and alone\n%+v", i, got[i], alone[i])
				}
			}
		})
	}
}

// TestPipelineSignals: what one pipeline sends for each kind of input.
func TestPipelineSignals(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	t.Run("a vanished target is unhealthy, and its return comes before the next score", func(t *testing.T) {
		src := &synthSource{memory: 10 << 20, t0: t0}
		p := newPipeline(t, src)
		run(t, p, 2)
		src.gone = true
		st := p.Sample(t.Context())
		if !errors.Is(st.Err, cgroup.ErrGone) || st.Message == nil || st.Message.State != podsignal.Unhealthy {
			t.Fatalf("gone: %+v", st)
		}
		src.gone = false
		st = p.Sample(t.Context())
		if st.Back == nil || st.Back.Verdict.State == podsignal.Unhealthy || !st.Back.Verdict.Changed || !st.Scored {
			t.Fatalf("back: %+v (back %+v)", st, st.Back)
		}
	})
	t.Run("a pushed end is unhealthy at once, and a new target's first sample says it is back", func(t *testing.T) {
		p := newPipeline(t, &synthSource{memory: 10 << 20, t0: t0})
		msgs := run(t, p, 2)
		e := p.Gone("OOM kill in the broker's container")
		if e.Message == nil || e.Message.State != podsignal.Unhealthy || !e.Verdict.Changed || e.Message.Seq != msgs[len(msgs)-1].Seq+1 {
			t.Fatalf("gone: %+v, after %+v", e, msgs)
		}
		if again := p.Gone("broker process exited"); again.Message != nil {
			t.Fatalf("a second end while unhealthy sent %+v", again.Message)
		}
		if _, err := p.SetTarget(&synthSource{memory: 10 << 20, t0: t0.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		st := p.Sample(t.Context())
		if st.Back == nil || st.Back.Verdict.State != podsignal.Healthy || st.Back.Message == nil {
			t.Fatalf("new target: %+v (back %+v)", st, st.Back)
		}
	})
	t.Run("messages carry the last score and count up", func(t *testing.T) {
		p := newPipeline(t, &synthSource{memory: 60 << 20, t0: t0})
		msgs := run(t, p, 4)
		for i, m := range msgs {
			if m.Seq != uint64(i+1) || m.Probability == nil || m.Features == nil || m.Features.MemoryPercent == nil {
				t.Fatalf("message %d: %+v", i, m)
			}
		}
		if len(msgs) != 4 { // healthy→anomalous at once, then every anomalous sample
			t.Fatalf("%d messages for 4 anomalous samples, want 4: %+v", len(msgs), msgs)
		}
	})
	t.Run("messages carry the container's memory limit and follow it when it is resized", func(t *testing.T) {
		src := &synthSource{memory: 60 << 20, t0: t0}
		p := newPipeline(t, src)
		msgs := run(t, p, 3)
		if l := msgs[len(msgs)-1].MemoryLimitBytes; l == nil || *l != 100<<20 {
			t.Fatalf("limit %v, want 100 MiB", l)
		}
		src.limit = 200 << 20 // the kubelet resized the container in place
		st := p.Sample(t.Context())
		if st.Err != nil {
			t.Fatal(st.Err)
		}
		e := p.Probe(true, "") // any message after the sample carries its limit
		m := st.Message
		if m == nil {
			m = e.Message
		}
		if m == nil {
			m = p.Stop("test").Message
		}
		if l := m.MemoryLimitBytes; l == nil || *l != 200<<20 {
			t.Fatalf("after the resize: limit %v, want 200 MiB", l)
		}
		if mp := *m.Features.MemoryPercent; mp != 30 {
			t.Errorf("memory_percent %v after the resize, want 30 (60 MiB of 200)", mp)
		}
	})
	t.Run("messages carry the memory's current slope once three steps give one", func(t *testing.T) {
		p := newPipeline(t, &synthSource{memory: 60 << 20, ramp: 1 << 20, t0: t0})
		msgs := run(t, p, 4)
		if msgs[0].MemorySlopeBytesPerSecond != nil {
			t.Errorf("first message: slope %v from one sample, want none", *msgs[0].MemorySlopeBytesPerSecond)
		}
		last := msgs[len(msgs)-1].MemorySlopeBytesPerSecond
		if last == nil || math.Abs(*last-(1<<20)) > 1e-6 {
			t.Fatalf("slope %v, want 1 MiB/s", last)
		}
	})
	t.Run("an anomalous message says what drove its score, a healthy one says nothing", func(t *testing.T) {
		for _, tc := range []struct {
			memory float64
			want   podsignal.State
		}{{60 << 20, podsignal.Anomalous}, {10 << 20, podsignal.Healthy}} {
			msgs := run(t, newPipeline(t, &synthSource{memory: tc.memory, t0: t0}), 4)
			if len(msgs) == 0 {
				t.Fatalf("memory %v: no message", tc.memory)
			}
			m := msgs[len(msgs)-1]
			if m.State != tc.want {
				t.Fatalf("memory %v: state %s, want %s", tc.memory, m.State, tc.want)
			}
			if got := m.Explanation != ""; got != (tc.want == podsignal.Anomalous) {
				t.Errorf("%s message's explanation %q", m.State, m.Explanation)
			}
			m.Version, m.Namespace, m.Pod = podsignal.Version, "tod", "broker-0" // the signaller's part
			if _, err := podsignal.Encode(&m); err != nil {
				t.Errorf("%s message does not encode: %v", m.State, err)
			}
		}
	})
	t.Run("stop always has a message and refuses the application after", func(t *testing.T) {
		p := newPipeline(t, &synthSource{memory: 10 << 20, t0: t0})
		run(t, p, 1)
		e := p.Stop("SIGTERM")
		if e.Message == nil || e.Message.State != podsignal.Stopping || e.Verdict.Publish || !e.Verdict.Changed {
			t.Fatalf("stop: %+v", e)
		}
		if _, err := p.App(podsignal.Unhealthy, "x"); !errors.Is(err, ErrStopping) {
			t.Fatalf("App after Stop: %v, want ErrStopping", err)
		}
	})
	t.Run("a target not found keeps it starting, with the reason", func(t *testing.T) {
		p, err := NewPipeline(PipelineConfig{Model: p1Model(t), Interval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := p.TargetNotFound("no container"); !ok {
			t.Fatal("TargetNotFound ignored without a target")
		}
		if st, why := p.State(); st != podsignal.Starting || why == "" {
			t.Fatalf("state %s %q", st, why)
		}
		if _, err := p.SetTarget(&synthSource{t0: t0}); err != nil {
			t.Fatal(err)
		}
		if _, ok := p.TargetNotFound("later"); ok {
			t.Fatal("TargetNotFound applied with a target")
		}
		if r := p.MemoryFallback(); r.Source != RefAssumed {
			t.Fatalf("memory fallback %+v, want assumed", r)
		}
	})
}
