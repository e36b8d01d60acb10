package healthcheck

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/contract"
)

// DefaultBroker is the broker in the same pod: containers of a pod share one
// network namespace, so the data-plane broker is on loopback.
const DefaultBroker = "tcp://127.0.0.1:1883"

// DefaultKeepAlive bounds how long a frozen broker (one that accepts TCP but
// never answers) keeps a dead-looking connection open when no probe round is
// due: after it, a PINGREQ unanswered within the timeout drops the connection.
const DefaultKeepAlive = 10 * time.Second

// maxFailedRounds is how many round trips in a row may fail on one connection
// before it is replaced: a broker that dropped our subscription (or a session
// wedged in some other way) would otherwise fail forever on a healthy socket.
const maxFailedRounds = 3

// disconnectQuiesce bounds how long a clean DISCONNECT may take at shutdown.
const disconnectQuiesce = 250 // milliseconds, as paho wants it

// MQTTConfig configures an [MQTTProber]. The zero value of every field but
// Broker selects a sensible default.
type MQTTConfig struct {
	// Broker is the broker URL; tcp://, mqtt://, ssl://, tls://, ws:// and wss://
	// are accepted. Default DefaultBroker.
	Broker string
	// Username and Password authenticate the probe, when the broker wants it.
	Username, Password string
	// TLS configures ssl://, tls:// and wss:// brokers; nil uses Go's defaults.
	TLS *tls.Config
	// ClientID defaults to "amf-probe-" and 12 random hex digits: unique, and at
	// most 23 bytes, the limit MQTT 3.1.1 brokers must accept.
	ClientID string
	// Topic is the private topic echoed through the broker; default
	// "amf/probe/<ClientID>". It must not contain wildcards.
	Topic string
	// Interval between the starts of two probe rounds; default DefaultInterval.
	Interval time.Duration
	// Timeout bounds connecting, subscribing and each round trip; default
	// DefaultTimeout. It must not exceed Interval.
	Timeout time.Duration
	// KeepAlive is the MQTT keep-alive, rounded up to whole seconds; default
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// ReconnectMin and ReconnectMax bound the exponential back-off between
	// reconnect attempts; defaults DefaultReconnectMin and DefaultReconnectMax.
	ReconnectMin, ReconnectMax time.Duration
}

// MQTTProber checks a broker's application logic end to end: a message
// published with QoS 1 to a private topic it is subscribed to must come back.
// It keeps one connection and reports its loss the moment paho notices it.
type MQTTProber struct {
	cfg     MQTTConfig
	nonce   string // distinguishes this prober's tokens from any earlier run's
	seq     atomic.Uint64
	running atomic.Bool
	// hurryUntil (Unix ns): until then a reconnect waits ReconnectMin, not
	// the back-off (Hurry).
	hurryUntil atomic.Int64
}

var _ Prober = (*MQTTProber)(nil)

// Hurry has the prober reconnect every ReconnectMin, without back-off, for
// d: the sidecar restarted the broker itself and wants to know the moment
// it is back, not the back-off's next try (up to ReconnectMax later).
func (p *MQTTProber) Hurry(d time.Duration) { p.hurryUntil.Store(time.Now().Add(d).UnixNano()) }

// NewMQTTProber validates cfg, fills in its defaults and returns a prober.
func NewMQTTProber(cfg MQTTConfig) (*MQTTProber, error) {
	if cfg.Broker == "" {
		cfg.Broker = DefaultBroker
	}
	if err := contract.CheckBrokerURL(cfg.Broker); err != nil {
		return nil, fmt.Errorf("healthcheck: %w", err)
	}
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("healthcheck: random nonce: %w", err)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "amf-probe-" + hex.EncodeToString(nonce[:])
	}
	if cfg.Topic == "" {
		cfg.Topic = "amf/probe/" + cfg.ClientID
	}
	if strings.ContainsAny(cfg.Topic, "+#") || strings.ContainsRune(cfg.Topic, 0) {
		return nil, fmt.Errorf("healthcheck: probe topic %q must not contain wildcards or NUL", cfg.Topic)
	}
	if err := validDurations(&cfg.Interval, &cfg.Timeout); err != nil {
		return nil, err
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = max(DefaultReconnectMax, cfg.ReconnectMin)
	}
	if cfg.KeepAlive < 0 || cfg.ReconnectMin <= 0 || cfg.ReconnectMax < cfg.ReconnectMin {
		return nil, fmt.Errorf("healthcheck: keep-alive %v, reconnect back-off %v..%v: need positive values, min ≤ max", cfg.KeepAlive, cfg.ReconnectMin, cfg.ReconnectMax)
	}
	return &MQTTProber{cfg: cfg, nonce: hex.EncodeToString(nonce[:])}, nil
}

