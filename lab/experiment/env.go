package experiment

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/node"
	"github.com/amf-edge/amf/lab/probe"
	"github.com/amf-edge/amf/lab/proc"
	"github.com/amf-edge/amf/lab/testbed"
)

// NodeName is the lab node's name.
const NodeName = "amf-lab"

// env is what every run shares: control plane, lab node, remote brokers, probe.
type env struct {
	cfg      *Config
	dir      string
	cp       *controlplane.ControlPlane
	client   kubernetes.Interface
	node     *node.Node
	nodeDone chan error
	stopNode context.CancelFunc
	rds, obu *testbed.Broker
	probe    *probe.Probe
	agentCfg string // the agent's kubeconfig
	// podDir holds what the pods' users (1883, 65532) must reach: the node's
	// state (volumes, container logs) and copies of the programs they run.
	// It is under the system's temporary folder, not the results folder,
	// whose parents may be private (e.g. /root).
	podDir    string
	stress    string // amf-lab, as the fault injector runs it inside the container
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
	e.progress("starting the Kubernetes control plane (etcd, kube-apiserver, controller manager, scheduler)")
	e.cp, err = controlplane.Launch(ctx, e.dir, controlplane.Options{}, func(f string, a ...any) { cfg.Log.Info(fmt.Sprintf(f, a...)) })
	if err != nil {
		return nil, err
	}
	e.client = e.cp.Client()

	e.progress("starting the lab node %q (pods run as local processes in cgroups)", NodeName)
	if e.podDir, err = os.MkdirTemp("", "amf-lab-pods-"); err != nil {
		return nil, err
	}
	if err := os.Chmod(e.podDir, 0o755); err != nil {
		return nil, err
	}
	sidecar := filepath.Join(e.podDir, "bin", "amf-sidecar")
	e.stress = filepath.Join(e.podDir, "bin", "amf-lab")
	if err := copyProgram(cfg.Bin.Sidecar, sidecar); err != nil {
		return nil, err
	}
	if err := copyProgram(cfg.Bin.Self, e.stress); err != nil {
		return nil, err
	}
	e.node, err = node.New(node.Config{
		Name:     NodeName,
		Client:   e.client,
		StateDir: filepath.Join(e.podDir, "state"),
		Images: map[string]node.Image{
			"eclipse-mosquitto":            {Entrypoint: []string{cfg.Bin.Mosquitto}, Cmd: []string{"-c", testbed.MosquittoConfigDir + "/mosquitto.conf"}},
			"ghcr.io/amf-edge/amf-sidecar": {Entrypoint: []string{sidecar}},
		},
		Log: cfg.Log.With("component", "lab-node"),
	})
	if err != nil {
		return nil, err
	}
	nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.stopNode, e.nodeDone = cancel, make(chan error, 1)
	go func() { e.nodeDone <- e.node.Run(nctx) }()
	select {
	case <-e.node.Ready():
	case err := <-e.nodeDone:
		e.nodeDone <- err
		return nil, fmt.Errorf("lab node: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	e.progress("starting the RDS and OBU Mosquitto brokers and the E2E probe (set/speed every 100 ms)")
	if e.rds, err = testbed.StartMosquitto(ctx, e.dir, "rds-broker", cfg.Bin.Mosquitto); err != nil {
		return nil, err
	}
	if e.obu, err = testbed.StartMosquitto(ctx, e.dir, "obu-broker", cfg.Bin.Mosquitto); err != nil {
		return nil, err
	}
	if e.probe, err = probe.Start(ctx, probe.Config{PublishURL: e.rds.URL(), SubscribeURL: e.obu.URL()}); err != nil {
		return nil, err
	}
	e.agentCfg = filepath.Join(e.dir, "amf-agent.kubeconfig")
	if err := testbed.ApplyAgentRBAC(ctx, e.cp, cfg.Repo, e.agentCfg); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	if e.probe != nil {
		e.probe.Stop()
	}
	if e.stopNode != nil {
		e.stopNode()
		select {
		case <-e.nodeDone:
		case <-time.After(time.Minute):
		}
	}
	for _, b := range []*testbed.Broker{e.rds, e.obu} {
		if b != nil {
			b.Stop()
		}
	}
	if e.cp != nil {
		e.cp.Stop()
	}
	if e.podDir != "" {
		if e.keepState {
			e.progress("pod state and container logs kept in %s", e.podDir)
		} else {
			os.RemoveAll(e.podDir)
		}
	}
}

// copyProgram copies an executable to dst (mode 0755), creating its folder.
func copyProgram(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// startAgent starts the agent for a mode: acting (amf, healthy) or observing.
func (e *env) startAgent(ctx context.Context, m Mode) (*testbed.Agent, error) {
	return testbed.StartAgent(ctx, testbed.AgentOptions{
		Bin: e.cfg.Bin.Agent, Kubeconfig: e.agentCfg, Node: NodeName, Actuate: true, ObserveOnly: m == Observe,
		LogPath: filepath.Join(e.dir, fmt.Sprintf("amf-agent-%s.log", m)),
	})
}

// edge describes the edge broker Deployments of a run in namespace ns.
func (e *env) edge(ns string, agent *testbed.Agent) (testbed.Edge, error) {
	ports := make([]int, 4)
	for i := range ports {
		addr, err := proc.FreeAddr()
		if err != nil {
			return testbed.Edge{}, err
		}
		var p int
		if _, err := fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &p); err != nil {
			return testbed.Edge{}, err
		}
		ports[i] = p
	}
	ed := testbed.Edge{Namespace: ns, Node: NodeName, RDS: e.rds.Addr, OBU: e.obu.Addr, Bridge: e.cfg.Bridge,
		BrokerPortA: ports[0], BrokerPortB: ports[1], HealthPortA: ports[2], HealthPortB: ports[3], Policy: e.cfg.Policy,
		SidecarModel: e.model.arg}
	if agent != nil {
		ed.AgentAddr = agent.Addr
	}
	return ed, nil
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

// remove deletes a run's namespace and waits until its pods are gone (their
// processes stopped, so ports and bridge client IDs are free for the next run).
func (e *env) remove(ctx context.Context, ns string) error {
	err := e.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return e.waitPodsGone(ctx, ns, 2*time.Minute)
}
