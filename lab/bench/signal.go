// Package bench holds the lab's benchmarks that need real processes: the
// signal-based (SCM) versus polling (PCM) detection benchmark, in sidecar
// mode on loopback against a kubelet-style poller and in node mode against
// a real API server (RunSignal), and on a real node against the real
// kubelet (RunNode); the agent load benchmark and node mode's footprint.
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
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/amf-edge/amf/lab/controlplane"
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

// The modes RunSignal measures.
const (
	ModeSidecar = "sidecar" // amf-sidecar beside the broker signals the agent over MQTT
	ModeNode    = "node"    // amf-agent --node-mode runs the pipeline itself
)

// SignalConfig configures the SCM vs PCM benchmark.
type SignalConfig struct {
	// Modes to measure, in this order; empty: sidecar, then node.
	Modes     []string
	Runs      int
	KeepAlive time.Duration // sidecar → agent MQTT keep-alive; bounds the freeze case
	Poller    PollerConfig
	Steady    time.Duration // how long the sidecar's steady-state CPU and RSS are measured
	Bin       Binaries
	WorkDir   string
	Progress  io.Writer
}

// Sample set of one case, and the reason the agent gave at each sample.
type Case struct {
	Name    string
	Samples []time.Duration
	Reasons []string
}

func (c *Case) add(d time.Duration, reason string) {
	c.Samples = append(c.Samples, d)
	c.Reasons = append(c.Reasons, reason)
}

// SignalReport is what the benchmark measured. The first fields are sidecar
// mode's; Node is node mode's, nil when it did not run.
type SignalReport struct {
	Modes         []string // the modes measured, in order; nil: sidecar only
	Runs          int
	BrokerCrash   Case // kill → agent has unhealthy (signals)
	Poller        Case // kill → poller declares it dead
	SidecarCrash  Case // kill → agent has gone
	SidecarFreeze Case // SIGSTOP → agent has gone
	// OOM kill in the broker's container → agent has unhealthy (the
	// sidecar's OOM notification); not measured without a cgroup of its own
	// (OOMSkipped says why).
	OOM        Case
	OOMSkipped string
	SidecarCPU float64
	SidecarRSS int64
	Broker     string
	Node       *NodeSignalReport
}

// NodeSignalReport is node mode's part of the signal benchmark: the same
// broker in a pod's container cgroup, watched by amf-agent --node-mode.
type NodeSignalReport struct {
	BrokerCrash Case // SIGKILL → agent has unhealthy (the pushed exit, pidfd)
	OOM         Case // OOM kill in the container → agent has unhealthy (the OOM notification)
}

const (
	benchNamespace = "lab"
	benchPod       = "broker-0"
	// benchMemLimit is every broker container's memory limit, the testbed's.
	benchMemLimit = 100 << 20
)

type signalBench struct {
	cfg       SignalConfig
	tokenFile string
	token     string
	agentAddr string
	brokerArg string // broker's listen address
	// The broker's own container cgroup, in the kubelet's layout (no API
	// server knows the pod), when one could be made; cgroupDir is its
	// memory directory, the sidecar's --cgroup-path.
	root      *benchCgroupRoot
	pod       *nodeModePod
	cgroupDir string
	events    chan transitionLine

	broker, sidecar, agent *proc.Proc
	expectSidecarExit      bool
}

// RunSignal runs the benchmark in each of cfg.Modes and returns its
// measurements. In every mode the same broker is SIGKILLed and OOM-killed
// cfg.Runs times; sidecar mode also times a kubelet-style poller against
// the same kills, and the sidecar's own crash and freeze. Node mode needs
// root and the control plane (make k8s).
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
	if len(cfg.Modes) == 0 {
		cfg.Modes = []string{ModeSidecar, ModeNode}
	}
	for _, m := range cfg.Modes {
		if m != ModeSidecar && m != ModeNode {
			return nil, fmt.Errorf("signal bench: mode %q: want %s or %s", m, ModeSidecar, ModeNode)
		}
	}
	// Node mode's prerequisites, checked before anything runs.
	if slices.Contains(cfg.Modes, ModeNode) {
		if os.Geteuid() != 0 {
			return nil, errors.New("signal bench: node mode needs root (it creates cgroups); --mode sidecar runs without")
		}
		if _, err := controlplane.BinDir(); err != nil {
			return nil, fmt.Errorf("signal bench: node mode needs the control plane (%w): run make k8s, or --mode sidecar", err)
		}
	}
	rep := &SignalReport{
		Modes:         cfg.Modes,
		Runs:          cfg.Runs,
		BrokerCrash:   Case{Name: "broker crash → agent has unhealthy (signal)"},
		Poller:        Case{Name: fmt.Sprintf("broker crash → poller (every %v, timeout %v, %d failures)", cfg.Poller.Period, cfg.Poller.Timeout, cfg.Poller.Threshold)},
		SidecarCrash:  Case{Name: "sidecar crash → agent has gone"},
		SidecarFreeze: Case{Name: fmt.Sprintf("sidecar frozen → agent has gone (keep-alive %v)", cfg.KeepAlive)},
		OOM:           Case{Name: "OOM kill in the broker container → agent has unhealthy"},
		Broker:        "mochi",
	}
	if cfg.Bin.Mosquitto != "" {
		rep.Broker = "mosquitto"
	}
	for _, m := range cfg.Modes {
		var err error
		switch m {
		case ModeSidecar:
			err = runSignalSidecar(ctx, cfg, rep)
		case ModeNode:
			rep.Node = &NodeSignalReport{
				BrokerCrash: Case{Name: "broker crash → agent has unhealthy (pushed exit)"},
				OOM:         Case{Name: "OOM kill in the broker container → agent has unhealthy"},
			}
			err = runSignalNode(ctx, cfg, rep.Node)
		}
		if err != nil {
			return nil, fmt.Errorf("%s mode: %w", m, err)
		}
	}
	return rep, nil
}

