package bench

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// nodeRig is what the node-mode benchmarks run against: a real control
// plane, a kubelet cgroup root of the benchmark's own with pods bound to
// benchNode whose broker containers are real cgroups each holding a real
// process, and a real amf-agent --node-mode watching the node. No kubelet
// runs: the benchmark writes the pods' status as one would.
type nodeRig struct {
	cp          *controlplane.ControlPlane
	cs          kubernetes.Interface
	root        *benchCgroupRoot
	pods        []*nodeModePod
	start       containerProc
	agent       *proc.Proc
	httpAddr    string
	agentLog    string
	transitions chan transitionLine
}

// containerProc starts the process of p's broker container (a new one at
// every restart); the rig moves it into the container's cgroups.
type containerProc func(p *nodeModePod) (*proc.Proc, error)

// sleepProc is a container whose process only exists.
func sleepProc(*nodeModePod) (*proc.Proc, error) {
	return proc.Start("pod process", os.DevNull, nil, "sleep", "infinity")
}

// nodeRigConfig says what the rig runs.
type nodeRigConfig struct {
	Pods     int
	Start    containerProc // the broker containers' process
	MemLimit int64         // bytes; every broker container's memory limit, 0: none
	Bin      Binaries
	WorkDir  string
	Progress io.Writer
}

// startNodeRig starts the rig, its pods not opted in yet (optIn). On error
// what was started is stopped; else close stops it.
func startNodeRig(ctx context.Context, cfg nodeRigConfig) (r *nodeRig, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("node-mode bench: needs root (it creates cgroups)")
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, err
	}
	progress := cfg.Progress
	r = &nodeRig{start: cfg.Start, agentLog: filepath.Join(cfg.WorkDir, "agent.log"), transitions: make(chan transitionLine, 256)}
	defer func() {
		if err != nil {
			_ = r.close()
			r = nil
		}
	}()
	// The controllers that would fight the benchmark's hand-made objects
	// are off: no ReplicaSet or Deployment controller scaling pods, no pod
	// GC of pods on a node without a kubelet, no node lifecycle evicting them.
	if r.cp, err = controlplane.Launch(ctx, cfg.WorkDir, controlplane.Options{NoFakeNodes: true,
		ControllerManagerFlags: []string{"--controllers=*,-replicaset,-deployment,-podgc,-nodelifecycle"}},
		func(format string, args ...any) { fmt.Fprintf(progress, format+"\n", args...) }); err != nil {
		return r, err
	}
	if r.root, err = newBenchCgroupRoot(); err != nil {
		return r, err
	}
	r.root.memLimit = cfg.MemLimit
	r.cs = r.cp.Client()
	if r.pods, err = createBenchPods(ctx, r.cs, cfg.Pods); err != nil {
		return r, err
	}
	for _, p := range r.pods {
		if err := r.root.addContainer(p, cfg.Start); err != nil {
			return r, err
		}
	}
	if err := markRunning(ctx, r.cs, r.pods); err != nil {
		return r, err
	}
	fmt.Fprintf(progress, "%d pods on %s, each a real process in a cgroup under %s\n", len(r.pods), benchNode, r.root.name)

	if r.httpAddr, err = proc.FreeAddr(); err != nil {
		return r, err
	}
	mqttAddr, err := proc.FreeAddr()
	if err != nil {
		return r, err
	}
	// Info level: one line per transition, whose received time is the
	// tracker's.
	if r.agent, err = proc.Start("amf-agent", r.agentLog, func(line string) {
		if tl, ok := parseTransition(line); ok {
			select {
			case r.transitions <- tl:
			default: // nobody waits for it
			}
		}
	}, cfg.Bin.Agent,
		"--listen", mqttAddr, "--http", r.httpAddr, "--kubeconfig", r.cp.Kubeconfig, "--node-name", benchNode,
		"--node-mode", "--kubelet-cgroup-root", "/"+r.root.name, "--log-level", "info"); err != nil {
		return r, err
	}
	if err := proc.WaitListening(ctx, r.agent, r.httpAddr, 20*time.Second); err != nil {
		return r, err
	}
	return r, nil
}

