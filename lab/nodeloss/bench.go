package nodeloss

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
)

// BenchConfig configures RunBench (amf-lab bench node-loss).
type BenchConfig struct {
	Cuts int    // power cuts of the primary's node (default 10)
	Repo string // the AMF repository (manifests/base, the images' module)
	// WorkDir holds the control plane's and the brokers' files.
	WorkDir string
	// K8sToleration is the not-ready/unreachable toleration of the broker
	// pod in the Kubernetes-alone run: 300 s is Kubernetes' default; 0
	// skips that run.
	K8sToleration time.Duration
	// K8sWait bounds the Kubernetes-alone run's wait for the service path.
	K8sWait time.Duration
	// Slow, when set, holds the primary's node after the cuts at SlowCPU
	// (default 0.7) of a CPU, saturated by a busy pod, for this long: a
	// slow node, which must not be failed over.
	Slow    time.Duration
	SlowCPU float64
	// Partitions is how many network partitions of the primary's node
	// follow the cuts (0: none): the node runs on, its agent fences, its
	// guard fails it over, and one primary remains after the heal.
	Partitions int
	// Crashes is how many crashes of the primary's broker (its processes
	// killed) follow the cuts: the agent of its node fails it over at once.
	Crashes int
	// ClientWait bounds the wait for the directly connected clients after a
	// cut (default 2 min; paho alone notices a dead broker ≈ 40 s after its
	// last answer at a 30 s keep-alive); negative: no clients.
	ClientWait time.Duration
	Progress   io.Writer
	Log        func(format string, args ...any)
}

// Cut is one power cut's figures, seconds after the cut.
type Cut struct {
	Node      string  `json:"node"`
	LostS     float64 `json:"lost_s"`     // the guard declared the node lost
	FailoverS float64 `json:"failover_s"` // the guard retired the primary: the standby is the primary
	// SOTS is the probe's longest interval between fresh messages from the
	// cut to the failover seen: the service path's outage.
	SOTS         float64 `json:"sot_s"`
	LostMessages int     `json:"lost_messages"`
	// Clients are the directly connected clients' figures.
	Clients []ClientCut `json:"clients,omitempty"`
}

// ClientCut is what one client of the primary saw of a cut, seconds after
// it: its connection lost (LostS, -1: never noticed within the wait) and its
// own messages served again by the new primary (ServedS, -1: not within the
// wait).
type ClientCut struct {
	Client    string     `json:"client"`
	Kind      ClientKind `json:"kind"`
	KeepAlive float64    `json:"keepalive_s"`
	LostS     float64    `json:"lost_s"`
	ServedS   float64    `json:"served_s"`
}

// Figure is the client's figure in the bench's sums: ServedS, or wait if
// it was not served within it.
func (c ClientCut) Figure(wait time.Duration) float64 {
	if c.ServedS < 0 {
		return wait.Seconds()
	}
	return c.ServedS
}

// Partition is one partition's figures, seconds after the cut (HealS: after
// the heal).
type Partition struct {
	Node string `json:"node"`
	// FenceS: its own agent fenced; PausedS: its broker was seen paused
	// (polled every 100 ms); FencedFirst: the fence came before the guard
	// declared the node lost.
	FenceS      float64 `json:"fence_s"`
	PausedS     float64 `json:"paused_s"`
	FencedFirst bool    `json:"fenced_first"`
	// StayedPaused: still paused after the guard's failover.
	StayedPaused bool    `json:"stayed_paused"`
	LostS        float64 `json:"lost_s"`
	FailoverS    float64 `json:"failover_s"`
	SOTS         float64 `json:"sot_s"`
	LostMessages int     `json:"lost_messages"`
	// HealS: from the heal until the old pod was gone and one primary left.
	HealS float64 `json:"heal_s"`
	// Clients are the directly connected clients' figures (on the near
	// side: the node no fault touches).
	Clients []ClientCut `json:"clients,omitempty"`
	// FarClients are those of a pod on the partitioned node itself,
	// connected to the primary there: seconds after the heal (LostS
	// negative: lost during the partition).
	FarClients []ClientCut `json:"far_clients,omitempty"`
}

// Crash is one crash's figures, seconds after the broker was killed.
type Crash struct {
	Node string `json:"node"`
	// FailoverS: the agent of the node retired the primary.
	FailoverS    float64     `json:"failover_s"`
	SOTS         float64     `json:"sot_s"`
	LostMessages int         `json:"lost_messages"`
	Clients      []ClientCut `json:"clients,omitempty"`
}

