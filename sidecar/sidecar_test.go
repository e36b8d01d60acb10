package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
	"github.com/amf-edge/amf/lab/broker"
	"github.com/amf-edge/amf/podsignal"
)

// loadSource is a target whose memory the test sets; CPU ticks along.
type loadSource struct {
	memory atomic.Int64
	cpu    atomic.Int64
}

func (l *loadSource) Read(context.Context) (cgroup.Stats, error) {
	c := l.cpu.Add(1)
	return cgroup.Stats{Time: time.Now(), CPUSeconds: float64(c) * 0.001, MemoryBytes: float64(l.memory.Load()),
		MemoryLimitBytes: 100 << 20, DiskBytes: 0, NetworkBytes: 0, HasNetwork: true}, nil
}

// startBroker runs a real mochi broker on loopback standing in for the agent's.
func startBroker(t *testing.T) (*mochi.Server, string) {
	t.Helper()
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	l := broker.NewTCP(srv, "tcp", "127.0.0.1:0")
	if err := srv.AddListener(l); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, "tcp://" + l.Address()
}

// watch subscribes to every health topic and returns the decoded messages.
func watch(t *testing.T, broker string) <-chan podsignal.Message {
	t.Helper()
	out := make(chan podsignal.Message, 1024)
	opts := mqtt.NewClientOptions().AddBroker(broker).SetClientID("watcher").SetAutoReconnect(false)
	c := mqtt.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("watcher connect: %v", tok.Error())
	}
	tok := c.Subscribe("amf/v1/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		msg, err := podsignal.Decode(m.Topic(), m.Payload())
		if err != nil {
			t.Errorf("sidecar sent an invalid signal: %v", err)
			return
		}
		out <- msg
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("watcher subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return out
}

// await returns the first message in state want, failing after a deadline.
func await(t *testing.T, msgs <-chan podsignal.Message, want podsignal.State) podsignal.Message {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m := <-msgs:
			if m.State == want {
				return m
			}
		case <-deadline:
			t.Fatalf("no %s signal within 20 s", want)
		}
	}
}

type running struct {
	sc     *Sidecar
	src    *loadSource
	cancel context.CancelFunc
	done   chan error
	http   *httptest.Server
}

