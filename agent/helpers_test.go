package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/podsignal"
)

// waitFor bounds every wait of these tests; they wait for events, never sleep.
const waitFor = 10 * time.Second

// Test identities and their tokens.
var (
	podA   = podsignal.PodID{Namespace: "tod", Pod: "broker-a"}
	podB   = podsignal.PodID{Namespace: "tod", Pod: "broker-b"}
	tokenA = "tok-a-0123456789abcdef"
	tokenB = "tok-b-0123456789abcdef"
)

// logSink collects the agent's JSON log lines and lets tests wait for one.
type logSink struct {
	mu      sync.Mutex
	partial []byte
	raw     []string
	lines   []map[string]any
	changed chan struct{} // closed and replaced on every new line
}

func newLogSink() *logSink { return &logSink{changed: make(chan struct{})} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		line := string(s.partial[:i])
		s.partial = s.partial[i+1:]
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			m = map[string]any{"msg": "NOT JSON", "line": line}
		}
		s.raw = append(s.raw, line)
		s.lines = append(s.lines, m)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return len(p), nil
}

// match returns the lines for which pred holds.
func (s *logSink) match(pred func(map[string]any) bool) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range s.lines {
		if pred(l) {
			out = append(out, l)
		}
	}
	return out
}

// wait returns the first line for which pred holds, waiting for it to be written.
func (s *logSink) wait(t *testing.T, what string, pred func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		s.mu.Lock()
		for _, l := range s.lines {
			if pred(l) {
				s.mu.Unlock()
				return l
			}
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no log line %s within %v; lines:\n%s", what, waitFor, strings.Join(s.rawLines(), "\n"))
		}
	}
}

func (s *logSink) rawLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.raw...)
}

// lineIs matches a log line by message and string fields.
func lineIs(msg string, kv ...string) func(map[string]any) bool {
	return func(l map[string]any) bool {
		if l["msg"] != msg {
			return false
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if fmt.Sprint(l[kv[i]]) != kv[i+1] {
				return false
			}
		}
		return true
	}
}

type testAgent struct {
	*Server
	logs   *logSink
	events <-chan podsignal.Observation
	stop   func() // stops the agent and waits for Serve to return; idempotent
}

// startAgent runs an agent on free loopback ports with the static tokens of
// podA and podB (unless cfg sets another authenticator) and stops it at the
// end of the test, checking that no token ever reached its log.
func startAgent(t *testing.T, mod func(*Config)) *testAgent {
	t.Helper()
	logs := newLogSink()
	cfg := Config{
		MQTTAddr:      "127.0.0.1:0",
		HTTPAddr:      "127.0.0.1:0",
		Authenticator: staticTokens(t, tokenA+" "+podA.String(), tokenB+" "+podB.String()),
		Logger:        slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	events := a.Tracker().Subscribe(ctx, 1024)
	if err := a.Listen(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	// Tests begin once the agent serves, never racing with its start.
	select {
	case <-a.Started():
	case err := <-done:
		cancel()
		t.Fatalf("Serve: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(waitFor):
				var buf bytes.Buffer
				_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
				t.Errorf("agent did not stop within %v; goroutines:\n%s", waitFor, buf.String())
			}
		})
	}
	t.Cleanup(func() {
		stop()
		for _, l := range logs.rawLines() {
			for _, tok := range []string{tokenA, tokenB} {
				if strings.Contains(l, tok) {
					t.Errorf("a token reached the log: %s", l)
				}
			}
			if strings.Contains(l, "NOT JSON") {
				t.Errorf("log line is not JSON: %s", l)
			}
		}
	})
	return &testAgent{Server: a, logs: logs, events: events, stop: stop}
}

// nextEvent returns the next event of id. It skips the events of other pods
// only, so a test sees every event of the pod it watches, in order.
func (ta *testAgent) nextEvent(t *testing.T, id podsignal.PodID) podsignal.Observation {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case ev, ok := <-ta.events:
			if !ok {
				t.Fatalf("event channel closed while waiting for %s", id)
			}
			if ev.PodID == id {
				return ev
			}
		case <-deadline:
			t.Fatalf("no event for %s within %v", id, waitFor)
		}
	}
}

func staticTokens(t *testing.T, lines ...string) *StaticTokens {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadStaticTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// client is a paho client whose TCP connection the test can cut.
type client struct {
	paho.Client
	conn atomic.Pointer[net.Conn]
}

// kill closes the TCP connection without an MQTT DISCONNECT, as a crash would.
func (c *client) kill(t *testing.T) {
	t.Helper()
	conn := c.conn.Load()
	if conn == nil {
		t.Fatal("no connection to kill")
	}
	_ = (*conn).Close()
}

// clientOptions are what a sidecar sends: username <ns>/<pod>, the token as
// password, client id <ns>/<pod>, MQTT 3.1.1, keepalive 5 s, no reconnects.
func clientOptions(addr string, id podsignal.PodID, token string) *paho.ClientOptions {
	return paho.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(id.String()).
		SetUsername(id.String()).
		SetPassword(token).
		SetProtocolVersion(4). // no fallback to 3.1: one refusal per attempt
		SetKeepAlive(5 * time.Second).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(waitFor).
		SetWriteTimeout(waitFor)
}

// dial connects a paho client; mod may change the options first.
func dial(t *testing.T, addr string, id podsignal.PodID, token string, mod func(*paho.ClientOptions)) (*client, error) {
	t.Helper()
	c := &client{}
	opts := clientOptions(addr, id, token)
	opts.SetCustomOpenConnectionFn(func(u *url.URL, _ paho.ClientOptions) (net.Conn, error) {
		conn, err := net.DialTimeout("tcp", u.Host, waitFor)
		if err == nil {
			c.conn.Store(&conn)
		}
		return conn, err
	})
	if mod != nil {
		mod(opts)
	}
	c.Client = paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(waitFor) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if c.IsConnected() {
			c.Disconnect(0)
		}
	})
	return c, nil
}

func mustDial(t *testing.T, addr string, id podsignal.PodID, token string, mod func(*paho.ClientOptions)) *client {
	t.Helper()
	c, err := dial(t, addr, id, token, mod)
	if err != nil {
		t.Fatalf("connect as %s: %v", id, err)
	}
	return c
}

// payload encodes a valid signal of id.
func payload(t testing.TB, id podsignal.PodID, state podsignal.State, seq uint64) []byte {
	t.Helper()
	p := 0.25
	if state == podsignal.Anomalous {
		p = 0.9
	}
	b, err := podsignal.Encode(&podsignal.Message{
		Version: podsignal.Version, Namespace: id.Namespace, Pod: id.Pod, State: state,
		Probability: &p, Seq: seq, Time: time.Now(), Reason: "test",
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publish sends a retained QoS 1 message and waits for its PUBACK.
func publish(t *testing.T, c *client, topic string, body []byte) {
	t.Helper()
	tok := c.Publish(topic, 1, true, body)
	if !tok.WaitTimeout(waitFor) {
		t.Fatalf("publish to %s: no PUBACK within %v", topic, waitFor)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("publish to %s: %v", topic, err)
	}
}

func timeout() <-chan time.Time { return time.After(waitFor) }
