// Package bench holds the lab's benchmarks that need real processes: the
// signal-based (SCM) versus polling (PCM) detection benchmark, on loopback
// against a kubelet-style poller (RunSignal) and on a real node against the
// real kubelet (RunNode), and the agent load benchmark.
package bench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/amf-edge/amf/lab/proc"
)

// Binaries locates the programs a benchmark runs.
type Binaries struct {
	Sidecar   string // amf-sidecar
	Agent     string // amf-agent
	Mosquitto string // empty: a mochi broker run by Self
	Self      string // amf-lab, for `amf-lab broker`
}

// FindBinaries looks for amf-sidecar and amf-agent beside the running program and
// for Debian's Mosquitto.
func FindBinaries() (Binaries, error) {
	self, err := os.Executable()
	if err != nil {
		return Binaries{}, err
	}
	dir := filepath.Dir(self)
	b := Binaries{Sidecar: filepath.Join(dir, "amf-sidecar"), Agent: filepath.Join(dir, "amf-agent"), Self: self}
	for _, p := range []string{b.Sidecar, b.Agent} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("%s not found beside %s: run make build", filepath.Base(p), self)
		}
	}
	if p, err := exec.LookPath("mosquitto"); err == nil {
		b.Mosquitto = p
	} else if _, err := os.Stat("/usr/sbin/mosquitto"); err == nil {
		b.Mosquitto = "/usr/sbin/mosquitto"
	}
	return b, nil
}

// PollerConfig is a kubelet-style probe: a TCP connect every Period, failed after
// Timeout, the container declared dead after Threshold consecutive failures.
type PollerConfig struct {
	Period    time.Duration
	Timeout   time.Duration
	Threshold int
}

// KubeletDefaults are kubelet's probe defaults.
var KubeletDefaults = PollerConfig{Period: 10 * time.Second, Timeout: time.Second, Threshold: 3}

// SignalConfig configures the SCM vs PCM benchmark.
type SignalConfig struct {
	Runs      int
	KeepAlive time.Duration // sidecar → agent MQTT keep-alive; bounds the freeze case
	Poller    PollerConfig
	Steady    time.Duration // how long the sidecar's steady-state CPU and RSS are measured
	Bin       Binaries
	WorkDir   string
	Progress  io.Writer
}

// Sample set of one case.
type Case struct {
	Name    string
	Samples []time.Duration
}

// SignalReport is what the benchmark measured.
type SignalReport struct {
	BrokerCrash   Case // kill → agent has unhealthy (signals)
	Poller        Case // kill → poller declares it dead
	SidecarCrash  Case // kill → agent has gone
	SidecarFreeze Case // SIGSTOP → agent has gone
	SidecarCPU    float64
	SidecarRSS    int64
	Broker        string
}

// transition is one line of the agent's JSON log.
type transition struct {
	Msg       string    `json:"msg"`
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	To        string    `json:"to"`
	Received  time.Time `json:"received"`
}

const (
	benchNamespace = "lab"
	benchPod       = "broker-0"
)

type signalBench struct {
	cfg       SignalConfig
	tokenFile string
	token     string
	agentAddr string
	brokerArg string // broker's listen address
	cgroupDir string // the broker's own memory cgroup, when one could be made
	events    chan transition

	broker, sidecar, agent *proc.Proc
	expectSidecarExit      bool
}

