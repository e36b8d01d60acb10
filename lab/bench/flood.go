package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/lab/proc"
)

// FloodConfig configures the connection-flood benchmark.
type FloodConfig struct {
	Sidecars int // sidecars reconnecting at once each round, each from its own loopback address
	Rounds   int // rounds per phase
	// FloodSources × FloodPerSource idle sockets, reopened the moment the
	// agent closes one; FloodSessions more: one pod's valid token with a new
	// client id each time.
	FloodSources, FloodPerSource int
	Bin                          Binaries
	WorkDir                      string
	Progress                     io.Writer
}

// FloodPhase is what the sidecars saw in one phase.
type FloodPhase struct {
	Connects  int     `json:"connects"`
	Failed    int     `json:"failed"`
	P50Millis float64 `json:"p50_ms"`
	P99Millis float64 `json:"p99_ms"`
	MaxMillis float64 `json:"max_ms"`
}

// FloodReport is the benchmark's result: the same reconnects without and
// with the flood, against one agent process.
type FloodReport struct {
	Sidecars         int        `json:"sidecars"`
	Rounds           int        `json:"rounds"`
	Quiet            FloodPhase `json:"quiet"`
	Flood            FloodPhase `json:"flood"`
	FloodConnections int64      `json:"flood_connections"`
	FloodSessions    int64      `json:"flood_sessions"`
	AgentRSSMiB      float64    `json:"agent_rss_mib"`
	FirstError       string     `json:"first_error,omitempty"`
}

// RunFlood starts a real agent process and measures how long its sidecars
// take to connect (TCP dial to CONNACK), all of them at once as after an
// agent restart, first on a quiet listener, then while idle sockets from
// several addresses and one pod's stream of new sessions try to take every
// place. Everything runs on loopback addresses.
func RunFlood(ctx context.Context, cfg FloodConfig) (*FloodReport, error) {
	if cfg.Sidecars < 0 || cfg.Rounds < 0 || cfg.FloodSources < 0 || cfg.FloodPerSource < 0 {
		return nil, fmt.Errorf("negative sidecars, rounds or flood size: %+v", cfg)
	}
	cfg.Sidecars = cmp.Or(cfg.Sidecars, 110)
	cfg.Rounds = cmp.Or(cfg.Rounds, 5)
	cfg.FloodSources = cmp.Or(cfg.FloodSources, 48)
	cfg.FloodPerSource = cmp.Or(cfg.FloodPerSource, 16)
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Sidecars > 250 || cfg.FloodSources > 250 {
		return nil, fmt.Errorf("at most 250 sidecars and 250 flood sources (one loopback address each)")
	}
	// The last token is the flooding pod's.
	ta, err := startTokenAgent(ctx, cfg.Bin.Agent, cfg.WorkDir, "flood", cfg.Sidecars+1)
	if err != nil {
		return nil, err
	}
	defer ta.proc.Stop(3 * time.Second)
	agent, mqttAddr, tokens := ta.proc, ta.mqttAddr, ta.tokens

	rep := &FloodReport{Sidecars: cfg.Sidecars, Rounds: cfg.Rounds}
	var firstErr atomic.Pointer[string]
	phase := func(name string) FloodPhase {
		var lat []time.Duration
		var ph FloodPhase
		for r := 0; r < cfg.Rounds && ctx.Err() == nil; r++ {
			d, failed := reconnectAll(ctx, mqttAddr, tokens[:cfg.Sidecars], &firstErr)
			lat = append(lat, d...)
			ph.Connects += cfg.Sidecars
			ph.Failed += failed
		}
		if len(lat) > 0 { // none when every connect failed
			ph.P50Millis, ph.P99Millis, ph.MaxMillis = percentiles(lat)
		}
		fmt.Fprintf(cfg.Progress, "%s: %d connects, %d failed, p99 %.1f ms\n", name, ph.Connects, ph.Failed, ph.P99Millis)
		return ph
	}
	rep.Quiet = phase("quiet")

	fctx, stopFlood := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var floodConns, floodSessions atomic.Int64
	for s := 0; s < cfg.FloodSources; s++ {
		src := &net.TCPAddr{IP: net.IPv4(127, 0, 2, byte(1+s))}
		for i := 0; i < cfg.FloodPerSource; i++ {
			wg.Go(func() { idleSocket(fctx, mqttAddr, src, &floodConns) })
		}
	}
	wg.Go(func() { sessionStream(fctx, mqttAddr, cfg.Sidecars, tokens[cfg.Sidecars], &floodSessions) })
	// The flood first fills every place it can.
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
	rep.Flood = phase("flood")
	stopFlood()
	wg.Wait()
	rep.FloodConnections, rep.FloodSessions = floodConns.Load(), floodSessions.Load()
	if _, rss, err := proc.Usage(agent.PID()); err == nil {
		rep.AgentRSSMiB = float64(rss) / (1 << 20)
	}
	if e := firstErr.Load(); e != nil {
		rep.FirstError = *e
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return rep, nil
}

// reconnectAll connects every sidecar at once, each from its own loopback
// address (127.0.1.<i+1>, as pods have their own), and returns the connect
// times of those that got in and how many did not.
func reconnectAll(ctx context.Context, addr string, tokens []string, firstErr *atomic.Pointer[string]) ([]time.Duration, int) {
	var mu sync.Mutex
	var lat []time.Duration
	failed := 0
	var wg sync.WaitGroup
	clients := make([]mqtt.Client, len(tokens))
	for i, tok := range tokens {
		wg.Go(func() {
			id := fmt.Sprintf("flood/sidecar-%d", i)
			opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id + "/sidecar").
				SetUsername(id).SetPassword(tok).SetProtocolVersion(4).SetAutoReconnect(false).
				SetKeepAlive(5 * time.Second).SetConnectTimeout(10 * time.Second).
				SetDialer(&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i))}, Timeout: 10 * time.Second})
			c := mqtt.NewClient(opts)
			start := time.Now()
			t := c.Connect()
			ok := t.WaitTimeout(10*time.Second) && t.Error() == nil
			d := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				failed++
				msg := fmt.Sprintf("%s: %v", id, t.Error())
				firstErr.CompareAndSwap(nil, &msg)
				return
			}
			lat = append(lat, d)
			clients[i] = c
		})
	}
	wg.Wait()
	for _, c := range clients {
		if c != nil {
			c.Disconnect(0)
		}
	}
	return lat, failed
}

