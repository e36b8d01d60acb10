package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/amf-edge/amf/podsignal"
)

// Default addresses, for tests and for running outside Kubernetes. In a pod
// give --listen 0.0.0.0:1884 behind the DaemonSet's hostPort 1884, so sidecars
// reach the agent at their node's address (status.hostIP), and --http
// 0.0.0.0:9464 so Prometheus can scrape the pod.
const (
	DefaultMQTTAddr = "127.0.0.1:1884"
	DefaultHTTPAddr = "127.0.0.1:9464"
)

// MaxPacketBytes (13 KiB) is the largest MQTT packet the broker reads. The largest
// legitimate packet is a CONNECT with a token (≤ 8 KiB) and a Last Will (≤ a
// signal), or a PUBLISH of a signal (≤ podsignal.MaxMessageBytes); 1 KiB covers
// headers, topics, client identifier and properties. A larger packet closes
// the connection (counted as malformed, reason packet_too_large); a payload
// between podsignal.MaxMessageBytes and this limit is read and refused by the
// decoder (reason too_large).
const MaxPacketBytes = maxTokenBytes + podsignal.MaxMessageBytes + 1<<10

// Config configures an Agent. Zero values take the defaults noted.
type Config struct {
	// MQTTAddr is the control-plane broker's TCP address; default DefaultMQTTAddr.
	// Port 0 picks a free port (see Agent.MQTTAddr).
	MQTTAddr string
	// HTTPAddr serves /metrics and /healthz; default DefaultHTTPAddr.
	HTTPAddr string
	// Authenticator proves the identity of connecting sidecars. Required.
	Authenticator Authenticator
	// Logger receives the agent's JSON lines; default: discard.
	Logger *slog.Logger
	// ObserveOnly keeps the agent from acting on the cluster: with actuation on
	// (amf-agent --actuate) it turns it into a dry run that logs every decision.
	ObserveOnly bool
	// MaxClients bounds the authenticated sessions, one per pod; default 256
	// (a node's 110 pods, with room to spare). Connections that have not
	// authenticated never take one of these slots.
	MaxClients int
	// MaxPending bounds the connections that have not authenticated yet;
	// default 256: a node's every sidecar reconnecting at once (the agent
	// restarted) must fit without evicting one another. When all are
	// taken, a newcomer evicts an idle one from the source holding the most.
	MaxPending int
	// MaxPendingPerSource bounds the unauthenticated connections from one
	// source address; default 8. Sidecars connect from their pods' addresses,
	// one connection each.
	MaxPendingPerSource int
	// MaxKeepalive is the longest MQTT keepalive a client may ask for; default
	// 60 s. A frozen sidecar is noticed keepalive + keepalive/2 (whole seconds,
	// mochi's rule) after its last packet: 7 s for the sidecar's default of 5 s.
	MaxKeepalive time.Duration
	// ConnectTimeout is how long a new connection has to send CONNECT;
	// default 3 s. A sidecar sends it right after its TCP handshake; the
	// deadline only bounds how long an idle socket holds a pending slot.
	ConnectTimeout time.Duration
	// AuthTimeout bounds one token check; default 5 s.
	AuthTimeout time.Duration
	// HistoryLen is how many transitions are kept per pod; default 16.
	HistoryLen int
	// Retention is how long a pod that is gone or stopping is remembered after
	// its last observation; default 1 h.
	Retention time.Duration
}

// Server is the node agent's control plane: the broker the sidecars signal,
// the tracker of pod states, and the HTTP endpoint. Create it with New, then Run (or Listen and
// Serve to learn the bound addresses in between).
type Server struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	tracker *Tracker
	server  *mqtt.Server
	mqttLn  *tcpListener
	adm     *admission
	httpLn  net.Listener
	httpSrv *http.Server
	phase   atomic.Int32  // phaseStarting, phaseServing, phaseStopping: what /healthz says
	started chan struct{} // closed once Serve has the broker and HTTP endpoint up
	used    atomic.Bool   // Listen was called
	served  atomic.Bool   // Serve was called
}

// The agent's phases, as /healthz reports them.
const (
	phaseStarting int32 = iota
	phaseServing
	phaseStopping
)