// RunSignal runs the benchmark and returns its measurements.
func RunSignal(ctx context.Context, cfg SignalConfig) (*SignalReport, error) {
	if cfg.Runs <= 0 {
		cfg.Runs = 5
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 5 * time.Second
	}
	if cfg.Poller == (PollerConfig{}) {
		cfg.Poller = KubeletDefaults
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	b := &signalBench{cfg: cfg, events: make(chan transition, 1024)}
	defer b.cleanup()
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	rep := &SignalReport{
		BrokerCrash:   Case{Name: "broker crash → agent has unhealthy (signal)"},
		Poller:        Case{Name: fmt.Sprintf("broker crash → poller (every %v, timeout %v, %d failures)", cfg.Poller.Period, cfg.Poller.Timeout, cfg.Poller.Threshold)},
		SidecarCrash:  Case{Name: "sidecar crash → agent has gone"},
		SidecarFreeze: Case{Name: fmt.Sprintf("sidecar frozen → agent has gone (keep-alive %v)", cfg.KeepAlive)},
		Broker:        "mochi",
	}
	if cfg.Bin.Mosquitto != "" {
		rep.Broker = "mosquitto"
	}

	if err := b.steadyState(ctx, rep); err != nil {
		return nil, err
	}
	for i := 0; i < cfg.Runs; i++ {
		scm, pcm, err := b.brokerCrash(ctx)
		if err != nil {
			return nil, fmt.Errorf("broker crash run %d: %w", i+1, err)
		}
		rep.BrokerCrash.Samples = append(rep.BrokerCrash.Samples, scm)
		rep.Poller.Samples = append(rep.Poller.Samples, pcm)
		fmt.Fprintf(cfg.Progress, "broker crash %d/%d: signal %v, poller %v\n", i+1, cfg.Runs, ms(scm), ms(pcm))
	}
	for i := 0; i < cfg.Runs; i++ {
		d, err := b.sidecarFault(ctx, syscall.SIGKILL)
		if err != nil {
			return nil, fmt.Errorf("sidecar crash run %d: %w", i+1, err)
		}
		rep.SidecarCrash.Samples = append(rep.SidecarCrash.Samples, d)
		fmt.Fprintf(cfg.Progress, "sidecar crash %d/%d: %v\n", i+1, cfg.Runs, ms(d))
	}
	for i := 0; i < cfg.Runs; i++ {
		d, err := b.sidecarFault(ctx, syscall.SIGSTOP)
		if err != nil {
			return nil, fmt.Errorf("sidecar freeze run %d: %w", i+1, err)
		}
		rep.SidecarFreeze.Samples = append(rep.SidecarFreeze.Samples, d)
		fmt.Fprintf(cfg.Progress, "sidecar freeze %d/%d: %v\n", i+1, cfg.Runs, ms(d))
	}
	return rep, nil
}

func (b *signalBench) start(ctx context.Context) error {
	token := make([]byte, 24)
	if _, err := crand.Read(token); err != nil {
		return err
	}
	b.token = hex.EncodeToString(token)
	b.tokenFile = filepath.Join(b.cfg.WorkDir, "tokens")
	line := fmt.Sprintf("%s %s/%s\n", b.token, benchNamespace, benchPod)
	if err := os.WriteFile(b.tokenFile, []byte(line), 0o600); err != nil {
		return err
	}
	var err error
	if b.agentAddr, err = proc.FreeAddr(); err != nil {
		return err
	}
	httpAddr, err := proc.FreeAddr()
	if err != nil {
		return err
	}
	b.agent, err = proc.Start("amf-agent", filepath.Join(b.cfg.WorkDir, "agent.log"), b.onAgentLine, b.cfg.Bin.Agent,
		"--listen", b.agentAddr, "--http", httpAddr, "--token-file", b.tokenFile, "--observe-only", "--log-level", "info")
	if err != nil {
		return err
	}
	if err := proc.WaitListening(ctx, b.agent, b.agentAddr, 10*time.Second); err != nil {
		return err
	}
	if b.brokerArg, err = proc.FreeAddr(); err != nil {
		return err
	}
	b.cgroupDir = makeBrokerCgroup(b.cfg.WorkDir)
	if err := b.startBroker(ctx); err != nil {
		return err
	}
	if err := b.startSidecar(); err != nil {
		return err
	}
	_, err = b.awaitState(ctx, 30*time.Second, "healthy", "anomalous")
	return err
}

func (b *signalBench) onAgentLine(line string) {
	var t transition
	if json.Unmarshal([]byte(line), &t) != nil || t.Msg != "transition" || t.Pod != benchPod {
		return
	}
	select {
	case b.events <- t:
	default: // the benchmark is not waiting; it drains before each fault
	}
}

// awaitState waits for the agent to log a transition of the pod into one of states.
func (b *signalBench) awaitState(ctx context.Context, timeout time.Duration, states ...string) (transition, error) {
	deadline := time.After(timeout)
	for {
		select {
		case t := <-b.events:
			for _, s := range states {
				if t.To == s {
					return t, nil
				}
			}
		case <-b.agent.Done():
			return transition{}, fmt.Errorf("amf-agent exited: %v (log %s)", b.agent.Err(), filepath.Join(b.cfg.WorkDir, "agent.log"))
		case <-b.sidecarDone():
			return transition{}, fmt.Errorf("amf-sidecar exited: %v (log %s)", b.sidecar.Err(), filepath.Join(b.cfg.WorkDir, "sidecar.log"))
		case <-ctx.Done():
			return transition{}, ctx.Err()
		case <-deadline:
			return transition{}, fmt.Errorf("agent saw no %v within %v (logs in %s)", states, timeout, b.cfg.WorkDir)
		}
	}
}

// sidecarDone is closed when a running sidecar exited; nil (never ready) while a
// fault the benchmark injected is expected to end it.
func (b *signalBench) sidecarDone() <-chan struct{} {
	if b.sidecar == nil || b.expectSidecarExit {
		return nil
	}
	return b.sidecar.Done()
}

// drain drops transitions seen so far, so the next wait sees only what follows.
func (b *signalBench) drain() {
	for {
		select {
		case <-b.events:
		default:
			return
		}
	}
}

func (b *signalBench) startBroker(ctx context.Context) error {
	var err error
	logPath := filepath.Join(b.cfg.WorkDir, "broker.log")
	if b.cfg.Bin.Mosquitto != "" {
		host, port, _ := net.SplitHostPort(b.brokerArg)
		conf := filepath.Join(b.cfg.WorkDir, "mosquitto.conf")
		text := fmt.Sprintf("listener %s %s\nallow_anonymous true\npersistence false\n", port, host)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return err
		}
		b.broker, err = proc.Start("mosquitto", logPath, nil, b.cfg.Bin.Mosquitto, "-c", conf)
	} else {
		b.broker, err = proc.Start("mochi broker", logPath, nil, b.cfg.Bin.Self, "broker", "--listen", b.brokerArg)
	}
	if err != nil {
		return err
	}
	if b.cgroupDir != "" {
		// Its own cgroup, as a container runtime would give it.
		if err := addToCgroup(b.cgroupDir, b.broker.PID()); err != nil {
			return err
		}
	}
	return proc.WaitListening(ctx, b.broker, b.brokerArg, 10*time.Second)
}

