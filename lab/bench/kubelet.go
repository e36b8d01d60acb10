package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/probe"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/podsignal"
)

// NodeName is the real node the benchmark runs its pods on.
const NodeName = "amf-bench-node"

// NodeRestartBackoff caps the node's crash-loop back-off, so that a round's
// faults follow each other within seconds: it changes when the kubelet
// restarts a container, never when it notices or decides.
const NodeRestartBackoff = 10 * time.Second

// Load is case (c)'s heavy but healthy load on the CPU-limited broker.
type Load struct {
	CPU      float64       // cores `amf-lab stress` burns in the broker container (its limit is 500m)
	Duration time.Duration // each round's load
	// Traffic is the interval between the MQTT messages a client on the host
	// publishes through each broker and receives back during the load.
	Traffic time.Duration
}

// DefaultLoads are two levels of case (c), each for a minute in the 500m
// container: 2 busy threads (4 × its limit, throttled all along, as a
// broker at its limit is), and 64, whose contention in the throttled
// cgroup is where the exec probe's short-lived processes start to wait.
var DefaultLoads = []Load{
	{CPU: 2, Duration: 60 * time.Second, Traffic: 10 * time.Millisecond},
	{CPU: 64, Duration: 60 * time.Second, Traffic: 10 * time.Millisecond},
}

// NodeConfig configures RunNode.
type NodeConfig struct {
	Runs  int    // rounds, each with one fault of every case (default 5)
	Loads []Load // case (c)'s levels, each in every round (default DefaultLoads)
	// Repo is the AMF repository: the agent is installed from its
	// manifests/base, and the images are built from its module.
	Repo string
	// BinDir holds prebuilt static binaries for the images (make build's bin/;
	// optional).
	BinDir string
	// WorkDir holds the control plane's files (when RunNode starts it).
	WorkDir string
	// ControlPlane and Node, when both are set, are used instead of starting
	// them (a test's; the node should cap its back-off at NodeRestartBackoff).
	ControlPlane *controlplane.ControlPlane
	Node         *kubenode.Node
	Progress     io.Writer
	// Log receives the control plane's and the node's progress (default: none).
	Log func(format string, args ...any)
}

// Liveness probes of the two broker pods. Both are what users write for a
// Mosquitto container, at the kubelet's defaults (period 10 s, timeout 1 s,
// 3 failures: the fields are left for the API server to default).
const (
	// ProbeExec is an MQTT round trip with the client the eclipse-mosquitto
	// image ships: the only liveness probe that can see a hung broker.
	ProbeExec = "exec"
	// ProbeTCP is the tcpSocket probe most charts ship: the kernel completes
	// the handshake of a stopped process, so it never sees a hang.
	ProbeTCP = "tcpSocket"
)

// LivenessCommand is ProbeExec's command, as users of the eclipse image write
// it (`mosquitto_sub -t '$SYS/#' -C 1 -W 3`): the broker's retained $SYS
// version comes back at once from a broker that works.
var LivenessCommand = []string{images.MosquittoSub, "-h", "127.0.0.1", "-p", "1883", "-t", "$SYS/#", "-C", "1", "-W", "3"}

// NodeReport is what RunNode measured.
type NodeReport struct {
	Kubelet, Runtime string
	// Liveness is the probe as the API server defaulted it (exec pod).
	Liveness    corev1.Probe
	GracePeriod int64 // the broker pods' terminationGracePeriodSeconds

	// (a) broker crash, both pods.
	CrashSignal Case // SIGKILL → the agent has unhealthy
	CrashStatus Case // SIGKILL → the termination arrives on a pod watch
	// CrashFinishedSameSecond counts crashes whose finishedAt (whole seconds
	// in the API) is the kill's second or the next.
	CrashFinishedSameSecond int

	// (b) broker hung (SIGSTOP), both pods.
	HangSignal   Case // → the agent has unhealthy (both pods)
	HangDecided  Case // → the kubelet's third failed exec liveness probe (its log), exec pod
	HangStatus   Case // → the termination arrives on a pod watch (after the grace period), exec pod
	HangTCPSeen  int  // hangs the tcpSocket pod's liveness probe failed on at all
	HangTCPRuns  int
	HangTCPWatch Case // how long each tcpSocket pod stayed hung, unnoticed by its probe

	// (c) heavy but healthy load, per level and pod kind.
	LoadRuns []*LoadResult
}

// LoadResult counts case (c) at one load on one kind of pod.
type LoadResult struct {
	Load             Load
	Kind             string // ProbeExec or ProbeTCP
	Runs             int
	Restarts         int // the kubelet killed the loaded broker
	LivenessFailures int // failed liveness probes (the kubelet's log)
	FalseSignals     int // unhealthy at the agent while the broker worked
	// SlowSignals are unhealthy signals while the test's own traffic, too,
	// went unanswered within the sidecar probe's timeout (answeredInTime):
	// the probe saw what a client saw, on a machine short of CPU.
	SlowSignals int
	Anomalous   int // transitions to anomalous (the model's score; no failover by itself)
	Reasons     []string
	MaxLatency  time.Duration // the MQTT traffic's largest round trip during the load
	Sent, Lost  int
	// Cores and Throttled are, per run, the broker container's CPU use
	// (cores, from cpuacct) and the share of CFS periods it was throttled in
	// while the injector ran: the evidence that it was at its limit.
	Cores, Throttled []float64
}

