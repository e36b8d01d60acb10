package node

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Backoff is the kubelet's crash-loop back-off. The zero value means the
// kubelet's defaults.
type Backoff struct {
	// Initial is the delay before the second restart (default 10 s); the first
	// restart happens at once, and each further one waits twice as long as the
	// one before.
	Initial time.Duration
	// Max caps the delay (default 5 min).
	Max time.Duration
	// Reset: a container that ran at least this long before it exited starts
	// the sequence again (default 10 min).
	Reset time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 10 * time.Second
	}
	if b.Max <= 0 {
		b.Max = 5 * time.Minute
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if b.Reset <= 0 {
		b.Reset = 10 * time.Minute
	}
	return b
}

// crashLoop is the restart delay of one container. It is a pure function of
// the start and exit times it is given, so it needs no clock of its own.
type crashLoop struct {
	cfg     Backoff
	crashes int // exits since the last reset
}

func newCrashLoop(b Backoff) *crashLoop { return &crashLoop{cfg: b.withDefaults()} }

// next returns how long to wait before restarting a container that started at
// started (zero if it never started, e.g. it could not be created) and exited
// or failed at exited: 0 the first time, then Initial, 2·Initial, ... up to
// Max; after a run of at least Reset, 0 again.
func (c *crashLoop) next(started, exited time.Time) time.Duration {
	if !started.IsZero() && exited.Sub(started) >= c.cfg.Reset {
		c.crashes = 0
	}
	var d time.Duration
	if c.crashes > 0 {
		d = c.cfg.Initial
		for i := 1; i < c.crashes && d < c.cfg.Max; i++ {
			d *= 2
		}
		d = min(d, c.cfg.Max)
	}
	c.crashes++
	return d
}

// sleep waits d on clk; it returns false if ctx or stop ended first.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration, stop <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-ctx.Done():
			return false
		case <-stop:
			return false
		default:
			return true
		}
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