func (b *signalBench) startSidecar() error {
	target := []string{"--pid", strconv.Itoa(os.Getpid())}
	if b.cgroupDir != "" {
		target = []string{"--cgroup-path", b.cgroupDir}
	}
	sidecarToken := filepath.Join(b.cfg.WorkDir, "sidecar-token")
	if err := os.WriteFile(sidecarToken, []byte(b.token), 0o600); err != nil {
		return err
	}
	args := append(append([]string{"run"}, target...),
		"--interval", "1s",
		"--probe-mqtt", "tcp://"+b.brokerArg, "--probe-interval", "2s", "--probe-timeout", "1s",
		"--agent", "tcp://"+b.agentAddr, "--namespace", benchNamespace, "--pod", benchPod,
		"--token-file", sidecarToken, "--keepalive", b.cfg.KeepAlive.String(), "--http", "")
	var err error
	b.sidecar, err = proc.Start("amf-sidecar", filepath.Join(b.cfg.WorkDir, "sidecar.log"), nil, b.cfg.Bin.Sidecar, args...)
	return err
}

// steadyState measures the sidecar's CPU share and RSS while all is well.
func (b *signalBench) steadyState(ctx context.Context, rep *SignalReport) error {
	if b.cfg.Steady <= 0 {
		return nil
	}
	cpu0, _, err := proc.Usage(b.sidecar.PID())
	if err != nil {
		return err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.cfg.Steady):
	}
	cpu1, rss, err := proc.Usage(b.sidecar.PID())
	if err != nil {
		return err
	}
	rep.SidecarCPU = float64(cpu1-cpu0) / float64(time.Since(t0))
	rep.SidecarRSS = rss
	fmt.Fprintf(b.cfg.Progress, "sidecar steady state over %v: CPU %.2f %% of a core, RSS %.1f MiB\n",
		b.cfg.Steady, 100*rep.SidecarCPU, float64(rss)/(1<<20))
	return nil
}

