package liveness

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestProbeIsAnsweredOnlyByARunningAgent probes real listeners on loopback:
// an agent serving probes answers; a socket whose process does not serve
// (the kernel completes the handshake from the backlog, as for a frozen
// agent) and a closed port do not, within the probe's deadline.
func TestProbeIsAnsweredOnlyByARunningAgent(t *testing.T) {
	listen := func(t *testing.T) net.Listener {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) string
		want bool
	}{
		{"an agent serving probes", func(t *testing.T) string {
			ln := listen(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- ServeProbes(ctx, ln) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("ServeProbes: %v", err)
				}
			})
			return ln.Addr().String()
		}, true},
		{"a socket nobody serves (accepted by the kernel only)", func(t *testing.T) string { return listen(t).Addr().String() }, false},
		{"a closed port", func(t *testing.T) string {
			ln := listen(t)
			a := ln.Addr().String()
			ln.Close()
			return a
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.addr(t)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if got := Probe(ctx, addr); got != tc.want {
				t.Errorf("Probe(%s) = %v, want %v", addr, got, tc.want)
			}
		})
	}
}
