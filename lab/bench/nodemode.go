package bench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/proc"
)

// NodeModeConfig configures the node-mode footprint benchmark.
type NodeModeConfig struct {
	Pods     int           // pods on the node; 110 is the kubelet's default limit
	Duration time.Duration // each measurement (without, then with the pipelines)
	Kills    int           // pods whose process is then killed, one at a time, to time the pushed exit (default 20)
	OOMKills int           // then pods OOM-killed, one at a time (default 10)
	Bin      Binaries
	WorkDir  string
	Progress io.Writer
}

// NodeModeReport is what it measured: the agent without pipelines and with
// one per pod, and the difference per pod.
type NodeModeReport struct {
	Pods         int     `json:"pods"`
	RSSMiBPerPod float64 `json:"rss_mib_per_pod"`
	CPUPctPerPod float64 `json:"cpu_pct_per_pod"` // of one core
	BaseRSSMiB   float64 `json:"base_rss_mib"`
	BaseCPUPct   float64 `json:"base_cpu_pct"`
	RSSMiB       float64 `json:"rss_mib"`
	CPUPct       float64 `json:"cpu_pct"`
	StartSeconds float64 `json:"start_s"` // opt-in → every pod healthy in the tracker
	// Kill → unhealthy in the agent's tracker (the received time of its
	// transition line), for the pushed exit.
	Kills         int     `json:"kills"`
	ExitP50Millis float64 `json:"exit_p50_ms"`
	ExitP99Millis float64 `json:"exit_p99_ms"`
	ExitMaxMillis float64 `json:"exit_max_ms"`
	// An OOM kill in the container → unhealthy, for the pushed OOM
	// notification (from the killed process's end as its parent saw it).
	OOMKills     int     `json:"oom_kills"`
	OOMP50Millis float64 `json:"oom_p50_ms"`
	OOMP99Millis float64 `json:"oom_p99_ms"`
	OOMMaxMillis float64 `json:"oom_max_ms"`
}

// benchNode is the Node name the benchmark's pods are bound to; no kubelet
// runs it: the pods' status is written by the benchmark.
const benchNode = "bench-node"

