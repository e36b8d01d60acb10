package kubenode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Faults of a whole node, as they happen at an edge site. Each is undone by
// Restore. PowerCut and Partition need the node to be on a LAN (Config.LAN):
// its LAN port is its only link.
//
//   - PowerCut: every process of the node stops at once — the daemons, the
//     shims, every pod's containers (the freezer cgroup of the node's cgroup
//     root, which they all inherit) — and its LAN port goes down, so nothing
//     it had open is ever closed: peers see neither FIN nor RST, only silence.
//   - Partition: the LAN port goes down; the node keeps running, cut off from
//     the API server, the other nodes and the host.
//   - CutInbound: an asymmetric partition: the node still opens connections
//     to its peers, they can open none to it, and it and the API server no
//     longer hear each other (inboundRules).
//   - Starve: the node's whole cgroup root gets a CPU quota (slow, alive).
//   - StopDaemon: one daemon (the kubelet, say) dies alone; StartDaemon or
//     Restore starts it again.
//
// Restore brings the node back as a suspended machine resumes: link up,
// processes thawed with their state, CPU unlimited, stopped daemons started.
// (A real power cut ends in a reboot, which loses the pods' processes; the
// thaw keeps them: what matters for the peers is the same silence.)

// Cut says what a PowerCut did.
type Cut struct {
	// At is when the freeze began; Frozen how long until the kernel said
	// every process of the node was frozen.
	At     time.Time
	Frozen time.Duration
	// Processes is how many processes were frozen.
	Processes int
}

// PowerCut freezes every process of the node and takes its LAN port down.
func (n *Node) PowerCut(ctx context.Context) (Cut, error) {
	if err := n.needLAN("PowerCut"); err != nil {
		return Cut{}, err
	}
	procs, err := n.Processes()
	if err != nil {
		return Cut{}, err
	}
	c := Cut{At: time.Now(), Processes: len(procs)}
	if err := n.setFreezer(ctx, "FROZEN"); err != nil {
		return c, err
	}
	c.Frozen = time.Since(c.At)
	n.mu.Lock()
	n.fault.frozen = true
	n.mu.Unlock()
	if err := n.setLink(false); err != nil {
		return c, err
	}
	return c, nil
}

// Partition takes the node's LAN port down; the node keeps running.
func (n *Node) Partition(context.Context) error {
	if err := n.needLAN("Partition"); err != nil {
		return err
	}
	return n.setLink(false)
}

// inboundRules are CutInbound's iptables rules, in the node's network
// namespace: every new TCP connection arriving at its LAN port dropped (to
// the node itself or, in raw before any DNAT, to its pods), and every packet
// between the API server (LANGateway:6443) and the node or its pods, both
// ways. Established connections with its peers keep working, and new ones
// out of the node still open: a SYN-ACK is no SYN.
//
// Both ways for the API server: dropping only what the node sends left its
// watches delivering (a receiver takes in-order data whether or not its
// ACKs arrive), so the lab's first version of this fault let the kubelet
// see its pod's deletion and carry it out 6 s after the cut.
func inboundRules() [][]string {
	toAPI := []string{"-d", LANGateway, "-p", "tcp", "--dport", strconv.Itoa(APIServerPort), "-j", "DROP"}
	return [][]string{
		{"raw", "PREROUTING", "-i", "eth0", "-p", "tcp", "--syn", "-j", "DROP"},
		{"raw", "PREROUTING", "-i", "eth0", "-s", LANGateway, "-p", "tcp", "--sport", strconv.Itoa(APIServerPort), "-j", "DROP"},
		append([]string{"filter", "OUTPUT"}, toAPI...),
		append([]string{"filter", "FORWARD"}, toAPI...),
	}
}

// CutInbound makes an asymmetric partition of the node (inboundRules); the
// node keeps running. Restore undoes it.
func (n *Node) CutInbound(context.Context) error {
	if err := n.needLAN("CutInbound"); err != nil {
		return err
	}
	n.mu.Lock()
	n.fault.inboundCut = true // set first: Restore undoes what went in
	n.mu.Unlock()
	for _, r := range inboundRules() {
		if err := n.iptables(rule(r, "-I")...); err != nil {
			return fmt.Errorf("kubenode %s: cut inbound: %w", n.Name, err)
		}
	}
	return nil
}

// uncutInbound deletes CutInbound's rules, those that are there.
func (n *Node) uncutInbound() error {
	n.mu.Lock()
	cut := n.fault.inboundCut
	n.mu.Unlock()
	if !cut {
		return nil
	}
	var errs []error
	for _, r := range inboundRules() {
		if n.iptables(rule(r, "-C")...) != nil {
			continue // never inserted
		}
		if err := n.iptables(rule(r, "-D")...); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kubenode %s: inbound back: %w", n.Name, err)
	}
	n.mu.Lock()
	n.fault.inboundCut = false
	n.mu.Unlock()
	return nil
}

