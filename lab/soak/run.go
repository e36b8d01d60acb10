package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/proc"
	"github.com/amf-edge/amf/lab/scrape"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/pause"
	"github.com/amf-edge/amf/podsignal"
)

// Config configures Run.
type Config struct {
	// Duration is how long faults are begun; the last one runs to its end.
	Duration time.Duration
	Seed     uint64
	Kinds    []Kind // all if empty
	Repo     string // the AMF repository (manifests/base, the images' module)
	// WorkDir holds the control plane's and the brokers' files, and the
	// agents' logs.
	WorkDir string
	Bounds  Bounds
	// ClientWait bounds the wait for the pair's clients after a fault
	// that acts (default 2 min; negative: no clients).
	ClientWait time.Duration
	// Pairs are the broker pairs, by kind (default: DefaultPairs). Each
	// has its namespace, its remote brokers and E2E probe, and its
	// clients; a stateful one its plan of retained messages, sessions and
	// queued messages, and its clock.
	Pairs []PairKind
	// SlowCPU is what a slow node is held at (default 0.7 of a CPU: on
	// cgroup v1 a node's quota may not be below a pod's).
	SlowCPU  float64
	Progress io.Writer
	Log      func(format string, args ...any)
}

// Run starts a control plane, three lab nodes, the agent DaemonSet, the
// hot pairs (the first with its primary on node 0 and its standby on node
// 1, the next the other way round, and so on; their remote brokers and
// clients on node 2), makes the schedule's faults one after another until
// cfg.Duration is over, and returns what happened. An error is the lab's
// (it could not start); a fault the pair did not come back from ends the
// run early and is in the History.
func Run(ctx context.Context, cfg Config) (_ History, err error) {
	if cfg.Duration <= 0 {
		return History{}, errors.New("soak: the duration must be positive")
	}
	if cfg.Bounds.Back == nil {
		cfg.Bounds = DefaultBounds()
	}
	if cfg.ClientWait == 0 {
		cfg.ClientWait = 2 * time.Minute
	}
	if cfg.SlowCPU <= 0 {
		cfg.SlowCPU = 0.7
	}
	if len(cfg.Pairs) == 0 {
		cfg.Pairs = DefaultPairs()
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	cp, cl, stop, err := nodeloss.LaunchCluster(ctx, cfg.Repo, filepath.Join(cfg.WorkDir, "cp"), say, cfg.Log)
	if err != nil {
		return History{}, err
	}
	defer stop()
	r := &runner{cfg: cfg, cp: cp, say: say, third: cl.Nodes[2], all: cl.Nodes[:3]}
	defer func() {
		for _, pr := range r.pairs {
			if pr.clients != nil {
				pr.clients.Stop()
			}
			if pr.state != nil && pr.state.clock != nil {
				pr.state.clock.Stop()
			}
			pr.p.Stop()
		}
	}()
	h := History{Seed: cfg.Seed}
	modes := make([]contract.Mode, len(cfg.Pairs))
	for i, k := range cfg.Pairs {
		modes[i] = k.Mode()
	}
	for i, kind := range cfg.Pairs {
		mode := kind.Mode()
		ns := pairNamespace(i)
		pdir := filepath.Join(cfg.WorkDir, "brokers", ns)
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			return History{}, err
		}
		pc := nodeloss.PairConfig{ControlPlane: cp, Cluster: cl, Repo: cfg.Repo, Dir: pdir, Namespace: ns, Mode: mode, Swap: i%2 == 1,
			Policy: map[string]string{contract.AnnCooldown: Cooldown.String()}, State: kind == StatePair}
		pn, sn := cl.Nodes[0], cl.Nodes[1]
		if pc.Swap {
			pn, sn = sn, pn
		}
		say("pair %d: a hot %s pair in namespace %s, its primary on %s, its standby on %s", i, kind, ns, pn.Name, sn.Name)
		if i > 0 {
			pc.Agents = r.pairs[0].p.Agents
		} else if slices.Contains(modes, contract.ModeNode) {
			pc.AgentLayout = "overlays/node-mode"
		}
		p, err := nodeloss.StartPair(ctx, pc)
		if err != nil {
			return History{}, fmt.Errorf("pair %d: %w", i, err)
		}
		pr := &pairRun{p: p, kind: kind, roles: [2]string{testbed.PrimaryName, testbed.StandbyName}, at: [2]*kubenode.Node{pn, sn},
			home: map[string]*kubenode.Node{testbed.PrimaryName: pn, testbed.StandbyName: sn}}
		if kind == StatePair {
			pr.state = &stateRun{plan: statePlan}
		}
		r.pairs = append(r.pairs, pr)
		h.Pairs = append(h.Pairs, PairInfo{Namespace: ns, Mode: mode, State: kind == StatePair})
	}
	r.agents = r.pairs[0].p.Agents
	for _, pr := range r.pairs {
		if err := pr.p.WaitPair(ctx, pr.roles[0], pr.roles[1], pr.at[0].Name, pr.at[1].Name); err != nil {
			return History{}, fmt.Errorf("%s: %w", pr.p.Namespace, err)
		}
		if cfg.ClientWait > 0 {
			say("%s: the clients: a pod on %s and the LAN, through the Service's ClusterIP and NodePort, keep-alive 30 s", pr.p.Namespace, r.third.Name)
			if pr.clients, err = pr.p.StartClients(ctx, r.third, cl.LAN, []time.Duration{30 * time.Second}); err != nil {
				return History{}, err
			}
		}
		if pr.state != nil {
			say("%s: the broker state: %d retained messages, %d sessions (%d MQTT 5) with %d QoS 1 messages queued each, a retained clock every %v",
				pr.p.Namespace, statePlan.Retained, statePlan.Sessions+statePlan.V5Sessions, statePlan.V5Sessions, statePlan.Queued, clockEvery)
			if err := r.seedState(ctx, pr); err != nil {
				return History{}, fmt.Errorf("%s: %w", pr.p.Namespace, err)
			}
		}
	}
	h.Start, h.BrokerPods = time.Now(), 2*len(r.pairs)
	sctx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Add(2)
	go func() { defer sampling.Done(); r.samplePrimaries(sctx) }()
	go func() { defer sampling.Done(); r.sampleAgents(sctx) }()

	sched := NewSchedule(cfg.Seed, cfg.Kinds, modes)
	say("soak: seed %d for %v", cfg.Seed, cfg.Duration)
	for i := 1; time.Since(h.Start) < cfg.Duration && ctx.Err() == nil; i++ {
		st := sched.Next()
		say("fault %d: %s", i, st)
		f := r.run(ctx, st)
		h.Faults = append(h.Faults, f)
		if f.Back.IsZero() {
			say("fault %d: the run ends here: %s", i, f.Err)
			break
		}
		say("fault %d: whole again after %.1f s (the probes' longest gap %.2f s, %d lost)", i, f.Back.Sub(f.Start).Seconds(), f.SOT().Seconds(), f.Lost())
		for _, p := range f.Pairs {
			if p.State != nil {
				say("fault %d: %s's broker state: %s", i, p.Namespace, p.State.Summary(f.Start))
			}
		}
		select { // the schedule's quiet period: a part of the run, not a synchronisation
		case <-time.After(st.Quiet):
		case <-ctx.Done():
		}
	}
	h.End = time.Now()
	stopSampling()
	sampling.Wait()
	h.Primaries, h.AgentUse = r.primaries, r.agentUse
	h.Decisions, h.Alarms = r.decisions()
	h.Leftovers = r.leftovers(ctx)
	nodeloss.SaveAgentLogs(cfg.WorkDir, r.pairs[0].p, say)
	return h, ctx.Err()
}