// close stops the agent, the pods' processes and the control plane, and
// removes the cgroups.
func (r *nodeRig) close() error {
	if r.agent != nil {
		r.agent.Stop(3 * time.Second)
	}
	var err error
	if r.root != nil {
		err = r.root.remove()
	}
	if r.cp != nil {
		r.cp.Stop()
	}
	return err
}

// optIn annotates the pods' Deployment for node mode; no pod changes.
func (r *nodeRig) optIn(ctx context.Context) error {
	_, err := r.cs.AppsV1().Deployments(nodeModeNamespace).Patch(ctx, "broker", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+contract.AnnMode+`":"node"}}}`), metav1.PatchOptions{})
	return err
}

// await waits for the agent to log a transition of pod into one of states.
func (r *nodeRig) await(ctx context.Context, pod string, timeout time.Duration, states ...string) (transitionLine, error) {
	deadline := time.After(timeout)
	for {
		select {
		case tl := <-r.transitions:
			if tl.Pod == pod && slices.Contains(states, tl.To) {
				return tl, nil
			}
		case <-r.agent.Done():
			return transitionLine{}, fmt.Errorf("node-mode bench: the agent exited: %v (%s)", r.agent.Err(), proc.LogTail(r.agentLog, 2000))
		case <-deadline:
			return transitionLine{}, fmt.Errorf("node-mode bench: no %v transition of %s within %v (agent log %s)", states, pod, timeout, r.agentLog)
		case <-ctx.Done():
			return transitionLine{}, ctx.Err()
		}
	}
}

// drain drops the transitions seen so far, so the next await sees only
// what follows.
func (r *nodeRig) drain() {
	for {
		select {
		case <-r.transitions:
		default:
			return
		}
	}
}

// restart replaces p's ended broker container as the kubelet would: a new
// container (new ID, new cgroup, a new process) and the pod status saying
// so, which is how the agent learns of it.
func (r *nodeRig) restart(ctx context.Context, p *nodeModePod) error {
	if err := r.root.removeContainer(p); err != nil {
		return err
	}
	if err := r.root.addContainer(p, r.start); err != nil {
		return err
	}
	p.restarts++
	return markRunning(ctx, r.cs, []*nodeModePod{p})
}

// transitionLine is the part of the agent's "transition" log line the
// benchmarks read.
type transitionLine struct {
	Msg       string    `json:"msg"`
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	To        string    `json:"to"`
	Received  time.Time `json:"received"`
	Reason    string    `json:"reason"`
}

func parseTransition(line string) (transitionLine, bool) {
	var tl transitionLine
	if !strings.Contains(line, `"msg":"transition"`) || json.Unmarshal([]byte(line), &tl) != nil {
		return tl, false
	}
	return tl, tl.Msg == "transition"
}

const nodeModeNamespace = "bench"

// nodeModePod is one pod, its broker container's cgroup and its process.
type nodeModePod struct {
	pod              *corev1.Pod
	uid, containerID string
	proc             *proc.Proc
	restarts         int32
	podMade          bool // its pod cgroup exists
}

// benchCgroupRoot is a kubelet cgroup root of the benchmark's own in each
// v1 controller the readers use (or the v2 hierarchy), with the pods below
// it as the cgroupfs driver lays them out.
type benchCgroupRoot struct {
	name     string   // "amf-bench-<random>"
	bases    []string // the hierarchies' mount points
	dirs     []string // every directory made, in creation order
	pods     []*nodeModePod
	baseMade bool
	// memLimit, when not 0, is every container's memory limit in bytes.
	memLimit int64
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
		return nil, errors.New("bench: no cgroup v1 memory hierarchy nor cgroup v2 at /sys/fs/cgroup")
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
			return fmt.Errorf("bench cgroups: %w", err)
		}
		r.dirs = append(r.dirs, d)
		if len(r.bases) == 1 && !leaf {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu +io +memory"), 0o644); err != nil {
				return fmt.Errorf("bench cgroups: %w", err)
			}
		}
	}
	return nil
}

