package experiment

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/probe"
	"github.com/amf-edge/amf/lab/testbed"
)

// NodeName is the real node's name.
const NodeName = "amf-edge-node"

// stressPath is the injector inside the lab's Mosquitto image.
const stressPath = images.LabBinary

// env is what every run shares: control plane, the real node, remote brokers, probe.
type env struct {
	cfg      *Config
	dir      string
	cp       *controlplane.ControlPlane
	client   kubernetes.Interface
	node     *kubenode.Node
	rds, obu *testbed.Broker
	probe    *probe.Probe
	agent    *testbed.AgentPod // the DaemonSet's pod, as the current mode runs it
	// podDir holds what the pods must read from the host (a model file):
	// under the system's temporary folder, not the results folder, whose
	// parents may be private (e.g. /root).
	podDir    string
	model     sidecarModel
	keepState bool
}

func setup(ctx context.Context, cfg *Config) (_ *env, err error) {
	e := &env{cfg: cfg, dir: cfg.Work}
	if e.dir == "" {
		e.dir = filepath.Join(cfg.Out, "work")
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	e.progress("building the images (pause, Mosquitto from Debian, amf-sidecar, amf-agent, amf-lab; cached)")
	imgs, err := images.Build(ctx, images.Options{ModuleDir: cfg.Repo, BinDir: filepath.Dir(cfg.Bin.Self)})
	if err != nil {
		return nil, err
	}
	e.progress("starting the Kubernetes control plane (etcd, kube-apiserver, controller manager, scheduler)")
	logf := func(f string, a ...any) { cfg.Log.Info(fmt.Sprintf(f, a...)) }
	e.cp, err = controlplane.Launch(ctx, e.dir, controlplane.Options{ServingIPs: kubenode.ServingIPs(), NoFakeNodes: true}, logf)
	if err != nil {
		return nil, err
	}
	e.client = e.cp.Client()

	e.progress("starting the node %q: containerd + kubelet + kube-proxy in a network namespace of its own", NodeName)
	archives := make([]string, len(imgs))
	for i, im := range imgs {
		archives[i] = im.Archive
	}
	nctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if e.node, err = kubenode.Launch(nctx, kubenode.Config{Name: NodeName, ControlPlane: e.cp, Images: archives, Log: logf}); err != nil {
		return nil, err
	}
	e.progress("node %s Ready: kubelet %s, %s", NodeName, e.node.KubeletVersion, e.node.RuntimeVersion)
	if e.podDir, err = os.MkdirTemp("", "amf-lab-pods-"); err != nil {
		return nil, err
	}
	if err := os.Chmod(e.podDir, 0o755); err != nil {
		return nil, err
	}

	e.progress("starting the RDS and OBU Mosquitto brokers (in the node's network) and the E2E probe (set/speed every 100 ms)")
	site := testbed.Site{NetNS: e.node.NetNS, IP: e.node.IP}
	if e.rds, err = testbed.StartMosquittoAt(ctx, e.dir, "rds-broker", cfg.Bin.Mosquitto, site); err != nil {
		return nil, err
	}
	if e.obu, err = testbed.StartMosquittoAt(ctx, e.dir, "obu-broker", cfg.Bin.Mosquitto, site); err != nil {
		return nil, err
	}
	if e.probe, err = probe.Start(ctx, probe.Config{PublishURL: e.rds.URL(), SubscribeURL: e.obu.URL()}); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	if e.agent != nil {
		e.agent.Stop()
	}
	if e.probe != nil {
		e.probe.Stop()
	}
	for _, b := range []*testbed.Broker{e.rds, e.obu} {
		if b != nil {
			b.Stop()
		}
	}
	if e.node != nil {
		if e.keepState {
			e.node.DumpLogs()
		}
		e.node.Stop()
	}
	if e.cp != nil {
		e.cp.Stop()
	}
	if e.podDir != "" {
		os.RemoveAll(e.podDir)
	}
}

// startAgent deploys the agent DaemonSet for a mode: acting (amf, healthy) or
// observing; debug logging, so that each signal is a line.
func (e *env) startAgent(ctx context.Context, m Mode) (*testbed.AgentPod, error) {
	if e.agent != nil {
		e.agent.Stop()
		e.agent = nil
	}
	extra := []string{"--log-level=debug"}
	if m == Observe {
		extra = append(extra, "--observe-only")
	}
	layout := "base"
	if m == AMFNode {
		layout = "overlays/node-mode"
	}
	e.progress("agent: kubectl apply -k manifests/%s, arguments %v, waiting for its pod", layout, extra)
	a, err := testbed.DeployAgentLayout(ctx, e.cp, e.cfg.Repo, layout, NodeName, extra)
	if err != nil {
		return nil, err
	}
	e.agent = a
	return a, nil
}

// edge describes the edge broker Deployments of a run in namespace ns. Each
// pod has its own network, so both brokers use 1883 and the sidecars 8086.
func (e *env) edge(ns string, _ *testbed.AgentPod) (testbed.Edge, error) {
	ed := testbed.Edge{Namespace: ns, Node: NodeName, RDS: e.rds.Addr, OBU: e.obu.Addr, Bridge: e.cfg.Bridge,
		BrokerPortA: 1883, BrokerPortB: 1883, Policy: e.cfg.Policy,
		SidecarModel: e.model.arg, BrokerImage: images.MosquittoRef}
	if e.model.file != "" {
		ed.ModelDir = filepath.Dir(e.model.arg)
		ed.SidecarModel = filepath.Join(testbed.ModelMount, filepath.Base(e.model.arg))
	}
	return ed, nil
}

// brokerURL is the MQTT URL of a pod's broker, from the host (the pod's IP is
// routed to the node).
func brokerURL(pod *corev1.Pod, port int) string {
	return "tcp://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))
}

// sidecarStatusClient reaches the sidecar's loopback-only health endpoint
// inside the pod's network namespace.
func (e *env) sidecarStatusClient(ctx context.Context, ns, pod string) (*http.Client, string, error) {
	pid, err := e.node.ContainerPID(ctx, ns, pod, inject.SidecarName)
	if err != nil {
		return nil, "", err
	}
	netns := fmt.Sprintf("/proc/%d/ns/net", pid)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return kubenode.DialIn(ctx, netns, addr)
	}}
	return &http.Client{Transport: tr, Timeout: 500 * time.Millisecond}, fmt.Sprintf("http://127.0.0.1:%d/status", inject.HealthPort), nil
}

// apply creates a namespace and the run's objects.
func (e *env) apply(ctx context.Context, ns string, objs testbed.Objects) error {
	_, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	for _, cm := range objs.ConfigMaps {
		if _, err := e.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ConfigMap %s/%s: %w", ns, cm.Name, err)
		}
	}
	for _, d := range objs.Deployments {
		if _, err := e.client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Deployment %s/%s: %w", ns, d.Name, err)
		}
	}
	return nil
}

// remove deletes a run's namespace and waits until its pods are gone (so the
// bridges' client IDs are free for the next run).
func (e *env) remove(ctx context.Context, ns string) error {
	err := e.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return e.waitPodsGone(ctx, ns, 2*time.Minute)
}