// runSignalSidecar is sidecar mode: a broker, an amf-sidecar and an
// amf-agent on loopback.
func runSignalSidecar(ctx context.Context, cfg SignalConfig, rep *SignalReport) error {
	cfg.WorkDir = filepath.Join(cfg.WorkDir, ModeSidecar)
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return err
	}
	b := &signalBench{cfg: cfg, events: make(chan transitionLine, 1024)}
	defer b.cleanup()
	if err := b.start(ctx); err != nil {
		return err
	}
	if err := b.steadyState(ctx, rep); err != nil {
		return err
	}
	for i := 0; i < cfg.Runs; i++ {
		scm, pcm, reason, err := b.brokerCrash(ctx)
		if err != nil {
			return fmt.Errorf("broker crash run %d: %w", i+1, err)
		}
		rep.BrokerCrash.add(scm, reason)
		rep.Poller.add(pcm, "")
		fmt.Fprintf(cfg.Progress, "sidecar mode: broker crash %d/%d: signal %v (%s), poller %v\n", i+1, cfg.Runs, ms(scm), reason, ms(pcm))
	}
	if b.root == nil {
		rep.OOMSkipped = "the broker has no cgroup of its own (not root, or no cgroup hierarchy)"
	}
	for i := 0; i < cfg.Runs && b.root != nil; i++ {
		b.drain()
		d, reason, err := b.root.timeOOMKill(ctx, b.pod, cfg.Bin.Self, func() (time.Time, string, error) {
			t, err := b.awaitState(ctx, 30*time.Second, "unhealthy")
			return t.Received, t.Reason, err
		})
		if err != nil {
			return fmt.Errorf("OOM kill run %d: %w", i+1, err)
		}
		rep.OOM.add(d, reason)
		fmt.Fprintf(cfg.Progress, "sidecar mode: OOM kill %d/%d: unhealthy %v from the kill (%s)\n", i+1, cfg.Runs, ms(d), reason)
		if err := b.awaitBackAfterOOM(ctx); err != nil {
			return fmt.Errorf("after OOM kill run %d: %w", i+1, err)
		}
	}
	for i := 0; i < cfg.Runs; i++ {
		d, err := b.sidecarFault(ctx, syscall.SIGKILL)
		if err != nil {
			return fmt.Errorf("sidecar crash run %d: %w", i+1, err)
		}
		rep.SidecarCrash.add(d, "")
		fmt.Fprintf(cfg.Progress, "sidecar mode: sidecar crash %d/%d: %v\n", i+1, cfg.Runs, ms(d))
	}
	for i := 0; i < cfg.Runs; i++ {
		d, err := b.sidecarFault(ctx, syscall.SIGSTOP)
		if err != nil {
			return fmt.Errorf("sidecar freeze run %d: %w", i+1, err)
		}
		rep.SidecarFreeze.add(d, "")
		fmt.Fprintf(cfg.Progress, "sidecar mode: sidecar freeze %d/%d: %v\n", i+1, cfg.Runs, ms(d))
	}
	return nil
}