// Config returns the configuration in use, defaults filled in.
func (p *MQTTProber) Config() MQTTConfig { return p.cfg }

// Run connects, probes every Interval and reconnects with back-off after a
// loss, until ctx ends. Failed connect attempts, lost connections and failed
// rounds are reported as failures; the first passing round after a failure is
// the recovery. A round runs at once after every (re)connect, so recovery is
// known without waiting for the next interval. Run may not be called again
// while it is running: both runs would use the same client ID.
func (p *MQTTProber) Run(ctx context.Context, report func(Result)) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("healthcheck: MQTT prober is already running")
	}
	defer p.running.Store(false)

	attempt := 0 // connects since the last passing round: drives the back-off
	for ctx.Err() == nil {
		wait := backoff(attempt, p.cfg.ReconnectMin, p.cfg.ReconnectMax)
		if time.Now().UnixNano() < p.hurryUntil.Load() {
			wait = p.cfg.ReconnectMin
		}
		if attempt > 0 && !sleepCtx(ctx, wait) {
			break
		}
		attempt++
		s, err := p.connect(ctx)
		if err != nil {
			if ctx.Err() == nil {
				report(failResult("%v", err))
			}
			continue
		}
		if s.run(ctx, report) {
			// The broker worked on this connection: try again at once, as a
			// restarted broker is usually back within a moment.
			attempt = 0
		}
		s.close()
	}
	return nil
}

// token returns a payload no other round, run or prober has used.
func (p *MQTTProber) token() string {
	return p.nonce + "-" + strconv.FormatUint(p.seq.Add(1), 10)
}

// echo is a message received on the probe topic.
type echo struct {
	payload string
	at      time.Time
}

// mqttSession is one connection; a new paho client is made for each, because
// paho does not support reusing a client after Disconnect.
type mqttSession struct {
	p      *MQTTProber
	client mqtt.Client
	echoes chan echo
	lost   chan error
}

func (p *MQTTProber) connect(ctx context.Context) (*mqttSession, error) {
	s := &mqttSession{
		p: p,
		// Buffered and written without blocking, because paho's callbacks must
		// not block. Stale echoes of timed-out rounds are drained by the next
		// round; at most maxFailedRounds of them exist per connection.
		echoes: make(chan echo, 16),
		lost:   make(chan error, 1),
	}
	opts := mqtt.NewClientOptions().
		AddBroker(p.cfg.Broker).
		SetClientID(p.cfg.ClientID).
		SetUsername(p.cfg.Username).
		SetPassword(p.cfg.Password).
		SetTLSConfig(p.cfg.TLS).
		SetCleanSession(true). // nothing to resume: the topic is private, rounds are independent
		SetProtocolVersion(4). // explicit, or paho retries with 3.1 and doubles the connect time
		SetAutoReconnect(false).
		SetConnectRetry(false). // our loop reconnects, so each loss is seen and reported
		SetConnectTimeout(p.cfg.Timeout).
		SetWriteTimeout(p.cfg.Timeout).
		SetKeepAlive((p.cfg.KeepAlive + time.Second - 1).Truncate(time.Second)).
		SetPingTimeout(p.cfg.Timeout).
		SetOrderMatters(false).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			select {
			case s.lost <- err:
			default: // one loss per session is all that matters
			}
		})
	s.client = mqtt.NewClient(opts)

	if err := waitToken(ctx, s.client.Connect(), p.cfg.Timeout); err != nil {
		s.abort()
		return nil, fmt.Errorf("connect to %s: %w", p.cfg.Broker, err)
	}
	tok := s.client.Subscribe(p.cfg.Topic, 1, func(_ mqtt.Client, m mqtt.Message) {
		select {
		case s.echoes <- echo{payload: string(m.Payload()), at: time.Now()}:
		default:
		}
	})
	if err := waitToken(ctx, tok, p.cfg.Timeout); err != nil {
		s.abort()
		return nil, fmt.Errorf("subscribe to %s: %w", p.cfg.Topic, err)
	}
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		if code := st.Result()[p.cfg.Topic]; code == 0x80 {
			s.abort()
			return nil, fmt.Errorf("subscribe to %s: refused by the broker (ACL?)", p.cfg.Topic)
		}
	}
	return s, nil
}