// BenchReport is the result; its JSON is the bench's last line.
type BenchReport struct {
	Cuts   int     `json:"cuts"`
	SOTP50 float64 `json:"sot_p50_s"`
	SOTP99 float64 `json:"sot_p99_s"`
	SOTMax float64 `json:"sot_max_s"`
	// The directly connected clients (BenchConfig.ClientWait): from the
	// cut to each client's first own message served by the new primary,
	// over every client of every cut, and by kind; a client not served
	// within the wait counts as the wait (ClientsNotBack says how many).
	ClientSOTP50         float64 `json:"client_sot_p50_s,omitempty"`
	ClientSOTP99         float64 `json:"client_sot_p99_s,omitempty"`
	ClientSOTMax         float64 `json:"client_sot_max_s,omitempty"`
	ClientPodSOTP50      float64 `json:"client_sot_pod_p50_s,omitempty"`
	ClientPodSOTP99      float64 `json:"client_sot_pod_p99_s,omitempty"`
	ClientPodSOTMax      float64 `json:"client_sot_pod_max_s,omitempty"`
	ClientNodePortSOTP50 float64 `json:"client_sot_nodeport_p50_s,omitempty"`
	ClientNodePortSOTP99 float64 `json:"client_sot_nodeport_p99_s,omitempty"`
	ClientNodePortSOTMax float64 `json:"client_sot_nodeport_max_s,omitempty"`
	ClientsNotBack       int     `json:"clients_not_back,omitempty"`
	Failover             float64 `json:"failover_p50_s"`
	FailMax              float64 `json:"failover_max_s"`
	LostP50              float64 `json:"lost_p50_s"`
	K8sSOT               float64 `json:"k8s_sot_s"` // -1: not run; the wait bound if the path never came back
	K8sTolS              float64 `json:"k8s_toleration_s"`
	K8sBack              bool    `json:"k8s_back"` // the path came back within K8sWait
	// The same four clients of the plain broker, through its Service, from
	// the cut (-1: not run; a client not served within K8sWait counts as
	// the wait).
	K8sClientSOTP50 float64     `json:"k8s_client_sot_p50_s,omitempty"`
	K8sClientSOTMax float64     `json:"k8s_client_sot_max_s,omitempty"`
	K8sClients      []ClientCut `json:"k8s_clients,omitempty"`
	FalseFail       int         `json:"false_failovers"`
	// RetireRepeats are retirements beyond the first within one fault.
	RetireRepeats int   `json:"retire_repeats"`
	PerCut        []Cut `json:"per_cut"`
	// The slow node (BenchConfig.Slow): how long, at what CPU, the share of
	// CFS periods in which the node was held at its quota, and what the
	// agents declared meanwhile (each a false alarm: the node was alive).
	SlowS         float64 `json:"slow_s,omitempty"`
	SlowCPU       float64 `json:"slow_cpu,omitempty"`
	SlowThrottled float64 `json:"slow_throttled,omitempty"`
	SlowLost      int     `json:"slow_lost"`
	SlowFenced    int     `json:"slow_fenced"`
	SlowRetired   int     `json:"slow_retired"`
	// The partitions (--partitions), when run.
	Partitions       int     `json:"partitions,omitempty"`
	PartFenceP50     float64 `json:"partition_fence_p50_s,omitempty"`
	PartFailoverP50  float64 `json:"partition_failover_p50_s,omitempty"`
	PartFencedFirst  int     `json:"partition_fenced_first,omitempty"`
	PartStayedPaused int     `json:"partition_stayed_paused,omitempty"`
	PartHealMax      float64 `json:"partition_heal_max_s,omitempty"`
	// PartClientSOTMax is the slowest client's figure over the partitions
	// (a client not served within the wait counts as the wait).
	PartClientSOTMax float64 `json:"partition_client_sot_max_s,omitempty"`
	// PartFarClientMax is the slowest far-side client's figure, from the
	// heal (a client not served within the wait counts as the wait).
	PartFarClientMax float64     `json:"partition_far_client_heal_max_s,omitempty"`
	PerPartition     []Partition `json:"per_partition,omitempty"`
	// The crashes (--crashes), when run: the failover and the clients, from
	// the kill.
	Crashes           int     `json:"crashes,omitempty"`
	CrashFailoverP50  float64 `json:"crash_failover_p50_s,omitempty"`
	CrashFailoverMax  float64 `json:"crash_failover_max_s,omitempty"`
	CrashClientSOTP50 float64 `json:"crash_client_sot_p50_s,omitempty"`
	CrashClientSOTMax float64 `json:"crash_client_sot_max_s,omitempty"`
	PerCrash          []Crash `json:"per_crash,omitempty"`
}