// runSignalNode is node mode: the same broker as the process of a pod's
// container, on the node rig (a real API server, amf-agent --node-mode);
// a killed broker's container is restarted as the kubelet would.
func runSignalNode(ctx context.Context, cfg SignalConfig, rep *NodeSignalReport) (err error) {
	dir := filepath.Join(cfg.WorkDir, ModeNode)
	addr, err := proc.FreeAddr()
	if err != nil {
		return err
	}
	start := func(*nodeModePod) (*proc.Proc, error) { return startBrokerProc(cfg.Bin, dir, addr) }
	rig, err := startNodeRig(ctx, nodeRigConfig{Pods: 1, Start: start, MemLimit: benchMemLimit, Bin: cfg.Bin, WorkDir: dir, Progress: cfg.Progress})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := rig.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	p := rig.pods[0]
	name := p.pod.Name
	if err := proc.WaitListening(ctx, p.proc, addr, 10*time.Second); err != nil {
		return err
	}
	if err := rig.optIn(ctx); err != nil {
		return err
	}
	if _, err := rig.await(ctx, name, 30*time.Second, "healthy", "anomalous"); err != nil {
		return err
	}
	for i := 0; i < cfg.Runs; i++ {
		rig.drain()
		killed := time.Now()
		p.proc.Kill()
		tl, err := rig.await(ctx, name, 30*time.Second, "unhealthy")
		if err != nil {
			return fmt.Errorf("broker crash run %d: %w", i+1, err)
		}
		d := tl.Received.Sub(killed)
		rep.BrokerCrash.add(d, tl.Reason)
		fmt.Fprintf(cfg.Progress, "node mode: broker crash %d/%d: unhealthy %v later (%s)\n", i+1, cfg.Runs, ms(d), tl.Reason)
		if err := rig.restart(ctx, p); err != nil {
			return err
		}
		if err := proc.WaitListening(ctx, p.proc, addr, 10*time.Second); err != nil {
			return err
		}
		if _, err := rig.await(ctx, name, 30*time.Second, "healthy", "anomalous"); err != nil {
			return fmt.Errorf("after broker crash run %d: %w", i+1, err)
		}
	}
	for i := 0; i < cfg.Runs; i++ {
		rig.drain()
		d, reason, err := rig.root.timeOOMKill(ctx, p, cfg.Bin.Self, func() (time.Time, string, error) {
			tl, err := rig.await(ctx, name, 30*time.Second, "unhealthy")
			return tl.Received, tl.Reason, err
		})
		if err != nil {
			return fmt.Errorf("OOM kill run %d: %w", i+1, err)
		}
		rep.OOM.add(d, reason)
		fmt.Fprintf(cfg.Progress, "node mode: OOM kill %d/%d: unhealthy %v from the kill (%s)\n", i+1, cfg.Runs, ms(d), reason)
		if _, err := rig.await(ctx, name, 30*time.Second, "healthy", "anomalous"); err != nil {
			return fmt.Errorf("after OOM kill run %d: %w", i+1, err)
		}
	}
	return nil
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
	b.makeCgroup()
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
	var t transitionLine
	if json.Unmarshal([]byte(line), &t) != nil || t.Msg != "transition" || t.Pod != benchPod {
		return
	}
	select {
	case b.events <- t:
	default: // the benchmark is not waiting; it drains before each fault
	}
}

// awaitBackAfterOOM waits for the pod to be back (healthy or anomalous)
// after the load generator's OOM kill. The kernel may have killed the broker
// as well (it shares the cgroup; once the dying generator is reaped, the
// broker is the largest process left): then the pod rightly stays unhealthy
// until the broker is restarted, as the kubelet would, and so does the
// benchmark, once.
func (b *signalBench) awaitBackAfterOOM(ctx context.Context) error {
	_, err := b.awaitState(ctx, 30*time.Second, "healthy", "anomalous")
	if err == nil || ctx.Err() != nil {
		return err
	}
	select {
	case <-b.broker.Done():
	default:
		return err
	}
	fmt.Fprintf(b.cfg.Progress, "sidecar mode: the kernel OOM-killed the broker too (%v): restarting it\n", b.broker.Err())
	if err := b.startBroker(ctx); err != nil {
		return err
	}
	_, err = b.awaitState(ctx, 30*time.Second, "healthy", "anomalous")
	return err
}