// cpuStat is a container cgroup's CPU counters (cgroup v1).
type cpuStat struct {
	at                 time.Time
	usage              time.Duration // cpuacct.usage
	periods, throttled int64         // cpu.stat nr_periods, nr_throttled
}

func readCPUStat(cg string) (cpuStat, error) {
	st := cpuStat{at: time.Now()}
	u, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", cg, "cpuacct.usage"))
	if err != nil {
		return st, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(u)), 10, 64)
	if err != nil {
		return st, fmt.Errorf("cpuacct.usage of %s: %w", cg, err)
	}
	st.usage = time.Duration(n)
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", cg, "cpu.stat"))
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "nr_periods":
			st.periods = n
		case "nr_throttled":
			st.throttled = n
		}
	}
	return st, nil
}

// nodeBench is one run of RunNode.
type nodeBench struct {
	cfg    NodeConfig
	cp     *controlplane.ControlPlane
	node   *kubenode.Node
	client kubernetes.Interface
	agent  *testbed.AgentPod
	feed   *feed
	rep    *NodeReport
}

// RunNode runs the signal benchmark against the real kubelet: on a real node
// (kubelet + containerd), two broker pods with the sidecar injected, one with
// an exec liveness probe and one with a tcpSocket one, and the agent as
// manifests/base's DaemonSet (observing only: the kubelet alone restarts).
// Each round crashes, hangs and loads both brokers (cases a, b and c).
func RunNode(ctx context.Context, cfg NodeConfig) (_ *NodeReport, err error) {
	if cfg.Runs <= 0 {
		cfg.Runs = 5
	}
	if len(cfg.Loads) == 0 {
		cfg.Loads = DefaultLoads
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if cfg.Repo == "" {
		return nil, errors.New("bench: NodeConfig.Repo (the AMF repository, for manifests/base) is required")
	}
	b := &nodeBench{cfg: cfg, cp: cfg.ControlPlane, node: cfg.Node, feed: newFeed()}
	if b.cp == nil || b.node == nil {
		stop, err := b.launch(ctx)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	b.client = b.cp.Client()
	b.rep = &NodeReport{Kubelet: b.node.KubeletVersion, Runtime: b.node.RuntimeVersion}
	for _, l := range cfg.Loads {
		for _, kind := range []string{ProbeExec, ProbeTCP} {
			b.rep.LoadRuns = append(b.rep.LoadRuns, &LoadResult{Load: l, Kind: kind})
		}
	}

	b.progress("agent: kubectl apply -k manifests/base, --observe-only (the kubelet alone acts on the brokers)")
	if b.agent, err = testbed.DeployAgent(ctx, b.cp, cfg.Repo, b.node.Name, []string{"--observe-only"}); err != nil {
		return nil, fmt.Errorf("deploy the agent DaemonSet: %w", err)
	}
	defer b.agent.Stop()
	lines, unsub := b.agent.Subscribe()
	evs, unsubNode := b.node.Subscribe(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { b.feed.consumeLines(lines) })
	wg.Go(func() { b.feed.consumeEvents(evs) })
	defer func() {
		b.feed.closeLines() // the agent's channel is never closed
		unsub()
		unsubNode() // closes evs
		wg.Wait()
	}()

	for i := 1; i <= cfg.Runs; i++ {
		if err := b.round(ctx, i); err != nil {
			return nil, fmt.Errorf("round %d: %w", i, err)
		}
	}
	return b.rep, nil
}

// launch starts the images, the control plane and the node, as
// lab/experiment does; the returned function stops them.
func (b *nodeBench) launch(ctx context.Context) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if err := kubenode.Check(); err != nil {
		return nil, err
	}
	b.progress("building the images (pause, Mosquitto from Debian, amf-sidecar, amf-agent, amf-lab; cached)")
	imgs, err := images.Build(ctx, images.Options{ModuleDir: b.cfg.Repo, BinDir: b.cfg.BinDir})
	if err != nil {
		return nil, err
	}
	b.progress("starting the Kubernetes control plane")
	if b.cp, err = controlplane.Launch(ctx, b.cfg.WorkDir, controlplane.Options{ServingIPs: kubenode.ServingIPs(), NoFakeNodes: true}, b.cfg.Log); err != nil {
		return nil, err
	}
	stops = append(stops, b.cp.Stop)
	b.progress("starting the node %q: containerd + kubelet + kube-proxy (crash-loop back-off capped at %v)", NodeName, NodeRestartBackoff)
	archives := make([]string, len(imgs))
	for i, im := range imgs {
		archives[i] = im.Archive
	}
	nctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if b.node, err = kubenode.Launch(nctx, kubenode.Config{Name: NodeName, ControlPlane: b.cp, Images: archives,
		MaxRestartBackoff: NodeRestartBackoff, Log: b.cfg.Log}); err != nil {
		return nil, err
	}
	stops = append(stops, b.node.Stop)
	b.progress("node %s Ready: kubelet %s, %s", b.node.Name, b.node.KubeletVersion, b.node.RuntimeVersion)
	return stop, nil
}

func (b *nodeBench) progress(format string, args ...any) {
	fmt.Fprintf(b.cfg.Progress, format+"\n", args...)
}

// working are the states of a sidecar whose broker answers its probe:
// anomalous is the model's view (of a fresh container's young windows, or
// of a load), which fails nothing over by itself.
var working = []podsignal.State{podsignal.Healthy, podsignal.Anomalous}

// brokerPod is one of a round's two broker pods.
type brokerPod struct {
	kind      string // ProbeExec or ProbeTCP
	ns, name  string // the pod
	ip        string
	pid       int // the broker's main process, on the host
	createdAt time.Time
}

func (p *brokerPod) String() string { return p.ns + "/" + p.name }

// round runs case (c), then (a), then (b) on a fresh pair of pods. Fresh
// pods per round keep the kubelet's event spam filter and back-off out of
// the measurements; (c) comes first so that the crash's signal, logged
// after every line of the load, proves those lines have all arrived.
func (b *nodeBench) round(ctx context.Context, i int) (err error) {
	ns := fmt.Sprintf("signal-%d", i)
	defer func() {
		if rerr := b.removeNamespace(context.WithoutCancel(ctx), ns); rerr != nil && err == nil {
			err = rerr
		}
	}()
	pods, err := b.startPods(ctx, ns)
	if err != nil {
		return err
	}
	b.progress("round %d/%d: pods %s (exec liveness) and %s (tcpSocket liveness) healthy at the agent", i, b.cfg.Runs, pods[0], pods[1])
	var loads []map[*brokerPod]*loadRun
	for _, l := range b.cfg.Loads {
		runs, err := b.load(ctx, pods, l)
		if err != nil {
			return fmt.Errorf("case (c), load: %w", err)
		}
		loads = append(loads, runs)
		for _, p := range pods {
			ends := b.feed.events(p, runs[p].from, runs[p].to, kubenode.EventExited, kubenode.EventOOMKilled)
			if len(ends) == 0 {
				continue
			}
			b.progress("  (c) the kubelet restarted the loaded broker of %s: waiting for it to work again", p)
			decided, err := b.killDecision(p, runs[p].from, ends[len(ends)-1])
			if err != nil {
				return err
			}
			if err := b.awaitRestarted(ctx, p, decided); err != nil {
				return fmt.Errorf("case (c): %w", err)
			}
		}
	}
	for _, p := range pods {
		if err := b.settle(ctx, pods); err != nil {
			return fmt.Errorf("case (a): %w", err)
		}
		if err := b.crash(ctx, p); err != nil {
			return fmt.Errorf("case (a), crash of %s: %w", p, err)
		}
	}
	// Every line of the loads is in now (the log is one ordered stream).
	for i, runs := range loads {
		if err := b.countLoad(pods, b.cfg.Loads[i], runs); err != nil {
			return err
		}
	}
	if err := b.hang(ctx, pods); err != nil {
		return fmt.Errorf("case (b), hang: %w", err)
	}
	return nil
}

// startPods creates the namespace and both broker Deployments, and waits
// until both sidecars are healthy at the agent.
func (b *nodeBench) startPods(ctx context.Context, ns string) ([]*brokerPod, error) {
	if _, err := b.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", ns, err)
	}
	if err := b.cp.WaitServiceAccount(ctx, ns, "default"); err != nil {
		return nil, err
	}
	var pods []*brokerPod
	for _, kind := range []string{ProbeExec, ProbeTCP} {
		name := "broker-" + strings.ToLower(kind)
		d, err := brokerDeployment(ns, name, kind, b.node.Name)
		if err != nil {
			return nil, err
		}
		if _, err := b.client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create Deployment %s/%s: %w", ns, name, err)
		}
		pods = append(pods, &brokerPod{kind: kind, ns: ns, createdAt: time.Now()})
	}
	for _, p := range pods {
		pod, err := waitPod(ctx, b.client, ns, "broker-"+strings.ToLower(p.kind), 2*time.Minute)
		if err != nil {
			return nil, err
		}
		p.name, p.ip = pod.Name, pod.Status.PodIP
		if p.kind == ProbeExec {
			b.rep.Liveness = *brokerContainer(pod).LivenessProbe
			b.rep.GracePeriod = ptr.Deref(pod.Spec.TerminationGracePeriodSeconds, 0)
		}
		if _, err := b.feed.awaitLine(ctx, 90*time.Second, p, p.createdAt, working...); err != nil {
			return nil, err
		}
	}
	return pods, nil
}

