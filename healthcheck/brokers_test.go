package healthcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"

	"github.com/amf-edge/amf/lab/broker"
	"github.com/amf-edge/amf/lab/proc"
)

// testBroker is a real broker a test can crash and bring back.
type testBroker interface {
	URL() string
	// Kill ends the broker abruptly; its clients' sockets are closed.
	Kill(t testing.TB)
	// Restart starts it again on the same address and waits until it accepts.
	Restart(t testing.TB)
}

// mosquittoPath returns the Mosquitto binary, or skips the test.
func mosquittoPath(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/mosquitto", "mosquitto"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("mosquitto not installed (apt-get install mosquitto): skipping tests against a real Mosquitto")
	return ""
}

// mosquittoBroker is a Mosquitto process on a free loopback port.
type mosquittoBroker struct {
	bin, conf, addr string
	cmd             *exec.Cmd
	exited          chan struct{}
	log             *lockedBuffer
}

func startMosquitto(t testing.TB) *mosquittoBroker {
	t.Helper()
	bin := mosquittoPath(t)
	port := freePort(t)
	conf := filepath.Join(t.TempDir(), "mosquitto.conf")
	cfg := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type error\nlog_type warning\n", port) + proc.MosquittoStaysUser()
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &mosquittoBroker{bin: bin, conf: conf, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: &lockedBuffer{}}
	m.start(t)
	t.Cleanup(func() {
		if m.cmd.Process != nil {
			_ = m.cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot die
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	})
	return m
}

func (m *mosquittoBroker) start(t testing.TB) {
	t.Helper()
	m.cmd = exec.Command(m.bin, "-c", m.conf)
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // a killed test leaves no broker
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start mosquitto: %v", err)
	}
	exited := make(chan struct{})
	m.exited = exited
	cmd := m.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := waitAccepting(m.addr, 10*time.Second, exited); err != nil {
		t.Fatalf("mosquitto on %s: %v; its log:\n%s", m.addr, err, m.log.String())
	}
}

func (m *mosquittoBroker) URL() string { return "tcp://" + m.addr }

func (m *mosquittoBroker) Kill(t testing.TB) {
	t.Helper()
	if err := m.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill mosquitto: %v", err)
	}
	<-m.exited
}

func (m *mosquittoBroker) Restart(t testing.TB) { t.Helper(); m.start(t) }

// Stop freezes the broker with SIGSTOP: the kernel still completes TCP
// handshakes, but nothing answers. Cont thaws it.
func (m *mosquittoBroker) Stop(t testing.TB) { t.Helper(); m.signal(t, syscall.SIGSTOP) }
func (m *mosquittoBroker) Cont(t testing.TB) { t.Helper(); m.signal(t, syscall.SIGCONT) }

func (m *mosquittoBroker) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := m.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to mosquitto: %v", sig, err)
	}
}

// mochiBroker is an embedded mochi server on loopback, allowing everyone.
type mochiBroker struct {
	addr string
	srv  *mochi.Server
}

func startMochi(t testing.TB) *mochiBroker {
	t.Helper()
	b := &mochiBroker{addr: "127.0.0.1:0"}
	b.start(t)
	t.Cleanup(func() { _ = b.srv.Close() })
	return b
}

func (b *mochiBroker) start(t testing.TB) {
	t.Helper()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	l := broker.NewTCP(srv, "tcp", b.addr)
	if err := srv.AddListener(l); err != nil { // listens at once
		t.Fatalf("mochi listener on %s: %v", b.addr, err)
	}
	if err := srv.Serve(); err != nil { // does not block
		t.Fatal(err)
	}
	b.addr, b.srv = l.Address(), srv
}

func (b *mochiBroker) URL() string { return "tcp://" + b.addr }

func (b *mochiBroker) Kill(t testing.TB) {
	t.Helper()
	if err := b.srv.Close(); err != nil {
		t.Fatal(err)
	}
}

func (b *mochiBroker) Restart(t testing.TB) { t.Helper(); b.start(t) }

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitAccepting dials addr until it accepts, the process exits or the time is up.
func waitAccepting(addr string, within time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(within)
	retry := time.NewTicker(10 * time.Millisecond)
	defer retry.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not accepting after %v: %w", within, err)
		}
		select {
		case <-exited:
			return errors.New("process exited")
		case <-retry.C:
		}
	}
}

// lockedBuffer collects a child's output, written from exec's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// probeRun is a Prober running in the background with its results on a channel.
type probeRun struct {
	results chan Result
}

func runProber(t testing.TB, p Prober) *probeRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr := &probeRun{results: make(chan Result, 256)}
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(r Result) {
			select {
			case pr.results <- r:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5 s of cancel")
		}
	})
	return pr
}

// await returns the next result with OK == ok, skipping others, or fails the
// test when none comes within d.
func (pr *probeRun) await(t testing.TB, ok bool, d time.Duration) Result {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		select {
		case r := <-pr.results:
			if r.OK == ok {
				return r
			}
		case <-deadline.C:
			t.Fatalf("no result with OK=%v within %v", ok, d)
			return Result{}
		}
	}
}

// next returns the next result, whatever it is.
func (pr *probeRun) next(t testing.TB, d time.Duration) Result {
	t.Helper()
	select {
	case r := <-pr.results:
		return r
	case <-time.After(d):
		t.Fatalf("no result within %v", d)
		return Result{}
	}
}
