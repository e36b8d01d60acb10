package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/podsignal"
)

// SignallerConfig says how to reach the node agent's control-plane broker.
type SignallerConfig struct {
	Broker    string // e.g. tcp://10.0.0.5:1884 (the node's agent), never the data-plane broker
	Namespace string
	Pod       string
	// Token proves the identity: a projected ServiceAccount token file (re-read at
	// every connect, since the kubelet rotates it) or a static token.
	TokenFile string
	Token     string
	TLS       *tls.Config
	// KeepAlive bounds how long a frozen sidecar goes unnoticed: the agent's broker
	// drops the connection after 1.5 keep-alives and publishes the Last Will.
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	ReconnectMin   time.Duration
	ReconnectMax   time.Duration
	Log            *slog.Logger
}

// Signaller publishes the pod's health to the node agent: retained, QoS 1, with a
// Last Will of state gone. It keeps the newest message and republishes it after
// every reconnect, so the agent always ends up with the current state.
//
// Each connection is a new MQTT client, so its Last Will carries the time and the
// sequence number current at connect time rather than those of the first connect.
type Signaller struct {
	cfg   SignallerConfig
	topic string

	mu        sync.Mutex
	client    mqtt.Client // nil while disconnected
	latest    *podsignal.Message
	connected chan struct{}          // closed and replaced on every connect, for waiters
	lost      chan struct{}          // signalled on connection loss
	commands  chan podsignal.Command // the newest command of the agent, one at most
}

// NewSignaller validates cfg and returns a signaller; Run connects it.
func NewSignaller(cfg SignallerConfig) (*Signaller, error) {
	if cfg.Broker == "" {
		return nil, errors.New("signaller: no agent address: set --agent to the node agent's broker, e.g. tcp://$(NODE_IP):1884")
	}
	// Refused here, at start: paho would only say "unknown protocol" at
	// every retry, forever.
	if u, err := url.Parse(cfg.Broker); err != nil {
		return nil, fmt.Errorf("signaller: agent address %q: %w (want tcp://HOST:PORT, e.g. tcp://$(NODE_IP):1884)", cfg.Broker, err)
	} else if u.Scheme != "tcp" && u.Scheme != "mqtt" {
		return nil, fmt.Errorf("signaller: agent address %q: scheme must be tcp or mqtt (the agent speaks plain MQTT on its node), e.g. tcp://$(NODE_IP):1884", cfg.Broker)
	} else if u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("signaller: agent address %q: want a host and a port, e.g. tcp://$(NODE_IP):1884", cfg.Broker)
	}
	if err := podsignal.ValidateNames(cfg.Namespace, cfg.Pod); err != nil {
		return nil, fmt.Errorf("signaller: %w (set --namespace/--pod or POD_NAMESPACE/POD_NAME from the downward API)", err)
	}
	if cfg.TokenFile == "" && cfg.Token == "" {
		return nil, errors.New("signaller: no token: set --token-file to the projected ServiceAccount token (audience amf-agent)")
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 5 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = 100 * time.Millisecond
	}
	if cfg.ReconnectMax <= 0 {
		cfg.ReconnectMax = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Signaller{
		cfg:       cfg,
		topic:     podsignal.Topic(cfg.Namespace, cfg.Pod),
		connected: make(chan struct{}),
		lost:      make(chan struct{}, 1),
		commands:  make(chan podsignal.Command, 1),
	}, nil
}

// Commands delivers the node agent's commands to this pod (podsignal.Command),
// subscribed to at every connect: only the newest one waits, since each
// replaces the one before.
func (s *Signaller) Commands() <-chan podsignal.Command { return s.commands }

func (s *Signaller) command(_ mqtt.Client, m mqtt.Message) {
	c, err := podsignal.DecodeCommand(m.Topic(), m.Payload())
	if err != nil {
		s.cfg.Log.Warn("command from the node agent refused", "topic", m.Topic(), "err", err)
		return
	}
	select { // drop an older command not taken yet
	case <-s.commands:
	default:
	}
	s.commands <- c
}

// Topic returns the health topic this signaller publishes on.
func (s *Signaller) Topic() string { return s.topic }

// Run keeps a connection to the agent until ctx ends, reconnecting with jittered
// exponential back-off. It returns nil when ctx ends.
func (s *Signaller) Run(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff(attempt, s.cfg.ReconnectMin, s.cfg.ReconnectMax)):
			}
		}
		c, err := s.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.cfg.Log.Warn("cannot reach the node agent; retrying", "broker", s.cfg.Broker, "attempt", attempt+1, "err", err)
			continue
		}
		attempt = 0
		select {
		case <-ctx.Done():
			return nil // Close does the orderly goodbye
		case <-s.lost:
			s.mu.Lock()
			if s.client == c {
				s.client = nil
			}
			s.mu.Unlock()
			c.Disconnect(0)
		}
	}
}