func brokerContainer(p *corev1.Pod) *corev1.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == testbed.BrokerContainer {
			return &p.Spec.Containers[i]
		}
	}
	return &corev1.Container{}
}

// brokerDeployment is a plain Mosquitto Deployment on node as a user writes it —
// the testbed's limits (500m, 100 Mi), a liveness probe of the given kind at
// the kubelet's defaults, the default grace period — injected with the
// sidecar by package inject (what `amf-agent inject` writes). Redundancy
// none: the benchmark compares detection, the kubelet alone acts.
func brokerDeployment(ns, name, kind, node string) (*appsv1.Deployment, error) {
	var live corev1.ProbeHandler
	switch kind {
	case ProbeExec:
		live.Exec = &corev1.ExecAction{Command: LivenessCommand}
	case ProbeTCP:
		live.TCPSocket = &corev1.TCPSocketAction{Port: intstr.FromString(inject.MQTTPortName)}
	default:
		return nil, fmt.Errorf("bench: liveness probe kind %q: want %s or %s", kind, ProbeExec, ProbeTCP)
	}
	labels := map[string]string{"app.kubernetes.io/name": "broker", "app.kubernetes.io/instance": name}
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels,
			Annotations: map[string]string{contract.AnnRedundancy: string(contract.None)}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                 map[string]string{corev1.LabelHostname: node},
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					Containers: []corev1.Container{{
						Name:  testbed.BrokerContainer,
						Image: images.MosquittoRef,
						Ports: []corev1.ContainerPort{{Name: inject.MQTTPortName, ContainerPort: 1883, Protocol: corev1.ProtocolTCP}},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("50Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")},
						},
						LivenessProbe: &corev1.Probe{ProbeHandler: live},
					}},
				},
			},
		},
	}
	in, err := yaml.Marshal(d)
	if err != nil {
		return nil, err
	}
	out, _, err := inject.Inject(in, inject.Options{})
	if err != nil {
		return nil, fmt.Errorf("inject the sidecar into %s: %w", name, err)
	}
	injected := new(appsv1.Deployment)
	if err := yaml.UnmarshalStrict(out, injected); err != nil {
		return nil, fmt.Errorf("read inject's output for %s: %w", name, err)
	}
	return injected, nil
}

