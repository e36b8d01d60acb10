package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// BenchmarkIntake measures the agent's hot path per message: ACL check,
// podsignal.Decode, state update and event dispatch to one subscriber, with the
// production JSON log handler (to io.Discard). It reports the p50 and p99 of
// single operations besides the mean; the target is p99 ≤ 1 ms.
//
//   - steady: an anomalous pod sending every sample (no transition, no log
//     line) — the load of the debounce;
//   - transitions: every message changes state (one log line each) — the
//     worst case.
func BenchmarkIntake(b *testing.B) {
	for _, bc := range []struct {
		name   string
		states []podsignal.State
	}{
		{"steady", []podsignal.State{podsignal.Anomalous}},
		{"transitions", []podsignal.State{podsignal.Anomalous, podsignal.Healthy}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := newMetrics()
			log := slog.New(slog.NewJSONHandler(io.Discard, nil))
			tr := newTracker(log, m, 16, time.Now)
			h := &hook{ctx: context.Background(), tracker: tr, m: m, log: log, now: time.Now}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := tr.Subscribe(ctx, 1024)
			go func() {
				for range events { // the actuation package, keeping up
				}
			}()
			sess := tr.begin(podA, podA.String())
			bodies := make([]messageTemplate, len(bc.states))
			for i, st := range bc.states {
				bodies[i] = newMessageTemplate(b, podA, st)
			}
			durations := make([]time.Duration, b.N)
			var buf []byte
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				buf = bodies[i%len(bodies)].with(buf[:0], uint64(i+1))
				start := time.Now()
				if err := h.intake(sess, sess.topic, buf); err != nil {
					b.Fatal(err)
				}
				durations[i] = time.Since(start)
			}
			b.StopTimer()
			slices.Sort(durations)
			b.ReportMetric(float64(durations[len(durations)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(durations[len(durations)*99/100].Nanoseconds()), "p99-ns")
			if st, _ := tr.Pod(podA); st.Message.Seq != uint64(b.N) {
				b.Fatalf("last seq recorded = %d, want %d", st.Message.Seq, b.N)
			}
		})
	}
}

// messageTemplate is an encoded signal whose seq can be replaced cheaply, so
// each benchmark iteration sends a new seq without re-encoding.
type messageTemplate struct{ prefix, suffix []byte }

func newMessageTemplate(b *testing.B, id podsignal.PodID, state podsignal.State) messageTemplate {
	b.Helper()
	f := func(v float64) *float64 { return &v }
	const marker = 987654321987654321
	body, err := podsignal.Encode(&podsignal.Message{
		Version: podsignal.Version, Namespace: id.Namespace, Pod: id.Pod, State: state,
		Probability: f(0.93), Seq: marker, Time: time.Now(), Reason: "score 0.93 >= 0.50",
		Features: &podsignal.Features{
			CPUPercent: f(81.5), MemoryPercent: f(62.25), NetworkIOBytesPerSec: f(10240.5),
			DiskIOBytesPerSec: f(4096), CPUGrowthRate: f(0.0012), MemoryGrowthRate: f(1048.75),
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	prefix, suffix, ok := bytes.Cut(body, []byte(strconv.Itoa(marker)))
	if !ok {
		b.Fatal("seq marker not found")
	}
	return messageTemplate{prefix: prefix, suffix: suffix}
}

func (t messageTemplate) with(buf []byte, seq uint64) []byte {
	buf = append(buf, t.prefix...)
	buf = strconv.AppendUint(buf, seq, 10)
	return append(buf, t.suffix...)
}