// containerRel is p's broker container's cgroup, relative to a hierarchy
// (burstable QoS, the pod named by its UID).
func (r *benchCgroupRoot) containerRel(p *nodeModePod) string {
	return filepath.Join(r.name, "kubepods", "burstable", "pod"+p.uid, p.containerID)
}

// memoryDir is p's container's directory in the memory hierarchy, and its
// file that holds the limit.
func (r *benchCgroupRoot) memoryDir(p *nodeModePod) (dir, limitFile string) {
	if len(r.bases) == 1 {
		return filepath.Join(r.bases[0], r.containerRel(p)), "memory.max"
	}
	for _, b := range r.bases {
		if strings.HasSuffix(b, "memory") {
			dir = filepath.Join(b, r.containerRel(p))
		}
	}
	return dir, "memory.limit_in_bytes"
}

// addContainer gives p a new broker container: a new ID, its cgroup (and
// the pod's, the first time), with the memory limit, and a process started
// by start and moved into it.
func (r *benchCgroupRoot) addContainer(p *nodeModePod, start containerProc) error {
	if !r.baseMade {
		for _, rel := range []string{r.name, filepath.Join(r.name, "kubepods"), filepath.Join(r.name, "kubepods", "burstable")} {
			if err := r.mkdir(rel, false); err != nil {
				return err
			}
		}
		r.baseMade = true
	}
	if !p.podMade {
		if err := r.mkdir(filepath.Join(r.name, "kubepods", "burstable", "pod"+p.uid), false); err != nil {
			return err
		}
		p.podMade = true
		r.pods = append(r.pods, p)
	}
	var b [32]byte
	if _, err := crand.Read(b[:]); err != nil {
		return err
	}
	p.containerID = hex.EncodeToString(b[:])
	if err := r.mkdir(r.containerRel(p), true); err != nil {
		return err
	}
	if r.memLimit > 0 {
		dir, file := r.memoryDir(p)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(r.memLimit, 10)), 0o644); err != nil {
			return fmt.Errorf("bench cgroups: memory limit: %w", err)
		}
	}
	var err error
	if p.proc, err = start(p); err != nil {
		return fmt.Errorf("bench: a pod's process: %w", err)
	}
	return r.moveInto(p, p.proc.PID())
}

// moveInto puts pid into p's container's cgroups, as the runtime starts a
// container's process in them.
func (r *benchCgroupRoot) moveInto(p *nodeModePod, pid int) error {
	for _, b := range r.bases {
		f := filepath.Join(b, r.containerRel(p), "cgroup.procs")
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("bench cgroups: %w", err)
		}
	}
	return nil
}