// RunNodeMode measures what node mode costs per pod: a real agent binary
// (amf-agent --node-mode) against a real API server, N pods bound to its
// node whose broker containers are real cgroups (under a kubelet cgroup
// root of the benchmark's own, in the kubelet's layout) each holding a real
// process, sampled every second. The agent runs first with the Deployment
// not opted in (no pipelines), then the annotation is set (no pod changes)
// and, once every pod is healthy in the agent's tracker, measured again.
// Needs root (cgroups) and the control plane (make k8s).
func RunNodeMode(ctx context.Context, cfg NodeModeConfig) (rep *NodeModeReport, err error) {
	if cfg.Pods <= 0 {
		cfg.Pods = 110
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Kills <= 0 {
		cfg.Kills = 20
	}
	if cfg.OOMKills <= 0 {
		cfg.OOMKills = 10
	}
	cfg.Kills = min(cfg.Kills, cfg.Pods)
	if os.Geteuid() != 0 {
		return nil, errors.New("node-mode bench: needs root (it creates cgroups)")
	}
	// The controllers that would fight the benchmark's hand-made objects
	// are off: no ReplicaSet or Deployment controller scaling pods, no pod
	// GC of pods on a node without a kubelet, no node lifecycle evicting them.
	cp, err := controlplane.Launch(ctx, cfg.WorkDir, controlplane.Options{NoFakeNodes: true,
		ControllerManagerFlags: []string{"--controllers=*,-replicaset,-deployment,-podgc,-nodelifecycle"}},
		func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) })
	if err != nil {
		return nil, err
	}
	defer cp.Stop()

	root, err := newBenchCgroupRoot()
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := root.remove(); rerr != nil && err == nil {
			err = rerr
		}
	}()
	cs := cp.Client()
	pods, err := createBenchPods(ctx, cs, cfg.Pods)
	if err != nil {
		return nil, err
	}
	if err := root.addPods(pods); err != nil {
		return nil, err
	}
	if err := markRunning(ctx, cs, pods); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "%d pods on %s, each a real process in a cgroup under %s\n", len(pods), benchNode, root.name)

	httpAddr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	mqttAddr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	// Info level: one line per transition (one per pod here), whose received
	// time is the tracker's.
	transitions := make(chan transitionLine, 256)
	agent, err := proc.Start("amf-agent", filepath.Join(cfg.WorkDir, "agent.log"), func(line string) {
		if tl, ok := parseTransition(line); ok {
			select {
			case transitions <- tl:
			default: // nobody waits for it
			}
		}
	}, cfg.Bin.Agent,
		"--listen", mqttAddr, "--http", httpAddr, "--kubeconfig", cp.Kubeconfig, "--node-name", benchNode,
		"--node-mode", "--kubelet-cgroup-root", "/"+root.name, "--log-level", "info")
	if err != nil {
		return nil, err
	}
	defer agent.Stop(3 * time.Second)
	if err := proc.WaitListening(ctx, agent, httpAddr, 20*time.Second); err != nil {
		return nil, err
	}
	rep = &NodeModeReport{Pods: len(pods)}
	measure := func(label string) (cpuPct, rssMiB float64, err error) {
		fmt.Fprintf(cfg.Progress, "measuring the agent %s for %v\n", label, cfg.Duration)
		c0, _, err := proc.Usage(agent.PID())
		if err != nil {
			return 0, 0, err
		}
		t0 := time.Now()
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-agent.Done():
			return 0, 0, fmt.Errorf("the agent exited: %v (%s)", agent.Err(), proc.LogTail(filepath.Join(cfg.WorkDir, "agent.log"), 2000))
		case <-time.After(cfg.Duration):
		}
		c1, rss, err := proc.Usage(agent.PID())
		if err != nil {
			return 0, 0, err
		}
		return 100 * float64(c1-c0) / float64(time.Since(t0)), float64(rss) / (1 << 20), nil
	}
	if rep.BaseCPUPct, rep.BaseRSSMiB, err = measure("with no pod opted in"); err != nil {
		return nil, err
	}
	optedIn := time.Now()
	if _, err := cs.AppsV1().Deployments(nodeModeNamespace).Patch(ctx, "broker", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+contract.AnnMode+`":"node"}}}`), metav1.PatchOptions{}); err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, "http://"+httpAddr+"/metrics", len(pods), 2*time.Minute); err != nil {
		return nil, err
	}
	rep.StartSeconds = time.Since(optedIn).Seconds()
	fmt.Fprintf(cfg.Progress, "opted in: %d pods healthy in the tracker %.2f s later\n", len(pods), rep.StartSeconds)
	if rep.CPUPct, rep.RSSMiB, err = measure(fmt.Sprintf("with %d pipelines", len(pods))); err != nil {
		return nil, err
	}
	rep.RSSMiBPerPod = (rep.RSSMiB - rep.BaseRSSMiB) / float64(len(pods))
	rep.CPUPctPerPod = (rep.CPUPct - rep.BaseCPUPct) / float64(len(pods))

	// Exits, one at a time: the pod's process killed, its unhealthy
	// transition awaited in the agent's log.
	await := func(name string) (transitionLine, error) {
		timeout := time.After(30 * time.Second)
		for {
			select {
			case tl := <-transitions:
				if tl.Pod == name && tl.To == "unhealthy" {
					return tl, nil
				}
			case <-timeout:
				return transitionLine{}, fmt.Errorf("node-mode bench: no unhealthy transition of %s within 30 s", name)
			case <-ctx.Done():
				return transitionLine{}, ctx.Err()
			}
		}
	}
	drain := func() {
		for {
			select {
			case <-transitions:
			default:
				return
			}
		}
	}
	var lat []time.Duration
	for _, p := range pods[:cfg.Kills] {
		drain()
		killed := time.Now()
		if err := p.cmd.Process.Kill(); err != nil {
			return nil, err
		}
		tl, err := await(p.pod.Name)
		if err != nil {
			return nil, err
		}
		lat = append(lat, tl.Received.Sub(killed))
		fmt.Fprintf(cfg.Progress, "kill %s: unhealthy %.1f ms later (%s)\n", p.pod.Name, millis(lat[len(lat)-1]), tl.Reason)
		_ = p.cmd.Wait()
	}
	rep.Kills = len(lat)
	rep.ExitP50Millis, rep.ExitP99Millis, rep.ExitMaxMillis = percentiles(lat)
	fmt.Fprintf(cfg.Progress, "%d kills: unhealthy in the agent p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", rep.Kills, rep.ExitP50Millis, rep.ExitP99Millis, rep.ExitMaxMillis)

	// OOM kills, one at a time, in other pods: a memory limit on the
	// container, and a process started in it that allocates past it (the
	// lab's load generator); the kernel kills it, the pod's own process
	// stays. Timed from the killed process's end as its parent (this
	// benchmark) reaps it; on cgroup v1 the notification comes just before
	// the kill, so a time can be below zero.
	var oomLat []time.Duration
	for _, p := range pods[cfg.Kills:min(len(pods), cfg.Kills+cfg.OOMKills)] {
		drain()
		hog, err := root.startHog(p, cfg.Bin.Self)
		if err != nil {
			return nil, err
		}
		done := make(chan time.Time, 1)
		go func() { _ = hog.Wait(); done <- time.Now() }()
		tl, err := await(p.pod.Name)
		if err != nil {
			_ = hog.Process.Kill()
			<-done
			return nil, err
		}
		var ended time.Time
		select {
		case ended = <-done:
		case <-time.After(30 * time.Second):
			_ = hog.Process.Kill()
			<-done
			return nil, fmt.Errorf("node-mode bench: %s signalled %q but its hog was not killed within 30 s", p.pod.Name, tl.Reason)
		}
		oomLat = append(oomLat, tl.Received.Sub(ended))
		fmt.Fprintf(cfg.Progress, "OOM kill in %s: unhealthy %.1f ms from the kill (%s)\n", p.pod.Name, millis(oomLat[len(oomLat)-1]), tl.Reason)
	}
	rep.OOMKills = len(oomLat)
	if len(oomLat) > 0 {
		rep.OOMP50Millis, rep.OOMP99Millis, rep.OOMMaxMillis = percentiles(oomLat)
	}
	return rep, nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentiles returns the median, the 99th percentile (nearest rank) and the
