package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// awaitRecorded waits until r holds a message in state want and returns it.
func awaitRecorded(t *testing.T, r *Recorder, want podsignal.State) podsignal.Message {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for seen := 0; ; {
		msgs, next := r.Messages()
		for _, m := range msgs[seen:] {
			if m.State == want {
				return m
			}
		}
		seen = len(msgs)
		select {
		case <-next:
		case <-timeout:
			t.Fatalf("no %s signal in %+v", want, msgs)
		}
	}
}

// TestSidecarPublishesThroughItsPublisher: the loop hands every signal to the
// Publisher, the last (stopping) through Close; the Recorder stands in for
// the MQTT signaller, which the broker tests above exercise.
func TestSidecarPublishesThroughItsPublisher(t *testing.T) {
	src := &loadSource{}
	src.memory.Store(10 << 20)
	rec := NewRecorder()
	sc, err := New(Config{Source: src, Interval: 10 * time.Millisecond, Model: p1Model(t), Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()

	awaitRecorded(t, rec, podsignal.Healthy)
	src.memory.Store(60 << 20)
	awaitRecorded(t, rec, podsignal.Anomalous)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	msgs, _ := rec.Messages()
	last := msgs[len(msgs)-1]
	if !rec.Closed() || last.State != podsignal.Stopping {
		t.Fatalf("closed %v, last %+v: want Close with stopping", rec.Closed(), last)
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Seq != msgs[i-1].Seq+1 {
			t.Fatalf("seq %d after %d", msgs[i].Seq, msgs[i-1].Seq)
		}
	}
}

// newQuietSidecar is a sidecar on a steady fake source (10 MiB), the P1
// model and a 10 ms interval; cfg adds the rest.
func newQuietSidecar(t *testing.T, cfg Config) *Sidecar {
	t.Helper()
	src := &loadSource{}
	src.memory.Store(10 << 20)
	cfg.Source, cfg.Interval, cfg.Model = src, 10*time.Millisecond, p1Model(t)
	sc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestASidecarWhoseHealthPortIsTakenStops: before, it logged "address
// already in use" and ran on with no endpoint, so the kubelet's readiness
// gate never opened and nothing said why.
func TestASidecarWhoseHealthPortIsTakenStops(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	rec := NewRecorder()
	sc := newQuietSidecar(t, Config{Publisher: rec, HTTPAddr: taken.Addr().String()})
	done := make(chan error, 1)
	go func() { done <- sc.Run(t.Context()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "--http") {
			t.Fatalf("Run = %v, want the bind error and what to do", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sidecar runs on without its health endpoint")
	}
	if msgs, _ := rec.Messages(); len(msgs) != 0 {
		n := len(msgs)
		t.Errorf("%d signals published by a sidecar that could not start", n)
	}
}

func TestASidecarSaysWhereItServes(t *testing.T) {
	lines := make(chan string, 64)
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		select {
		case lines <- string(p):
		default: // the test reads the first lines only
		}
		return len(p), nil
	}), nil))
	sc := newQuietSidecar(t, Config{HTTPAddr: "127.0.0.1:0", Log: log})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	const msg, key = `msg="health endpoint serving"`, " addr="
	for addr := ""; addr == ""; {
		select {
		case line := <-lines:
			if i := strings.Index(line, key); strings.Contains(line, msg) && i >= 0 {
				addr = strings.Fields(line[i+len(key):])[0]
				resp, err := http.Get("http://" + addr + "/healthz")
				if err != nil {
					t.Fatalf("the logged address %s does not serve: %v", addr, err)
				}
				resp.Body.Close()
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no line says where the endpoint serves")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestTheStoppingSignalNamesWhatStoppedTheSidecar: before, SIGINT was
// reported as "received SIGTERM".
func TestTheStoppingSignalNamesWhatStoppedTheSidecar(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause error
		want  string
	}{
		{"a signal named by the cmd", errors.New("received SIGINT"), "sidecar received SIGINT"},
		{"a plain cancel", nil, "sidecar stopping: its context ended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := NewRecorder()
			sc := newQuietSidecar(t, Config{Publisher: rec})
			ctx, cancel := context.WithCancelCause(t.Context())
			done := make(chan error, 1)
			go func() { done <- sc.Run(ctx) }()
			awaitRecorded(t, rec, podsignal.Healthy)
			cancel(tc.cause)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			msgs, _ := rec.Messages()
			if last := msgs[len(msgs)-1]; last.State != podsignal.Stopping || last.Reason != tc.want {
				t.Fatalf("last message %s %q, want stopping %q", last.State, last.Reason, tc.want)
			}
		})
	}
}

// TestAnAgentAddressThatCannotWorkIsRefusedAtStart: before, --agent
// foo://bar was taken and retried forever ("unknown protocol").
func TestAnAgentAddressThatCannotWorkIsRefusedAtStart(t *testing.T) {
	for _, tc := range []struct {
		broker string
		ok     bool
	}{
		{"tcp://10.0.0.5:1884", true},
		{"mqtt://node-a:1884", true},
		{"foo://bar", false},
		{"ws://10.0.0.5:1884", false},
		{"tcp://10.0.0.5", false},
		{"10.0.0.5:1884", false},
		{"tcp://:1884", false},
		{"tcp://%zz", false},
	} {
		_, err := NewSignaller(SignallerConfig{Broker: tc.broker, Namespace: "tod", Pod: "broker-0", Token: "t"})
		if (err == nil) != tc.ok {
			t.Errorf("NewSignaller(%q) = %v, want ok %v", tc.broker, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "tcp://") {
			t.Errorf("NewSignaller(%q): %v does not say what to give", tc.broker, err)
		}
	}
}