// idleSocket holds one connection that never speaks, reopened as soon as
// the agent closes it, until ctx ends.
func idleSocket(ctx context.Context, addr string, src *net.TCPAddr, n *atomic.Int64) {
	d := net.Dialer{LocalAddr: src, Timeout: time.Second}
	var b [1]byte
	for ctx.Err() == nil {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			continue
		}
		n.Add(1)
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		_, _ = conn.Read(b[:])
		stop()
		_ = conn.Close()
	}
}

// sessionStream connects with one pod's valid token again and again, a new
// client id each time, keeping every session it gets, until ctx ends.
func sessionStream(ctx context.Context, addr string, pod int, token string, n *atomic.Int64) {
	id := fmt.Sprintf("flood/sidecar-%d", pod)
	var held []mqtt.Client
	defer func() {
		for _, c := range held {
			c.Disconnect(0)
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(fmt.Sprintf("%s/h%d", id, i)).
			SetUsername(id).SetPassword(token).SetProtocolVersion(4).SetAutoReconnect(false).
			SetKeepAlive(30 * time.Second).SetConnectTimeout(2 * time.Second).
			SetDialer(&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3, 1)}, Timeout: 2 * time.Second}))
		if t := c.Connect(); t.WaitTimeout(2*time.Second) && t.Error() == nil {
			n.Add(1)
			held = append(held, c)
		}
	}
}

// PrintFlood writes the benchmark's table and, last, its JSON line.
func PrintFlood(w io.Writer, r *FloodReport) error {
	fmt.Fprintf(w, "\nsidecar connects (%d at once, %d rounds), dial to CONNACK:\n", r.Sidecars, r.Rounds)
	fmt.Fprintf(w, "  %-8s %8s %7s %9s %9s %9s\n", "phase", "connects", "failed", "p50 ms", "p99 ms", "max ms")
	for _, p := range []struct {
		name string
		ph   FloodPhase
	}{{"quiet", r.Quiet}, {"flood", r.Flood}} {
		fmt.Fprintf(w, "  %-8s %8d %7d %9.1f %9.1f %9.1f\n", p.name, p.ph.Connects, p.ph.Failed, p.ph.P50Millis, p.ph.P99Millis, p.ph.MaxMillis)
	}
	fmt.Fprintf(w, "flood: %d idle connections opened, %d sessions of one pod; agent RSS %.1f MiB\n", r.FloodConnections, r.FloodSessions, r.AgentRSSMiB)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first failed connect: %s\n", r.FirstError)
	}
	return json.NewEncoder(w).Encode(r)
}