// maximum of ds, in milliseconds.
func percentiles(ds []time.Duration) (p50, p99, maxMs float64) {
	ds = slices.Sorted(slices.Values(ds))
	return millis(ds[len(ds)/2]), millis(ds[min(len(ds)-1, int(math.Ceil(0.99*float64(len(ds))))-1)]), millis(ds[len(ds)-1])
}

// startHog limits p's container to 64 MiB and starts the load generator in
// it, allocating past the limit. A shell moves itself into the container's
// cgroups before it becomes the load generator, so nothing is charged
// elsewhere first.
func (r *benchCgroupRoot) startHog(p *nodeModePod, self string) (*exec.Cmd, error) {
	rel := filepath.Join(r.name, "kubepods", "burstable", "pod"+p.uid, p.containerID)
	limitFile := "memory.max"
	if len(r.bases) > 1 {
		limitFile = "memory.limit_in_bytes"
	}
	var memDir string
	args := []string{"-c", `for f in "$@"; do echo $$ > "$f" || exit 1; done; exec "$0" stress --profile 60s:mem=256Mi`, self}
	for _, b := range r.bases {
		if strings.HasSuffix(b, "memory") || len(r.bases) == 1 {
			memDir = filepath.Join(b, rel)
		}
		args = append(args, filepath.Join(b, rel, "cgroup.procs"))
	}
	if err := os.WriteFile(filepath.Join(memDir, limitFile), []byte("67108864"), 0o644); err != nil {
		return nil, fmt.Errorf("node-mode bench: memory limit: %w", err)
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("node-mode bench: start the load generator: %w", err)
	}
	return cmd, nil
}