// Validate says what is wrong with c, if anything. It is the one check of
// c's values: New makes it, and a command calls it before it starts
// anything, so that a bad value stops it before the broker binds. A zero
// value that takes a default is valid.
func (c Config) Validate() error {
	if c.Authenticator == nil {
		return errors.New("agent: Config.Authenticator is required")
	}
	c = c.withDefaults()
	switch {
	case c.MaxClients < 1:
		return fmt.Errorf("agent: MaxClients %d, want at least 1", c.MaxClients)
	case c.MaxPending < 1 || c.MaxPendingPerSource < 1:
		return fmt.Errorf("agent: MaxPending %d and MaxPendingPerSource %d, want at least 1 each", c.MaxPending, c.MaxPendingPerSource)
	case c.MaxKeepalive < time.Second || c.MaxKeepalive > 65535*time.Second:
		return fmt.Errorf("agent: MaxKeepalive %v, want 1 s to 65535 s", c.MaxKeepalive)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("%s: ConnectTimeout %v", errNegative, c.ConnectTimeout)
	case c.AuthTimeout < 0:
		return fmt.Errorf("%s: AuthTimeout %v", errNegative, c.AuthTimeout)
	case c.HistoryLen < 0:
		return fmt.Errorf("%s: HistoryLen %d", errNegative, c.HistoryLen)
	case c.Retention < 0:
		return fmt.Errorf("%s: Retention %v", errNegative, c.Retention)
	}
	return nil
}

// errNegative starts Validate's error for a negative duration or length.
const errNegative = "agent: negative timeout, history length or retention"