// runner is one run's lab and what it samples.
type runner struct {
	cfg   Config
	cp    *controlplane.ControlPlane
	pairs []*pairRun
	// agents are the cluster's agents, by node (every pair's).
	agents map[string]*testbed.AgentPod
	say    func(string, ...any)
	// third is the node of the remote brokers and the clients.
	third *kubenode.Node
	// all are the three nodes, in a fixed order (for the samplers: the
	// roles move under them).
	all []*kubenode.Node

	mu        sync.Mutex
	primaries []Primaries
	agentUse  []AgentUse
}

// pairRun is one broker pair as the run follows it.
type pairRun struct {
	p       *nodeloss.Pair
	kind    PairKind
	clients *nodeloss.Clients
	// state follows a stateful pair's broker state (nil for the others).
	state *stateRun
	// roles are the primary's and the standby's Deployments; at their
	// nodes.
	roles [2]string
	at    [2]*kubenode.Node
	// home is each Deployment's node (StartPair pins them).
	home map[string]*kubenode.Node
}

// pairNamespace is the namespace of the run's i-th pair.
func pairNamespace(i int) string {
	if i == 0 {
		return nodeloss.BrokerNamespace
	}
	return fmt.Sprintf("%s-%d", nodeloss.BrokerNamespace, i)
}

// node is the node role names for pair i.
func (r *runner) node(i int, role Role) *kubenode.Node {
	switch role {
	case PrimaryNode:
		return r.pairs[i].at[0]
	case StandbyNode:
		return r.pairs[i].at[1]
	case ThirdNode:
		return r.third
	}
	return nil
}

func (r *runner) nodes(st Step) map[Role]string {
	out := map[Role]string{}
	for _, s := range []*Step{&st, st.With} {
		if s != nil && s.On != "" {
			out[s.On] = r.node(st.Pair, s.On).Name
		}
	}
	return out
}

