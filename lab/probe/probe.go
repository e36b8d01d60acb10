// Package probe measures the end-to-end service outage time (E2E SOT) of the
// paper's service path: a publisher at the RDS broker sends `set/speed` every
// 100 ms (QoS 0, payload "seq,unixnano"), the edge broker bridges it to the OBU
// broker, and a subscriber there records every receipt. A gap is an interval
// between consecutive fresh receipts longer than a threshold (250 ms).
//
// It is lab test infrastructure: product code never imports it.
//
// Usage:
//
//	p, err := probe.Start(ctx, probe.Config{PublishURL: rds, SubscribeURL: obu})
//	...
//	err = p.WaitReceived(ctx, p.Received()+10) // the path delivers
//	... inject the fault ...
//	rec := p.Stop()
//	sot, ok := rec.LargestGapWithin(onset, 0)
//
// Both clients reconnect on their own; their disconnects are in
// Recording.Events. During a make-before-break switchover both edge brokers
// forward, so the OBU may get each message twice: the second copy is a
// Duplicate and does not end a gap, nor does a Late (reordered) message.
// Receive times are taken in paho's callback, which only copies the message
// into the recording under a lock, so it never blocks the client.
package probe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Defaults of Config.
const (
	DefaultTopic          = "set/speed"
	DefaultInterval       = 100 * time.Millisecond
	DefaultGapThreshold   = 250 * time.Millisecond
	DefaultRetryInterval  = 200 * time.Millisecond
	DefaultConnectTimeout = 10 * time.Second
	DefaultDrain          = 500 * time.Millisecond
	DefaultKeepAlive      = 10 * time.Second
)

// Config says where the probe publishes and subscribes. Zero fields take the
// defaults above.
type Config struct {
	PublishURL   string // the RDS broker, e.g. tcp://127.0.0.1:1883
	SubscribeURL string // the OBU broker
	Topic        string // DefaultTopic
	Interval     time.Duration
	GapThreshold time.Duration
	// ClientID prefixes both clients' IDs ("-pub", "-sub"); default
	// "amf-probe-<pid>-<random>", so two probes never take over each other.
	ClientID string
	// RetryInterval bounds the wait between (re)connection attempts.
	RetryInterval time.Duration
	// ConnectTimeout bounds Start's wait for both clients' first connection.
	ConnectTimeout time.Duration
	// Drain is how long Stop waits, after the last send, for it to arrive.
	Drain     time.Duration
	KeepAlive time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.PublishURL == "" || c.SubscribeURL == "" {
		return c, errors.New("probe: PublishURL and SubscribeURL are required (e.g. tcp://127.0.0.1:1883)")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Interval, DefaultInterval)
	def(&c.GapThreshold, DefaultGapThreshold)
	def(&c.RetryInterval, DefaultRetryInterval)
	def(&c.ConnectTimeout, DefaultConnectTimeout)
	def(&c.Drain, DefaultDrain)
	def(&c.KeepAlive, DefaultKeepAlive)
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.ClientID == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.ClientID = fmt.Sprintf("amf-probe-%d-%s", os.Getpid(), hex.EncodeToString(b))
	}
	return c, nil
}

// Probe is a running measurement. Its methods are safe for concurrent use.
type Probe struct {
	cfg      Config
	pub, sub mqtt.Client

	mu      sync.Mutex
	rec     *recorder
	changed chan struct{} // closed and replaced on every receipt, to wake waiters
	subUp   chan struct{} // closed at the subscriber's first SUBACK
	subOnce sync.Once

	stopPub  context.CancelFunc
	pubDone  chan struct{}
	stopOnce sync.Once
	final    *Recording
}

