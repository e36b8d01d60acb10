package liveness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
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

// maxProbeName bounds the node name a prober sends (a DNS subdomain).
const maxProbeName = 253

// ServeProbes answers probes on ln until ctx ends: every connection gets one
// byte, then is closed. A prober first names its node (a line; an older
// agent names none); vouch (nil: always) says for that node whether the
// answer vouches for it. It closes ln.
func ServeProbes(ctx context.Context, ln net.Listener, vouch func(node string) bool) error {
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
			defer c.Close()
			reply := byte(probeReply)
			if vouch != nil {
				// The name comes with the connection's first packet; a
				// prober that sends none is answered after the deadline.
				_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
				line, _ := bufio.NewReaderSize(io.LimitReader(c, maxProbeName+1), 64).ReadString('\n')
				if node := strings.TrimSuffix(line, "\n"); node != line && node != "" && !vouch(node) {
					reply = probeAlive
				}
			}
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte{reply})
		}()
	}
}

// Probe says whether the agent at addr answers within ctx, either answer;
// self names the prober's node.
func Probe(ctx context.Context, addr, self string) bool {
	b, ok := probe(ctx, addr, self)
	return ok && (b == probeReply || b == probeAlive)
}

// ProbeVouched says whether the agent at addr answers within ctx and
// vouches for self, the prober's node: what a fencer counts of its guards.
func ProbeVouched(ctx context.Context, addr, self string) bool {
	b, ok := probe(ctx, addr, self)
	return ok && b == probeReply
}

func probe(ctx context.Context, addr, self string) (byte, bool) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, false
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, self+"\n"); err != nil {
		return 0, false
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, false
	}
	return b[0], true
}