// LaunchCluster builds the lab's images, starts a control plane (its files
// in dir) and three lab nodes on one LAN with the images in them; stop
// stops the nodes, then the control plane.
func LaunchCluster(ctx context.Context, repo, dir string, say, log func(string, ...any)) (_ *controlplane.ControlPlane, _ *kubenode.Cluster, stop func(), err error) {
	if err := kubenode.Check(); err != nil {
		return nil, nil, nil, err
	}
	say("building the images (cached)")
	imgs, err := images.Build(ctx, images.Options{ModuleDir: repo})
	if err != nil {
		return nil, nil, nil, err
	}
	say("starting the control plane and three nodes on one LAN")
	cp, err := controlplane.Launch(ctx, dir, controlplane.Options{ServingIPs: kubenode.ServingIPs(), NoFakeNodes: true}, log)
	if err != nil {
		return nil, nil, nil, err
	}
	var archives []string
	for _, im := range imgs {
		archives = append(archives, im.Archive)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cl, err := kubenode.LaunchCluster(cctx, kubenode.ClusterConfig{ControlPlane: cp, Nodes: 3, Node: kubenode.Config{Images: archives, Log: log}})
	if err != nil {
		cp.Stop()
		return nil, nil, nil, err
	}
	return cp, cl, func() { cl.Stop(); cp.Stop() }, nil
}

// RunBench starts a control plane, three lab nodes and a Pair, cuts the
// power of the primary's node cfg.Cuts times (the roles alternate between
// nodes 0 and 1; each cut is restored and one primary awaited before the
// next), then, with the pair removed, runs one plain broker as Kubernetes
// alone would and cuts its node.
func RunBench(ctx context.Context, cfg BenchConfig) (_ *BenchReport, err error) {
	if cfg.Cuts <= 0 {
		cfg.Cuts = 10
	}
	if cfg.K8sWait <= 0 {
		cfg.K8sWait = 10 * time.Minute
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) }
	cp, cl, stop, err := LaunchCluster(ctx, cfg.Repo, filepath.Join(cfg.WorkDir, "cp"), say, cfg.Log)
	if err != nil {
		return nil, err
	}
	defer stop()
	dir := filepath.Join(cfg.WorkDir, "brokers")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	say("the agents and the hot pair")
	p, err := StartPair(ctx, PairConfig{ControlPlane: cp, Cluster: cl, Repo: cfg.Repo, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	defer func() {
		if err != nil {
			SaveAgentLogs(cfg.WorkDir, p, say)
		}
	}()
	var clients *Clients
	if cfg.ClientWait >= 0 {
		if cfg.ClientWait == 0 {
			cfg.ClientWait = 2 * time.Minute
		}
		say("the clients: a pod on %s and the LAN, through the Service's ClusterIP and NodePort, keep-alive 30 s and 60 s", cl.Nodes[2].Name)
		if clients, err = p.StartClients(ctx, cl.Nodes[2], cl.LAN, []time.Duration{30 * time.Second, 60 * time.Second}); err != nil {
			return nil, err
		}
		defer clients.Stop()
	}
	rep := &BenchReport{Cuts: cfg.Cuts, K8sSOT: -1}
	start := time.Now()
	var faults []window // each fault, from before it until one primary again
	roles := [2]string{testbed.PrimaryName, testbed.StandbyName}
	at := [2]*kubenode.Node{cl.Nodes[0], cl.Nodes[1]}
	for i := 1; i <= cfg.Cuts; i++ {
		primary, standby := roles[0], roles[1]
		pn, sn := at[0], at[1]
		w0 := time.Now()
		if err := p.WaitPair(ctx, primary, standby, pn.Name, sn.Name); err != nil {
			return nil, fmt.Errorf("cut %d: %w", i, err)
		}
		old, err := p.PodOf(ctx, primary)
		if err != nil {
			return nil, fmt.Errorf("cut %d: %w", i, err)
		}
		var marks []int
		if clients != nil {
			if err := clients.OntoPrimary(ctx, old); err != nil {
				return nil, fmt.Errorf("cut %d: %w", i, err)
			}
			marks = clients.Marks()
		}
		cut, err := pn.PowerCut(ctx)
		if err != nil {
			return nil, fmt.Errorf("cut %d: %w", i, err)
		}
		f, err := p.WaitFailover(ctx, primary, standby, old, cut.At, pn.Name, sn.Name, time.Minute)
		if err != nil {
			_ = p.Restore(ctx, pn)
			return nil, fmt.Errorf("cut %d: %w", i, err)
		}
		c := Cut{Node: pn.Name, LostS: f.Lost.Sub(cut.At).Seconds(), FailoverS: f.Retired.Sub(cut.At).Seconds(),
			SOTS: f.MaxGap.Seconds(), LostMessages: f.LostMessages}
		if clients != nil {
			newPod, err := p.PodOf(ctx, standby)
			if err != nil {
				return nil, fmt.Errorf("cut %d: %w", i, err)
			}
			c.Clients = clients.Served(ctx, marks, cut.At, cfg.ClientWait, newPod)
			for _, cc := range c.Clients {
				say("cut %d: client %s lost its connection after %.2f s, served again after %.2f s", i, cc.Client, cc.LostS, cc.ServedS)
			}
		}
		rep.PerCut = append(rep.PerCut, c)
		say("cut %d of %s: lost after %.2f s, failed over after %.2f s, longest interval between fresh messages %.3f s, %d lost",
			i, pn.Name, c.LostS, c.FailoverS, c.SOTS, c.LostMessages)
		if err := p.Restore(ctx, pn); err != nil {
			return nil, fmt.Errorf("cut %d: restore: %w", i, err)
		}
		if err := p.WaitOnePrimary(ctx, standby, primary, old); err != nil {
			return nil, fmt.Errorf("cut %d: %w", i, err)
		}
		faults = append(faults, window{what: fmt.Sprintf("cut %d", i), from: w0, to: time.Now()})
		roles[0], roles[1] = roles[1], roles[0]
		at[0], at[1] = at[1], at[0]
	}
	// timed runs one fault and keeps its window.
	timed := func(what string, f func() error) error {
		w0 := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		faults = append(faults, window{what: what, from: w0, to: time.Now()})
		return nil
	}
	for i := 1; i <= cfg.Crashes; i++ {
		var cr Crash
		if err := timed(fmt.Sprintf("crash %d", i), func() (err error) {
			cr, err = crash(ctx, p, at[0], at[1], roles, clients, cfg.ClientWait)
			return err
		}); err != nil {
			return nil, err
		}
		rep.PerCrash = append(rep.PerCrash, cr)
		for _, cc := range cr.Clients {
			say("crash %d: client %s lost its connection after %.2f s, served again after %.2f s", i, cc.Client, cc.LostS, cc.ServedS)
		}
		say("crash %d on %s: failed over after %.2f s, longest interval between fresh messages %.3f s, %d lost", i, cr.Node, cr.FailoverS, cr.SOTS, cr.LostMessages)
		roles[0], roles[1] = roles[1], roles[0]
		at[0], at[1] = at[1], at[0]
	}
	rep.crashFigures(cfg.ClientWait)
	// The far side of a partition: a client in a pod on each node of the
	// pair, connected to the primary on its own node when that node is cut
	// off.
	far := map[string]*Clients{}
	if clients != nil && cfg.Partitions > 0 {
		for _, n := range at {
			say("far-side clients: a pod on %s, through the Service's ClusterIP, keep-alive 30 s", n.Name)
			fc, err := p.StartClients(ctx, n, nil, []time.Duration{30 * time.Second})
			if err != nil {
				return nil, err
			}
			defer fc.Stop()
			far[n.Name] = fc
		}
	}
	for i := 1; i <= cfg.Partitions; i++ {
		var pt Partition
		if err := timed(fmt.Sprintf("partition %d", i), func() (err error) {
			pt, err = partition(ctx, p, at[0], at[1], roles, clients, far[at[0].Name], cfg.ClientWait)
			return err
		}); err != nil {
			return nil, err
		}
		rep.PerPartition = append(rep.PerPartition, pt)
		for _, cc := range pt.Clients {
			say("partition %d: client %s lost its connection after %.2f s, served again after %.2f s", i, cc.Client, cc.LostS, cc.ServedS)
		}
		for _, cc := range pt.FarClients {
			say("partition %d: far-side client %s lost its connection %.2f s after the heal, served again by the new primary %.2f s after it", i, cc.Client, cc.LostS, cc.ServedS)
		}
		say("partition %d of %s: fenced after %.2f s, broker seen paused after %.2f s, lost after %.2f s, failed over after %.2f s, still paused %v; longest interval between fresh messages %.3f s, %d lost; one primary %.2f s after the heal",
			i, pt.Node, pt.FenceS, pt.PausedS, pt.LostS, pt.FailoverS, pt.StayedPaused, pt.SOTS, pt.LostMessages, pt.HealS)
		roles[0], roles[1] = roles[1], roles[0]
		at[0], at[1] = at[1], at[0]
	}
	if n := len(rep.PerPartition); n > 0 {
		rep.Partitions = n
		var fence, fo []float64
		for _, pt := range rep.PerPartition {
			fence, fo = append(fence, pt.FenceS), append(fo, pt.FailoverS)
			rep.PartHealMax = max(rep.PartHealMax, pt.HealS)
			for _, cc := range pt.Clients {
				rep.PartClientSOTMax = max(rep.PartClientSOTMax, cc.Figure(cfg.ClientWait))
			}
			for _, cc := range pt.FarClients {
				rep.PartFarClientMax = max(rep.PartFarClientMax, cc.Figure(cfg.ClientWait))
			}
			if pt.FencedFirst {
				rep.PartFencedFirst++
			}
			if pt.StayedPaused {
				rep.PartStayedPaused++
			}
		}
		rep.PartFenceP50, rep.PartFailoverP50 = Quantile(fence, 0.5), Quantile(fo, 0.5)
	}
	if cfg.Slow > 0 {
		if err := slowNode(ctx, p, cp, at[0], at[1], roles, cfg, rep, say); err != nil {
			return nil, fmt.Errorf("slow node: %w", err)
		}
	}
	// A retirement outside every fault's window is a false failover; one
	// more within a window is a repeat (of the same retirement, by another
	// agent or after a restart: idempotent, but said).
	n := map[int]int{}
	for node, ag := range p.Agents {
		for _, l := range ag.Lines() {
			if l.Msg != "decision" || l.Action != "RetirePrimary" || l.Error != "" || !l.Time.After(start) {
				continue
			}
			i := slices.IndexFunc(faults, func(w window) bool { return !l.Time.Before(w.from) && !l.Time.After(w.to) })
			switch {
			case i < 0:
				rep.FalseFail++
				say("a retirement outside every fault, by the agent on %s: %s", node, l.Raw)
			case n[i] > 0:
				rep.RetireRepeats++
				say("a retirement repeated in %s, by the agent on %s: %s", faults[i].what, node, l.Raw)
				n[i]++
			default:
				n[i]++
			}
		}
	}
	var sot, fo, lost []float64
	for _, c := range rep.PerCut {
		sot, fo, lost = append(sot, c.SOTS), append(fo, c.FailoverS), append(lost, c.LostS)
	}
	rep.SOTP50, rep.SOTP99, rep.SOTMax = Quantile(sot, 0.5), Quantile(sot, 0.99), Quantile(sot, 1)
	rep.Failover, rep.FailMax, rep.LostP50 = Quantile(fo, 0.5), Quantile(fo, 1), Quantile(lost, 0.5)
	rep.clientFigures(cfg.ClientWait)

	if cfg.K8sToleration > 0 {
		// The pair's clients go with the pair: their Service's NodePort may
		// be the plain broker's next, and their client IDs are the same.
		if clients != nil {
			clients.Stop()
		}
		for _, fc := range far {
			fc.Stop()
		}
		rep.K8sTolS = cfg.K8sToleration.Seconds()
		say("Kubernetes alone: one plain broker, toleration %v; the pair removed", cfg.K8sToleration)
		sot, back, k8sClients, err := k8sAlone(ctx, p, cl, cfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes alone: %w", err)
		}
		rep.K8sSOT, rep.K8sBack, rep.K8sClients = sot.Seconds(), back, k8sClients
		say("Kubernetes alone: service path back after %.1f s (back: %v)", rep.K8sSOT, back)
		var xs []float64
		for _, cc := range k8sClients {
			say("Kubernetes alone: client %s lost its connection after %.2f s, served again after %.2f s", cc.Client, cc.LostS, cc.ServedS)
			xs = append(xs, cc.Figure(cfg.K8sWait))
		}
		rep.K8sClientSOTP50, rep.K8sClientSOTMax = Quantile(xs, 0.5), Quantile(xs, 1)
	}
	return rep, nil
}

// window is a fault's time, from before it until one primary again.
type window struct {
	what     string
	from, to time.Time
}

// partition partitions the primary's node pn (its standby's on sn) and
// measures the fence, the failover and the heal; the clients on the near
// side from the partition, those on pn (far) from the heal.
func partition(ctx context.Context, p *Pair, pn, sn *kubenode.Node, roles [2]string, clients, far *Clients, clientWait time.Duration) (Partition, error) {
	primary, standby := roles[0], roles[1]
	old, err := p.settled(ctx, roles, pn, sn)
	if err != nil {
		return Partition{}, err
	}
	var marks, farMarks []int
	for _, c := range []*Clients{clients, far} {
		if c != nil {
			if err := c.OntoPrimary(ctx, old); err != nil {
				return Partition{}, err
			}
		}
	}
	if clients != nil {
		marks = clients.Marks()
	}
	if far != nil {
		farMarks = far.Marks()
	}
	at := time.Now()
	if err := pn.Partition(ctx); err != nil {
		return Partition{}, err
	}
	pt := Partition{Node: pn.Name, PausedS: -1}
	if err := p.WaitBrokerPaused(ctx, old, time.Minute); err == nil {
		pt.PausedS = time.Since(at).Seconds()
	}
	f, err := p.WaitFailover(ctx, primary, standby, old, at, pn.Name, sn.Name, time.Minute)
	if err != nil {
		_ = p.Restore(ctx, pn)
		return pt, err
	}
	pt.LostS, pt.FailoverS, pt.SOTS, pt.LostMessages = f.Lost.Sub(at).Seconds(), f.Retired.Sub(at).Seconds(), f.MaxGap.Seconds(), f.LostMessages
	pt.StayedPaused, _, _ = p.BrokerPaused(ctx, old)
	newPod, err := p.PodOf(ctx, standby)
	if err != nil {
		return pt, err
	}
	if clients != nil {
		pt.Clients = clients.Served(ctx, marks, at, clientWait, newPod)
	}
	// The heal is the link back; Restore then waits for the node's
	// readiness, which the far side's clients do not.
	healed := time.Now()
	if err := p.Restore(ctx, pn); err != nil {
		return pt, fmt.Errorf("restore: %w", err)
	}
	if far != nil {
		pt.FarClients = far.Served(ctx, farMarks, healed, clientWait, newPod)
	}
	fence, err := p.WaitLine(ctx, pn.Name, "fence", at, pn.Name)
	if err != nil {
		return pt, err
	}
	pt.FenceS, pt.FencedFirst = fence.Sub(at).Seconds(), fence.Before(f.Lost)
	if err := p.WaitOnePrimary(ctx, standby, primary, old); err != nil {
		return pt, err
	}
	pt.HealS = time.Since(healed).Seconds()
	return pt, nil
}

// settled waits until the pair is as roles (primary, standby) and its nodes
// (pn, sn) say, and returns the primary's pod.
func (p *Pair) settled(ctx context.Context, roles [2]string, pn, sn *kubenode.Node) (string, error) {
	if err := p.WaitPair(ctx, roles[0], roles[1], pn.Name, sn.Name); err != nil {
		return "", err
	}
	return p.PodOf(ctx, roles[0])
}

// crash kills the broker of the primary (on pn, its standby on sn) and
// measures the failover its node's agent makes at once, and the clients.
func crash(ctx context.Context, p *Pair, pn, sn *kubenode.Node, roles [2]string, clients *Clients, clientWait time.Duration) (Crash, error) {
	primary, standby := roles[0], roles[1]
	old, err := p.settled(ctx, roles, pn, sn)
	if err != nil {
		return Crash{}, err
	}
	newPod, err := p.PodOf(ctx, standby)
	if err != nil {
		return Crash{}, err
	}
	var marks []int
	if clients != nil {
		if err := clients.OntoPrimary(ctx, old); err != nil {
			return Crash{}, err
		}
		marks = clients.Marks()
	}
	at, err := p.CrashBroker(ctx, pn, old)
	if err != nil {
		return Crash{}, err
	}
	f, err := p.WaitExchanged(ctx, primary, standby, old, at, time.Minute)
	if err != nil {
		return Crash{}, err
	}
	retired, err := p.waitLine(ctx, pn.Name, "the RetirePrimary decision", func(l testbed.AgentLine) bool {
		return l.Msg == "decision" && l.Action == "RetirePrimary" && l.Deployment == BrokerNamespace+"/"+primary && l.Time.After(at) && l.Error == ""
	})
	if err != nil {
		return Crash{}, err
	}
	cr := Crash{Node: pn.Name, FailoverS: retired.Sub(at).Seconds(), SOTS: f.MaxGap.Seconds(), LostMessages: f.LostMessages}
	if clients != nil {
		cr.Clients = clients.Served(ctx, marks, at, clientWait, newPod)
	}
	return cr, p.WaitOnePrimary(ctx, standby, primary, old)
}

// crashFigures sums the crashes up.
func (r *BenchReport) crashFigures(wait time.Duration) {
	if len(r.PerCrash) == 0 {
		return
	}
	var fo, cls []float64
	for _, c := range r.PerCrash {
		fo = append(fo, c.FailoverS)
		for _, cc := range c.Clients {
			cls = append(cls, cc.Figure(wait))
		}
	}
	r.Crashes = len(r.PerCrash)
	r.CrashFailoverP50, r.CrashFailoverMax = Quantile(fo, 0.5), Quantile(fo, 1)
	r.CrashClientSOTP50, r.CrashClientSOTMax = Quantile(cls, 0.5), Quantile(cls, 1)
}

// SaveAgentLogs writes what each agent logged into dir (agent-NODE.log):
// a failed bench's, a soak's.
func SaveAgentLogs(dir string, p *Pair, say func(string, ...any)) {
	for node, ag := range p.Agents {
		var b strings.Builder
		for _, l := range ag.Lines() {
			b.WriteString(l.Raw)
			b.WriteByte('\n')
		}
		path := filepath.Join(dir, "agent-"+node+".log")
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			say("the agents' logs: %v", err)
			return
		}
		say("the agent on %s logged into %s", node, path)
	}
}

// Quantile is the nearest-rank quantile q of xs (0 if empty), as the lab's
// node-loss bench and soak report their figures.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// k8sAlone removes the pair, runs the edge broker as Kubernetes alone would
// (one Deployment, no sidecar, no standby, tolerating not-ready and
// unreachable for cfg.K8sToleration, kept off node 2, where RDS and OBU
// run), with the same clients as the pair's (cfg.ClientWait not negative)
// through a Service of its own, cuts the power of its node and waits for
// the service path and the clients.
func k8sAlone(ctx context.Context, p *Pair, cl *kubenode.Cluster, cfg BenchConfig) (_ time.Duration, _ bool, _ []ClientCut, err error) {
	c := p.Client
	if err := c.CoreV1().Namespaces().Delete(ctx, BrokerNamespace, metav1.DeleteOptions{}); err != nil {
		return 0, false, nil, err
	}
	if err := eventually(ctx, "the pair's namespace gone", 3*time.Minute, func() (bool, string) {
		_, err := c.CoreV1().Namespaces().Get(ctx, BrokerNamespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	}); err != nil {
		return 0, false, nil, err
	}
	cordon, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": true}})
	if _, err := c.CoreV1().Nodes().Patch(ctx, cl.Nodes[2].Name, types.MergePatchType, cordon, metav1.PatchOptions{}); err != nil {
		return 0, false, nil, err
	}
	const ns = "k8s-alone"
	ed := testbed.Edge{Namespace: ns, RDS: p.RDS, OBU: p.OBU, Bridge: testbed.DefaultBridge, BrokerPortA: 1883, BrokerImage: images.MosquittoRef, ClientPrefix: "k8s"}
	objs, err := ed.Reactive()
	if err != nil {
		return 0, false, nil, err
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return 0, false, nil, err
	}
	for _, cm := range objs.ConfigMaps {
		if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return 0, false, nil, err
		}
	}
	d := objs.Deployments[0]
	tol := ptr.To(int64(cfg.K8sToleration.Seconds()))
	d.Spec.Template.Spec.Tolerations = []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: tol},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: tol},
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return 0, false, nil, err
	}
	var node string
	if err := eventually(ctx, "the plain broker Ready", 3*time.Minute, func() (bool, string) {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Sprint(err)
		}
		pod := pods.Items[0]
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				node = pod.Spec.NodeName
				return true, ""
			}
		}
		return false, pod.Name + " not Ready"
	}); err != nil {
		return 0, false, nil, err
	}
	if err := p.Probe.WaitReceived(ctx, p.Probe.Received()+10); err != nil {
		return 0, false, nil, fmt.Errorf("no messages through the plain broker: %w", err)
	}
	n := p.Node(node)
	if n == nil {
		return 0, false, nil, fmt.Errorf("the plain broker runs on %q, not a lab node", node)
	}
	var clients *Clients
	var marks []int
	if cfg.ClientWait >= 0 {
		clients, err = startClients(ctx, c, ns, cl.Nodes[2], cl.LAN, []time.Duration{30 * time.Second, 60 * time.Second})
		if err != nil {
			return 0, false, nil, err
		}
		defer clients.Stop()
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=edge-broker"})
		if err != nil || len(pods.Items) != 1 {
			return 0, false, nil, fmt.Errorf("the plain broker's pod: %d found (%v)", len(pods.Items), err)
		}
		if err := clients.OntoPrimary(ctx, pods.Items[0].Name); err != nil {
			return 0, false, nil, err
		}
		marks = clients.Marks()
	}
	before := p.Probe.Received()
	cut, err := n.PowerCut(ctx)
	if err != nil {
		return 0, false, nil, err
	}
	defer func() { _ = p.Restore(context.WithoutCancel(ctx), n) }()
	wctx, cancel := context.WithTimeout(ctx, cfg.K8sWait)
	defer cancel()
	// Messages still on their way at the cut are not the path's return:
	// wait for ten more than had arrived by then.
	back := p.Probe.WaitReceived(wctx, before+10) == nil
	if ctx.Err() != nil {
		return 0, false, nil, ctx.Err()
	}
	var served []ClientCut
	if clients != nil {
		// Served by the broker that replaced it: a new pod, never told
		// its name (so any broker).
		served = clients.Served(ctx, marks, cut.At, cfg.K8sWait, "")
	}
	rec := p.Probe.Snapshot()
	g, ok := rec.MaxGap(cut.At, time.Now())
	if !ok {
		return 0, back, nil, errors.New("no probe receipts around the cut")
	}
	return g.Duration(), back, served, nil
}

