package healthcheck

import (
	"context"
	"fmt"
	"net"
	"time"
)

// TCPConfig configures a [TCPProber].
type TCPConfig struct {
	// Address is host:port of the workload, e.g. 127.0.0.1:8080. Required.
	Address string
	// Interval between the starts of two probes; default DefaultInterval.
	Interval time.Duration
	// Timeout bounds each connect; default DefaultTimeout, at most Interval.
	Timeout time.Duration
}

// TCPProber passes while a TCP port accepts connections, for workloads without
// a protocol the sidecar speaks. It says less than [MQTTProber]: a frozen
// process still completes handshakes from its listen backlog, so a TCP probe
// only catches a process that is gone or not listening.
type TCPProber struct {
	cfg TCPConfig
}

var _ Prober = (*TCPProber)(nil)

// NewTCPProber validates cfg, fills in its defaults and returns a prober.
func NewTCPProber(cfg TCPConfig) (*TCPProber, error) {
	if _, _, err := net.SplitHostPort(cfg.Address); err != nil {
		return nil, fmt.Errorf("healthcheck: TCP probe address: %w", err)
	}
	if err := validDurations(&cfg.Interval, &cfg.Timeout); err != nil {
		return nil, err
	}
	return &TCPProber{cfg: cfg}, nil
}

// Run connects every Interval and reports each outcome until ctx ends.
func (p *TCPProber) Run(ctx context.Context, report func(Result)) error {
	d := net.Dialer{Timeout: p.cfg.Timeout}
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-next.C:
		}
		start := time.Now()
		conn, err := d.DialContext(ctx, "tcp", p.cfg.Address)
		rtt := time.Since(start)
		if ctx.Err() != nil {
			if conn != nil {
				_ = conn.Close()
			}
			return nil
		}
		if err != nil {
			report(failResult("connect to %s: %v", p.cfg.Address, err))
		} else {
			// Nothing was written, so a close error says nothing about the workload.
			_ = conn.Close()
			report(okResult(max(rtt, time.Nanosecond)))
		}
		next.Reset(p.cfg.Interval - time.Since(start))
	}
}
