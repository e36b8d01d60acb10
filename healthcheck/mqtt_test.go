package healthcheck

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// longInterval is far beyond every deadline below, so a failure that arrives
// in time cannot have come from a scheduled round: it was signalled.
const longInterval = 30 * time.Second

func newTestMQTTProber(t testing.TB, url string, interval, timeout time.Duration) *MQTTProber {
	t.Helper()
	p, err := NewMQTTProber(MQTTConfig{
		Broker:       url,
		Interval:     interval,
		Timeout:      timeout,
		ReconnectMin: 20 * time.Millisecond,
		ReconnectMax: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testCrashAndRecovery runs the life cycle every broker must support: pass,
// crash reported at once, recovery reported after a restart.
func testCrashAndRecovery(t *testing.T, b testBroker) {
	run := runProber(t, newTestMQTTProber(t, b.URL(), longInterval, time.Second))

	// The first round runs at once on connect, not after the interval.
	r := run.await(t, true, 5*time.Second)
	if r.RTT <= 0 || r.Reason != "" || r.At.IsZero() {
		t.Fatalf("passing result %+v: want RTT > 0, no reason, a time", r)
	}

	killed := time.Now()
	b.Kill(t)
	r = run.next(t, 5*time.Second)
	took := time.Since(killed)
	if r.OK || !strings.Contains(r.Reason, "connection lost") {
		t.Fatalf("first result after the kill: %+v, want a connection-lost failure", r)
	}
	if took > 2*time.Second {
		t.Fatalf("loss reported %v after the kill: not at once", took)
	}
	t.Logf("kill → failure reported in %v (%s)", took, r.Reason)

	b.Restart(t)
	restarted := time.Now()
	r = run.await(t, true, 10*time.Second)
	if r.RTT <= 0 {
		t.Fatalf("recovery result %+v: want RTT > 0", r)
	}
	t.Logf("restart → recovery reported in %v", time.Since(restarted))
}

func TestMQTTProbeMosquitto(t *testing.T) {
	testCrashAndRecovery(t, startMosquitto(t))
}

func TestMQTTProbeMochi(t *testing.T) {
	testCrashAndRecovery(t, startMochi(t))
}

// A frozen broker keeps its sockets open and the kernel keeps accepting, so
// only the round-trip timeout can tell.
func TestMQTTProbeMosquittoFrozen(t *testing.T) {
	b := startMosquitto(t)
	const interval, timeout = 500 * time.Millisecond, 250 * time.Millisecond
	run := runProber(t, newTestMQTTProber(t, b.URL(), interval, timeout))
	run.await(t, true, 5*time.Second)

	b.Stop(t)
	stopped := time.Now()
	r := run.await(t, false, 5*time.Second)
	took := time.Since(stopped)
	b.Cont(t)
	if !strings.Contains(r.Reason, "not echoed") {
		t.Errorf("failure reason %q, want a round-trip timeout", r.Reason)
	}
	// The next round starts within one interval and fails after one timeout.
	if limit := interval + timeout + time.Second; took > limit {
		t.Errorf("frozen broker reported after %v, want ≤ %v", took, limit)
	}
	t.Logf("SIGSTOP → failure reported in %v (%s)", took, r.Reason)

	run.await(t, true, 10*time.Second)
}

// A listener that accepts and never answers: connecting must fail within the
// timeout, not hang on CONNACK.
func TestMQTTProbeSilentListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn // keep them open and silent
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()

	const timeout = 200 * time.Millisecond
	started := time.Now()
	run := runProber(t, newTestMQTTProber(t, "tcp://"+ln.Addr().String(), longInterval, timeout))
	r := run.next(t, 5*time.Second)
	took := time.Since(started)
	if r.OK || !strings.Contains(r.Reason, "connect to") {
		t.Fatalf("result %+v, want a connect failure", r)
	}
	if took > timeout+time.Second {
		t.Fatalf("connect failure after %v, want about %v", took, timeout)
	}
}

func TestMQTTProbeNoBroker(t *testing.T) {
	run := runProber(t, newTestMQTTProber(t, "tcp://127.0.0.1:"+itoa(freePort(t)), longInterval, time.Second))
	r := run.next(t, 5*time.Second)
	if r.OK || !strings.Contains(r.Reason, "connect to") {
		t.Fatalf("result %+v, want a connect failure", r)
	}
	// Reconnect attempts go on with back-off, each one reported.
	if r := run.next(t, 5*time.Second); r.OK {
		t.Fatalf("second result %+v, want another failure", r)
	}
}

// TestAHurriedProberTriesAgainWithoutBackOff: a broker the sidecar
// restarted itself is looked for every ReconnectMin, not at the back-off's
// doubling waits: ten tries of a dead address take 10 × 20 ms, where the
// back-off would take 20 ms × 2¹⁰.
func TestAHurriedProberTriesAgainWithoutBackOff(t *testing.T) {
	p, err := NewMQTTProber(MQTTConfig{Broker: "tcp://127.0.0.1:" + itoa(freePort(t)), Interval: longInterval, Timeout: time.Second,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p.Hurry(time.Minute)
	run := runProber(t, p)
	all := time.Now().Add(3 * time.Second) // the back-off's ten tries take 8 s here
	for i := range 10 {
		if r := run.next(t, time.Until(all)); r.OK {
			t.Fatalf("try %d: %+v, want a connect failure", i, r)
		}
	}
}

func TestMQTTProberRunTwice(t *testing.T) {
	b := startMochi(t)
	p := newTestMQTTProber(t, b.URL(), longInterval, time.Second)
	run := runProber(t, p)
	run.await(t, true, 5*time.Second)
	if err := p.Run(context.Background(), func(Result) {}); err == nil {
		t.Fatal("a second concurrent Run succeeded, want an error")
	}
}

func TestNewMQTTProber(t *testing.T) {
	p, err := NewMQTTProber(MQTTConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c := p.Config()
	if c.Broker != DefaultBroker || c.Interval != DefaultInterval || c.Timeout != DefaultTimeout {
		t.Errorf("defaults: %+v", c)
	}
	if !strings.HasPrefix(c.ClientID, "amf-probe-") || len(c.ClientID) > 23 {
		t.Errorf("default client ID %q: want amf-probe-…, at most 23 bytes", c.ClientID)
	}
	if c.Topic != "amf/probe/"+c.ClientID {
		t.Errorf("default topic %q", c.Topic)
	}
	if q, _ := NewMQTTProber(MQTTConfig{}); q.Config().ClientID == c.ClientID {
		t.Error("two default client IDs are equal")
	}

	for name, cfg := range map[string]MQTTConfig{
		"bad scheme":        {Broker: "http://127.0.0.1:1883"},
		"no host":           {Broker: "tcp://"},
		"unparsable":        {Broker: "tcp://[::1"},
		"wildcard topic":    {Topic: "amf/probe/#"},
		"plus topic":        {Topic: "amf/+/x"},
		"timeout>interval":  {Interval: time.Second, Timeout: 2 * time.Second},
		"negative interval": {Interval: -time.Second},
		"backoff min>max":   {ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
	} {
		if _, err := NewMQTTProber(cfg); err == nil {
			t.Errorf("%s: accepted %+v", name, cfg)
		}
	}
}
