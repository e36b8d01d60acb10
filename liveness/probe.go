package liveness

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// AnnProbe is the annotation on an agent's Lease that says where its agent
// answers probes (host:port on the node's network): a guard reads it from
// the Lease events it watches anyway, so no Node object is read.
const AnnProbe = "amf.io/probe"

// The one byte a probe's answer carries: the accept alone is the kernel's
// (it completes handshakes from the listen backlog even for a process that
// no longer runs), the byte is the agent's. probeReply also vouches for the
// prober (its guard sees it: Sights); probeAlive does not (the guard cannot
// see it, so may declare its node lost: it must fence).
const (
	probeReply = 'k'
	probeAlive = 'n'
)

// ServeProbes answers probes on ln until ctx ends: every connection gets one
// byte, then is closed; vouch (nil: always) says for the prober's host
// whether the answer vouches for it. It closes ln.
func ServeProbes(ctx context.Context, ln net.Listener, vouch func(host string) bool) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("liveness: accept probes: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			reply := byte(probeReply)
			if host, _, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil && vouch != nil && !vouch(host) {
				reply = probeAlive
			}
			_, _ = c.Write([]byte{reply})
			c.Close()
		}()
	}
}

// Probe says whether the agent at addr answers within ctx: it connects and
// reads the answer's byte, either one.
func Probe(ctx context.Context, addr string) bool {
	b, ok := probe(ctx, addr)
	return ok && (b == probeReply || b == probeAlive)
}

// ProbeVouched says whether the agent at addr answers within ctx and
// vouches for the prober: what a fencer counts of its guards.
func ProbeVouched(ctx context.Context, addr string) bool {
	b, ok := probe(ctx, addr)
	return ok && b == probeReply
}

func probe(ctx context.Context, addr string) (byte, bool) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, false
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, false
	}
	return b[0], true
}
