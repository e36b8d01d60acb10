package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/mosquittodb"
)

// StateConfig configures RunState.
type StateConfig struct {
	// Plan is the state put into each broker before its event (default:
	// 300 retained, 3 MQTT 3.1.1 and 1 MQTT 5 persistent sessions, 20
	// QoS 1 messages queued for each).
	Plan    brokerstate.Plan
	Repo    string // the AMF module, for the images
	BinDir  string // prebuilt static binaries for the images (optional)
	WorkDir string // the control plane's files (when RunState starts it)
	// ControlPlane and Node, when both are set, are used instead of
	// starting them (a test's).
	ControlPlane *controlplane.ControlPlane
	Node         *kubenode.Node
	// NodeLoss adds the case nodeloss: a stateful pair across two nodes of
	// a cluster of three of its own (lab/nodeloss.RunStateCut), the
	// primary's node's power cut.
	NodeLoss bool
	Progress io.Writer
	Log      func(format string, args ...any)
}

// StateCase is one event and what the broker held after it.
type StateCase struct {
	Key    string // the JSON prefix: k8s_crash, k8s_crash_on_changes, k8s_restart, handover, switchover, crash
	What   string // the event, in words
	Result brokerstate.Result
	// Back is from the event to the broker accepting connections again, as
	// a client dialling every 20 ms sees it; for the agent's cases, from
	// the primary's retirement to the new primary's pod Ready.
	Back time.Duration
	// AgentSaid, for a case whose live clients lost or gave up a message,
	// is what the agent logged of the pair: what the loss is read by.
	AgentSaid string
	// Complete, for a switchover: from the stress's onset to the new
	// primary's pod Ready (0: not a switchover).
	Complete time.Duration
	// RetainedAge, for a failover, is how much older than the fault the
	// new primary's retained set is: the fault's time minus the retained
	// clock's value there (brokerstate.Clock, every 100 ms up to the
	// fault); -1: the clock was not carried; 0: not measured.
	RetainedAge time.Duration
	// Live is what QoS 1 clients connected through the pair's Service
	// saw across a switchover (nil: none ran).
	Live *brokerstate.LiveResult
}

// StateReport is RunState's result.
type StateReport struct {
	Plan  brokerstate.Plan
	Cases []StateCase
}

