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

// probeReply is the one byte a probe's answer carries: the accept alone is
// the kernel's (it completes handshakes from the listen backlog even for a
// process that no longer runs), the byte is the agent's.
const probeReply = 'k'

// ServeProbes answers probes on ln until ctx ends: every connection gets one
// byte, then is closed. It closes ln.
func ServeProbes(ctx context.Context, ln net.Listener) error {
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
			_, _ = c.Write([]byte{probeReply})
			c.Close()
		}()
	}
}

// Probe says whether the agent at addr answers within ctx: it connects and
// reads the answer's byte.
func Probe(ctx context.Context, addr string) bool {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return false
	}
	return b[0] == probeReply
}
