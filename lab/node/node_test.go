package node

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/sidecar/cgroup"
)

// The test binary doubles as a container program (image "lab/helper").
const helperEnv = "AMF_LAB_NODE_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// helper is a container program:
//
//	serve [--file=F]... [--ready=R] : checks each F is readable, prints its
//	                      environment, creates R, waits for SIGTERM, exits 0
//	http PORT           : serves 200 on /healthz at 127.0.0.1:PORT until SIGTERM
//	findcontainer ROOT  : prints the container sidecar/cgroup.FindContainer picks for $POD_UID under ROOT
//	exit N              : exits N
func helper(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no mode")
		return 2
	}
	switch args[0] {
	case "serve":
		for _, a := range args[1:] {
			if f, ok := strings.CutPrefix(a, "--file="); ok {
				if _, err := os.ReadFile(f); err != nil {
					fmt.Fprintln(os.Stderr, "helper:", err)
					return 1
				}
				fmt.Println("readable", f)
			}
		}
		for _, kv := range os.Environ() {
			fmt.Println("env", kv)
		}
		for _, a := range args[1:] {
			if f, ok := strings.CutPrefix(a, "--ready="); ok {
				if err := os.WriteFile(f, nil, 0o644); err != nil {
					fmt.Fprintln(os.Stderr, "helper:", err)
					return 1
				}
			}
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		<-sig
		fmt.Println("SIGTERM")
		return 0
	case "http":
		l, err := net.Listen("tcp", "127.0.0.1:"+args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
		go func() { _ = http.Serve(l, mux) }()
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		<-sig
		return 0
	case "findcontainer":
		c, err := cgroup.FindContainer(cgroup.PodQuery{UID: os.Getenv("POD_UID")}, cgroup.WithCgroupRoot(args[1]))
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		fmt.Println(c.ID)
		return 0
	case "exit":
		n, _ := strconv.Atoi(args[1])
		return n
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", args[0])
	return 2
}

const nodeName = "amf-lab"

// labEnv is a control plane with a lab node.
type labEnv struct {
	cp     *controlplane.ControlPlane
	cs     kubernetes.Interface
	node   *Node
	events <-chan Event
	state  string
	helper string // the test binary, where every pod user can run it
	stop   func() // stops the node (cancels Run and waits)
}

// openDir makes a temporary directory that every user can traverse (the pods
// run as 1883 and 65532); t.TempDir makes its folders 0700.
func openDir(t *testing.T) string {
	d := t.TempDir()
	for p := d; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func startLab(ctx context.Context, t *testing.T) *labEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	if os.Geteuid() != 0 {
		t.Skip("the lab node needs root")
	}
	cp, err := controlplane.Start(ctx, t, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := openDir(t)
	helperPath := filepath.Join(dir, "bin", "node-helper")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := copyFile(self, helperPath); err != nil {
		t.Fatal(err)
	}
	e := &labEnv{cp: cp, cs: cp.Client(), state: filepath.Join(dir, "state"), helper: helperPath}
	e.startNode(ctx, t)
	return e
}

// startNode starts a lab node (again) on e's control plane.
func (e *labEnv) startNode(ctx context.Context, t *testing.T) {
	t.Helper()
	helperPath := e.helper
	cp := e.cp
	images := map[string]Image{
		"eclipse-mosquitto": {Entrypoint: []string{"/usr/sbin/mosquitto"}, Cmd: []string{"-c", "/mosquitto/config/mosquitto.conf"}},
		"lab/helper":        {Entrypoint: []string{helperPath}, Env: []string{helperEnv + "=1"}},
		"debian":            {Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"sleep infinity"}},
	}
	n, err := New(Config{
		Name: nodeName, Client: cp.Client(), Images: images, StateDir: e.state,
		Backoff: Backoff{Initial: 500 * time.Millisecond, Max: 2 * time.Second, Reset: time.Minute},
		Log:     slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: logLevel()})),
	})
	if err != nil {
		t.Skipf("lab node: %v", err)
	}
	events, unsubscribe := n.Subscribe()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(runCtx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Error("Run did not return 2 minutes after its context ended")
		}
		unsubscribe()
	}
	t.Cleanup(stop) // before the control plane stops (cleanups run last first)
	select {
	case <-n.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-ctx.Done():
		t.Fatal("the node did not become Ready")
	}
	e.node, e.events, e.stop = n, events, stop
}