// transitionLine is the part of the agent's "transition" log line the
// benchmark reads.
type transitionLine struct {
	Msg      string    `json:"msg"`
	Pod      string    `json:"pod"`
	To       string    `json:"to"`
	Received time.Time `json:"received"`
	Reason   string    `json:"reason"`
}

func parseTransition(line string) (transitionLine, bool) {
	var tl transitionLine
	if !strings.Contains(line, `"msg":"transition"`) || json.Unmarshal([]byte(line), &tl) != nil {
		return tl, false
	}
	return tl, tl.Msg == "transition"
}

const nodeModeNamespace = "bench"

// nodeModePod is one pod, its cgroup and its process.
type nodeModePod struct {
	pod              *corev1.Pod
	uid, containerID string
	cmd              *exec.Cmd
}

// benchCgroupRoot is a kubelet cgroup root of the benchmark's own in each
// v1 controller the readers use (or the v2 hierarchy), with the pods below
// it as the cgroupfs driver lays them out.
type benchCgroupRoot struct {
	name  string   // "amf-bench-<random>"
	bases []string // the hierarchies' mount points
	dirs  []string // every directory made, in creation order
	pods  []*nodeModePod
}

func newBenchCgroupRoot() (*benchCgroupRoot, error) {
	var rnd [6]byte
	if _, err := crand.Read(rnd[:]); err != nil {
		return nil, err
	}
	r := &benchCgroupRoot{name: "amf-bench-" + hex.EncodeToString(rnd[:])}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		for _, c := range []string{"cpuacct", "memory", "blkio"} {
			r.bases = append(r.bases, filepath.Join("/sys/fs/cgroup", c))
		}
	} else if _, err := os.Stat("/sys/fs/cgroup/cgroup.subtree_control"); err == nil {
		r.bases = []string{"/sys/fs/cgroup"}
	} else {
		return nil, errors.New("node-mode bench: no cgroup v1 memory hierarchy nor cgroup v2 at /sys/fs/cgroup")
	}
	// A benchmark killed (SIGKILL) cannot remove its cgroups; its processes
	// died with it (Pdeathsig), so the next run removes the empty trees.
	for _, b := range r.bases {
		stale, _ := filepath.Glob(filepath.Join(b, "amf-bench-*"))
		for _, d := range stale {
			removeEmptyTree(d)
		}
	}
	return r, nil
}

// removeEmptyTree removes a cgroup directory and those below it, deepest
// first; a cgroup that still holds a process stays (rmdir fails).
func removeEmptyTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeEmptyTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = syscall.Rmdir(dir)
}

// mkdir makes rel in every hierarchy; on v2 a directory that is not a leaf
// hands the controllers the readers need to its children.
func (r *benchCgroupRoot) mkdir(rel string, leaf bool) error {
	for _, b := range r.bases {
		d := filepath.Join(b, rel)
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("node-mode bench: %w", err)
		}
		r.dirs = append(r.dirs, d)
		if len(r.bases) == 1 && !leaf {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu +io +memory"), 0o644); err != nil {
				return fmt.Errorf("node-mode bench: %w", err)
			}
		}
	}
	return nil
}

// addPods makes the pods' cgroups (burstable QoS, named by their UIDs) with
// one process each.
func (r *benchCgroupRoot) addPods(pods []*nodeModePod) error {
	for _, rel := range []string{r.name, filepath.Join(r.name, "kubepods"), filepath.Join(r.name, "kubepods", "burstable")} {
		if err := r.mkdir(rel, false); err != nil {
			return err
		}
	}
	for _, p := range pods {
		var b [32]byte
		if _, err := crand.Read(b[:]); err != nil {
			return err
		}
		p.containerID = hex.EncodeToString(b[:])
		podRel := filepath.Join(r.name, "kubepods", "burstable", "pod"+p.uid)
		if err := r.mkdir(podRel, false); err != nil {
			return err
		}
		if err := r.mkdir(filepath.Join(podRel, p.containerID), true); err != nil {
			return err
		}
		p.cmd = exec.Command("sleep", "infinity")
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			return fmt.Errorf("node-mode bench: a pod's process: %w", err)
		}
		r.pods = append(r.pods, p)
		for _, b := range r.bases {
			f := filepath.Join(b, podRel, p.containerID, "cgroup.procs")
			if err := os.WriteFile(f, []byte(strconv.Itoa(p.cmd.Process.Pid)), 0o644); err != nil {
				return fmt.Errorf("node-mode bench: %w", err)
			}
		}
	}
	return nil
}