func (s *Signaller) connect(ctx context.Context) (mqtt.Client, error) {
	token := s.cfg.Token
	if s.cfg.TokenFile != "" {
		b, err := os.ReadFile(s.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("read token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	s.mu.Lock()
	will := podsignal.Message{Version: podsignal.Version, Namespace: s.cfg.Namespace, Pod: s.cfg.Pod,
		State: podsignal.Gone, Time: time.Now(), Reason: "sidecar connection lost"}
	if s.latest != nil {
		will.Seq = s.latest.Seq
	}
	s.mu.Unlock()
	willPayload, err := podsignal.Encode(&will)
	if err != nil {
		return nil, err
	}

	opts := mqtt.NewClientOptions().
		AddBroker(s.cfg.Broker).
		SetClientID(s.cfg.Namespace+"/"+s.cfg.Pod+"/sidecar").
		SetUsername(s.cfg.Namespace+"/"+s.cfg.Pod).
		SetPassword(token).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetKeepAlive(s.cfg.KeepAlive).
		SetPingTimeout(s.cfg.KeepAlive).
		SetConnectTimeout(s.cfg.ConnectTimeout).
		SetWriteTimeout(s.cfg.ConnectTimeout).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetOrderMatters(false).
		SetBinaryWill(s.topic, willPayload, 1, true).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			s.cfg.Log.Warn("connection to the node agent lost", "err", err)
			select {
			case s.lost <- struct{}{}:
			default:
			}
		})
	if s.cfg.TLS != nil {
		opts.SetTLSConfig(s.cfg.TLS)
	}
	c := mqtt.NewClient(opts)
	if err := waitToken(ctx, c.Connect(), s.cfg.ConnectTimeout); err != nil {
		c.Disconnect(0)
		return nil, err
	}
	s.mu.Lock()
	s.client = c
	latest := s.latest
	close(s.connected)
	s.connected = make(chan struct{})
	s.mu.Unlock()
	s.cfg.Log.Info("connected to the node agent", "broker", s.cfg.Broker, "topic", s.topic)
	// The agent's commands to this pod; a retained one arrives at once. An
	// agent that refuses the subscription (older than commands) is no reason
	// to stop signalling.
	cmdTopic := podsignal.CommandTopic(s.cfg.Namespace, s.cfg.Pod)
	if tok := c.Subscribe(cmdTopic, 1, s.command); !tok.WaitTimeout(s.cfg.ConnectTimeout) || tok.Error() != nil {
		s.cfg.Log.Warn("not subscribed to the node agent's commands", "topic", cmdTopic, "err", tok.Error())
	} else if st, ok := tok.(*mqtt.SubscribeToken); ok && st.Result()[cmdTopic] == 0x80 {
		s.cfg.Log.Warn("the node agent refused the subscription to its commands (an agent older than commands?)", "topic", cmdTopic)
	}
	// The agent may have seen our Last Will, or nothing: say where we are now.
	if latest != nil {
		s.send(c, latest)
	}
	return c, nil
}

// Publish makes m the current state and sends it now when connected; when not,
// it is sent on the next connect. It never blocks on the network.
func (s *Signaller) Publish(m podsignal.Message) error {
	m.Version, m.Namespace, m.Pod = podsignal.Version, s.cfg.Namespace, s.cfg.Pod
	if _, err := podsignal.Encode(&m); err != nil {
		return err
	}
	s.mu.Lock()
	s.latest = &m
	c := s.client
	s.mu.Unlock()
	if c != nil {
		s.send(c, &m)
	}
	return nil
}

func (s *Signaller) send(c mqtt.Client, m *podsignal.Message) {
	payload, err := podsignal.Encode(m)
	if err != nil {
		s.cfg.Log.Error("refusing to send an invalid signal", "err", err)
		return
	}
	c.Publish(s.topic, 1, true, payload) // async: the token is not awaited on the hot path
}

// Close sends final (normally state stopping), waits up to timeout for the agent
// to acknowledge it, and disconnects cleanly so no Last Will is published.
func (s *Signaller) Close(final podsignal.Message, timeout time.Duration) error {
	final.Version, final.Namespace, final.Pod = podsignal.Version, s.cfg.Namespace, s.cfg.Pod
	payload, err := podsignal.Encode(&final)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.latest = &final
	c := s.client
	s.client = nil
	s.mu.Unlock()
	if c == nil {
		return errors.New("signaller: not connected to the node agent; final state not sent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = waitToken(ctx, c.Publish(s.topic, 1, true, payload), timeout)
	c.Disconnect(uint(timeout / time.Millisecond))
	return err
}

// Connected returns a channel closed at the next successful connect (for tests
// and start-up ordering).
func (s *Signaller) Connected() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return s.connected
}

func waitToken(ctx context.Context, tok mqtt.Token, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("no answer from the node agent within %v", timeout)
	}
}

// backoff is exponential from min to max with full jitter on the upper half, so
// sidecars restarted together do not reconnect in lockstep.
func backoff(attempt int, lo, hi time.Duration) time.Duration {
	d := lo << min(attempt-1, 30)
	if d > hi || d <= 0 {
		d = hi
	}
	return d/2 + rand.N(d/2+1)
}