// removeContainer ends p's container's process and removes its cgroups, as
// the runtime does with an ended container.
func (r *benchCgroupRoot) removeContainer(p *nodeModePod) error {
	if p.proc != nil {
		p.proc.Kill()
	}
	var errs []error
	for _, b := range r.bases {
		d := filepath.Join(b, r.containerRel(p))
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// remove ends the processes and removes the cgroups, deepest first.
func (r *benchCgroupRoot) remove() error {
	for _, p := range r.pods {
		if p.proc != nil {
			p.proc.Kill()
		}
	}
	var errs []error
	for i := len(r.dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(r.dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", r.dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

// startHog starts the lab's load generator in p's container, allocating
// 256 MiB in its own RSS, past the container's limit: the kernel OOM-kills
// it (the container's largest process), and p's own process stays. limit,
// when not 0, is set first. A shell moves itself into the container's
// cgroups before it becomes the load generator, so nothing is charged
// elsewhere first.
func (r *benchCgroupRoot) startHog(p *nodeModePod, self string, limit int64) (*exec.Cmd, error) {
	if limit > 0 {
		dir, file := r.memoryDir(p)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
			return nil, fmt.Errorf("bench: memory limit: %w", err)
		}
	}
	args := []string{"-c", `for f in "$@"; do echo $$ > "$f" || exit 1; done; exec "$0" stress --profile 60s:mem=256Mi`, self}
	for _, b := range r.bases {
		args = append(args, filepath.Join(b, r.containerRel(p), "cgroup.procs"))
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start the load generator: %w", err)
	}
	return cmd, nil
}

// oomKills reads the oom_kill counter of p's memory cgroup (v1
// memory.oom_control, v2 memory.events), as the kernel counts its OOM kills.
func (r *benchCgroupRoot) oomKills(p *nodeModePod) (uint64, error) {
	dir, limitFile := r.memoryDir(p)
	file := "memory.events"
	if limitFile == "memory.limit_in_bytes" {
		file = "memory.oom_control"
	}
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: no oom_kill counter in %s (kernel older than 4.13?)", f.Name())
}

// oomKillWindow brackets the kernel's next OOM kill in p's container: it
// reads the counter every millisecond until it moves, and sends the last
// time it had not (the kill came after it: latencies timed from it are an
// upper bound) and the first time it had. The counter moves as the kernel
// picks the victim, before the victim ends, so a latency from the victim's
// reaping would be too short. Closed without a value when ctx ends.
func (r *benchCgroupRoot) oomKillWindow(ctx context.Context, p *nodeModePod) (<-chan [2]time.Time, error) {
	last, err := r.oomKills(p)
	if err != nil {
		return nil, err
	}
	ch := make(chan [2]time.Time, 1)
	go func() {
		defer close(ch)
		before := time.Now()
		for ctx.Err() == nil {
			n, err := r.oomKills(p)
			now := time.Now()
			if err != nil {
				return
			}
			if n > last {
				ch <- [2]time.Time{before, now}
				return
			}
			before = now
			time.Sleep(time.Millisecond)
		}
	}()
	return ch, nil
}

// benchNode is the Node name the benchmark's pods are bound to; no kubelet
// runs it: the pods' status is written by the benchmark.
const benchNode = "bench-node"

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
			RestartCount: p.restarts,
			State:        corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		}}}
		updated, err := cs.CoreV1().Pods(nodeModeNamespace).UpdateStatus(ctx, st, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		p.pod = updated
	}
	return nil
}

// timeOOMKill OOM-kills the load generator in p's container (startHog) and
// times the agent's unhealthy (awaited by unhealthy, which returns its
// received time and reason) from the last moment the kernel had not killed
// yet (oomKillWindow): an upper bound of the latency from the kill. It
// returns once the killed process is reaped.
func (r *benchCgroupRoot) timeOOMKill(ctx context.Context, p *nodeModePod, self string,
	unhealthy func() (received time.Time, reason string, err error)) (time.Duration, string, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	window, err := r.oomKillWindow(wctx, p)
	if err != nil {
		return 0, "", err
	}
	hog, err := r.startHog(p, self, 0)
	if err != nil {
		return 0, "", err
	}
	reaped := make(chan struct{})
	go func() { _ = hog.Wait(); close(reaped) }()
	defer func() {
		_ = hog.Process.Kill() // a no-op once it was reaped
		<-reaped
	}()
	received, reason, err := unhealthy()
	if err != nil {
		return 0, "", err
	}
	var w [2]time.Time
	select {
	case v, ok := <-window:
		if !ok {
			return 0, "", fmt.Errorf("bench: the agent has %s unhealthy (%s) but the kernel's OOM kill counter could not be read", p.pod.GetName(), reason)
		}
		w = v
	case <-time.After(30 * time.Second):
		return 0, "", fmt.Errorf("bench: the agent has %s unhealthy (%s) but the kernel counted no OOM kill within 30 s", p.pod.GetName(), reason)
	}
	select {
	case <-reaped:
	case <-time.After(30 * time.Second):
		return 0, "", fmt.Errorf("bench: the OOM-killed load generator in %s did not end within 30 s", p.pod.GetName())
	}
	return received.Sub(w[0]), reason, nil
}