// brokerCrash kills the broker and measures both detectors against the same kill.
func (b *signalBench) brokerCrash(ctx context.Context) (scm, pcm time.Duration, err error) {
	// The poller runs at its own phase, as kubelet's probes do relative to a crash.
	poll := newPoller(b.cfg.Poller, b.brokerArg)
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { poll.run(pctx) })
	defer wg.Wait()
	if err := poll.awaitHealthyProbe(ctx); err != nil {
		return 0, 0, err
	}
	// Crash at a random phase of the poller's period, as real crashes do.
	select {
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(rand.N(b.cfg.Poller.Period)):
	}

	b.drain()
	killed := time.Now()
	poll.markKill(killed)
	b.broker.Kill()
	t, err := b.awaitState(ctx, 30*time.Second, "unhealthy")
	if err != nil {
		return 0, 0, err
	}
	scm = t.Received.Sub(killed)
	pcm, err = poll.awaitDead(ctx, b.cfg.Poller.Period*time.Duration(b.cfg.Poller.Threshold+2))
	if err != nil {
		return 0, 0, err
	}
	stop()

	b.drain()
	if err := b.startBroker(ctx); err != nil {
		return 0, 0, err
	}
	if _, err := b.awaitState(ctx, 30*time.Second, "healthy", "anomalous"); err != nil {
		return 0, 0, err
	}
	return scm, pcm, nil
}

// sidecarFault kills or freezes the sidecar and measures until the agent has gone.
func (b *signalBench) sidecarFault(ctx context.Context, sig syscall.Signal) (time.Duration, error) {
	b.drain()
	b.expectSidecarExit = sig == syscall.SIGKILL
	at := time.Now()
	if err := b.sidecar.Signal(sig); err != nil {
		return 0, err
	}
	t, err := b.awaitState(ctx, 3*b.cfg.KeepAlive+10*time.Second, "gone")
	if err != nil {
		return 0, err
	}
	d := t.Received.Sub(at)
	b.drain()
	if sig == syscall.SIGSTOP {
		if err := b.sidecar.Signal(syscall.SIGCONT); err != nil {
			return 0, err
		}
	} else {
		<-b.sidecar.Done()
		if err := b.startSidecar(); err != nil {
			return 0, err
		}
		b.expectSidecarExit = false
	}
	if _, err := b.awaitState(ctx, 30*time.Second, "healthy", "anomalous"); err != nil {
		return 0, err
	}
	return d, nil
}

func (b *signalBench) cleanup() {
	for _, p := range []*proc.Proc{b.sidecar, b.broker, b.agent} {
		if p != nil {
			p.Stop(3 * time.Second)
		}
	}
	if b.cgroupDir != "" {
		removeBrokerCgroup(b.cgroupDir)
	}
}

// poller is a kubelet-style TCP probe loop.
type poller struct {
	cfg  PollerConfig
	addr string

	mu       sync.Mutex
	killedAt time.Time
	fails    int
	okSeen   chan struct{}
	dead     chan time.Time
}

func newPoller(cfg PollerConfig, addr string) *poller {
	return &poller{cfg: cfg, addr: addr, okSeen: make(chan struct{}, 1), dead: make(chan time.Time, 1)}
}

func (p *poller) run(ctx context.Context) {
	tick := time.NewTicker(p.cfg.Period)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", p.addr, p.cfg.Timeout)
		now := time.Now()
		p.mu.Lock()
		if err == nil {
			c.Close()
			p.fails = 0
			select {
			case p.okSeen <- struct{}{}:
			default:
			}
		} else if p.fails++; p.fails == p.cfg.Threshold && !p.killedAt.IsZero() {
			p.dead <- now
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (p *poller) awaitHealthyProbe(ctx context.Context) error {
	select {
	case <-p.okSeen:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * p.cfg.Period):
		return errors.New("poller: broker never answered")
	}
}

func (p *poller) markKill(at time.Time) {
	p.mu.Lock()
	p.killedAt = at
	p.mu.Unlock()
}

func (p *poller) awaitDead(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	select {
	case at := <-p.dead:
		p.mu.Lock()
		defer p.mu.Unlock()
		return at.Sub(p.killedAt), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(timeout):
		return 0, errors.New("poller never declared the broker dead")
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