// clientFigures sums the clients up: a client not served again within the
// wait counts as the wait.
func (r *BenchReport) clientFigures(wait time.Duration) {
	var all []float64
	by := map[ClientKind][]float64{}
	for _, c := range r.PerCut {
		for _, cc := range c.Clients {
			s := cc.Figure(wait)
			if cc.ServedS < 0 {
				r.ClientsNotBack++
			}
			all = append(all, s)
			by[cc.Kind] = append(by[cc.Kind], s)
		}
	}
	if len(all) == 0 {
		return
	}
	q := func(xs []float64) (p50, p99, top float64) {
		return Quantile(xs, 0.5), Quantile(xs, 0.99), Quantile(xs, 1)
	}
	r.ClientSOTP50, r.ClientSOTP99, r.ClientSOTMax = q(all)
	if xs := by[InPod]; len(xs) > 0 {
		r.ClientPodSOTP50, r.ClientPodSOTP99, r.ClientPodSOTMax = q(xs)
	}
	if xs := by[NodePort]; len(xs) > 0 {
		r.ClientNodePortSOTP50, r.ClientNodePortSOTP99, r.ClientNodePortSOTMax = q(xs)
	}
}

// PrintBench writes the per-cut lines and the JSON line (last).
func PrintBench(w io.Writer, r *BenchReport) {
	for i, c := range r.PerCut {
		fmt.Fprintf(w, "cut %d %s: lost %.2f s, failover %.2f s, SOT %.3f s, %d messages lost\n", i+1, c.Node, c.LostS, c.FailoverS, c.SOTS, c.LostMessages)
		for _, cc := range c.Clients {
			fmt.Fprintf(w, "  client %s: its connection lost after %.2f s, served again after %.2f s\n", cc.Client, cc.LostS, cc.ServedS)
		}
	}
	for i, pt := range r.PerPartition {
		fmt.Fprintf(w, "partition %d %s: fenced %.2f s (before lost: %v), paused %.2f s, lost %.2f s, failover %.2f s, still paused %v, SOT %.3f s, %d messages lost, one primary %.2f s after the heal\n",
			i+1, pt.Node, pt.FenceS, pt.FencedFirst, pt.PausedS, pt.LostS, pt.FailoverS, pt.StayedPaused, pt.SOTS, pt.LostMessages, pt.HealS)
		for _, cc := range pt.Clients {
			fmt.Fprintf(w, "  client %s: its connection lost after %.2f s, served again after %.2f s\n", cc.Client, cc.LostS, cc.ServedS)
		}
		for _, cc := range pt.FarClients {
			fmt.Fprintf(w, "  far-side client %s: its connection lost %.2f s after the heal, served again %.2f s after it\n", cc.Client, cc.LostS, cc.ServedS)
		}
	}
	for i, c := range r.PerCrash {
		fmt.Fprintf(w, "crash %d %s: failover %.2f s, SOT %.3f s, %d messages lost\n", i+1, c.Node, c.FailoverS, c.SOTS, c.LostMessages)
		for _, cc := range c.Clients {
			fmt.Fprintf(w, "  client %s: its connection lost after %.2f s, served again after %.2f s\n", cc.Client, cc.LostS, cc.ServedS)
		}
	}
	for _, cc := range r.K8sClients {
		fmt.Fprintf(w, "Kubernetes alone: client %s: its connection lost after %.2f s, served again after %.2f s\n", cc.Client, cc.LostS, cc.ServedS)
	}
	b, _ := json.Marshal(r)
	fmt.Fprintln(w, string(b))
}

