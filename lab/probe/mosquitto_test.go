package probe

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/proc"
)

// The tests in this file run the paper's service path with real Mosquitto
// brokers on loopback: RDS and OBU brokers with no bridge, and edge brokers that
// initiate both bridges (`set/# in` from RDS, `set/# out` to OBU), as in the
// testbed.

const mosquittoPath = "/usr/sbin/mosquitto"

// mosquitto is one broker process; it can be killed and started again on the
// same port with the same configuration.
type mosquitto struct {
	t    *testing.T
	name string
	addr string // 127.0.0.1:port
	conf string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func mosquittoBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real Mosquitto brokers")
	}
	if _, err := os.Stat(mosquittoPath); err != nil {
		if p, err := exec.LookPath("mosquitto"); err == nil {
			return p
		}
		t.Skip("mosquitto not installed (make deps installs it)")
	}
	return mosquittoPath
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// newMosquitto writes the broker's configuration (a loopback listener plus
// extra lines) and starts it.
func newMosquitto(t *testing.T, name, extra string) *mosquitto {
	t.Helper()
	dir := t.TempDir()
	m := &mosquitto{t: t, name: name, addr: freeAddr(t), conf: filepath.Join(dir, name+".conf"), log: filepath.Join(dir, name+".log")}
	_, port, _ := net.SplitHostPort(m.addr)
	// user root: run as is, so the broker can read its configuration in the
	// test's private temporary folder.
	text := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n%s%s", port, proc.MosquittoStaysUser(), extra)
	if err := os.WriteFile(m.conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	m.start()
	t.Cleanup(func() {
		m.kill()
		if t.Failed() {
			b, _ := os.ReadFile(m.log)
			t.Logf("%s log:\n%s", name, b)
		}
	})
	return m
}

func (m *mosquitto) url() string { return "tcp://" + m.addr }

func (m *mosquitto) start() {
	m.t.Helper()
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		m.t.Fatal(err)
	}
	m.cmd = exec.Command(mosquittoBin(m.t), "-c", m.conf)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		logf.Close()
		m.t.Fatalf("start %s: %v", m.name, err)
	}
	done := make(chan struct{})
	m.done = done
	go func(cmd *exec.Cmd) {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}(m.cmd)
	// Listening is an event to wait for: poll the port until it accepts.
	deadline := time.Now().Add(10 * time.Second)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if c, err := net.DialTimeout("tcp", m.addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			b, _ := os.ReadFile(m.log)
			m.t.Fatalf("%s exited before listening on %s:\n%s", m.name, m.addr, b)
		case <-time.After(delay):
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s not listening on %s after 10 s", m.name, m.addr)
		}
	}
}