// acting says which pairs st takes a primary from: the struck pair for a
// fault of its broker; every pair whose primary runs on the node a power
// cut or a partition takes away.
func (r *runner) acting(st Step) []bool {
	out := make([]bool, len(r.pairs))
	var gone *kubenode.Node
	switch st.Kind {
	case Crash, OOM, Anomaly, Hang:
		out[st.Pair] = true
	case PowerCut, Partition, AsymmetricPartition:
		gone = r.node(st.Pair, PrimaryNode)
	case StandbyCut:
		gone = r.node(st.Pair, StandbyNode)
	}
	for i, pr := range r.pairs {
		if gone != nil && pr.at[0] == gone {
			out[i] = true
		}
	}
	return out
}

// run makes one step and waits until every pair is whole again.
func (r *runner) run(ctx context.Context, st Step) (f Fault) {
	f = Fault{Step: st, Nodes: r.nodes(st)}
	bound := r.cfg.Bounds.Back[st.Kind]
	if st.With != nil {
		bound += r.cfg.Bounds.Overlapped
	}
	fctx, cancel := context.WithTimeout(ctx, bound+time.Minute)
	defer cancel()
	fail := func(err error) Fault {
		f.Back, f.Err = time.Time{}, err.Error()
		return f
	}
	acts := r.acting(st)
	olds, prims := make([]string, len(r.pairs)), make([]string, len(r.pairs))
	marks := make([][]int, len(r.pairs))
	for i, pr := range r.pairs {
		f.Pairs = append(f.Pairs, PairPart{Namespace: pr.p.Namespace, PrimaryNode: pr.at[0].Name, StandbyNode: pr.at[1].Name, Acts: acts[i]})
		old, err := pr.p.PodOf(fctx, pr.roles[0])
		if err != nil {
			return fail(fmt.Errorf("%s: %w", pr.p.Namespace, err))
		}
		olds[i], prims[i] = old, pr.roles[0]
		if pr.clients != nil && acts[i] {
			if err := pr.clients.OntoPrimary(fctx, old); err != nil {
				return fail(fmt.Errorf("%s: %w", pr.p.Namespace, err))
			}
			marks[i] = pr.clients.Marks()
		}
	}
	if st.Kind == Anomaly {
		// The flap guard holds a switchover back for the cooldown after
		// the pair's last retirement: the anomaly begins once it is over,
		// so that it is switched over.
		if err := r.hold(fctx, time.Until(r.lastRetired(r.pairs[st.Pair].p.Namespace).Add(Cooldown+time.Second))); err != nil {
			return fail(err)
		}
	}
	// A stateful pair's snapshot is not awaited here: the fault comes at
	// whatever point of the snapshot interval the run has reached, so the
	// retained set's age samples it (the plan was in the standby's hub
	// since its seeding: seedState).
	f.Start = time.Now()
	var with sync.WaitGroup
	var withErr error
	if st.With != nil {
		with.Add(1)
		go func() {
			defer with.Done()
			select { // the schedule's offset
			case <-time.After(st.Offset):
			case <-fctx.Done():
				return
			}
			f.WithDown, withErr = r.strike(fctx, *st.With)
		}()
	}
	err := r.fault(fctx, st, &f, acts, olds)
	with.Wait()
	if withErr != nil {
		withErr = fmt.Errorf("%s: %w", st.With.Kind, withErr)
	}
	if err = errors.Join(err, withErr); err != nil {
		return fail(err)
	}
	for i, pr := range r.pairs {
		if err := r.settle(fctx, pr, olds[i], acts[i]); err != nil {
			return fail(fmt.Errorf("%s: %w", pr.p.Namespace, err))
		}
	}
	f.Back = time.Now()
	for i, pr := range r.pairs {
		now, err := pr.p.PodOf(ctx, pr.roles[0])
		if err != nil {
			return fail(fmt.Errorf("%s: %w", pr.p.Namespace, err))
		}
		f.Pairs[i].Moved = now != olds[i]
		// Also after a fault that need not act but did, by the product's
		// rule (an agent or a sidecar away too long): a failover the
		// state was to survive, and after which the plan is seeded again.
		if pr.state == nil || !f.Pairs[i].Moved {
			continue
		}
		c, err := r.checkState(ctx, pr, f.Start)
		f.Pairs[i].State = &c
		if err != nil {
			return fail(fmt.Errorf("%s: the broker state: %w", pr.p.Namespace, err))
		}
	}
	for i, pr := range r.pairs {
		part := &f.Pairs[i]
		rec := pr.p.Probe.Snapshot()
		gap, _ := rec.MaxGap(f.Start, f.Back)
		part.SOT = gap.Duration()
		// A second's margin at the end: messages on their way are not lost.
		part.Lost = len(rec.Lost(f.Start.Add(-time.Second), f.Back.Add(-time.Second)))
		if !acts[i] {
			continue
		}
		part.Failover = r.retired(pr.p.Namespace+"/"+prims[i], f.Start)
		if pr.clients == nil {
			continue
		}
		// Served by either broker of the pair but the old primary's pod:
		// the Service spreads connections over both brokers of a hot pair,
		// and a client that reconnects once the new standby is Ready may
		// reach it (told its name now, as the pair is whole). The run's
		// context, not the fault's: the clients' wait is their own.
		if err := pr.clients.Tell(ctx); err != nil {
			return fail(fmt.Errorf("%s: %w", pr.p.Namespace, err))
		}
		old := olds[i]
		part.Clients = pr.clients.ServedBy(ctx, marks[i], f.Start, r.cfg.ClientWait, func(b string) bool { return b != "" && b != old })
		for j, c := range part.Clients {
			if c.ServedS < 0 {
				part.ClientsNotBack = append(part.ClientsNotBack, pr.clients.List[j].Describe(marks[i][j]))
			}
		}
	}
	return f
}