// slowNode holds the primary's node n (its standby's on sn) at cfg.SlowCPU with a busy pod on it
// for cfg.Slow and records what the agents declared meanwhile; then the
// node is restored and the pair awaited as it was.
func slowNode(ctx context.Context, p *Pair, cp *controlplane.ControlPlane, n, sn *kubenode.Node, roles [2]string, cfg BenchConfig, rep *BenchReport, say func(string, ...any)) error {
	if cfg.SlowCPU <= 0 {
		// Not less: on cgroup v1 a node's quota may not be below a pod's,
		// and the broker's pod may use 0.6.
		cfg.SlowCPU = 0.7
	}
	busy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "busy", Namespace: BrokerNamespace},
		Spec: corev1.PodSpec{
			NodeName: n.Name, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "busy", Image: images.LabRef, ImagePullPolicy: corev1.PullNever,
				Args: []string{"stress", "--profile", fmt.Sprintf("%ds:cpu=2", int(cfg.Slow.Seconds())+60)}}},
		},
	}
	c := cp.Client()
	if _, err := c.CoreV1().Pods(BrokerNamespace).Create(ctx, busy, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() {
		_ = c.CoreV1().Pods(BrokerNamespace).Delete(context.WithoutCancel(ctx), busy.Name, metav1.DeleteOptions{})
	}()
	if err := n.Starve(ctx, cfg.SlowCPU); err != nil {
		return err
	}
	say("slow node: %s held at %.1f CPU and saturated for %v", n.Name, cfg.SlowCPU, cfg.Slow)
	p0, t0, err := CPUThrottling(n)
	if err != nil {
		return err
	}
	start := time.Now()
	select { // the window in which nothing may happen: a measurement, not a synchronisation
	case <-time.After(cfg.Slow):
	case <-ctx.Done():
		return ctx.Err()
	}
	p1, t1, err := CPUThrottling(n)
	if err != nil {
		return err
	}
	rep.SlowS, rep.SlowCPU = time.Since(start).Seconds(), cfg.SlowCPU
	if p1 > p0 {
		rep.SlowThrottled = float64(t1-t0) / float64(p1-p0)
	}
	for _, ag := range p.Agents {
		for _, l := range ag.Lines() {
			if !l.Time.After(start) {
				continue
			}
			switch {
			case l.Msg == "guarded node lost":
				rep.SlowLost++
			case l.Msg == "fence":
				rep.SlowFenced++
			case l.Msg == "decision" && l.Action == "RetirePrimary" && l.Error == "":
				rep.SlowRetired++
			}
		}
	}
	say("slow node: %.0f s, held at its quota in %.0f %% of the periods; %d lost, %d fenced, %d retired",
		rep.SlowS, 100*rep.SlowThrottled, rep.SlowLost, rep.SlowFenced, rep.SlowRetired)
	if err := p.Restore(ctx, n); err != nil {
		return err
	}
	return p.WaitPair(ctx, roles[0], roles[1], n.Name, sn.Name)
}

// CPUThrottling reads the CFS periods of node n's cgroup root and those in
// which it was held at its quota (cgroup v1 cpu.stat).
func CPUThrottling(n *kubenode.Node) (periods, throttled int64, err error) {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", n.Cgroup, "cpu.stat"))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		x, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "nr_periods":
			periods = x
		case "nr_throttled":
			throttled = x
		}
	}
	return periods, throttled, nil
}