// waitPod waits (watch) for a running pod of Deployment name whose
// containers are Ready. The agent observes only, so the readiness gate
// amf.io/healthy is never set and the pod itself never Ready.
func waitPod(ctx context.Context, c kubernetes.Interface, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(c.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/instance=" + name
	})
	var got *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.ContainersReady && cond.Status == corev1.ConditionTrue {
				got = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no pod of %s/%s with its containers Ready within %v: %w", ns, name, timeout, err)
	}
	return got, nil
}

// removeNamespace deletes a round's namespace and waits until its pods are gone.
func (b *nodeBench) removeNamespace(ctx context.Context, ns string) error {
	err := b.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", ns, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(b.client.CoreV1().RESTClient(), "pods", ns, func(*metav1.ListOptions) {})
	var store cache.Store
	empty := func() (bool, error) { return len(store.List()) == 0, nil }
	_, err = watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(s cache.Store) (bool, error) {
		store = s
		return empty()
	}, func(watch.Event) (bool, error) { return empty() })
	if err != nil {
		return fmt.Errorf("pods of namespace %s still there after its deletion: %w", ns, err)
	}
	return nil
}

// brokerPID finds the broker's main process on the host: the process of
// the broker container's cgroup that is PID 1 of the container's PID
// namespace (exec'd probes and the injector are in that cgroup too).
func (b *nodeBench) brokerPID(ctx context.Context, p *brokerPod) (int, error) {
	cg, err := b.node.ContainerCgroup(ctx, p.ns, p.name, testbed.BrokerContainer)
	if err != nil {
		return 0, err
	}
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cg, "cgroup.procs"))
	if err != nil {
		return 0, fmt.Errorf("broker of %s: %w", p, err)
	}
	for _, f := range strings.Fields(string(procs)) {
		status, err := os.ReadFile(filepath.Join("/proc", f, "status"))
		if err != nil {
			continue // ended since the cgroup was read
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ids, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if fs := strings.Fields(ids); len(fs) > 0 && fs[len(fs)-1] == "1" {
					return strconv.Atoi(f)
				}
			}
		}
	}
	return 0, fmt.Errorf("no PID 1 of the container among the processes of %s (cgroup %s)", p, cg)
}

// CrashSpacing is how long the round waits before each crash, once every pod
// of the round is Ready: the aftermath of the round's previous step (the
// load's 64 threads ending, a restart's container start, the kubelet's
// status updates, the sidecar's rediscovery) must not share the node's CPU
// with the crash's signal, which would measure the benchmark's own previous
// step (39 ms seen for a crash right after the load, 2–7 ms otherwise). A
// schedule, not a synchronisation: the Ready wait before it is the
// synchronisation.
const CrashSpacing = 5 * time.Second

// settle waits until every pod of the round has its containers Ready in the
// API, then CrashSpacing more.
func (b *nodeBench) settle(ctx context.Context, pods []*brokerPod) error {
	for _, p := range pods {
		if _, err := waitPod(ctx, b.client, p.ns, "broker-"+strings.ToLower(p.kind), 2*time.Minute); err != nil {
			return err
		}
	}
	return pause(ctx, CrashSpacing)
}