// rule is iptables' arguments to do op (-I, -C, -D) with r: table, chain,
// match and target.
func rule(r []string, op string) []string {
	return append([]string{"-t", r[0], op, r[1]}, r[2:]...)
}

// iptables runs iptables in the node's network namespace.
func (n *Node) iptables(args ...string) error {
	return run("nsenter", append([]string{"--net=" + n.NetNS, "--", "iptables", "-w"}, args...)...)
}

// Starve limits the whole node (daemons and pods) to cpus CPUs (e.g. 0.05)
// with a CFS quota on its cgroup root.
func (n *Node) Starve(_ context.Context, cpus float64) error {
	if cpus <= 0 {
		return fmt.Errorf("kubenode %s: Starve needs a positive CPU share, not %v", n.Name, cpus)
	}
	const period = 100000 // µs
	quota := max(int(cpus*period), 1000)
	dir := filepath.Join("/sys/fs/cgroup/cpu", n.Cgroup)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0o644); err != nil {
		return fmt.Errorf("kubenode %s: starve: %w", n.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quota)), 0o644); err != nil {
		return fmt.Errorf("kubenode %s: starve: %w", n.Name, err)
	}
	n.mu.Lock()
	n.fault.starved = true
	n.mu.Unlock()
	return nil
}

// StopDaemon kills one of the node's daemons (Containerd, Kubelet or
// KubeProxy) with sig and waits until its process is gone. It stays dead
// until StartDaemon or Restore.
func (n *Node) StopDaemon(ctx context.Context, name string, sig syscall.Signal) error {
	if _, ok := daemonUp(n)[name]; !ok {
		return fmt.Errorf("kubenode %s: no daemon %q to stop: %s, %s or %s", n.Name, name, Containerd, Kubelet, KubeProxy)
	}
	n.restartMu.Lock()
	defer n.restartMu.Unlock()
	return n.stopDaemon(ctx, name, sig)
}

func (n *Node) stopDaemon(ctx context.Context, name string, sig syscall.Signal) error {
	n.mu.Lock()
	stopped, d := n.stopped, n.daemons[name]
	n.mu.Unlock()
	if stopped || d == nil {
		return fmt.Errorf("kubenode %s: %s not stopped: the node is not running", n.Name, name)
	}
	select {
	case <-d.done:
	default:
		if err := d.cmd.Process.Signal(sig); err != nil {
			return fmt.Errorf("kubenode %s: signal %s (pid %d) with %v: %w", n.Name, name, d.cmd.Process.Pid, sig, err)
		}
	}
	select {
	case <-d.done:
	case <-ctx.Done():
		return fmt.Errorf("kubenode %s: %s (pid %d) still running after %v: %w", n.Name, name, d.cmd.Process.Pid, sig, ctx.Err())
	}
	n.mu.Lock()
	n.fault.down[name] = true
	n.mu.Unlock()
	return nil
}

// StartDaemon starts a daemon that StopDaemon stopped (or that died), with
// its arguments, in the node's namespaces and cgroups, and returns once it is
// back (see RestartDaemon).
func (n *Node) StartDaemon(ctx context.Context, name string) error {
	if _, ok := daemonUp(n)[name]; !ok {
		return fmt.Errorf("kubenode %s: no daemon %q to start: %s, %s or %s", n.Name, name, Containerd, Kubelet, KubeProxy)
	}
	n.restartMu.Lock()
	defer n.restartMu.Unlock()
	return n.startAgain(ctx, name)
}

func (n *Node) startAgain(ctx context.Context, name string) error {
	n.mu.Lock()
	stopped, d := n.stopped, n.daemons[name]
	n.mu.Unlock()
	if stopped || d == nil {
		return fmt.Errorf("kubenode %s: %s not started: the node is not running", n.Name, name)
	}
	select {
	case <-d.done:
	default:
		return fmt.Errorf("kubenode %s: %s (pid %d) is running", n.Name, name, d.cmd.Process.Pid)
	}
	if err := n.startDaemon(name, d.args...); err != nil {
		return fmt.Errorf("kubenode %s: start %s again: %w", n.Name, name, err)
	}
	n.mu.Lock()
	delete(n.fault.down, name)
	n.mu.Unlock()
	nd := n.daemon(name)
	if err := poll(ctx, name+" back after a restart", nd, func() error { return daemonUp(n)[name](ctx) }); err != nil {
		return fmt.Errorf("kubenode %s: %w", n.Name, err)
	}
	return nil
}

// daemonUp says how each daemon is checked to be back.
func daemonUp(n *Node) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		Containerd: n.containerdUp,
		Kubelet:    n.kubeletUp,
		KubeProxy:  func(ctx context.Context) error { return n.healthz(ctx, kubeProxyHealthz) },
	}
}