// logLevel is the node's log level in tests: info, or $AMF_LAB_NODE_LOG
// (debug shows every status patch).
func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("AMF_LAB_NODE_LOG"))); err != nil {
		return slog.LevelInfo
	}
	return l
}

// testWriter sends the node's log to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func copyFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (e *labEnv) namespace(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cp.WaitServiceAccount(ctx, name, "default"); err != nil {
		t.Fatal(err)
	}
}

// waitPod watches the pods matching selector until cond holds for one.
func (e *labEnv) waitPod(ctx context.Context, t *testing.T, ns, selector, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(e.cs.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	var got *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if ok && ev.Type != watch.Deleted && cond(p) {
			got = p
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return got
}

// waitPodsGone watches until no pod matches selector.
func (e *labEnv) waitPodsGone(ctx context.Context, t *testing.T, ns, selector string) {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(e.cs.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	empty := func(store cache.Store) (bool, error) { return len(store.List()) == 0, nil }
	var store cache.Store
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(s cache.Store) (bool, error) {
		store = s
		return empty(s)
	}, func(watch.Event) (bool, error) { return empty(store) })
	if err != nil {
		t.Fatalf("waiting for the pods %s to go: %v", selector, err)
	}
}

// waitEvent reads node events until match, failing at ctx's end.
func (e *labEnv) waitEvent(ctx context.Context, t *testing.T, what string, match func(Event) bool) Event {
	t.Helper()
	for {
		select {
		case ev, ok := <-e.events:
			if !ok {
				t.Fatalf("waiting for %s: events closed", what)
			}
			if match(ev) {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func isTrue(p *corev1.Pod, typ corev1.PodConditionType) bool {
	c := condition(p, typ)
	return c != nil && c.Status == corev1.ConditionTrue
}

func containerStatusOf(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, l := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}

func running(p *corev1.Pod, name string) bool {
	cs := containerStatusOf(p, name)
	return cs != nil && cs.State.Running != nil
}

// cgroupDirs lists where cgroup hierarchy path p is, in every v1 hierarchy.
func (e *labEnv) cgroupDirs(p string) []string {
	var dirs []string
	for _, h := range e.node.cg.hs {
		dirs = append(dirs, h.dir(p))
	}
	return dirs
}

func (e *labEnv) assertCgroupGone(t *testing.T, p string) {
	t.Helper()
	for _, d := range e.cgroupDirs(p) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s is still there", d)
		}
	}
}

func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// A zombie waiting for its parent has state Z.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// sidecarMemory is the test sidecar's memory limit: the manifests' 48 Mi, or
// 1 GiB for the race-enabled test binary it runs.
var sidecarMemory = func() int64 {
	if raceEnabled {
		return 1 << 30
	}
	return 48 << 20
}()

func brokerResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("50Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("100Mi")},
	}
}

// TestLabNode runs the node on a real control plane: a broker Deployment in
// the shape of manifests/examples/broker-a.yaml (native sidecar, downward API,
// projected token, host cgroup mount, config map, readiness gate), then OOM
// kills with crash-loop back-off, failures to start, probes and restart
// policies, and a node shutdown.
func TestLabNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e := startLab(ctx, t)

	nd, err := e.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nd.Labels["kubernetes.io/hostname"] != nodeName || nd.Status.Addresses[0].Address != "127.0.0.1" || nd.Status.Allocatable.Pods().Value() != 110 {
		t.Errorf("node %+v %+v", nd.Labels, nd.Status)
	}
	if _, ok := nd.Annotations["kwok.x-k8s.io/node"]; ok {
		t.Error("the lab node carries kwok's annotation")
	}
	lease, err := e.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil || lease.Spec.RenewTime == nil || *lease.Spec.LeaseDurationSeconds != 40 {
		t.Errorf("lease %+v: %v", lease, err)
	}

	t.Run("broker", func(t *testing.T) { testBroker(ctx, t, e) })
	t.Run("oom", func(t *testing.T) { testOOM(ctx, t, e) })
	t.Run("failures", func(t *testing.T) { testFailures(ctx, t, e) })
	t.Run("shutdown", func(t *testing.T) { testShutdown(ctx, t, e) })
}

func testBroker(ctx context.Context, t *testing.T, e *labEnv) {
	const ns, name = "mqtt", "edge-broker-a"
	e.namespace(ctx, t, ns)
	port := freePort(t)
	conf := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stdout\n", port)
	if _, err := e.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"mosquitto.conf": conf},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbl := map[string]string{"app.kubernetes.io/instance": name}
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: lbl},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl},
				Spec: corev1.PodSpec{
					NodeSelector:                 map[string]string{"kubernetes.io/hostname": nodeName},
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					ReadinessGates:               []corev1.PodReadinessGate{{ConditionType: "amf.io/healthy"}},
					SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1883), RunAsGroup: ptr.To[int64](1883)},
					InitContainers: []corev1.Container{{
						Name: "amf-sidecar", Image: "lab/helper:v1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
						Args: []string{"serve", "--file=/var/run/secrets/amf/token", "--file=/host/sys/fs/cgroup/memory/memory.limit_in_bytes", "--ready=/run/amf/ready"},
						// Ready once it has written its log (an exec probe, path-rewritten too).
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/run/amf/ready"}}},
							PeriodSeconds: 1,
						},
						Env: []corev1.EnvVar{
							{Name: "POD_UID", ValueFrom: field("metadata.uid")},
							{Name: "POD_NAME", ValueFrom: field("metadata.name")},
							{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
							{Name: "NODE_IP", ValueFrom: field("status.hostIP")},
							{Name: "AMF_AGENT", Value: "tcp://$(NODE_IP):1884"},
							{Name: "TOKEN_FILE", Value: "/var/run/secrets/amf/token"},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: *resource.NewQuantity(sidecarMemory, resource.BinarySI)},
						},
						SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532)},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "amf-token", MountPath: "/var/run/secrets/amf", ReadOnly: true},
							{Name: "amf-host-cgroup", MountPath: "/host/sys/fs/cgroup", ReadOnly: true},
							{Name: "run", MountPath: "/run/amf"},
						},
					}},
					Containers: []corev1.Container{{
						Name: "mosquitto", Image: "eclipse-mosquitto:2.0.20",
						Ports:     []corev1.ContainerPort{{Name: "mqtt", ContainerPort: int32(port)}},
						Resources: brokerResources(),
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("mqtt")}},
							PeriodSeconds: 1,
						},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "config", MountPath: "/mosquitto/config", ReadOnly: true},
							{Name: "data", MountPath: "/mosquitto/data"},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}},
						{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "amf-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
							ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "amf-agent", ExpirationSeconds: ptr.To[int64](3600), Path: "token"},
						}}}}},
						{Name: "amf-host-cgroup", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/cgroup", Type: ptr.To(corev1.HostPathDirectory)}}},
					},
				},
			},
		},
	}
	deps := e.cs.AppsV1().Deployments(ns)
	if _, err := deps.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sel := labels.SelectorFromSet(lbl).String()

	// Containers ready; the pod waits for its readiness gate.
	pod := e.waitPod(ctx, t, ns, sel, "broker ready, gate pending", func(p *corev1.Pod) bool {
		return isTrue(p, corev1.ContainersReady) && condition(p, corev1.PodReady) != nil
	})
	if r := condition(pod, corev1.PodReady); r.Status != corev1.ConditionFalse || r.Reason != "ReadinessGatesNotReady" {
		t.Errorf("Ready before the gate: %+v", r)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP != "127.0.0.1" || pod.Status.HostIP != "127.0.0.1" || pod.Status.StartTime == nil {
		t.Errorf("status %s podIP %q hostIP %q start %v", pod.Status.Phase, pod.Status.PodIP, pod.Status.HostIP, pod.Status.StartTime)
	}
	for _, c := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodScheduled} {
		if !isTrue(pod, c) {
			t.Errorf("condition %s: %+v", c, condition(pod, c))
		}
	}
	side, broker := containerStatusOf(pod, "amf-sidecar"), containerStatusOf(pod, "mosquitto")
	if side == nil || side.State.Running == nil || !side.Ready || !*side.Started || !strings.HasPrefix(side.ContainerID, "lab://") {
		t.Fatalf("sidecar status %+v", side)
	}
	if broker == nil || broker.State.Running == nil || !broker.Ready || broker.RestartCount != 0 || broker.Image != "eclipse-mosquitto:2.0.20" {
		t.Fatalf("broker status %+v", broker)
	}
	if side.State.Running.StartedAt.After(broker.State.Running.StartedAt.Time) {
		t.Error("the native sidecar started after the broker")
	}
	var d appsv1.Deployment
	if got, err := deps.Get(ctx, name, metav1.GetOptions{}); err != nil || got.Status.ReadyReplicas != 0 {
		t.Errorf("readyReplicas before the gate: %+v %v", got.Status, err)
	}

	// The broker is a real Mosquitto on the configured port, started through
	// path rewriting of -c /mosquitto/config/mosquitto.conf.
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(fmt.Sprintf("tcp://127.0.0.1:%d", port)).SetClientID("lab-test").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Errorf("MQTT connect: %v", tok.Error())
	} else {
		c.Disconnect(100)
	}

	// Its cgroup, limits, user.
	brokerCg, err := e.node.ContainerCgroup(ns, pod.Name, "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	brokerID := strings.TrimPrefix(broker.ContainerID, "lab://")
	sideID := strings.TrimPrefix(side.ContainerID, "lab://")
	if want := "/kubepods/burstable/pod" + string(pod.UID) + "/" + brokerID; brokerCg != want || len(brokerID) != 64 {
		t.Errorf("broker cgroup %s, want %s", brokerCg, want)
	}
	memDir := e.node.cg.memory.dir(brokerCg)
	if b, _ := os.ReadFile(filepath.Join(memDir, "memory.limit_in_bytes")); strings.TrimSpace(string(b)) != strconv.Itoa(100<<20) {
		t.Errorf("broker memory limit %q", b)
	}
	pids, _ := e.node.cg.procs(brokerCg)
	if len(pids) != 1 {
		t.Fatalf("broker cgroup processes %v", pids)
	}
	brokerPID := pids[0]
	if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", brokerPID)); !bytes.Contains(st, []byte("\nUid:\t1883\t")) {
		t.Errorf("broker not running as 1883:\n%s", st)
	}
	pdir := e.node.cg.memory.dir(filepath.Dir(brokerCg))
	if b, _ := os.ReadFile(filepath.Join(pdir, "memory.limit_in_bytes")); strings.TrimSpace(string(b)) != strconv.FormatInt(100<<20+sidecarMemory, 10) {
		t.Errorf("pod memory limit %q", b)
	}

	// The sidecar got its environment, its token (audience amf-agent, bound
	// to the pod) and the host cgroup tree, through path rewriting.
	p, err := e.node.findPod(ns, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	log0, err := os.ReadFile(filepath.Join(p.dir, "amf-sidecar", "0.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"env AMF_AGENT=tcp://127.0.0.1:1884", "env POD_UID=" + string(pod.UID), "env POD_NAME=" + pod.Name,
		"env POD_NAMESPACE=" + ns, "env TOKEN_FILE=" + filepath.Join(p.dir, "volumes", "amf-token", "token"),
		"readable /sys/fs/cgroup/memory/memory.limit_in_bytes", "env HOSTNAME=" + pod.Name,
	} {
		if !bytes.Contains(log0, []byte(want+"\n")) {
			t.Errorf("sidecar log lacks %q:\n%s", want, log0)
		}
	}
	tok, err := os.ReadFile(filepath.Join(p.dir, "volumes", "amf-token", "token"))
	if err != nil {
		t.Fatal(err)
	}
	claims := jwtClaims(t, string(tok))
	if aud, _ := json.Marshal(claims["aud"]); string(aud) != `["amf-agent"]` {
		t.Errorf("token audience %s", aud)
	}
	if k8s, ok := claims["kubernetes.io"].(map[string]any); !ok || k8s["pod"].(map[string]any)["uid"] != string(pod.UID) {
		t.Errorf("token not bound to the pod: %v", claims["kubernetes.io"])
	}

	// The sidecar's own discovery, run inside the sidecar container, finds
	// the broker: it excludes itself by /proc/self/cgroup, there is no pause.
	var out, errb bytes.Buffer
	cmd, err := e.node.Exec(ctx, ns, pod.Name, "amf-sidecar", []string{e.helper, "findcontainer", "/host/sys/fs/cgroup"}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("findcontainer in the sidecar: %v: %s", err, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != brokerID {
		t.Errorf("FindContainer from the sidecar chose %s, want the broker %s", got, brokerID)
	}
	if got, err := cgroup.FindContainer(cgroup.PodQuery{UID: string(pod.UID), Exclude: []string{sideID}}); err != nil || got.ID != brokerID || got.Path != brokerCg {
		t.Errorf("FindContainer excluding the sidecar: %+v %v", got, err)
	}

	// The readiness gate: the pod becomes Ready when the agent's condition
	// is True, and the Deployment counts it (the real controller manager).
	gate := fmt.Sprintf(`{"status":{"conditions":[{"type":"amf.io/healthy","status":"True","reason":"Healthy","lastTransitionTime":%q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := e.cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(gate), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	e.waitDeployment(ctx, t, ns, name, func(d *appsv1.Deployment) bool { return d.Status.ReadyReplicas == 1 })
	pod, err = e.cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !isTrue(pod, corev1.PodReady) || !isTrue(pod, "amf.io/healthy") {
		t.Errorf("conditions after the gate: %+v", pod.Status.Conditions)
	}
	_ = d

	// An Exec'd process (a fault injector) runs in the broker's cgroup.
	inj, err := e.node.Exec(ctx, ns, pod.Name, "mosquitto", []string{"sleep", "1000"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	injDone := make(chan error, 1)
	go func() { injDone <- inj.Wait() }()
	if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", inj.Process.Pid)); !bytes.Contains(b, []byte(":memory:"+brokerCg+"\n")) {
		t.Errorf("exec'd process not in the broker's cgroup:\n%s", b)
	}

	// Scale to 0: the broker gets SIGTERM before the sidecar, everything in
	// the pod's cgroups dies, the cgroups go and so does the pod.
	scale, err := deps.GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 0
	if _, err := deps.UpdateScale(ctx, name, scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stopped := map[string]Event{}
	for len(stopped) < 2 {
		ev := e.waitEvent(ctx, t, "both containers stopped", func(ev Event) bool { return ev.Type == EventStopped && ev.UID == pod.UID })
		stopped[ev.Container] = ev
	}
	if !stopped["amf-sidecar"].Time.After(stopped["mosquitto"].Time) {
		t.Errorf("the sidecar stopped before the broker: %v, %v", stopped["amf-sidecar"].Time, stopped["mosquitto"].Time)
	}
	if ev := stopped["mosquitto"]; ev.ExitCode != 0 || ev.Reason != reasonCompleted {
		t.Errorf("broker stop: %+v", ev)
	}
	e.waitPodsGone(ctx, t, ns, sel)
	select {
	case err := <-injDone:
		if ws, ok := inj.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("exec'd process ended with %v, want SIGKILL", err)
		}
	case <-ctx.Done():
		t.Fatal("the exec'd process outlived its pod")
	}
	if !processGone(brokerPID) {
		t.Errorf("broker %d still running", brokerPID)
	}
	e.assertCgroupGone(t, "/kubepods/burstable/pod"+string(pod.UID))
	if log1, err := os.ReadFile(filepath.Join(p.dir, "amf-sidecar", "0.log")); err != nil || !bytes.HasSuffix(log1, []byte("SIGTERM\n")) {
		t.Errorf("the sidecar did not end on SIGTERM: %v\n%s", err, log1)
	}
}

func (e *labEnv) waitDeployment(ctx context.Context, t *testing.T, ns, name string, cond func(*appsv1.Deployment) bool) {
	t.Helper()
	lw := cache.NewListWatchFromClient(e.cs.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", name))
	_, err := watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		return ok && cond(d), nil
	})
	if err != nil {
		t.Fatalf("waiting for deployment %s: %v", name, err)
	}
}

// jwtClaims decodes a JWT's claims (no verification: the API server made it).
func jwtClaims(t *testing.T, tok string) map[string]any {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(tok), ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT (%d parts)", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// testOOM: a container that allocates beyond its limit is OOM-killed as a
// whole (its shell survives the kernel's kill, not the node's), restarted at
// once, then with back-off; the status says OOMKilled and CrashLoopBackOff.
func testOOM(ctx context.Context, t *testing.T, e *labEnv) {
	const ns, name = "oom", "hog"
	e.namespace(ctx, t, ns)
	lbl := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: lbl},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl},
				Spec: corev1.PodSpec{
					NodeName: nodeName,
					Containers: []corev1.Container{{
						Name: "hog", Image: "debian:12",
						// tail keeps a line without end in memory; the kernel kills
						// it, the shell would go on sleeping without oom.group.
						Args: []string{"head -c 500000000 /dev/zero | tail; sleep 1000"},
						Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
						},
					}},
				},
			},
		},
	}
	if _, err := e.cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var delays []time.Duration
	var exits []Event
	for len(exits) < 4 || len(delays) < 3 {
		ev := e.waitEvent(ctx, t, "OOM kills", func(ev Event) bool { return ev.Namespace == ns })
		switch ev.Type {
		case EventExited:
			if ev.Reason != reasonOOMKilled || ev.ExitCode != 137 {
				t.Errorf("exit %+v, want OOMKilled 137", ev)
			}
			exits = append(exits, ev)
		case EventBackOff:
			delays = append(delays, ev.Delay)
		}
	}
	if want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}; fmt.Sprint(delays[:3]) != fmt.Sprint(want) {
		t.Errorf("back-off delays %v, want %v (the first restart at once)", delays, want)
	}
	pod := e.waitPod(ctx, t, ns, "app="+name, "OOMKilled in the status, CrashLoopBackOff", func(p *corev1.Pod) bool {
		cs := containerStatusOf(p, "hog")
		return cs != nil && cs.RestartCount >= 2 && cs.State.Waiting != nil && cs.State.Waiting.Reason == reasonCrashLoopBackOff &&
			cs.LastTerminationState.Terminated != nil && cs.LastTerminationState.Terminated.Reason == reasonOOMKilled &&
			cs.LastTerminationState.Terminated.ExitCode == 137
	})
	if pod.Status.Phase != corev1.PodRunning || isTrue(pod, corev1.PodReady) {
		t.Errorf("crash-looping pod: phase %s, Ready %v", pod.Status.Phase, condition(pod, corev1.PodReady))
	}
	if err := e.cs.AppsV1().Deployments(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	e.waitPodsGone(ctx, t, ns, "app="+name)
	e.assertCgroupGone(t, "/kubepods/burstable/pod"+string(pod.UID))
}

// testFailures: an unmapped image, a missing program, a missing ConfigMap
// key, a failing liveness probe, restartPolicy Never and OnFailure, an init
// container.
func testFailures(ctx context.Context, t *testing.T, e *labEnv) {
	const ns = "failures"
	e.namespace(ctx, t, ns)
	mk := func(name string, restart corev1.RestartPolicy, c corev1.Container, init ...corev1.Container) *corev1.Pod {
		c.Name = "main"
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"test": name}},
			Spec:       corev1.PodSpec{NodeName: nodeName, RestartPolicy: restart, Containers: []corev1.Container{c}, InitContainers: init, TerminationGracePeriodSeconds: ptr.To[int64](5)},
		}
		got, err := e.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	waiting := func(reason string) func(*corev1.Pod) bool {
		return func(p *corev1.Pod) bool {
			cs := containerStatusOf(p, "main")
			return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == reason
		}
	}
	mk("unmapped", corev1.RestartPolicyAlways, corev1.Container{Image: "ghcr.io/amf-edge/amf-agent:v0.1.0"})
	mk("noprogram", corev1.RestartPolicyAlways, corev1.Container{Image: "debian:12", Command: []string{"/nonexistent/program"}})
	mk("nokey", corev1.RestartPolicyAlways, corev1.Container{Image: "debian:12", Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
		ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k"}}}}})
	mk("liveness", corev1.RestartPolicyAlways, corev1.Container{Image: "debian:12", LivenessProbe: &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/nonexistent"}}}, PeriodSeconds: 1, FailureThreshold: 1,
	}})
	port := freePort(t)
	mk("http", corev1.RestartPolicyAlways, corev1.Container{Image: "lab/helper", Args: []string{"http", strconv.Itoa(port)},
		Ports: []corev1.ContainerPort{{Name: "health", ContainerPort: int32(port)}},
		StartupProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(int32(port))}},
			PeriodSeconds: 1, FailureThreshold: 30},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}},
			PeriodSeconds: 1, SuccessThreshold: 2},
	})
	mk("startup", corev1.RestartPolicyAlways, corev1.Container{Image: "debian:12", StartupProbe: &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(freePort(t)))}}, PeriodSeconds: 1, FailureThreshold: 2,
	}})
	never := mk("never", corev1.RestartPolicyNever, corev1.Container{Image: "lab/helper", Args: []string{"exit", "3"}})
	mk("onfailure", corev1.RestartPolicyOnFailure, corev1.Container{Image: "lab/helper", Args: []string{"exit", "0"}},
		corev1.Container{Name: "init", Image: "lab/helper", Args: []string{"exit", "0"}})

	p := e.waitPod(ctx, t, ns, "test=unmapped", "ErrImagePull", waiting(reasonErrImagePull))
	if msg := containerStatusOf(p, "main").State.Waiting.Message; !strings.Contains(msg, "ghcr.io/amf-edge/amf-agent") || !strings.Contains(msg, "Config.Images") {
		t.Errorf("ErrImagePull message %q", msg)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s", p.Status.Phase)
	}
	p = e.waitPod(ctx, t, ns, "test=noprogram", "CreateContainerError", waiting(reasonCreateContainerErr))
	if msg := containerStatusOf(p, "main").State.Waiting.Message; !strings.Contains(msg, "/nonexistent/program") {
		t.Errorf("CreateContainerError message %q", msg)
	}
	p = e.waitPod(ctx, t, ns, "test=nokey", "CreateContainerConfigError", waiting(reasonCreateConfigError))
	if msg := containerStatusOf(p, "main").State.Waiting.Message; !strings.Contains(msg, "absent") {
		t.Errorf("CreateContainerConfigError message %q", msg)
	}
	ev := e.waitEvent(ctx, t, "liveness kill", func(ev Event) bool { return ev.Pod == "liveness" && ev.Type == EventExited })
	if ev.Message != "liveness probe failed" || ev.Signal != syscall.SIGTERM || ev.ExitCode != 143 {
		t.Errorf("liveness exit %+v", ev)
	}
	e.waitPod(ctx, t, ns, "test=liveness", "restart after liveness failures", func(p *corev1.Pod) bool {
		cs := containerStatusOf(p, "main")
		return cs != nil && cs.RestartCount >= 1
	})
	p = e.waitPod(ctx, t, ns, "test=http", "Ready by HTTP probes", func(p *corev1.Pod) bool { return isTrue(p, corev1.PodReady) })
	if cs := containerStatusOf(p, "main"); !*cs.Started || cs.RestartCount != 0 {
		t.Errorf("http: %+v", cs)
	}
	ev = e.waitEvent(ctx, t, "startup probe kill", func(ev Event) bool { return ev.Pod == "startup" && ev.Type == EventExited })
	if ev.Message != "startup probe failed" {
		t.Errorf("startup exit %+v", ev)
	}
	e.waitPod(ctx, t, ns, "test=startup", "restarted, never started", func(p *corev1.Pod) bool {
		cs := containerStatusOf(p, "main")
		return cs != nil && cs.RestartCount >= 1 && cs.Started != nil && !*cs.Started
	})
	// Failed, then cleaned up (no longer ReadyToStartContainers).
	p = e.waitPod(ctx, t, ns, "test=never", "Failed and cleaned up", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed && condition(p, corev1.PodReadyToStartContainers).Status == corev1.ConditionFalse
	})
	if term := containerStatusOf(p, "main").State.Terminated; term == nil || term.ExitCode != 3 || term.Reason != reasonError {
		t.Errorf("never: %+v", containerStatusOf(p, "main").State)
	}
	e.assertCgroupGone(t, "/kubepods/besteffort/pod"+string(never.UID))
	p = e.waitPod(ctx, t, ns, "test=onfailure", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if init := containerStatusOf(p, "init"); init == nil || init.State.Terminated == nil || init.State.Terminated.Reason != reasonCompleted || !isTrue(p, corev1.PodInitialized) {
		t.Errorf("init container %+v", init)
	}

	if err := e.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodsGone(ctx, t, ns, "")
}

// testShutdown: when Run's context ends, the containers stop and their
// cgroups go, but the pod stays in the API.
func testShutdown(ctx context.Context, t *testing.T, e *labEnv) {
	const ns = "shutdown"
	e.namespace(ctx, t, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Labels: map[string]string{"test": "shutdown"}},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Image: "debian:12", Resources: brokerResources()}}},
	}
	pod, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitPod(ctx, t, ns, "test=shutdown", "running", func(p *corev1.Pod) bool { return running(p, "main") })
	cgp, err := e.node.ContainerCgroup(ns, pod.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	pids, _ := e.node.cg.procs(cgp)
	e.stop()
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("process %d survived the node", pid)
		}
	}
	e.assertCgroupGone(t, filepath.Dir(cgp))
	if _, err := e.cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Error("the node deleted its pod on shutdown")
	}
	if n := e.node.EventsDropped(); n > 0 {
		t.Errorf("%d events dropped", n)
	}

	// A new node of the same name takes the Node and the pod over, with a
	// new container, and deletes the pod when asked.
	old := containerStatusOf(e.waitPod(ctx, t, ns, "test=shutdown", "pod", func(*corev1.Pod) bool { return true }), "main").ContainerID
	e.startNode(ctx, t)
	p := e.waitPod(ctx, t, ns, "test=shutdown", "running again", func(p *corev1.Pod) bool {
		return running(p, "main") && containerStatusOf(p, "main").ContainerID != old
	})
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodsGone(ctx, t, ns, "test=shutdown")
	e.assertCgroupGone(t, filepath.Dir(cgp))
}