// Start connects both clients, waits until the subscriber has subscribed and
// the publisher is connected, then publishes every Interval until ctx ends or
// Stop is called. An error means the probe is not running. Call Stop in any
// case to disconnect the clients and get the final recording.
func Start(ctx context.Context, cfg Config) (*Probe, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Probe{cfg: cfg, rec: newRecorder(cfg.Topic, cfg.Interval, cfg.GapThreshold),
		changed: make(chan struct{}), subUp: make(chan struct{})}
	p.sub = mqtt.NewClient(p.options(cfg.SubscribeURL, cfg.ClientID+"-sub", Subscriber).
		SetOnConnectHandler(p.onSubConnect))
	p.pub = mqtt.NewClient(p.options(cfg.PublishURL, cfg.ClientID+"-pub", Publisher).
		SetOnConnectHandler(func(mqtt.Client) { p.event(Publisher, Connected, nil) }))

	connectCtx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	subTok, pubTok := p.sub.Connect(), p.pub.Connect()
	fail := func(err error) (*Probe, error) {
		p.sub.Disconnect(0)
		p.pub.Disconnect(0)
		return nil, err
	}
	for _, w := range []struct {
		what string
		done <-chan struct{}
		tok  mqtt.Token
	}{{"subscriber connected to " + cfg.SubscribeURL, subTok.Done(), subTok},
		{"publisher connected to " + cfg.PublishURL, pubTok.Done(), pubTok},
		{"subscriber subscribed to " + cfg.Topic, p.subUp, nil}} {
		select {
		case <-w.done:
			if w.tok != nil && w.tok.Error() != nil {
				return fail(fmt.Errorf("probe: %s: %w", w.what, w.tok.Error()))
			}
		case <-connectCtx.Done():
			return fail(fmt.Errorf("probe: waiting until %s: %w", w.what, connectCtx.Err()))
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	p.stopPub, p.pubDone = stop, make(chan struct{})
	p.mu.Lock()
	p.rec.rec.Started = time.Now()
	p.mu.Unlock()
	go p.publish(runCtx)
	return p, nil
}

// Run is Start, then Stop when ctx ends.
func Run(ctx context.Context, cfg Config) (*Recording, error) {
	p, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	<-ctx.Done()
	return p.Stop(), nil
}

func (p *Probe) options(url, id, client string) *mqtt.ClientOptions {
	return mqtt.NewClientOptions().AddBroker(url).SetClientID(id).
		SetCleanSession(true).
		SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(p.cfg.RetryInterval).SetMaxReconnectInterval(p.cfg.RetryInterval).
		SetConnectTimeout(2 * time.Second).SetWriteTimeout(time.Second).
		SetKeepAlive(p.cfg.KeepAlive).SetPingTimeout(p.cfg.KeepAlive / 2).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { p.event(client, Lost, err) })
}

// onSubConnect runs in its own goroutine (paho starts it) at every
// (re)connection: a clean session has no subscription, so make it again.
func (p *Probe) onSubConnect(c mqtt.Client) {
	tok := c.Subscribe(p.cfg.Topic, 0, p.onMessage)
	tok.Wait()
	if err := tok.Error(); err != nil {
		p.event(Subscriber, Lost, fmt.Errorf("subscribe %s: %w", p.cfg.Topic, err))
		return
	}
	p.event(Subscriber, Connected, nil)
	p.subOnce.Do(func() { close(p.subUp) })
}

// onMessage is paho's callback: it must not block, so it only records.
func (p *Probe) onMessage(_ mqtt.Client, m mqtt.Message) {
	at := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec.receive(m.Payload(), at) {
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

func (p *Probe) event(client, kind string, err error) {
	e := ConnEvent{Time: time.Now(), Client: client, Kind: kind}
	if err != nil {
		e.Err = err.Error()
	}
	p.mu.Lock()
	p.rec.rec.Events = append(p.rec.rec.Events, e)
	p.mu.Unlock()
}

// publish sends on a ticker: a late tick is dropped rather than bunched, so the
// send rate never exceeds one per Interval.
func (p *Probe) publish(ctx context.Context) {
	defer close(p.pubDone)
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		// Record the send before publishing so a fast receipt always finds it.
		p.mu.Lock()
		now := time.Now()
		seq := p.rec.send(now)
		p.mu.Unlock()
		tok := p.pub.Publish(p.cfg.Topic, 0, false, payload(seq, now))
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				p.mu.Lock()
				p.rec.rec.Sends[seq-1].Err = err.Error()
				p.mu.Unlock()
			}
		default: // still being written; QoS 0 has no outcome worth waiting for
		}
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.rec.rec.Ended = time.Now()
			p.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// Stop stops publishing, waits up to Drain for the last message, disconnects
// both clients and returns the recording. Later calls return the same one.
func (p *Probe) Stop() *Recording {
	p.stopOnce.Do(func() {
		p.stopPub()
		<-p.pubDone
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Drain)
		_ = p.waitFor(ctx, func(r *recorder) bool { return r.seen[uint64(len(r.rec.Sends))] })
		cancel()
		p.pub.Disconnect(100)
		p.sub.Disconnect(100)
		p.mu.Lock()
		p.final = p.rec.snapshot(time.Now())
		p.mu.Unlock()
	})
	return p.final
}

// Snapshot is a copy of the recording so far, its Ended set to now while the
// probe runs.
func (p *Probe) Snapshot() *Recording {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec.snapshot(time.Now())
}

// Received is the number of distinct messages received so far.
func (p *Probe) Received() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec.distinct()
}

// Duplicates is the number of duplicate receipts so far.
func (p *Probe) Duplicates() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec.duplicates()
}

// WaitReceived waits until at least n distinct messages have been received
// since Start (use Received()+k to wait for k more).
func (p *Probe) WaitReceived(ctx context.Context, n int) error {
	if err := p.waitFor(ctx, func(r *recorder) bool { return r.distinct() >= n }); err != nil {
		return fmt.Errorf("probe: waiting for %d messages (have %d): %w", n, p.Received(), err)
	}
	return nil
}

// WaitDuplicates waits until at least n duplicate receipts have been recorded.
func (p *Probe) WaitDuplicates(ctx context.Context, n int) error {
	if err := p.waitFor(ctx, func(r *recorder) bool { return r.duplicates() >= n }); err != nil {
		return fmt.Errorf("probe: waiting for %d duplicates (have %d): %w", n, p.Duplicates(), err)
	}
	return nil
}

func (p *Probe) waitFor(ctx context.Context, cond func(*recorder) bool) error {
	for {
		p.mu.Lock()
		ok, ch := cond(p.rec), p.changed
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