// settle waits until pr is whole again, whichever way round: the old
// primary's pod gone (if the fault took it away), one Deployment the
// primary and the other its standby, both Ready with their nodes recorded,
// the probe's messages flowing; and takes the roles as it finds them (a
// fault may have failed the pair over twice: a crash, then the new
// primary's node's agent away for longer than its guard waits).
func (r *runner) settle(ctx context.Context, pr *pairRun, old string, acted bool) error {
	var primary string
	for {
		var state string
		primary, state = r.readRoles(ctx, pr, old, acted)
		if primary != "" {
			break
		}
		select { // polling the API until the roles settle
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("one primary, the old primary's pod %s gone: %w; last seen: %s", old, ctx.Err(), state)
		}
	}
	standby := testbed.StandbyName
	if primary == testbed.StandbyName {
		standby = testbed.PrimaryName
	}
	pr.roles = [2]string{primary, standby}
	pr.at = [2]*kubenode.Node{pr.home[primary], pr.home[standby]}
	return pr.p.WaitPair(ctx, primary, standby, pr.at[0].Name, pr.at[1].Name)
}

// readRoles returns pr's primary Deployment once one Deployment of the
// pair is the primary, with its policy, and the other the standby, and (if
// acted) the pod old is gone; else "" and what it saw.
func (r *runner) readRoles(ctx context.Context, pr *pairRun, old string, acted bool) (string, string) {
	c := pr.p.Client
	ns := pr.p.Namespace
	if acted {
		_, err := c.CoreV1().Pods(ns).Get(ctx, old, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return "", fmt.Sprintf("the old primary's pod %s still there (%v)", old, err)
		}
	}
	var primaries, standbys []string
	for _, name := range []string{testbed.PrimaryName, testbed.StandbyName} {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err.Error()
		}
		_, policy := d.Annotations[contract.AnnStandby]
		switch role := d.Annotations[contract.AnnRole]; {
		case isPrimary(d) && policy:
			primaries = append(primaries, name)
		case role == "standby" && !policy:
			standbys = append(standbys, name)
		}
	}
	if len(primaries) != 1 || len(standbys) != 1 {
		return "", fmt.Sprintf("primaries %v, standbys %v", primaries, standbys)
	}
	return primaries[0], ""
}

// isPrimary says whether d is a pair's primary: its role says so, or it
// has none yet and holds the pair's policy (amf.io/role is written by the
// first role exchange; until then the Deployment the user annotated is the
// primary).
func isPrimary(d *appsv1.Deployment) bool {
	_, policy := d.Annotations[contract.AnnStandby]
	role := d.Annotations[contract.AnnRole]
	return role == "primary" || (role == "" && policy)
}

// fault makes st's own fault and waits for what it must bring: for the
// pairs it takes a primary from (acts), the standby the primary; for the
// others its end.
func (r *runner) fault(ctx context.Context, st Step, f *Fault, acts []bool, olds []string) error {
	exchanged := func() error {
		var errs []error
		for i, pr := range r.pairs {
			if !acts[i] {
				continue
			}
			if err := r.failedOver(ctx, pr, olds[i], r.cfg.Bounds.Back[st.Kind]); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", pr.p.Namespace, err))
			}
		}
		return errors.Join(errs...)
	}
	pr := r.pairs[st.Pair]
	pn, sn, old := pr.at[0], pr.at[1], olds[st.Pair]
	restore := func(n *kubenode.Node) error {
		f.Healed = time.Now()
		return pr.p.Restore(context.WithoutCancel(ctx), n)
	}
	switch st.Kind {
	case Crash:
		at, err := pr.p.CrashBroker(ctx, pn, old)
		f.Start = at
		if err != nil {
			return err
		}
		return exchanged()
	case OOM, Anomaly:
		f.Start = time.Now()
		stop, err := r.stress(ctx, pr, pn, old, st.Kind)
		if err != nil {
			return err
		}
		if err := exchanged(); err != nil {
			return fmt.Errorf("%w (%s)", err, stop())
		}
		stop()
		return nil
	case Hang:
		f.Start = time.Now()
		if err := r.hang(ctx, pr, old); err != nil {
			return err
		}
		return exchanged()
	case PowerCut, Partition, AsymmetricPartition:
		var err error
		switch f.Start = time.Now(); st.Kind {
		case PowerCut:
			var c kubenode.Cut
			c, err = pn.PowerCut(ctx)
			f.Start = c.At
		case Partition:
			err = pn.Partition(ctx)
		case AsymmetricPartition:
			err = pn.CutInbound(ctx)
		}
		if err == nil {
			err = exchanged()
		}
		return errors.Join(err, restore(pn))
	case StandbyCut:
		c, err := sn.PowerCut(ctx)
		f.Start = c.At
		if err == nil {
			// The primaries that ran there (another pair's) fail over;
			// the rest hold longer than the guard's Lost, so that what it
			// does then is seen.
			err = errors.Join(exchanged(), r.hold(ctx, 10*time.Second))
		}
		return errors.Join(err, restore(sn))
	}
	down, err := r.strike(ctx, st)
	f.Down = down
	return err
}

