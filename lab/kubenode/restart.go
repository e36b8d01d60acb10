package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Daemons a node runs and RestartDaemon can restart.
const (
	Containerd = "containerd"
	Kubelet    = "kubelet"
	KubeProxy  = "kube-proxy"
)

// Where the node's daemons answer health checks, inside its network
// namespace (config.go binds them there).
const (
	kubeletHealthz   = "127.0.0.1:10248"
	kubeProxyHealthz = "127.0.0.1:10256"
)

// RestartDaemon stops one of the node's daemons (Containerd, Kubelet or
// KubeProxy) with sig — SIGKILL for a crash, SIGTERM for an orderly stop —
// waits until its process is gone, and starts it again as a service manager
// would: the same arguments, in the node's namespaces and cgroups (the new
// process joins /<Cgroup>/system before it execs, so the janitor still tears
// it down). Pods keep running meanwhile, as on a real node: their shims do
// not belong to containerd's process.
//
// It returns once the daemon is back: containerd answers its API on its
// socket (ctr version); the kubelet's healthz says ok and it knows every pod
// the API server binds to the node (its healthz is ok a second or so before
// it has read them, and until then it answers an exec or a log request
// with "pod does not exist"); kube-proxy's healthz says ok. If the daemon
// exits again before that, the error says so with its log's end.
func (n *Node) RestartDaemon(ctx context.Context, name string, sig syscall.Signal) error {
	if _, ok := daemonUp(n)[name]; !ok {
		return fmt.Errorf("kubenode %s: no daemon %q to restart: restart %s, %s or %s", n.Name, name, Containerd, Kubelet, KubeProxy)
	}
	// One restart at a time per node: two would race for the same slot in
	// n.daemons and start the daemon twice.
	n.restartMu.Lock()
	defer n.restartMu.Unlock()
	if err := n.stopDaemon(ctx, name, sig); err != nil {
		return err
	}
	return n.startAgain(ctx, name)
}

// DaemonPID returns the host PID of one of the node's daemons (Containerd,
// Kubelet, KubeProxy), or 0 if the node has none of that name.
func (n *Node) DaemonPID(name string) int {
	if d := n.daemon(name); d != nil {
		return d.cmd.Process.Pid
	}
	return 0
}

// kubeletUp checks that the kubelet is healthy and serves its pods: the pods
// it lists (GET /pods, through the API server's node proxy, as kubectl get
// --raw does) include every pod bound to the node in the API server.
func (n *Node) kubeletUp(ctx context.Context) error {
	if err := n.healthz(ctx, kubeletHealthz); err != nil {
		return err
	}
	c := n.cfg.ControlPlane.Client()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	bound, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return fmt.Errorf("list the node's pods: %w", err)
	}
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "pods").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("the kubelet's /pods: %w", err)
	}
	var known corev1.PodList
	if err := json.Unmarshal(raw, &known); err != nil {
		return fmt.Errorf("the kubelet's /pods: %w", err)
	}
	has := map[types.UID]bool{}
	for _, p := range known.Items {
		has[p.UID] = true
	}
	var missing []string
	for _, p := range bound.Items {
		if !has[p.UID] {
			missing = append(missing, p.Namespace+"/"+p.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the kubelet does not know pods %s yet", strings.Join(missing, ", "))
	}
	return nil
}

// containerdUp checks that containerd serves its API (a gRPC round trip,
// not only a socket that accepts: the socket file outlives a killed
// containerd, and containerd listens only after its plugins are loaded).
func (n *Node) containerdUp(ctx context.Context) error {
	c, err := net.DialTimeout("unix", n.Socket, time.Second)
	if err != nil {
		return err
	}
	c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := n.Ctr(ctx, "version")
	if err != nil {
		return err
	}
	if !strings.Contains(string(out), "Server:") {
		return fmt.Errorf("ctr version shows no server: %s", out)
	}
	return nil
}

// healthz GETs http://addr/healthz inside the node's network namespace and
// wants 200.
func (n *Node) healthz(ctx context.Context, addr string) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return DialIn(ctx, n.NetNS, addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/healthz: %s", addr, resp.Status)
	}
	return nil
}