// throttled reads how many CFS periods the container of p has been throttled
// in so far, -1 if it cannot be read: a sidecar at its CPU limit when the
// broker dies delays the signal by up to a period, which the progress line
// then says.
func (b *nodeBench) throttled(ctx context.Context, p *brokerPod, container string) int64 {
	cg, err := b.node.ContainerCgroup(ctx, p.ns, p.name, container)
	if err != nil {
		return -1
	}
	st, err := readCPUStat(cg)
	if err != nil {
		return -1
	}
	return st.throttled
}

// crash is case (a): SIGKILL of the broker from the host, then the agent's
// unhealthy and the kubelet's termination in the pod status are awaited;
// the round goes on once the kubelet has restarted it and the sidecar says
// healthy again.
func (b *nodeBench) crash(ctx context.Context, p *brokerPod) error {
	pid, err := b.brokerPID(ctx, p)
	if err != nil {
		return err
	}
	throttledBefore := b.throttled(ctx, p, inject.SidecarName)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill the broker of %s (PID %d): %w", p, pid, err)
	}
	l, err := b.feed.awaitLine(ctx, 30*time.Second, p, killed, podsignal.Unhealthy)
	if err != nil {
		return err
	}
	sidecarThrottled := "unknown"
	if after := b.throttled(ctx, p, inject.SidecarName); throttledBefore >= 0 && after >= 0 {
		sidecarThrottled = strconv.FormatInt(after-throttledBefore, 10)
	}
	ev, err := b.feed.awaitEvent(ctx, 30*time.Second, p, killed, kubenode.EventExited, kubenode.EventOOMKilled)
	if err != nil {
		return err
	}
	scm, pcm := l.Received.Sub(killed), ev.Seen.Sub(killed)
	b.rep.CrashSignal.Samples = append(b.rep.CrashSignal.Samples, scm)
	b.rep.CrashStatus.Samples = append(b.rep.CrashStatus.Samples, pcm)
	sec := killed.Truncate(time.Second)
	if f := ev.Time.Truncate(time.Second); f.Equal(sec) || f.Equal(sec.Add(time.Second)) {
		b.rep.CrashFinishedSameSecond++
	}
	b.progress("  (a) crash %s (%s): agent has unhealthy after %s, the pod status shows it after %s (finishedAt %s, kill at %s; sidecar throttled in %s CFS periods meanwhile)",
		p.name, p.kind, ms(scm), ms(pcm), ev.Time.UTC().Format("15:04:05"), killed.UTC().Format("15:04:05.000"), sidecarThrottled)
	return b.awaitRestarted(ctx, p, killed)
}

// awaitRestarted waits for the kubelet's restart of p's broker, dead since
// then, and for the sidecar to say it works again: an unhealthy received
// since then, followed by healthy (or anomalous: the model's view of a fresh
// container) with no unhealthy after it.
func (b *nodeBench) awaitRestarted(ctx context.Context, p *brokerPod, since time.Time) error {
	// The back-off is capped at NodeRestartBackoff; the grace period of a
	// hung broker comes before it.
	timeout := NodeRestartBackoff + time.Duration(b.rep.GracePeriod)*time.Second + time.Minute
	if _, err := b.feed.awaitEvent(ctx, timeout, p, since, kubenode.EventRestarted); err != nil {
		return err
	}
	return b.feed.await(ctx, time.Minute, fmt.Sprintf("healthy at the agent for %s after its restart", p), func() bool {
		down, up := -1, -1
		for i, l := range b.feed.all {
			if l.Namespace != p.ns || l.Pod != p.name || l.Received.Before(since) {
				continue
			}
			switch l.To {
			case string(podsignal.Unhealthy):
				down = i
			case string(podsignal.Healthy), string(podsignal.Anomalous): // working
				up = i
			}
		}
		return down >= 0 && up > down
	})
}