// withDefaults returns c with the defaults noted on Config in place of its
// zero values.
func (c Config) withDefaults() Config {
	if c.MQTTAddr == "" {
		c.MQTTAddr = DefaultMQTTAddr
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.MaxClients = cmpOr(c.MaxClients, 256)
	c.MaxPending = cmpOr(c.MaxPending, 256)
	c.MaxPendingPerSource = cmpOr(c.MaxPendingPerSource, 8)
	c.MaxKeepalive = cmpOr(c.MaxKeepalive, 60*time.Second)
	c.ConnectTimeout = cmpOr(c.ConnectTimeout, 3*time.Second)
	c.AuthTimeout = cmpOr(c.AuthTimeout, 5*time.Second)
	c.HistoryLen = cmpOr(c.HistoryLen, 16)
	c.Retention = cmpOr(c.Retention, time.Hour)
	return c
}

// New checks cfg (Validate) and builds an agent; nothing is bound yet.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()

	log := cfg.Logger
	m := newMetrics()
	a := &Server{cfg: cfg, log: log, m: m, tracker: newTracker(log, m, cfg.HistoryLen, time.Now), started: make(chan struct{})}

	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = MaxPacketBytes
	caps.MinimumProtocolVersion = 4 // MQTT 3.1.1 or 5
	caps.MaximumQos = 1             // the contract uses QoS 1; QoS 2 buys nothing here
	caps.TopicAliasMaximum = 0      // an alias would hide the topic from the ACL check
	caps.SharedSubAvailable = 0
	caps.MaximumSessionExpiryInterval = 0 // sidecars publish; no session to keep after a disconnect
	caps.ReceiveMaximum = 64              // in-flight QoS 1 publishes per client
	caps.MaximumInflight = 64
	caps.MaximumClientWritesPending = 64 // the agent only writes acks
	// The listener and the hook enforce the agent's own admission (pending
	// connections apart from sessions, one session per pod); mochi's own
	// client limit stays off.

	mochiLevel := slog.LevelError
	if log.Enabled(context.Background(), slog.LevelDebug) {
		mochiLevel = slog.LevelDebug
	}
	a.server = mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       slog.New(mochiHandler{inner: log.Handler(), min: mochiLevel}).With("component", "mochi"),
		// Nobody may subscribe to $SYS; publishing it every second is wasted work.
		SysTopicResendInterval: 3600,
		// The agent publishes its commands to sidecars itself (Command).
		InlineClient: true,
	})
	refusals := &logSampler{perSecond: 10}
	adm := newAdmission(cfg.MaxPending, cfg.MaxPendingPerSource, cfg.MaxClients, bytesWaiting)
	a.adm = adm
	a.mqttLn = &tcpListener{
		id:        "amf-control",
		address:   cfg.MQTTAddr,
		handshake: cfg.ConnectTimeout,
		adm:       adm,
		onRefuse: func(remote, reason string) {
			m.connRefused.WithLabelValues(reason).Inc()
			// A flood is thousands of these a second: the metric counts
			// each, the log gets a sample with the count it stands for.
			if n, ok := refusals.allow(reason, time.Now()); ok {
				log.Warn("connection refused", slog.String("remote", remote), slog.String("reason", reason),
					slog.Int("max_pending", cfg.MaxPending), slog.Int("max_pending_per_source", cfg.MaxPendingPerSource),
					slog.Int("suppressed_before", n))
			}
		},
		disconnect: func(id string) {
			// GetAll copies the map under one read lock; see tcpListener.disconnect.
			for _, cl := range a.server.Clients.GetAll() {
				if cl.Net.Listener == id && !cl.Closed() {
					_ = a.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
				}
			}
		},
		onDone: func(tc *trackedConn) {
			// mochi skips OnDisconnect when CONNACK cannot be written.
			if s := tc.sess.Load(); s != nil {
				a.tracker.end(s, false)
			}
		},
		log: log,
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	mux.HandleFunc("GET /healthz", a.healthz)
	a.httpSrv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return a, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// replace ends the connection of a pod's session that a newer session of
// the same pod has replaced. MQTT 5 clients are told why (DISCONNECT 0x8E,
// session taken over). The write gets a short deadline: the connection
// being replaced is often one that silently died, and the new session must
// not wait for it.
func (a *Server) replace(old *trackedConn) {
	_ = old.SetWriteDeadline(time.Now().Add(time.Second))
	if cl := old.cl.Load(); cl != nil {
		_ = a.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
		return
	}
	_ = old.Close()
}

// Tracker returns the pod states and the event subscription of the agent.
func (a *Server) Tracker() *Tracker { return a.tracker }

// MQTTAddr returns the broker's bound address (after Listen).
func (a *Server) MQTTAddr() string { return a.mqttLn.Address() }

// HTTPAddr returns the HTTP endpoint's bound address (after Listen).
func (a *Server) HTTPAddr() string {
	if a.httpLn == nil {
		return a.cfg.HTTPAddr
	}
	return a.httpLn.Addr().String()
}

// Listen binds the broker and HTTP addresses. An agent listens once.
func (a *Server) Listen() error {
	if !a.used.CompareAndSwap(false, true) {
		return errors.New("agent: Listen called twice")
	}
	if err := a.server.AddListener(a.mqttLn); err != nil {
		return fmt.Errorf("agent: MQTT listener on %s: %w", a.cfg.MQTTAddr, err)
	}
	ln, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		_ = a.mqttLn.ln.Close()
		return fmt.Errorf("agent: HTTP listener on %s: %w", a.cfg.HTTPAddr, err)
	}
	a.httpLn = ln
	return nil
}