// awaitState waits for the agent to log a transition of the pod into one of
// states; the error says which transition came last.
func (b *signalBench) awaitState(ctx context.Context, timeout time.Duration, states ...string) (transitionLine, error) {
	deadline := time.After(timeout)
	last := "none"
	for {
		select {
		case t := <-b.events:
			for _, s := range states {
				if t.To == s {
					return t, nil
				}
			}
			last = fmt.Sprintf("to %s at %s (%s)", t.To, t.Received.Format(time.TimeOnly), t.Reason)
		case <-b.agent.Done():
			return transitionLine{}, fmt.Errorf("amf-agent exited: %v (log %s)", b.agent.Err(), filepath.Join(b.cfg.WorkDir, "agent.log"))
		case <-b.sidecarDone():
			return transitionLine{}, fmt.Errorf("amf-sidecar exited: %v (log %s)", b.sidecar.Err(), filepath.Join(b.cfg.WorkDir, "sidecar.log"))
		case <-ctx.Done():
			return transitionLine{}, ctx.Err()
		case <-deadline:
			return transitionLine{}, fmt.Errorf("agent saw no %v within %v, the last transition: %s (logs in %s)", states, timeout, last, b.cfg.WorkDir)
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

// makeCgroup gives the broker a container cgroup of its own with the
// testbed's memory limit, so that broker restarts keep the sidecar's target;
// where none can be made (not root) the sidecar samples the lab process
// instead and the OOM case is not measured.
func (b *signalBench) makeCgroup() {
	if os.Geteuid() != 0 {
		return
	}
	root, err := newBenchCgroupRoot()
	if err != nil {
		fmt.Fprintf(b.cfg.Progress, "sidecar mode: no cgroup for the broker (%v): the sidecar samples the lab process\n", err)
		return
	}
	root.memLimit = benchMemLimit
	var uid [16]byte
	_, _ = crand.Read(uid[:])
	id := hex.EncodeToString(uid[:])
	b.root = root
	b.pod = &nodeModePod{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: benchPod, Namespace: benchNamespace, UID: types.UID(id)}}, uid: id}
}

// startBrokerProc starts the broker (Mosquitto, or a mochi broker by
// amf-lab) listening on addr, its log in dir.
func startBrokerProc(bin Binaries, dir, addr string) (*proc.Proc, error) {
	logPath := filepath.Join(dir, "broker.log")
	if bin.Mosquitto != "" {
		host, port, _ := net.SplitHostPort(addr)
		conf := filepath.Join(dir, "mosquitto.conf")
		text := fmt.Sprintf("listener %s %s\nallow_anonymous true\npersistence false\n", port, host) + proc.MosquittoStaysUser()
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil, err
		}
		return proc.Start("mosquitto", logPath, nil, bin.Mosquitto, "-c", conf)
	}
	return proc.Start("mochi broker", logPath, nil, bin.Self, "broker", "--listen", addr)
}

func (b *signalBench) startBroker(ctx context.Context) error {
	start := func(*nodeModePod) (*proc.Proc, error) { return startBrokerProc(b.cfg.Bin, b.cfg.WorkDir, b.brokerArg) }
	var err error
	switch {
	case b.root == nil:
		b.broker, err = start(nil)
	case b.cgroupDir == "":
		// The first start makes the container's cgroup.
		if err = b.root.addContainer(b.pod, start); err != nil {
			return err
		}
		b.broker = b.pod.proc
		b.cgroupDir, _ = b.root.memoryDir(b.pod)
	default:
		// A restart: the same container cgroup, as the sidecar's target
		// is fixed (--cgroup-path).
		if b.broker, err = start(nil); err == nil {
			b.pod.proc = b.broker
			err = b.root.moveInto(b.pod, b.broker.PID())
		}
	}
	if err != nil {
		return err
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
func (b *signalBench) brokerCrash(ctx context.Context) (scm, pcm time.Duration, reason string, err error) {
	// The poller runs at its own phase, as kubelet's probes do relative to a crash.
	poll := newPoller(b.cfg.Poller, b.brokerArg)
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { poll.run(pctx) })
	defer wg.Wait()
	if err := poll.awaitHealthyProbe(ctx); err != nil {
		return 0, 0, "", err
	}
	// Crash at a random phase of the poller's period, as real crashes do.
	select {
	case <-ctx.Done():
		return 0, 0, "", ctx.Err()
	case <-time.After(rand.N(b.cfg.Poller.Period)):
	}

	b.drain()
	killed := time.Now()
	poll.markKill(killed)
	b.broker.Kill()
	t, err := b.awaitState(ctx, 30*time.Second, "unhealthy")
	if err != nil {
		return 0, 0, "", err
	}
	scm = t.Received.Sub(killed)
	pcm, err = poll.awaitDead(ctx, b.cfg.Poller.Period*time.Duration(b.cfg.Poller.Threshold+2))
	if err != nil {
		return 0, 0, "", err
	}
	stop()

	b.drain()
	if err := b.startBroker(ctx); err != nil {
		return 0, 0, "", err
	}
	if _, err := b.awaitState(ctx, 30*time.Second, "healthy", "anomalous"); err != nil {
		return 0, 0, "", err
	}
	return scm, pcm, t.Reason, nil
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
	if b.root != nil {
		if err := b.root.remove(); err != nil {
			fmt.Fprintf(b.cfg.Progress, "sidecar mode: %v\n", err)
		}
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