// hang is case (b): SIGSTOP of both brokers at a random phase of the
// kubelet's probe period. The agent's unhealthy is awaited for both; the
// exec pod's kubelet decision (its log) and termination (after the grace
// period, as SIGTERM waits for a stopped process); the tcpSocket pod's
// probe is checked to have seen nothing by then, and its broker resumed.
func (b *nodeBench) hang(ctx context.Context, pods []*brokerPod) error {
	execPod, tcpPod := pods[0], pods[1]
	for _, p := range pods {
		pid, err := b.brokerPID(ctx, p)
		if err != nil {
			return err
		}
		p.pid = pid
	}
	// Hangs come at any phase of the kubelet's probe period: a schedule,
	// not a synchronisation.
	period := time.Duration(b.rep.Liveness.PeriodSeconds) * time.Second
	if err := pause(ctx, rand.N(period)); err != nil {
		return err
	}
	stopped := map[*brokerPod]time.Time{}
	for _, p := range pods {
		stopped[p] = time.Now()
		if err := syscall.Kill(p.pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("stop the broker of %s (PID %d): %w", p, p.pid, err)
		}
	}
	resumed := false
	defer func() {
		if !resumed { // an error on the way: leave no broker stopped (PIDs a few seconds old)
			for _, p := range pods {
				_ = syscall.Kill(p.pid, syscall.SIGCONT)
			}
		}
	}()
	for _, p := range pods {
		l, err := b.feed.awaitLine(ctx, 30*time.Second, p, stopped[p], podsignal.Unhealthy)
		if err != nil {
			return err
		}
		d := l.Received.Sub(stopped[p])
		b.rep.HangSignal.Samples = append(b.rep.HangSignal.Samples, d)
		b.progress("  (b) hang %s (%s): agent has unhealthy after %s (%s)", p.name, p.kind, ms(d), l.Reason)
	}
	threshold := time.Duration(b.rep.Liveness.FailureThreshold) * period
	grace := time.Duration(b.rep.GracePeriod) * time.Second
	ev, err := b.feed.awaitEvent(ctx, threshold+2*period+grace+time.Minute, execPod, stopped[execPod], kubenode.EventExited, kubenode.EventOOMKilled)
	if err != nil {
		return fmt.Errorf("the kubelet never ended the hung broker of %s: %w", execPod, err)
	}
	status := ev.Seen.Sub(stopped[execPod])
	fails, err := probeFailures(b.kubeletLog(), stopped[execPod], ev.Seen, execPod.ns+"/"+execPod.name, testbed.BrokerContainer)
	if err != nil {
		return err
	}
	need := int(b.rep.Liveness.FailureThreshold)
	if len(fails) < need {
		return fmt.Errorf("the kubelet ended the hung broker of %s after %d failed liveness probes in its log, fewer than failureThreshold %d", execPod, len(fails), need)
	}
	decided := fails[need-1].Time.Sub(stopped[execPod])
	b.rep.HangDecided.Samples = append(b.rep.HangDecided.Samples, decided)
	b.rep.HangStatus.Samples = append(b.rep.HangStatus.Samples, status)
	b.progress("  (b) hang %s (exec liveness): the kubelet decided after %s (failure %d: %q), the pod status shows the end after %s",
		execPod.name, ms(decided), need, fails[need-1].Output, ms(status))

	// The tcpSocket pod has been hung as long: its probe saw nothing.
	watched := time.Since(stopped[tcpPod])
	tcpFails, err := probeFailures(b.kubeletLog(), stopped[tcpPod], time.Now(), tcpPod.ns+"/"+tcpPod.name, testbed.BrokerContainer)
	if err != nil {
		return err
	}
	b.rep.HangTCPRuns++
	b.rep.HangTCPWatch.Samples = append(b.rep.HangTCPWatch.Samples, watched)
	if len(tcpFails) > 0 {
		b.rep.HangTCPSeen++
	}
	b.progress("  (b) hang %s (tcpSocket liveness): %d failed liveness probes in %s hung; resumed", tcpPod.name, len(tcpFails), ms(watched))
	resumed = true
	if err := syscall.Kill(tcpPod.pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume the broker of %s (PID %d): %w", tcpPod, tcpPod.pid, err)
	}
	if _, err := b.feed.awaitLine(ctx, 30*time.Second, tcpPod, stopped[tcpPod], working...); err != nil {
		return err
	}
	return b.awaitRestarted(ctx, execPod, stopped[execPod])
}

func (b *nodeBench) kubeletLog() string { return filepath.Join(b.node.Dir, "logs", "kubelet.log") }

// loadRun is one pod's case (c) in a round, counted once its lines are in.
type loadRun struct {
	from, to time.Time
	rec      *probe.Recording
	// cores and throttled while the injector ran; negative where the
	// container ended before it did (its cgroup is gone).
	cores, throttled float64
}