// kill sends SIGKILL, as a crash or the OOM killer would, and reaps it.
func (m *mosquitto) kill() {
	select {
	case <-m.done:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
}

// edgeBridges is the testbed's edge configuration: the edge initiates both
// bridges; id makes the bridge client IDs unique so a second edge broker (the
// standby) can be bridged at the same time as the first.
func edgeBridges(rds, obu *mosquitto, id string) string {
	var b strings.Builder
	for _, c := range []struct{ name, addr, topics string }{
		{"rds", rds.addr, "topic set/# in\ntopic get/# out\n"},
		{"obu", obu.addr, "topic set/# out\ntopic get/# in\n"},
	} {
		fmt.Fprintf(&b, "\nconnection edge-%s-%s\naddress %s\n%scleansession true\ntry_private false\n"+
			"keepalive_interval 30\nrestart_timeout 1\nlocal_clientid edge-%s-local-%s\nremote_clientid edge-%s-%s\n",
			id, c.name, c.addr, c.topics, id, c.name, id, c.name)
	}
	return b.String()
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// An edge crash and restart shows as one gap about as long as the outage.
func TestProbeMeasuresEdgeOutage(t *testing.T) {
	mosquittoBin(t)
	ctx := testContext(t)
	rds, obu := newMosquitto(t, "rds", ""), newMosquitto(t, "obu", "")
	edge := newMosquitto(t, "edge", edgeBridges(rds, obu, "a"))

	p, err := Start(ctx, Config{PublishURL: rds.url(), SubscribeURL: obu.url()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.WaitReceived(ctx, 20); err != nil { // the bridges are up
		t.Fatal(err)
	}
	healthyFrom := time.Now()
	if err := p.WaitReceived(ctx, p.Received()+10); err != nil {
		t.Fatal(err)
	}

	const outage = time.Second
	killed := time.Now()
	edge.kill()
	time.Sleep(outage) // the fault's length, not a synchronisation
	edge.start()
	restarted := time.Now()
	if err := p.WaitReceived(ctx, p.Received()+10); err != nil {
		t.Fatal(err)
	}
	rec := p.Stop()

	gaps := rec.Gaps()
	if len(gaps) != 1 {
		t.Fatalf("gaps %+v, want exactly one", gaps)
	}
	g, ok := rec.LargestGapWithin(killed, 0)
	if !ok || g != gaps[0] {
		t.Fatalf("LargestGapWithin(kill) = %+v, %v; want %+v", g, ok, gaps[0])
	}
	// The gap covers the outage; after the restart the bridges come back within a
	// few seconds even on a busy machine.
	if g.Duration() < outage || g.End.Before(restarted) || g.Duration() > outage+5*time.Second {
		t.Errorf("gap %v (from %v to %v after the kill), outage %v", g.Duration(), g.Start.Sub(killed), g.End.Sub(killed), outage)
	}
	if j, ok := rec.MaxGap(healthyFrom, killed.Add(-rec.Interval)); !ok || j.Duration() > rec.GapThreshold {
		t.Errorf("healthy jitter %v (ok %v)", j.Duration(), ok)
	}
	lost := rec.Lost(killed, restarted)
	if min := int(outage/rec.Interval) - 2; len(lost) < min {
		t.Errorf("%d messages lost during a %v outage, want ≥ %d", len(lost), outage, min)
	}
	if n := rec.DuplicateCount(); n != 0 {
		t.Errorf("%d duplicates with one edge", n)
	}
	// The probe's own clients never lost their brokers.
	for _, e := range rec.Events {
		if e.Kind == Lost {
			t.Errorf("unexpected disconnect %+v", e)
		}
	}
	s := rec.Summary()
	t.Logf("gap %v, lost %d, sent %d, received %d, latency p50 %v p99 %v",
		g.Duration().Round(time.Millisecond), len(lost), s.Sent, s.Received, s.Latency.P50, s.Latency.P99)
}

// With a second edge broker bridged at the same time (make-before-break), the
// OBU gets every message twice; retiring the first edge then costs no gap.
func TestProbeCountsDuplicatesOfTwoEdges(t *testing.T) {
	mosquittoBin(t)
	ctx := testContext(t)
	rds, obu := newMosquitto(t, "rds", ""), newMosquitto(t, "obu", "")
	primary := newMosquitto(t, "edge-primary", edgeBridges(rds, obu, "a"))

	p, err := Start(ctx, Config{PublishURL: rds.url(), SubscribeURL: obu.url()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.WaitReceived(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if p.Duplicates() != 0 {
		t.Fatalf("%d duplicates with one edge", p.Duplicates())
	}
	standbyStarted := time.Now()
	newMosquitto(t, "edge-standby", edgeBridges(rds, obu, "b"))
	if err := p.WaitDuplicates(ctx, 10); err != nil {
		t.Fatal(err)
	}
	retired := time.Now()
	primary.kill()
	if err := p.WaitReceived(ctx, p.Received()+10); err != nil {
		t.Fatal(err)
	}
	rec := p.Stop()

	if n := rec.Duplicates(time.Time{}, standbyStarted); n != 0 {
		t.Errorf("%d duplicates before the standby started", n)
	}
	if n := rec.Duplicates(standbyStarted, retired); n < 10 {
		t.Errorf("%d duplicates during the overlap, want ≥ 10", n)
	}
	// Make-before-break: the standby's path existed before the primary went, so
	// no outage — only jitter, bounded generously for a busy machine.
	if g, ok := rec.MaxGap(retired, time.Now()); !ok || g.Duration() >= time.Second {
		t.Errorf("gap after retiring the primary %v (ok %v)", g.Duration(), ok)
	} else {
		t.Logf("largest interval after retiring the primary: %v", g.Duration())
	}
	if lost := rec.Lost(standbyStarted, rec.Ended.Add(-time.Second)); len(lost) > 0 {
		t.Errorf("lost %v during make-before-break", lost)
	}
}

// The probe's clients reconnect on their own and the recording notes it.
func TestProbeReconnectsAfterBrokerRestart(t *testing.T) {
	mosquittoBin(t)
	ctx := testContext(t)
	b := newMosquitto(t, "single", "")
	p, err := Start(ctx, Config{PublishURL: b.url(), SubscribeURL: b.url()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.WaitReceived(ctx, 5); err != nil {
		t.Fatal(err)
	}
	b.kill()
	b.start()
	if err := p.WaitReceived(ctx, p.Received()+5); err != nil {
		t.Fatal(err)
	}
	rec := p.Stop()
	count := map[string]int{}
	for _, e := range rec.Events {
		count[e.Client+" "+e.Kind]++
	}
	for _, k := range []string{"publisher connected", "subscriber connected"} {
		if count[k] != 2 {
			t.Errorf("%s %d times, want 2 (start and reconnect): %+v", k, count[k], rec.Events)
		}
	}
	for _, k := range []string{"publisher lost", "subscriber lost"} {
		if count[k] != 1 {
			t.Errorf("%s %d times, want 1: %+v", k, count[k], rec.Events)
		}
	}
	if len(rec.Gaps()) != 1 {
		t.Errorf("gaps %+v, want one", rec.Gaps())
	}
}

func TestStartFailsWithoutBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	dead := "tcp://" + freeAddr(t)
	_, err := Start(ctx, Config{PublishURL: dead, SubscribeURL: dead, ConnectTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Fatalf("got %v, want a connection timeout", err)
	}
	if _, err := Start(ctx, Config{}); err == nil {
		t.Fatal("no URLs accepted")
	}
}