// failedOver waits (bound at most) until pr's old primary's pod is gone or
// being deleted and a primary Deployment of the pair has a Ready pod,
// whichever Deployment that is: a fault may fail a pair over twice (the
// 2-hour run's first version waited for the standby's Deployment alone, and
// a switchover then failed back ended the run).
func (r *runner) failedOver(ctx context.Context, pr *pairRun, old string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	c, ns := pr.p.Client, pr.p.Namespace
	seen := func() (bool, string) {
		pod, err := c.CoreV1().Pods(ns).Get(ctx, old, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) && (err != nil || pod.DeletionTimestamp == nil) {
			return false, fmt.Sprintf("the old primary's pod %s not deleted (%v)", old, err)
		}
		var state []string
		for _, name := range []string{testbed.PrimaryName, testbed.StandbyName} {
			d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if d.Annotations[contract.AnnRole] == "primary" && d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1 {
				return true, ""
			}
			state = append(state, fmt.Sprintf("%s role %q ready %d", name, d.Annotations[contract.AnnRole], d.Status.ReadyReplicas))
		}
		return false, strings.Join(state, "; ")
	}
	for {
		ok, state := seen()
		if ok {
			return nil
		}
		select { // polling the API until the roles say so
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("a new primary serving, the old one's pod %s gone: not within %v; last seen: %s", old, bound, state)
		}
	}
}