// remove ends the processes and removes the cgroups, deepest first.
func (r *benchCgroupRoot) remove() error {
	for _, p := range r.pods {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	var errs []error
	for i := len(r.dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(r.dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", r.dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

// createBenchPods writes a Deployment (not opted in yet), its ReplicaSet
// and n pods bound to benchNode.
func createBenchPods(ctx context.Context, cs kubernetes.Interface, n int) ([]*nodeModePod, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodeModeNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	labels := map[string]string{"app": "broker"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mosquitto", Image: "eclipse-mosquitto:2"}}}}
	d, err := cs.AppsV1().Deployments(nodeModeNamespace).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "broker"},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(int32(n)), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	rs, err := cs.AppsV1().ReplicaSets(nodeModeNamespace).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "broker-bench", Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(int32(n)), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var pods []*nodeModePod
	for i := range n {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("broker-%d", i), Labels: labels,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: benchNode, Containers: tmpl.Spec.Containers},
		}
		created, err := cs.CoreV1().Pods(nodeModeNamespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		pods = append(pods, &nodeModePod{pod: created, uid: string(created.UID)})
	}
	return pods, nil
}

// markRunning writes each pod's status as its kubelet would: Running, its
// broker container running with the ID of its cgroup.
func markRunning(ctx context.Context, cs kubernetes.Interface, pods []*nodeModePod) error {
	for _, p := range pods {
		st := p.pod.DeepCopy()
		st.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "mosquitto", ContainerID: "containerd://" + p.containerID, Ready: true, Image: "eclipse-mosquitto:2",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		}}}
		if _, err := cs.CoreV1().Pods(nodeModeNamespace).UpdateStatus(ctx, st, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// waitHealthy polls the agent's metrics (another process: nothing to
// await) until n pods are healthy in its tracker.
func waitHealthy(ctx context.Context, url string, n int, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		got, err := healthyPods(ctx, url)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node-mode bench: %d of %d pods healthy in the agent after %v (%v)", got, n, bound, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func healthyPods(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, m := range families["amf_agent_pods"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "state" && l.GetValue() == "healthy" {
				return int(m.GetGauge().GetValue()), nil
			}
		}
	}
	return 0, nil
}

// PrintNodeMode writes the result; its last line is the report as JSON.
func PrintNodeMode(w io.Writer, r *NodeModeReport) error {
	fmt.Fprintf(w, "\nnode mode: %d pods, one pipeline each, sampled every 1 s\n", r.Pods)
	fmt.Fprintf(w, "agent without pipelines: %.2f %% of one core, RSS %.1f MiB\n", r.BaseCPUPct, r.BaseRSSMiB)
	fmt.Fprintf(w, "agent with %d pipelines: %.2f %% of one core, RSS %.1f MiB (all healthy %.2f s after the opt-in)\n", r.Pods, r.CPUPct, r.RSSMiB, r.StartSeconds)
	fmt.Fprintf(w, "per pod: %.3f MiB RSS, %.4f %% of one core\n", r.RSSMiBPerPod, r.CPUPctPerPod)
	fmt.Fprintf(w, "broker process killed → unhealthy in the agent (pushed exit, %d kills): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.Kills, r.ExitP50Millis, r.ExitP99Millis, r.ExitMaxMillis)
	fmt.Fprintf(w, "OOM kill in the container → unhealthy in the agent (pushed OOM notification, %d kills): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.OOMKills, r.OOMP50Millis, r.OOMP99Millis, r.OOMMaxMillis)
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
