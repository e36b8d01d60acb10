package healthcheck

import (
	"context"
	"testing"
	"time"
)

// BenchmarkMQTTProbeRoundTrip measures one probe round — publish QoS 1, receive
// the echo — over loopback against the embedded mochi broker.
func BenchmarkMQTTProbeRoundTrip(b *testing.B) {
	broker := startMochi(b)
	p := newTestMQTTProber(b, broker.URL(), time.Second, time.Second)
	ctx := context.Background()
	s, err := p.connect(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer s.close()
	var rtt time.Duration
	for b.Loop() {
		r, _ := s.roundTrip(ctx)
		if !r.OK {
			b.Fatalf("round trip failed: %s", r.Reason)
		}
		rtt += r.RTT
	}
	b.ReportMetric(float64(rtt.Nanoseconds())/float64(b.N), "rtt-ns/op")
}