// RunState measures what survives on a real node (kubelet + containerd) of
// what a Mosquitto broker holds, put there by real clients: Kubernetes alone
// restarting the broker in place after a crash (the process SIGKILLed) with
// Mosquitto's default autosave and with autosave_on_changes, after a clean
// stop (SIGTERM, as the kubelet stops it), and AMF's handover levers (the
// state saved by one pod's sidecar and loaded by another's, which the
// kubelet restarts on it), then the agent pulling them: a stateful pair's
// planned switchover and crash failover (DESIGN.md, "Broker state").
func RunState(ctx context.Context, cfg StateConfig) (*StateReport, error) {
	if cfg.Plan == (brokerstate.Plan{}) {
		cfg.Plan = brokerstate.Plan{Retained: 300, Sessions: 3, V5Sessions: 1, Queued: 20}
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if cfg.Plan.V5Sessions > 0 && cfg.Plan.MosquittoSub == "" {
		sub, err := brokerstate.MosquittoSub()
		if err != nil {
			return nil, err
		}
		cfg.Plan.MosquittoSub = sub
	}
	nb := &nodeBench{cfg: NodeConfig{Repo: cfg.Repo, BinDir: cfg.BinDir, WorkDir: cfg.WorkDir, Progress: cfg.Progress, Log: cfg.Log}, cp: cfg.ControlPlane, node: cfg.Node}
	if nb.cp == nil || nb.node == nil {
		stop, err := nb.launch(ctx)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	s := &stateBench{cfg: cfg, cp: nb.cp, node: nb.node, c: nb.cp.Client(), ns: "amf-bench-state"}
	if _, err := s.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	rep := &StateReport{Plan: cfg.Plan}
	for _, k := range []struct {
		key, what, autosave string
		sig                 syscall.Signal
	}{
		{"k8s_crash", "Kubernetes alone: the broker SIGKILLed, restarted in place (autosave_interval 1800, Mosquitto's default)", "", syscall.SIGKILL},
		{"k8s_crash_on_changes", "Kubernetes alone: the broker SIGKILLed, restarted in place (autosave_on_changes true, autosave_interval 1: a save after every change)", "autosave_on_changes true\nautosave_interval 1\n", syscall.SIGKILL},
		{"k8s_restart", "Kubernetes alone: the broker stopped with SIGTERM (it saves as it stops), restarted in place", "", syscall.SIGTERM},
	} {
		fmt.Fprintf(cfg.Progress, "case %s: %s\n", k.key, k.what)
		cctx, cancel := context.WithTimeout(ctx, caseTimeout)
		c, err := s.inPlace(cctx, k.key, k.autosave, k.sig)
		cancel()
		if err != nil {
			return rep, fmt.Errorf("%s: %w", k.key, err)
		}
		c.What = k.what
		rep.Cases = append(rep.Cases, c)
	}
	fmt.Fprintf(cfg.Progress, "case handover: the primary's state saved by its sidecar, loaded by the standby's\n")
	cctx, cancel := context.WithTimeout(ctx, caseTimeout)
	defer cancel()
	c, err := s.handover(cctx)
	if err != nil {
		return rep, fmt.Errorf("handover: %w", err)
	}
	rep.Cases = append(rep.Cases, c)

	// The agent's cases: the agent DaemonSet pulls the levers.
	agent, err := testbed.DeployAgent(ctx, s.cp, cfg.Repo, s.node.Name, nil)
	if err != nil {
		return rep, fmt.Errorf("the agent DaemonSet: %w", err)
	}
	defer agent.Stop()
	lines, unsub := agent.Subscribe()
	defer unsub()
	for _, k := range []struct {
		key, what string
		crash     bool
	}{
		{"switchover", "AMF: a planned switchover (the paper's stress), the final state carried through the agent's hub; back: from the retirement to the new primary Ready", false},
		{"crash", "AMF: the primary's broker SIGKILLed, failed over onto its last snapshot (every second); back: from the retirement to the new primary Ready", true},
	} {
		fmt.Fprintf(cfg.Progress, "case %s: %s\n", k.key, k.what)
		cctx, cancel := context.WithTimeout(ctx, caseTimeout)
		c, err := s.agentCase(cctx, lines, k.key, k.crash)
		cancel()
		if err != nil {
			return rep, fmt.Errorf("%s: %w; the agent said of the pair:\n%s", k.key, err, pairLines(agent.Lines(), s.ns+"/state-"+k.key))
		}
		c.What = k.what + c.What
		if l := c.Live; l != nil && (l.Lost != 0 || l.Refused != 0 || l.MarkerMissed) {
			c.AgentSaid = pairLines(agent.Lines(), s.ns+"/state-"+k.key)
		}
		rep.Cases = append(rep.Cases, c)
	}
	if cfg.NodeLoss {
		const what = "AMF: the power of the primary's node cut (a pair across two of three nodes), failed over by the guard onto the snapshot relayed before; back: from the cut to the new primary Ready"
		fmt.Fprintf(cfg.Progress, "case nodeloss: %s\n", what)
		cctx, cancel := context.WithTimeout(ctx, 2*caseTimeout)
		cut, err := nodeloss.RunStateCut(cctx, nodeloss.StateCutConfig{Repo: cfg.Repo, WorkDir: cfg.WorkDir, Plan: cfg.Plan, Phase: crashPhase, Progress: cfg.Progress, Log: cfg.Log})
		cancel()
		if err != nil {
			return rep, fmt.Errorf("nodeloss: %w", err)
		}
		c := StateCase{Key: "nodeloss", What: what, Result: cut.Result, Back: cut.Back, RetainedAge: cut.RetainedAge}
		if cut.NotCarried != "" {
			c.What += " (the agent gave the state up: " + cut.NotCarried + ")"
		}
		rep.Cases = append(rep.Cases, c)
	}
	return rep, nil
}

// crashPhase is how long after a snapshot was taken in the crash case
// kills the broker: 0.9 of the sidecar's default snapshot interval.
const crashPhase = 900 * time.Millisecond

// agentCase is a stateful pair's switchover (stress) or crash failover
// (SIGKILL), done by the agent, and what the new primary holds after it.
func (s *stateBench) agentCase(ctx context.Context, lines <-chan testbed.AgentLine, key string, crash bool) (StateCase, error) {
	p, err := testbed.StartStatePair(ctx, s.c, s.node, lines, s.ns, "state-"+key, s.cfg.Plan)
	if p != nil {
		defer s.remove(p.Deployments[:]...)
	}
	if err != nil {
		return StateCase{}, err
	}
	var onset time.Time
	var live *brokerstate.Live
	if !crash {
		if live, err = p.StartLive(ctx); err != nil {
			return StateCase{}, err
		}
	}
	var clock *brokerstate.Clock
	if crash {
		if clock, err = p.StartClock(ctx); err != nil {
			return StateCase{}, err
		}
		if _, err := p.AwaitClockSnapshotLine(ctx); err != nil {
			clock.Stop()
			return StateCase{}, err
		}
		// The crash comes late in the snapshot interval (the sidecar's
		// default, 1 s), the worst phase for it: most of an interval
		// taken in since the last snapshot. A phase, not a wait for
		// anything.
		select {
		case <-time.After(crashPhase):
		case <-ctx.Done():
			clock.Stop()
			return StateCase{}, ctx.Err()
		}
		onset, err = p.Crash(ctx)
		clock.Stop()
		if err != nil {
			return StateCase{}, err
		}
	} else {
		stop, err := p.Stress(ctx)
		if err != nil {
			return StateCase{}, err
		}
		defer stop()
		onset = time.Now()
	}
	h, err := p.Handover(ctx)
	if err != nil {
		return StateCase{}, err
	}
	served, err := p.AwaitServing(ctx)
	if err != nil {
		return StateCase{}, err
	}
	c := StateCase{Key: key, Back: served.Sub(h.Retired)}
	if live != nil {
		lr, err := live.Stop(ctx)
		if err != nil {
			return StateCase{}, err
		}
		c.Live = &lr
	}
	if clock != nil {
		at, ok, err := p.ReadClock(ctx)
		if err != nil {
			return StateCase{}, fmt.Errorf("the retained clock: %w", err)
		}
		c.RetainedAge = -1
		if ok {
			c.RetainedAge = onset.Sub(at)
		}
	}
	res, err := p.Check(ctx)
	if err != nil {
		err = fmt.Errorf("%w (the new primary then: %s)", err, podNow(ctx, s.c, s.ns, p.Standby.Name))
	}
	c.Result = res
	if !crash {
		c.Complete = served.Sub(onset)
	}
	if h.NotCarried != "" {
		c.What = " (the agent gave the state up: " + h.NotCarried + ")"
	}
	return c, err
}

// podNow says in one line what pod ns/name is now: its IP, conditions and
// containers, for a check that could not reach it.
func podNow(ctx context.Context, c kubernetes.Interface, ns, name string) string {
	pod, err := c.CoreV1().Pods(ns).Get(context.WithoutCancel(ctx), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", pod.Status.PodIP, pod.Status.Phase)
	for _, cd := range pod.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s", cd.Type, cd.Status)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		fmt.Fprintf(&b, " %s(ready=%t restarts=%d started=%v)", cs.Name, cs.Ready, cs.RestartCount, cs.State.Running != nil)
	}
	return b.String()
}

// pairLines are the agent's lines of the pair whose Deployments start
// with prefix (ns/name), one per line: what a failed case is read by.
func pairLines(lines []testbed.AgentLine, prefix string) string {
	var b strings.Builder
	for _, l := range lines {
		if strings.HasPrefix(l.Deployment, prefix) || strings.Contains(l.Raw, prefix) || l.Namespace != "" && strings.HasPrefix(l.Namespace+"/"+l.Pod, prefix) {
			b.WriteString(l.Raw)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// caseTimeout bounds one case: a pod that cannot be scheduled or a broker
// that never comes back ends the run with the reason instead of a hang.
const caseTimeout = 3 * time.Minute

type stateBench struct {
	cfg  StateConfig
	cp   *controlplane.ControlPlane
	node *kubenode.Node
	c    kubernetes.Interface
	ns   string
}

// deploy creates ConfigMap and Deployments and returns the running pods.
func (s *stateBench) deploy(ctx context.Context, name, conf string, deps ...*appsv1.Deployment) ([]*corev1.Pod, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"mosquitto.conf": brokerstate.Config(conf)}}
	if _, err := s.c.CoreV1().ConfigMaps(s.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var pods []*corev1.Pod
	for _, d := range deps {
		d.Namespace = s.ns
		if _, err := s.c.AppsV1().Deployments(s.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	for _, d := range deps {
		p, err := brokerstate.RunningPod(ctx, s.c, s.ns, d.Name)
		if err != nil {
			return nil, err
		}
		if _, err := brokerstate.Accepting(ctx, brokerstate.Addr(p)); err != nil {
			return nil, err
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// remove deletes the Deployments and waits until their pods are gone, so
// that the next case has the node's CPU.
func (s *stateBench) remove(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fg := metav1.DeletePropagationForeground
	for _, n := range names {
		_ = s.c.AppsV1().Deployments(s.ns).Delete(ctx, n, metav1.DeleteOptions{PropagationPolicy: &fg})
	}
	for _, n := range names {
		for {
			pods, err := s.c.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + n})
			if err != nil || len(pods.Items) == 0 || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // polling the API server, not a synchronisation
			}
		}
	}
}

// inPlace seeds one broker, signals its process from the host and, once the
// kubelet has started it again, checks what it holds.
func (s *stateBench) inPlace(ctx context.Context, name, autosave string, sig syscall.Signal) (StateCase, error) {
	name = strings.ReplaceAll(name, "_", "-")
	pods, err := s.deploy(ctx, name, autosave, brokerstate.Deployment(s.ns, name, name, nil))
	if err != nil {
		return StateCase{}, err
	}
	// Removed after the case: the node has room for a few of the testbed's
	// 500m brokers only.
	defer s.remove(name)
	p := pods[0]
	if err := brokerstate.Seed(ctx, brokerstate.Addr(p), s.cfg.Plan); err != nil {
		return StateCase{}, err
	}
	pid, err := s.node.ContainerPID(ctx, s.ns, p.Name, brokerstate.BrokerContainer)
	if err != nil {
		return StateCase{}, err
	}
	evs, stop := s.node.Subscribe(ctx)
	defer stop()
	t0 := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		return StateCase{}, fmt.Errorf("signal the broker (pid %d): %w", pid, err)
	}
	if err := brokerstate.Restarted(ctx, evs, p.Name); err != nil {
		return StateCase{}, err
	}
	back, err := brokerstate.Accepting(ctx, brokerstate.Addr(p))
	if err != nil {
		return StateCase{}, err
	}
	res, err := brokerstate.Check(ctx, brokerstate.Addr(p), s.cfg.Plan)
	return StateCase{Key: strings.ReplaceAll(name, "-", "_"), Result: res, Back: back.Sub(t0)}, err
}

// handover runs a hot pair as inject --standby --state-dir writes it, seeds
// the primary, saves its state through its sidecar and loads it into the
// standby through the standby's.
func (s *stateBench) handover(ctx context.Context) (StateCase, error) {
	deps, err := brokerstate.InjectedPair(s.ns, "handover")
	if err != nil {
		return StateCase{}, err
	}
	defer s.remove(deps[0].Name, deps[1].Name)
	pods, err := s.deploy(ctx, "handover", "", deps...)
	if err != nil {
		return StateCase{}, err
	}
	primary, standby := pods[0], pods[1]
	if err := brokerstate.Seed(ctx, brokerstate.Addr(primary), s.cfg.Plan); err != nil {
		return StateCase{}, err
	}
	state, err := brokerstate.SidecarState(ctx, s.cp, s.ns, primary.Name, nil, "save")
	if err != nil {
		return StateCase{}, err
	}
	sum, err := mosquittodb.Read(state)
	if err != nil {
		return StateCase{}, fmt.Errorf("the primary's sidecar saved no whole state: %w", err)
	}
	evs, stop := s.node.Subscribe(ctx)
	defer stop()
	t0 := time.Now()
	if _, err := brokerstate.SidecarState(ctx, s.cp, s.ns, standby.Name, state, "load"); err != nil {
		return StateCase{}, err
	}
	if err := brokerstate.Restarted(ctx, evs, standby.Name); err != nil {
		return StateCase{}, err
	}
	back, err := brokerstate.Accepting(ctx, brokerstate.Addr(standby))
	if err != nil {
		return StateCase{}, err
	}
	res, err := brokerstate.Check(ctx, brokerstate.Addr(standby), s.cfg.Plan)
	return StateCase{Key: "handover", Result: res, Back: back.Sub(t0),
		What: fmt.Sprintf("AMF's levers: the primary's state (%d bytes) saved by its sidecar, loaded by the standby's, which the kubelet restarts on it", sum.Bytes)}, err
}

// WriteStateReport prints the table and the JSON line.
func WriteStateReport(w io.Writer, r *StateReport) {
	p := r.Plan
	fmt.Fprintf(w, "\nstate before each event: %d retained, %d sessions (%d MQTT 3.1.1, %d MQTT 5), %d QoS 1 messages queued for each\n\n",
		p.Retained, p.Sessions+p.V5Sessions, p.Sessions, p.V5Sessions, p.Queued)
	fmt.Fprintf(w, "| case | retained lost | sessions lost | QoS 1 lost | duplicates | broker back after |\n|---|---|---|---|---|---|\n")
	js := map[string]any{}
	var live strings.Builder
	for _, c := range r.Cases {
		res := c.Result
		fmt.Fprintf(w, "| %s | %d of %d | %d of %d | %d of %d | %d | %.2f s |\n", c.What,
			res.RetainedLost, p.Retained, len(res.SessionsLost), p.Sessions+p.V5Sessions, res.QueuedLost, res.QueuedLost+res.QueuedFound, res.Duplicates, c.Back.Seconds())
		js[c.Key+"_retained_lost"] = res.RetainedLost
		js[c.Key+"_sessions_lost"] = len(res.SessionsLost)
		js[c.Key+"_qos1_lost"] = res.QueuedLost
		js[c.Key+"_duplicates"] = res.Duplicates
		js[c.Key+"_back_s"] = math.Round(c.Back.Seconds()*1000) / 1000
		if c.Complete > 0 {
			js[c.Key+"_complete_s"] = math.Round(c.Complete.Seconds()*1000) / 1000
		}
		switch {
		case c.RetainedAge < 0:
			js[c.Key+"_retained_clock_lost"] = true
			fmt.Fprintf(&live, "%s, the retained clock: not on the new primary\n", c.Key)
		case c.RetainedAge > 0:
			js[c.Key+"_retained_age_s"] = math.Round(c.RetainedAge.Seconds()*1000) / 1000
			fmt.Fprintf(&live, "%s, the retained clock (every 100 ms up to the fault): the new primary's %.2f s older than the fault\n", c.Key, c.RetainedAge.Seconds())
		}
		if l := c.Live; l != nil {
			js[c.Key+"_live_lost"] = l.Lost
			js[c.Key+"_live_refused"] = l.Refused
			js[c.Key+"_live_duplicates"] = l.Duplicates
			js[c.Key+"_outage_s"] = math.Round(max(l.AckGap, l.ReceiveGap).Seconds()*1000) / 1000
			fmt.Fprintf(&live, "%s, live QoS 1 clients through the Service: %v\n", c.Key, *l)
		}
	}
	if live.Len() > 0 {
		fmt.Fprintf(w, "\n%s", live.String())
	}
	b, _ := json.Marshal(js) // a map of numbers cannot fail
	fmt.Fprintf(w, "%s\n", b)
}