// errTimeout marks a paho operation that did not complete in time.
var errTimeout = errors.New("timed out")

// waitToken waits for a paho token, at most timeout, and returns its error.
func waitToken(ctx context.Context, tok mqtt.Token, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-t.C:
		return fmt.Errorf("%w after %v", errTimeout, timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run probes on this connection until it is lost, fails too often or ctx
// ends. It reports whether any round passed.
func (s *mqttSession) run(ctx context.Context, report func(Result)) (passed bool) {
	next := time.NewTimer(0) // first round at once: connected is not yet working
	defer next.Stop()
	failed := 0
	for {
		select {
		case <-ctx.Done():
			return passed
		case err := <-s.lost:
			report(failResult("connection lost: %v", err))
			return passed
		case <-next.C:
		}
		start := time.Now()
		r, lost := s.roundTrip(ctx)
		if ctx.Err() != nil {
			return passed // shutting down is not a failure of the broker
		}
		report(r)
		if lost {
			return passed
		}
		if r.OK {
			passed, failed = true, 0
		} else if failed++; failed >= maxFailedRounds {
			return passed
		}
		next.Reset(s.p.cfg.Interval - time.Since(start))
	}
}

// roundTrip publishes one token and waits for it to come back. lost tells the
// caller the connection is gone (already part of the returned failure).
func (s *mqttSession) roundTrip(ctx context.Context) (r Result, lost bool) {
	timeout := s.p.cfg.Timeout
	t := time.NewTimer(timeout)
	defer t.Stop()

	token := s.p.token()
	start := time.Now()
	pub := s.client.Publish(s.p.cfg.Topic, 1, false, token)
	pubDone := pub.Done()
	for {
		select {
		case e := <-s.echoes:
			if e.payload == token {
				return okResult(max(e.at.Sub(start), time.Nanosecond)), false
			}
			// An echo of an earlier, timed-out round (or a QoS 1 duplicate): ignore.
		case <-pubDone:
			pubDone = nil // the PUBACK alone proves nothing; keep waiting for the echo
			if err := pub.Error(); err != nil {
				// paho fails pending publishes when the connection drops, before it
				// calls the connection-lost handler: report the loss now.
				if !s.client.IsConnectionOpen() {
					return failResult("connection lost: publish: %v", err), true
				}
				return failResult("publish: %v", err), false
			}
		case err := <-s.lost:
			return failResult("connection lost: %v", err), true
		case <-t.C:
			return failResult("probe message not echoed within %v", timeout), false
		case <-ctx.Done():
			return Result{}, false
		}
	}
}

// close ends the connection; a DISCONNECT is attempted, but a frozen broker can
// delay it by disconnectQuiesce at most.
func (s *mqttSession) close() {
	s.client.Disconnect(disconnectQuiesce)
}

// abort drops a connection that never became usable without waiting, so the
// failure is reported within the timeout; paho finishes the cleanup in the
// background.
func (s *mqttSession) abort() {
	s.client.Disconnect(0)
}
