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
			go func() { done <- ServeProbes(ctx, ln, nil) }()
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
			if got := Probe(ctx, addr, "n1"); got != tc.want {
				t.Errorf("Probe(%s) = %v, want %v", addr, got, tc.want)
			}
		})
	}
}

// TestProbeAnswerVouchesOnlyForAnAgentTheGuardSees: a real probe server on
// loopback whose guard sees the prober's node (or does not guard it)
// vouches; one whose guard lost sight of it answers alive without
// vouching. The prober names its node: its address may be its pod's, not
// its node's.
func TestProbeAnswerVouchesOnlyForAnAgentTheGuardSees(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name    string
		sights  func(*Sights)
		vouched bool
	}{
		{"a prober this agent does not guard", func(*Sights) {}, true},
		{"a guarded prober seen just now", func(s *Sights) { s.Saw("n1", now) }, true},
		{"a guarded prober not seen for a second", func(s *Sights) { s.Saw("n1", now.Add(-time.Second)) }, false},
		{"a node just guarded, never seen yet", func(s *Sights) { s.Keep([]string{"n1"}, now) }, true},
		{"a node guarded for a second, never seen", func(s *Sights) { s.Keep([]string{"n1"}, now.Add(-time.Second)) }, false},
		{"a node no longer guarded is forgotten", func(s *Sights) { s.Saw("n1", now.Add(-time.Second)); s.Keep([]string{"n2"}, now) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSights()
			tc.sights(s)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- ServeProbes(ctx, ln, func(host string) bool { return s.Vouches(host, time.Now(), DefaultTiming.Vouch()) })
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("ServeProbes: %v", err)
				}
			}()
			pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer pcancel()
			if !Probe(pctx, ln.Addr().String(), "n1") {
				t.Fatal("not answered")
			}
			if got := ProbeVouched(pctx, ln.Addr().String(), "n1"); got != tc.vouched {
				t.Errorf("vouched %v, want %v", got, tc.vouched)
			}
		})
	}
}