// Serve runs the broker and the HTTP endpoint until ctx ends, then disconnects
// every client and returns nil; it returns early with the error if the HTTP
// endpoint fails. Listen must have succeeded.
func (a *Server) Serve(ctx context.Context) error {
	if a.httpLn == nil {
		return errors.New("agent: Serve before a successful Listen")
	}
	if !a.served.CompareAndSwap(false, true) {
		return errors.New("agent: Serve called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &hook{
		ctx:          ctx,
		auth:         a.cfg.Authenticator,
		tracker:      a.tracker,
		m:            a.m,
		log:          a.log,
		maxKeepalive: uint16(a.cfg.MaxKeepalive / time.Second),
		authTimeout:  a.cfg.AuthTimeout,
		now:          time.Now,
		adm:          a.adm,
		replace:      a.replace,
	}
	// The HTTP endpoint first, so /healthz says "starting" until the broker
	// serves.
	httpErr := make(chan error, 1)
	go func() { httpErr <- a.httpSrv.Serve(a.httpLn) }()
	if err := a.server.AddHook(h, nil); err != nil {
		_ = a.httpSrv.Close()
		return fmt.Errorf("agent: add hook: %w", err)
	}
	if err := a.server.Serve(); err != nil {
		_ = a.httpSrv.Close()
		return fmt.Errorf("agent: start broker: %w", err)
	}
	a.phase.Store(phaseServing)
	close(a.started)
	a.log.Info("agent serving",
		slog.String("mqtt_addr", a.MQTTAddr()), slog.String("http_addr", a.HTTPAddr()),
		slog.Bool("observe_only", a.cfg.ObserveOnly), slog.Int("max_clients", a.cfg.MaxClients),
		slog.Int("max_pending", a.cfg.MaxPending), slog.Int("max_pending_per_source", a.cfg.MaxPendingPerSource),
		slog.String("connect_timeout", a.cfg.ConnectTimeout.String()),
		slog.String("max_keepalive", a.cfg.MaxKeepalive.String()))

	prune := time.NewTicker(max(min(a.cfg.Retention/4, time.Minute), time.Second))
	defer prune.Stop()
	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err = <-httpErr:
			err = fmt.Errorf("agent: HTTP endpoint: %w", err)
			break loop
		case now := <-prune.C:
			for _, id := range a.tracker.prune(now.Add(-a.cfg.Retention)) {
				// Forget the retained signal and command too, or pod churn grows the broker.
				a.server.Topics.RetainMessage(packets.Packet{TopicName: id.Topic()})
				a.server.Topics.RetainMessage(packets.Packet{TopicName: id.CommandTopic()})
			}
		}
	}
	a.shutdown(cancel)
	return err
}

// shutdown stops in an order that keeps the record honest: first the tracker
// stops reading disconnects as pods going, then pending token checks abort,
// then the broker disconnects everyone.
func (a *Server) shutdown(cancel context.CancelFunc) {
	a.phase.Store(phaseStopping)
	a.tracker.shutdown()
	cancel()
	_ = a.server.Close()
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if err := a.httpSrv.Shutdown(ctx); err != nil {
		a.log.Warn("HTTP shutdown", slog.String("error", err.Error()))
	}
	a.log.Info("agent stopped")
}

// Command publishes c on its pod's command topic, retained, so the pod's
// sidecar has it now if connected, or at its next connect: the newest
// command is what the sidecar is to do. It fails only for an invalid
// command or an agent that is not serving.
func (a *Server) Command(c podsignal.Command) error {
	c.Version = podsignal.Version
	b, err := podsignal.EncodeCommand(&c)
	if err != nil {
		return err
	}
	select {
	case <-a.started:
	default:
		return errors.New("agent: command before the broker serves")
	}
	if a.phase.Load() == phaseStopping {
		return errors.New("agent: command while stopping")
	}
	if err := a.server.Publish(podsignal.CommandTopic(c.Namespace, c.Pod), b, true, 1); err != nil {
		return fmt.Errorf("agent: publish the command to %s/%s: %w", c.Namespace, c.Pod, err)
	}
	a.m.commands.WithLabelValues(c.Name()).Inc()
	a.log.Info("command", slog.String("pod", c.Namespace+"/"+c.Pod), slog.Bool("fence", c.Fence), slog.String("reason", c.Reason))
	return nil
}

// Run listens and serves until ctx ends.
func (a *Server) Run(ctx context.Context) error {
	if err := a.Listen(); err != nil {
		return err
	}
	return a.Serve(ctx)
}

// Started is closed once Serve has the broker and the HTTP endpoint up: a
// caller that must not race with the start (a test, a supervisor) waits on it.
func (a *Server) Started() <-chan struct{} { return a.started }

// healthz answers 200 while the broker serves, 503 with the phase otherwise.
func (a *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch a.phase.Load() {
	case phaseStarting:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"starting"}` + "\n"))
		return
	case phaseStopping:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"stopping"}` + "\n"))
		return
	}
	_ = json.NewEncoder(w).Encode(struct {
		Status string `json:"status"`
		Pods   int    `json:"pods"`
	}{"ok", a.tracker.len()})
}