// Restore undoes every fault of the node: its LAN port up, its processes
// thawed, its CPU unlimited, its stopped daemons started (in the order
// containerd, kubelet, kube-proxy). It returns once that is done, not once
// the Node is Ready again (WaitReady).
func (n *Node) Restore(ctx context.Context) error {
	var errs []error
	if n.cfg.LAN != nil {
		errs = append(errs, n.setLink(true), n.uncutInbound())
	}
	if err := n.setFreezer(ctx, "THAWED"); err != nil {
		errs = append(errs, err)
	} else {
		n.mu.Lock()
		n.fault.frozen = false
		n.mu.Unlock()
	}
	if err := os.WriteFile(filepath.Join("/sys/fs/cgroup/cpu", n.Cgroup, "cpu.cfs_quota_us"), []byte("-1"), 0o644); err != nil {
		errs = append(errs, fmt.Errorf("kubenode %s: CPU quota off: %w", n.Name, err))
	} else {
		n.mu.Lock()
		n.fault.starved = false
		n.mu.Unlock()
	}
	n.restartMu.Lock()
	defer n.restartMu.Unlock()
	for _, name := range []string{Containerd, Kubelet, KubeProxy} {
		n.mu.Lock()
		d := n.daemons[name]
		n.mu.Unlock()
		if d == nil {
			continue
		}
		select {
		case <-d.done:
			errs = append(errs, n.startAgain(ctx, name))
		default:
		}
	}
	return errors.Join(errs...)
}

// Faulty says which faults the node has now (none: the empty string), e.g.
// "frozen, link down, starved, kubelet down".
func (n *Node) Faulty() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var fs []string
	if n.fault.frozen {
		fs = append(fs, "frozen")
	}
	if n.fault.linkDown {
		fs = append(fs, "link down")
	}
	if n.fault.inboundCut {
		fs = append(fs, "inbound cut")
	}
	if n.fault.starved {
		fs = append(fs, "starved")
	}
	var down []string
	for d := range n.fault.down {
		down = append(down, d+" down")
	}
	sort.Strings(down)
	return strings.Join(append(fs, down...), ", ")
}

// WaitReady waits until the Node is Ready and schedulable in the API server
// (after Restore, say).
func (n *Node) WaitReady(ctx context.Context) error { return n.waitReady(ctx) }

// Processes lists every process of the node: the PIDs in its cgroups in any
// hierarchy (daemons, shims, containers, the namespace holder).
func (n *Node) Processes() ([]int, error) {
	seen := map[int]bool{}
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		err := filepath.WalkDir(filepath.Join(h, n.Cgroup), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed meanwhile
				}
				return err
			}
			if d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil // the cgroup went meanwhile
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	pids := make([]int, 0, len(seen))
	for p := range seen {
		pids = append(pids, p)
	}
	sort.Ints(pids)
	return pids, nil
}

// FreezerState is the node's freezer state: THAWED, FREEZING or FROZEN.
func (n *Node) FreezerState() (string, error) {
	b, err := os.ReadFile(n.freezerState())
	if err != nil {
		return "", fmt.Errorf("kubenode %s: %w", n.Name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (n *Node) freezerState() string {
	return filepath.Join("/sys/fs/cgroup/freezer", n.Cgroup, "freezer.state")
}

// setFreezer writes state (FROZEN or THAWED) and waits until the kernel
// reports it (a freeze is FREEZING until every task has stopped).
func (n *Node) setFreezer(ctx context.Context, state string) error {
	if err := os.WriteFile(n.freezerState(), []byte(state), 0o644); err != nil {
		return fmt.Errorf("kubenode %s: freezer %s: %w", n.Name, state, err)
	}
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		got, err := n.FreezerState()
		if err != nil {
			return err
		}
		if got == state {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubenode %s: freezer still %s, want %s: %w", n.Name, got, state, ctx.Err())
		case <-time.After(delay):
		}
		if state == "FROZEN" { // a task that forked meanwhile: ask again
			_ = os.WriteFile(n.freezerState(), []byte(state), 0o644)
		}
	}
}

func (n *Node) setLink(up bool) error {
	if err := n.needLAN("a link fault"); err != nil {
		return err
	}
	if err := n.cfg.LAN.setPort(n.Index, up); err != nil {
		return fmt.Errorf("kubenode %s: %w", n.Name, err)
	}
	n.mu.Lock()
	n.fault.linkDown = !up
	n.mu.Unlock()
	return nil
}

func (n *Node) needLAN(what string) error {
	if n.cfg.LAN == nil {
		return fmt.Errorf("kubenode %s: %s needs the node on a LAN (Config.LAN): its only link is the one to cut", n.Name, what)
	}
	return nil
}