// hold lets a fault last d: a part of the schedule, not a synchronisation.
func (r *runner) hold(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// strike makes a fault that takes no broker away, and returns when it is
// over: the daemon, the agent or the API server back, the node fast again;
// and, for a container killed, how long it was away.
func (r *runner) strike(ctx context.Context, st Step) (time.Duration, error) {
	n := r.node(st.Pair, st.On)
	switch st.Kind {
	case KubeletRestart:
		return 0, n.RestartDaemon(ctx, kubenode.Kubelet, syscall.SIGKILL)
	case ContainerdRestart:
		return 0, n.RestartDaemon(ctx, kubenode.Containerd, syscall.SIGKILL)
	case APIServerRestart:
		return 0, r.cp.RestartAPIServer(ctx)
	case EtcdRestart:
		return 0, r.cp.RestartEtcd(ctx)
	case AgentKilled:
		return r.killContainer(ctx, n, testbed.AgentNamespace, r.agents[n.Name].Pod, "agent")
	case SidecarKilled:
		pr := r.pairs[st.Pair]
		dep := pr.roles[0]
		if st.On == StandbyNode {
			dep = pr.roles[1]
		}
		pod, err := pr.p.PodOf(ctx, dep)
		if err != nil {
			return 0, err
		}
		return r.killContainer(ctx, n, pr.p.Namespace, pod, contract.SidecarName)
	case SlowNode:
		return 0, r.slow(ctx, n, st.Hold)
	}
	return 0, fmt.Errorf("soak: %s cannot come within another fault", st.Kind)
}

// stress starts the lab's load generator (which the lab's Mosquitto image
// holds) in pod's broker container on n, its memory in a memory file:
// charged to the container but outside that process's RSS. For OOM it
// takes twice the container's memory limit at once, so the kernel's OOM
// killer ends the broker, the container's main process, as cgroup v2's
// memory.oom.group would end the whole container; for Anomaly it is the
// paper's staged fault (Anomaly). stop waits for the
// process's end (kills the exec if the pod's end has not ended it) and
// says what it wrote, for an end that did not come.
func (r *runner) stress(ctx context.Context, pr *pairRun, n *kubenode.Node, pod string, k Kind) (stop func() string, err error) {
	pd, err := pr.p.Client.CoreV1().Pods(pr.p.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var limit int64
	for _, c := range pd.Spec.Containers {
		if c.Name == testbed.BrokerContainer {
			limit = c.Resources.Limits.Memory().Value()
		}
	}
	if limit == 0 {
		return nil, fmt.Errorf("pod %s: its %s container has no memory limit to cross", pod, testbed.BrokerContainer)
	}
	profile := fmt.Sprintf("60s:mem=%dMi", 2*limit>>20)
	if k == Anomaly {
		profile = "30s:mem=60Mi,cpu=0.4;60s:mem=86Mi,ramp=2Mi/s"
	}
	var out bytes.Buffer
	cmd, err := n.Exec(ctx, pr.p.Namespace, pod, testbed.BrokerContainer, []string{images.LabBinary, "stress", "--memory-file", "--profile", profile}, &out, &out)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return func() string {
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
		return fmt.Sprintf("stress in pod %s: %v; %s", pod, err, strings.TrimSpace(out.String()))
	}, nil
}

// hang stops every process of pod's broker (SIGSTOP).
func (r *runner) hang(ctx context.Context, pr *pairRun, pod string) error {
	pd, err := pr.p.Client.CoreV1().Pods(pr.p.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pids, err := nodeloss.BrokerPIDs(pd)
	if err == nil && len(pids) == 0 {
		err = errors.New("no process")
	}
	if err != nil {
		return fmt.Errorf("hang pod %s's broker: %w", pod, err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("hang pod %s's broker (%d): %w", pod, pid, err)
		}
	}
	return nil
}

// killContainer kills the process of pod's container on n, waits until the
// kubelet has started it again and it is Ready, or the pod is gone (a
// primary whose sidecar stayed away beyond its grace is failed over), and
// returns how long that took.
func (r *runner) killContainer(ctx context.Context, n *kubenode.Node, ns, pod, container string) (time.Duration, error) {
	c := r.cp.Client().CoreV1().Pods(ns)
	gone := false
	restarts := func() (int32, bool, error) {
		pd, err := c.Get(ctx, pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && pd.DeletionTimestamp != nil) {
			gone = true
		}
		if err != nil {
			return 0, false, err
		}
		// A sidecar may be a restartable init container (a native sidecar).
		for _, cs := range slices.Concat(pd.Status.InitContainerStatuses, pd.Status.ContainerStatuses) {
			if cs.Name == container {
				return cs.RestartCount, cs.Ready, nil
			}
		}
		return 0, false, fmt.Errorf("pod %s: no %s container in its status", pod, container)
	}
	before, _, err := restarts()
	if err != nil {
		return 0, err
	}
	pid, err := n.ContainerPID(ctx, ns, pod, container)
	if err != nil {
		return 0, err
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill %s of %s/%s on %s (%d): %w", container, ns, pod, n.Name, pid, err)
	}
	for {
		now, ready, err := restarts()
		if (err == nil && now > before && ready) || gone {
			return time.Since(killed), nil
		}
		select { // polling the API until the kubelet reports the restart
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return time.Since(killed), fmt.Errorf("%s of %s/%s on %s not Ready again: %w (last: restarts %d, %v)", container, ns, pod, n.Name, ctx.Err(), now, err)
		}
	}
}

// slow holds n at cfg.SlowCPU of a CPU, saturated by a busy pod, for d.
func (r *runner) slow(ctx context.Context, n *kubenode.Node, d time.Duration) error {
	name := "busy-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	busy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nodeloss.BrokerNamespace},
		Spec: corev1.PodSpec{
			NodeName: n.Name, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "busy", Image: images.LabRef, ImagePullPolicy: corev1.PullNever,
				Args: []string{"stress", "--profile", fmt.Sprintf("%ds:cpu=2", int(d.Seconds())+60)}}},
		},
	}
	c := r.cp.Client().CoreV1().Pods(nodeloss.BrokerNamespace)
	if _, err := c.Create(ctx, busy, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() { _ = c.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) }()
	if err := n.Starve(ctx, r.cfg.SlowCPU); err != nil {
		return err
	}
	err := r.hold(ctx, d)
	return errors.Join(err, r.pairs[0].p.Restore(context.WithoutCancel(ctx), n))
}

// Cooldown is the soak's pairs' amf.io/cooldown, the flap guard's least
// time between two retirements of a pair (5 min by default, which would
// keep most of a soak's anomalies from acting).
const Cooldown = 20 * time.Second

// lastRetired is the last RetirePrimary decision of a Deployment of
// namespace ns, by any agent (zero: none).
func (r *runner) lastRetired(ns string) time.Time {
	var last time.Time
	for _, ag := range r.agents {
		for _, l := range ag.Lines() {
			if l.Msg == "decision" && l.Action == "RetirePrimary" && l.Error == "" && strings.HasPrefix(l.Deployment, ns+"/") && l.Time.After(last) {
				last = l.Time
			}
		}
	}
	return last
}