// reconnect is the signaller's back-off before reconnecting.
func startSidecar(t *testing.T, broker string, reconnect time.Duration) *running {
	t.Helper()
	m, err := model.Embedded(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	return startSidecarWith(t, broker, reconnect, m)
}

// startSidecarWith is startSidecar running model m.
func startSidecarWith(t *testing.T, broker string, reconnect time.Duration, m *model.Model) *running {
	t.Helper()
	sig, err := NewSignaller(SignallerConfig{Broker: broker, Namespace: "tod", Pod: "broker-0", Token: "t",
		KeepAlive: 2 * time.Second, ReconnectMin: reconnect, ReconnectMax: reconnect})
	if err != nil {
		t.Fatal(err)
	}
	src := &loadSource{}
	src.memory.Store(10 << 20)
	sc, err := New(Config{Source: src, Interval: 20 * time.Millisecond, Model: m, Publisher: sig,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := healthcheck.NewServer(sc.serverConfig())
	if err != nil {
		t.Fatal(err)
	}
	r := &running{sc: sc, src: src, done: make(chan error, 1), http: httptest.NewServer(srv.Handler())}
	t.Cleanup(r.http.Close)
	ctx, cancel := context.WithCancel(t.Context())
	r.cancel = cancel
	go func() { r.done <- sc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestSidecarSignalsEveryAnomalousSampleAndItsTransitions(t *testing.T) {
	_, broker := startBroker(t)
	msgs := watch(t, broker)
	r := startSidecar(t, broker, 10*time.Millisecond)

	healthy := await(t, msgs, podsignal.Healthy)
	if healthy.Probability == nil || *healthy.Probability >= 0.5 {
		t.Fatalf("healthy signal without a low score: %+v", healthy)
	}
	if _, body := get(t, r.http.URL+"/status"); strings.Contains(body, `"explanation"`) {
		t.Errorf("/status explains a healthy score: %s", body)
	}

	// 60 MiB of a 100 MiB limit is 120 on the dataset's scale: over its 80 cut.
	r.src.memory.Store(60 << 20)
	first := await(t, msgs, podsignal.Anomalous)
	seq := first.Seq
	for i := 0; i < 3; i++ { // consecutive anomalous samples keep coming
		m := <-msgs
		if m.State != podsignal.Anomalous || m.Seq != seq+1 {
			t.Fatalf("after seq %d got %s seq %d, want anomalous seq %d", seq, m.State, m.Seq, seq+1)
		}
		seq = m.Seq
	}
	if code, body := get(t, r.http.URL+"/status"); code != 200 || !strings.Contains(body, `"state":"anomalous"`) {
		t.Fatalf("/status = %d %s", code, body)
	}
	// The anomalous score is explained: memory is what changed.
	if _, body := get(t, r.http.URL+"/status"); !strings.Contains(body, `"explanation":"memory_percent +`) {
		t.Errorf("/status while anomalous does not name memory_percent first in its explanation: %s", body)
	}

	// The application beside the broker says it is broken.
	resp, err := http.Post(r.http.URL+"/signal", "application/json", strings.NewReader(`{"state":"unhealthy","reason":"bridge down"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST /signal = %d", resp.StatusCode)
	}
	if m := await(t, msgs, podsignal.Unhealthy); !strings.Contains(m.Reason, "bridge down") {
		t.Fatalf("unhealthy reason %q", m.Reason)
	}
	if code, _ := get(t, r.http.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while unhealthy = %d, want 503", code)
	}

	// SIGTERM: stopping is sent and acknowledged before Run returns.
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	r.done <- nil // for the cleanup
	await(t, msgs, podsignal.Stopping)
}

func TestSidecarOnPredictLinearAlarmsOnAMemoryClimbAndSaysWhenItMeetsTheLimit(t *testing.T) {
	m, err := model.Embedded(model.PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	_, broker := startBroker(t)
	msgs := watch(t, broker)
	r := startSidecarWith(t, broker, 10*time.Millisecond, m)
	if h := await(t, msgs, podsignal.Healthy); h.Probability == nil || *h.Probability >= 0.5 {
		t.Fatalf("healthy signal without a score under the limit: %+v", h)
	}
	// Memory climbs 1 MiB per sample (every 20 ms): the line meets the 100 MiB
	// limit well within the rule's horizon.
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				if r.src.memory.Load() < 90<<20 {
					r.src.memory.Add(1 << 20)
				}
			}
		}
	}()
	defer close(stop)
	a := await(t, msgs, podsignal.Anomalous)
	if a.Probability == nil || *a.Probability < 0.5 {
		t.Fatalf("anomalous without a projection at the limit: %+v", a)
	}
	if _, body := get(t, r.http.URL+"/status"); !strings.Contains(body, `"explanation":"memory's line m`) ||
		!strings.Contains(body, "predict_linear(memory_bytes[") {
		t.Errorf("/status does not say when memory meets the limit: %s", body)
	}
}

func TestSidecarLastWillAndRepublishOnReconnect(t *testing.T) {
	srv, broker := startBroker(t)
	msgs := watch(t, broker)
	// The broker publishes a Last Will only if the session is not taken over
	// first: a sidecar reconnecting with the same client ID within microseconds
	// inherits the session and no will is sent (the agent sees the disconnect
	// itself then). Back off long enough for the will to go out.
	startSidecar(t, broker, time.Second)
	await(t, msgs, podsignal.Healthy)

	// Cut the sidecar's TCP connection under the broker, as a network cut
	// would. Not cl.Stop: mochi sends no will when its read loop finds the
	// client stopped between two packets, which a sidecar publishing every
	// 20 ms made a race the test lost now and then.
	cl, ok := srv.Clients.Get("tod/broker-0/sidecar")
	if !ok {
		t.Fatal("sidecar client not connected")
	}
	_ = cl.Net.Conn.Close()
	gone := await(t, msgs, podsignal.Gone)
	if gone.Reason == "" {
		t.Fatal("Last Will without a reason")
	}
	// The sidecar reconnects and says where it is now.
	await(t, msgs, podsignal.Healthy)
}

// goneSource is a target that has vanished, as a restarted container's cgroup.
type goneSource struct{}

func (goneSource) Read(context.Context) (cgroup.Stats, error) {
	return cgroup.Stats{}, fmt.Errorf("read /sys/fs/cgroup/x: %w", cgroup.ErrGone)
}

func (goneSource) String() string { return "the old container" }

// A sidecar without its target starts anyway, says why and looks again at
// every sample; a target that vanishes is looked for again the same way.
func TestSidecarLooksForItsTargetUntilFound(t *testing.T) {
	m, err := model.Embedded(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	next := make(chan detect.Source, 1)
	rediscover := func(context.Context) (detect.Source, error) {
		calls.Add(1)
		select {
		case src := <-next:
			return src, nil
		default:
			return nil, errors.New(`pod mqtt/b has no container "mosquitto"`)
		}
	}
	sc, err := New(Config{Rediscover: rediscover, TargetError: "not looked yet", Interval: 10 * time.Millisecond, Model: m,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitFor := func(what string, ok func(healthcheck.Status) bool) healthcheck.Status {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if st := sc.Status(); ok(st) {
				return st
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s: not within 10 s; status %+v", what, sc.Status())
		return healthcheck.Status{}
	}
	st := waitFor("looked again", func(healthcheck.Status) bool { return calls.Load() >= 3 })
	if st.State != podsignal.Starting || !strings.Contains(st.TargetError, `no container "mosquitto"`) || !strings.Contains(st.TransitionReason, "not found yet") {
		t.Errorf("status %+v: want starting, with the reason", st)
	}

	src := &loadSource{}
	src.memory.Store(10 << 20)
	next <- src
	st = waitFor("found", func(st healthcheck.Status) bool { return st.State == podsignal.Healthy })
	if st.TargetError != "" || st.Target == "" {
		t.Errorf("status %+v: want the target and no error", st)
	}

	// It vanishes: unhealthy, and looked for until it is back.
	sc.do(ctx, func() { _, _ = sc.pipe.SetTarget(goneSource{}) })
	waitFor("gone", func(st healthcheck.Status) bool { return st.State == podsignal.Unhealthy })
	next <- src
	waitFor("back", func(st healthcheck.Status) bool { return st.State == podsignal.Healthy })
}

func p1Model(t *testing.T) *model.Model { return modeltest.P1(t) }