// load is case (c): `amf-lab stress` exec'd into both broker containers
// (as kubectl exec does: the kubelet, the runtime, the container's cgroups)
// with MQTT traffic through each broker, for Load.Duration. The window
// counted runs one probe period past the load: a probe that started under
// it may fail after it.
func (b *nodeBench) load(ctx context.Context, pods []*brokerPod, l Load) (map[*brokerPod]*loadRun, error) {
	profile := fmt.Sprintf("%s:cpu=%g", l.Duration, l.CPU)
	b.progress("  (c) load: amf-lab stress --profile %s in both broker containers, MQTT traffic every %v through each", profile, l.Traffic)
	runs := map[*brokerPod]*loadRun{}
	probes := map[*brokerPod]*probe.Probe{}
	defer func() {
		for _, pr := range probes {
			pr.Stop()
		}
	}()
	for _, p := range pods {
		url := "tcp://" + p.ip + ":1883"
		pr, err := probe.Start(ctx, probe.Config{PublishURL: url, SubscribeURL: url, Interval: l.Traffic, Topic: "bench/traffic"})
		if err != nil {
			return nil, fmt.Errorf("MQTT traffic through %s: %w", p, err)
		}
		probes[p] = pr
	}
	type injector struct {
		cmd    interface{ Wait() error }
		stderr *bytes.Buffer
	}
	execs := map[*brokerPod]injector{}
	cgroups, before := map[*brokerPod]string{}, map[*brokerPod]cpuStat{}
	for _, p := range pods {
		cg, err := b.node.ContainerCgroup(ctx, p.ns, p.name, testbed.BrokerContainer)
		if err != nil {
			return nil, err
		}
		if before[p], err = readCPUStat(cg); err != nil {
			return nil, fmt.Errorf("CPU counters of %s's broker: %w", p, err)
		}
		cgroups[p] = cg
	}
	for _, p := range pods {
		var stderr bytes.Buffer
		runs[p] = &loadRun{from: time.Now(), cores: -1, throttled: -1}
		cmd, err := b.node.Exec(ctx, p.ns, p.name, testbed.BrokerContainer, []string{images.LabBinary, "stress", "--profile", profile}, io.Discard, &stderr)
		if err != nil {
			return nil, err
		}
		execs[p] = injector{cmd, &stderr}
	}
	for _, p := range pods {
		// A broker the kubelet killed ends its injector with it: not an error.
		if err := execs[p].cmd.Wait(); err != nil {
			b.progress("  (c) the injector in %s ended: %v %s", p, err, strings.TrimSpace(execs[p].stderr.String()))
		}
		if after, err := readCPUStat(cgroups[p]); err == nil {
			s0 := before[p]
			runs[p].cores = float64(after.usage-s0.usage) / float64(after.at.Sub(s0.at))
			if dp := after.periods - s0.periods; dp > 0 {
				runs[p].throttled = float64(after.throttled-s0.throttled) / float64(dp)
			}
		}
	}
	period := time.Duration(b.rep.Liveness.PeriodSeconds) * time.Second
	if err := pause(ctx, period); err != nil { // the window's tail (see above)
		return nil, err
	}
	for _, p := range pods {
		runs[p].to = time.Now()
		runs[p].rec = probes[p].Stop()
	}
	return runs, nil
}

// answeredInTime says whether the broker answered the test's own traffic in
// the sidecar probe's last period and timeout before at (the injected
// sidecar's defaults): every message sent then arrived, none slower than the
// probe's timeout. An unhealthy signal when it did not is no false signal:
// the probe was as slow to be answered as any client (under a light load,
// only a machine short of CPU does that).
func answeredInTime(rec *probe.Recording, at time.Time) bool {
	from := at.Add(-(healthcheck.DefaultInterval + healthcheck.DefaultTimeout))
	return rec.LatencySent(from, at).Max < healthcheck.DefaultTimeout && len(rec.Lost(from, at)) == 0
}

// countLoad counts case (c) from the node's events, the kubelet's log and
// the agent's lines, which are all in by now. A restart of the loaded
// broker is the kubelet's (nothing else touched it); an unhealthy at the
// agent is false unless it came after the kubelet's decision to kill
// (its failureThreshold-th failed probe before the broker's end).
func (b *nodeBench) countLoad(pods []*brokerPod, l Load, runs map[*brokerPod]*loadRun) error {
	for _, p := range pods {
		r := runs[p]
		var res *LoadResult
		for _, lr := range b.rep.LoadRuns {
			if lr.Load == l && lr.Kind == p.kind {
				res = lr
			}
		}
		res.Runs++
		fails, err := probeFailures(b.kubeletLog(), r.from, r.to, p.ns+"/"+p.name, testbed.BrokerContainer)
		if err != nil {
			return err
		}
		res.LivenessFailures += len(fails)
		ends := b.feed.events(p, r.from, r.to, kubenode.EventExited, kubenode.EventOOMKilled)
		res.Restarts += len(ends)
		// The kills' own consequences: from each decision on.
		var killed []time.Time
		for _, e := range ends {
			decided, err := b.killDecision(p, r.from, e)
			if err != nil {
				return err
			}
			killed = append(killed, decided)
		}
		falseHere, anomalous := 0, 0
		for _, l := range b.feed.lines(p, r.from, r.to) {
			switch l.To {
			case string(podsignal.Anomalous):
				anomalous++
			case string(podsignal.Unhealthy):
				caused := false
				for _, k := range killed {
					caused = caused || !l.Received.Before(k)
				}
				switch {
				case caused:
				case !answeredInTime(r.rec, l.Received):
					res.SlowSignals++
				default:
					falseHere++
					res.Reasons = append(res.Reasons, l.Reason)
				}
			}
		}
		res.FalseSignals += falseHere
		res.Anomalous += anomalous
		lat := r.rec.Latency(r.from, r.to)
		res.MaxLatency = max(res.MaxLatency, lat.Max)
		for _, s := range r.rec.Sends {
			if !s.Time.Before(r.from) && s.Time.Before(r.to) {
				res.Sent++
			}
		}
		res.Lost += len(r.rec.Lost(r.from, r.to))
		if r.cores >= 0 {
			res.Cores, res.Throttled = append(res.Cores, r.cores), append(res.Throttled, r.throttled)
		}
		b.progress("  (c) cpu=%g on %s (%s liveness): broker container at %.2f cores, throttled in %.0f %% of CFS periods; %d failed liveness probes, %d kubelet restarts, %d false unhealthy (%d more while the test's traffic was as slow), %d anomalous; MQTT max round trip %s, %d lost",
			l.CPU, p.name, p.kind, r.cores, 100*r.throttled, len(fails), len(ends), falseHere, res.SlowSignals, anomalous, ms(lat.Max), len(r.rec.Lost(r.from, r.to)))
	}
	return nil
}