// retired is the first RetirePrimary decision of dep after since, by any
// agent (zero: none).
func (r *runner) retired(dep string, since time.Time) time.Time {
	var first time.Time
	for _, ag := range r.agents {
		for _, l := range ag.Lines() {
			if l.Msg == "decision" && l.Action == "RetirePrimary" && l.Error == "" && l.Deployment == dep && l.Time.After(since) &&
				(first.IsZero() || l.Time.Before(first)) {
				first = l.Time
			}
		}
	}
	return first
}

// decisions are the agents' decisions (with the Events that say why a
// primary was retired) and their pods' health turning anomalous, from
// every agent's log.
func (r *runner) decisions() (ds []Decision, as []Alarm) {
	for node, ag := range r.agents {
		for _, l := range ag.Lines() {
			switch {
			case l.Msg == "decision" && l.Error == "" && l.Action != "" && (l.Action != "Event" || retirement(l.Reason)):
				ds = append(ds, Decision{Time: l.Time, Node: node, Action: l.Action, Reason: l.Reason, Deployment: l.Deployment, Raw: l.Raw})
			case l.Msg == "transition" && l.To == string(podsignal.Anomalous):
				as = append(as, Alarm{Time: l.Time, Pod: l.Namespace + "/" + l.Pod, Raw: l.Raw})
			}
		}
	}
	slices.SortFunc(ds, func(a, b Decision) int { return a.Time.Compare(b.Time) })
	slices.SortFunc(as, func(a, b Alarm) int { return a.Time.Compare(b.Time) })
	return ds, as
}

// retirement says whether an Event's reason says why a primary was
// retired: a switchover completed, or a failover.
func retirement(reason string) bool { return reason == "SwitchoverConfirmed" || reason == "Failover" }

