package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Result is the outcome of one probe round, or of an event between rounds such
// as a lost connection.
type Result struct {
	// OK is true when the application logic answered correctly in time.
	OK bool `json:"ok"`
	// RTT is how long the successful round took; zero when !OK.
	RTT time.Duration `json:"rtt_ns"`
	// Reason says why the probe failed; empty when OK.
	Reason string `json:"reason,omitempty"`
	// At is when the result was known.
	At time.Time `json:"at"`
}

// Prober checks the application logic of the workload beside the sidecar.
type Prober interface {
	// Run probes until ctx ends, then returns nil. It calls report with every
	// result as soon as it is known, from one goroutine, one call at a time; a
	// slow report delays the next probe. An error means Run could not start.
	Run(ctx context.Context, report func(Result)) error
}

// Defaults of the probe configurations.
const (
	DefaultInterval     = 2 * time.Second
	DefaultTimeout      = 1 * time.Second
	DefaultReconnectMin = 100 * time.Millisecond
	DefaultReconnectMax = 5 * time.Second
)

func okResult(rtt time.Duration) Result {
	return Result{OK: true, RTT: rtt, At: time.Now()}
}

func failResult(format string, args ...any) Result {
	return Result{Reason: fmt.Sprintf(format, args...), At: time.Now()}
}

// OnChange wraps report so that it sees only the first result and every result
// whose OK differs from the previous one: the transitions a state machine needs,
// without the steady stream of identical verdicts.
func OnChange(report func(Result)) func(Result) {
	var (
		mu    sync.Mutex
		seen  bool
		lastO bool
	)
	return func(r Result) {
		mu.Lock()
		changed := !seen || r.OK != lastO
		seen, lastO = true, r.OK
		mu.Unlock()
		if changed {
			report(r)
		}
	}
}

// ProbeState keeps the latest probe result, for /readyz and /status. Its Report
// method is meant to be (part of) the report func given to [Prober.Run].
type ProbeState struct {
	maxAge time.Duration
	now    func() time.Time

	mu   sync.Mutex
	last Result
	has  bool
}

// NewProbeState returns a ProbeState whose Check fails when the latest result
// is older than maxAge: a probe loop that stopped reporting must not keep the
// workload ready forever. A good maxAge is 2×interval + timeout; 0 disables it.
func NewProbeState(maxAge time.Duration) *ProbeState {
	return &ProbeState{maxAge: maxAge, now: time.Now}
}

// Report records r as the latest result.
func (s *ProbeState) Report(r Result) {
	s.mu.Lock()
	s.last, s.has = r, true
	s.mu.Unlock()
}

// Last returns the latest result and whether there is one yet.
func (s *ProbeState) Last() (Result, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.has
}

// Check returns nil while the latest result passed and is fresh, otherwise an
// error saying why; it fits [ServerConfig.Readiness].
func (s *ProbeState) Check() error {
	r, ok := s.Last()
	switch {
	case !ok:
		return errors.New("no probe result yet")
	case !r.OK:
		return fmt.Errorf("app-logic probe failing: %s", r.Reason)
	case s.maxAge > 0:
		if age := s.now().Sub(r.At); age > s.maxAge {
			return fmt.Errorf("last probe result is %v old (limit %v): probe loop stalled", age.Round(time.Millisecond), s.maxAge)
		}
	}
	return nil
}

// Heartbeat tells whether a periodic loop (the sidecar's sample loop) is still
// turning: the loop calls Beat every iteration, /healthz calls Check.
type Heartbeat struct {
	maxAge time.Duration
	now    func() time.Time

	mu   sync.Mutex
	last time.Time
}

// NewHeartbeat returns a Heartbeat that fails when no Beat came for maxAge. It
// counts as beaten at creation, so a process is alive for maxAge before its
// first iteration.
func NewHeartbeat(maxAge time.Duration) *Heartbeat {
	return &Heartbeat{maxAge: maxAge, now: time.Now, last: time.Now()}
}

// Beat records that the loop made progress.
func (h *Heartbeat) Beat() {
	t := h.now()
	h.mu.Lock()
	h.last = t
	h.mu.Unlock()
}

// Check returns an error when the last beat is older than maxAge; it fits
// [ServerConfig.Liveness].
func (h *Heartbeat) Check() error {
	h.mu.Lock()
	last := h.last
	h.mu.Unlock()
	if age := h.now().Sub(last); age > h.maxAge {
		return fmt.Errorf("loop stuck: last beat %v ago (limit %v)", age.Round(time.Millisecond), h.maxAge)
	}
	return nil
}

// backoff returns the delay before reconnect attempt n (n ≥ 1): exponential
// from lo, capped at hi, with "equal jitter" so that many sidecars restarted
// together do not hammer their brokers in lockstep.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	half := d / 2
	return half + rand.N(half+1)
}

// sleepCtx waits for d or for ctx to end; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// validDurations checks the probe timing shared by all probers and fills in defaults.
func validDurations(interval, timeout *time.Duration) error {
	if *interval == 0 {
		*interval = DefaultInterval
	}
	if *timeout == 0 {
		*timeout = DefaultTimeout
	}
	if *interval < 0 || *timeout < 0 {
		return fmt.Errorf("healthcheck: negative interval %v or timeout %v", *interval, *timeout)
	}
	if *timeout > *interval {
		// Rounds run one at a time; a timeout beyond the interval would silently
		// stretch the interval.
		return fmt.Errorf("healthcheck: timeout %v exceeds interval %v", *timeout, *interval)
	}
	return nil
}