// killDecision is when the kubelet decided to end p's broker, which ended
// (end) after from: its last failed liveness probe before the end, from the
// kubelet's log (written before the kill, so before the end is seen); the
// end's arrival itself where no probe failed.
func (b *nodeBench) killDecision(p *brokerPod, from time.Time, end kubenode.Event) (time.Time, error) {
	fails, err := probeFailures(b.kubeletLog(), from, end.Seen, p.ns+"/"+p.name, testbed.BrokerContainer)
	if err != nil || len(fails) == 0 {
		return end.Seen, err
	}
	return fails[len(fails)-1].Time, nil
}

// pause waits d: a schedule (a random phase, a measurement window), never
// a synchronisation.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// feed keeps the agent's lines and the node's container events as they
// arrive, for waits and for counts over a window.
type feed struct {
	mu      sync.Mutex
	all     []testbed.AgentLine
	evs     []kubenode.Event
	changed chan struct{} // closed and replaced at every arrival
	done    chan struct{}
	once    sync.Once
}

func newFeed() *feed { return &feed{changed: make(chan struct{}), done: make(chan struct{})} }

func (f *feed) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *feed) consumeLines(ch <-chan testbed.AgentLine) {
	for {
		select {
		case l := <-ch:
			if l.Msg != "transition" {
				continue
			}
			f.mu.Lock()
			f.all = append(f.all, l)
			f.notifyLocked()
			f.mu.Unlock()
		case <-f.done:
			return
		}
	}
}

// closeLines ends consumeLines (the agent's channel is never closed).
func (f *feed) closeLines() { f.once.Do(func() { close(f.done) }) }

func (f *feed) consumeEvents(ch <-chan kubenode.Event) {
	for ev := range ch {
		if ev.Container != testbed.BrokerContainer {
			continue
		}
		f.mu.Lock()
		f.evs = append(f.evs, ev)
		f.notifyLocked()
		f.mu.Unlock()
	}
}

// await calls found under the lock at every arrival until it is true.
func (f *feed) await(ctx context.Context, timeout time.Duration, what string, found func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		ok, ch := found(), f.changed
		f.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("no %s within %v", what, timeout)
		}
	}
}

// awaitLine waits for the agent's transition of p's pod to one of states,
// received at or after since.
func (f *feed) awaitLine(ctx context.Context, timeout time.Duration, p *brokerPod, since time.Time, states ...podsignal.State) (testbed.AgentLine, error) {
	var got testbed.AgentLine
	err := f.await(ctx, timeout, fmt.Sprintf("%v at the agent for %s (kubectl -n amf-system logs ds/amf-agent)", states, p), func() bool {
		for _, l := range f.all {
			if l.Namespace != p.ns || l.Pod != p.name || l.Received.Before(since) {
				continue
			}
			for _, s := range states {
				if l.To == string(s) {
					got = l
					return true
				}
			}
		}
		return false
	})
	return got, err
}

// awaitEvent waits for a container event of p's broker of one of types,
// delivered at or after since.
func (f *feed) awaitEvent(ctx context.Context, timeout time.Duration, p *brokerPod, since time.Time, types ...kubenode.EventType) (kubenode.Event, error) {
	var got kubenode.Event
	err := f.await(ctx, timeout, fmt.Sprintf("%v of %s's broker in its pod status", types, p), func() bool {
		if es := f.eventsLocked(p, since, time.Time{}, types...); len(es) > 0 {
			got = es[0]
			return true
		}
		return false
	})
	return got, err
}

// events returns p's broker events of types delivered in [from, to).
func (f *feed) events(p *brokerPod, from, to time.Time, types ...kubenode.EventType) []kubenode.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.eventsLocked(p, from, to, types...)
}

// eventsLocked: to zero means no end.
func (f *feed) eventsLocked(p *brokerPod, from, to time.Time, types ...kubenode.EventType) []kubenode.Event {
	var out []kubenode.Event
	for _, e := range f.evs {
		if e.Namespace != p.ns || e.Pod != p.name || e.Seen.Before(from) || (!to.IsZero() && !e.Seen.Before(to)) {
			continue
		}
		for _, t := range types {
			if e.Type == t {
				out = append(out, e)
			}
		}
	}
	return out
}

// lines returns p's transitions at the agent received in [from, to).
func (f *feed) lines(p *brokerPod, from, to time.Time) []testbed.AgentLine {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []testbed.AgentLine
	for _, l := range f.all {
		if l.Namespace == p.ns && l.Pod == p.name && !l.Received.Before(from) && l.Received.Before(to) {
			out = append(out, l)
		}
	}
	return out
}