// samplePrimaries records every half second how many brokers of each
// pair serve as primaries: the pods that were Ready while their Deployment
// was the primary, as long as they exist, their broker runs and is not
// paused (the fence), their node is not cut off from power, and they are
// not being deleted on a node that is linked (serving).
func (r *runner) samplePrimaries(ctx context.Context) {
	everPrimary := map[string]bool{}
	for {
		for _, pr := range r.pairs {
			if s, ok := r.countPrimaries(ctx, pr.p.Namespace, everPrimary); ok {
				r.mu.Lock()
				r.primaries = append(r.primaries, s)
				r.mu.Unlock()
			}
		}
		select { // a sampling period
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

func (r *runner) countPrimaries(ctx context.Context, ns string, everPrimary map[string]bool) (Primaries, bool) {
	c := r.cp.Client()
	deps, err := c.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Primaries{}, false // the API server away: no sample
	}
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Primaries{}, false
	}
	s := Primaries{Namespace: ns, Time: time.Now()}
	for _, pod := range pods.Items {
		key := ns + "/" + pod.Name
		for _, d := range deps.Items {
			if isPrimary(&d) && strings.HasPrefix(pod.Name, d.Name+"-") &&
				pod.DeletionTimestamp == nil && testbed.PodReady(&pod) {
				everPrimary[key] = true
			}
		}
		if !everPrimary[key] || !r.serving(&pod) {
			continue
		}
		s.Count++
		s.Pods = append(s.Pods, pod.Name)
	}
	return s, true
}

// serving says whether pod's broker runs, unpaused, on a node with power.
//
// A pod being deleted on a node that is linked serves nobody: it is out of
// its Service's endpoints, its connections were ended (amf-connkill) and its
// kubelet is stopping it (a power-cut node thawed by the lab's restore, which
// a real reboot would not even bring back, runs its old primary for the
// seconds that takes). On a partitioned node it may still serve the clients
// on that side, and on a node cut one way (inbound cut) those still
// connected, its kubelet deaf to the deletion: only the fence stops it.
func (r *runner) serving(pod *corev1.Pod) bool {
	for _, n := range r.all {
		if n.Name != pod.Spec.NodeName {
			continue
		}
		faults := n.Faulty()
		cut := strings.Contains(faults, "link down") || strings.Contains(faults, "inbound cut")
		if strings.Contains(faults, "frozen") || (pod.DeletionTimestamp != nil && !cut) {
			return false
		}
	}
	pids, err := nodeloss.BrokerPIDs(pod)
	if err != nil {
		return false
	}
	for _, pid := range pids {
		if stopped, err := pause.Stopped("", pid); err == nil && !stopped {
			return true
		}
	}
	return false
}

// sampleAgents records every ten seconds what each agent's process holds.
func (r *runner) sampleAgents(ctx context.Context) {
	for {
		for _, n := range r.all {
			if u, err := r.readAgentUse(ctx, n); err == nil {
				r.mu.Lock()
				r.agentUse = append(r.agentUse, u)
				r.mu.Unlock()
			}
		}
		select { // a sampling period
		case <-time.After(10 * time.Second):
		case <-ctx.Done():
			return
		}
	}
}

// readAgentUse reads the RSS, threads and goroutines of the agent's
// process on n.
func (r *runner) readAgentUse(ctx context.Context, n *kubenode.Node) (AgentUse, error) {
	ag := r.agents[n.Name]
	if ag == nil || strings.Contains(n.Faulty(), "frozen") {
		return AgentUse{}, errors.New("no agent to read")
	}
	pid, err := n.ContainerPID(ctx, testbed.AgentNamespace, ag.Pod, "agent")
	if err != nil {
		return AgentUse{}, err
	}
	_, rss, err := proc.Usage(pid)
	if err != nil {
		return AgentUse{}, err
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return AgentUse{}, err
	}
	u := AgentUse{Time: time.Now(), Node: n.Name, PID: pid, RSS: rss, Threads: len(tasks)}
	// Goroutines from the agent's own /metrics (the Go collector's
	// go_goroutines), on its pod's IP: an unanswered scrape (the API
	// server away, the agent restarting) leaves the sample without them.
	if pod, err := r.cp.Client().CoreV1().Pods(testbed.AgentNamespace).Get(ctx, ag.Pod, metav1.GetOptions{}); err == nil && pod.Status.PodIP != "" {
		if g, err := goroutines(ctx, "http://"+net.JoinHostPort(pod.Status.PodIP, "9464")+"/metrics"); err == nil {
			u.Goroutines = g
		}
	}
	return u, nil
}

// goroutines reads go_goroutines from a Prometheus text endpoint.
func goroutines(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	families, err := scrape.Families(ctx, url)
	if err != nil {
		return 0, err
	}
	ms := families["go_goroutines"].GetMetric()
	if len(ms) == 0 {
		return 0, fmt.Errorf("%s: no go_goroutines", url)
	}
	return int(ms[0].GetGauge().GetValue()), nil
}

// leftovers waits (a minute at most) until the brokers' namespace holds
// what it should — each Deployment's pods, none being deleted, and the
// clients' pod — and returns what it still holds beyond that, and what
// each node holds for pods the API server no longer binds to it.
func (r *runner) leftovers(ctx context.Context) []string {
	var left []string
	deadline := time.Now().Add(time.Minute)
	for {
		left = nil
		for _, pr := range r.pairs {
			left = append(left, r.extraPods(ctx, pr.p.Namespace)...)
		}
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select { // polling the API until the deletions are done
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	for _, n := range r.all {
		l, err := n.Leftovers(ctx)
		if err != nil {
			left = append(left, fmt.Sprintf("node %s: %v", n.Name, err))
		}
		for _, x := range l {
			left = append(left, fmt.Sprintf("node %s: %s", n.Name, x))
		}
	}
	return left
}

// extraPods lists a pair's namespace's pods beyond each Deployment's
// replicas and the clients' pod, and those being deleted.
func (r *runner) extraPods(ctx context.Context, ns string) []string {
	c := r.cp.Client()
	deps, err := c.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{fmt.Sprintf("the Deployments of %s: %v", ns, err)}
	}
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{fmt.Sprintf("the pods of %s: %v", ns, err)}
	}
	var left []string
	count := map[string]int32{}
	for _, pod := range pods.Items {
		what := fmt.Sprintf("pod %s/%s (%s)", pod.Namespace, pod.Name, pod.Status.Phase)
		if pod.DeletionTimestamp != nil {
			left = append(left, what+" being deleted")
			continue
		}
		if pod.Labels["app"] == "clients" {
			continue
		}
		i := slices.IndexFunc(deps.Items, func(d appsv1.Deployment) bool { return strings.HasPrefix(pod.Name, d.Name+"-") })
		if i < 0 {
			left = append(left, what+" of no Deployment")
			continue
		}
		count[deps.Items[i].Name]++
	}
	for _, d := range deps.Items {
		if want := ptr.Deref(d.Spec.Replicas, 1); count[d.Name] != want {
			left = append(left, fmt.Sprintf("Deployment %s/%s: %d pods, %d replicas", d.Namespace, d.Name, count[d.Name], want))
		}
	}
	if len(deps.Items) != 2 {
		left = append(left, fmt.Sprintf("%d Deployments in %s, not the pair's two", len(deps.Items), ns))
	}
	return append(left, staleAnnotations(deps.Items)...)
}

// staleAnnotations lists what the agents write for the length of an action
// and remove at its end, still on a pair's Deployments once every pair is
// whole: a state handover (amf.io/state-handover) that never ended.
func staleAnnotations(deps []appsv1.Deployment) []string {
	var left []string
	for _, d := range deps {
		if v, ok := d.Annotations[contract.AnnHandover]; ok {
			left = append(left, fmt.Sprintf("Deployment %s/%s: %s %s, a handover never ended", d.Namespace, d.Name, contract.AnnHandover, v))
		}
	}
	return left
}
