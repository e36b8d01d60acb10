package kubenode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// inNS runs a command in the network namespace at nsPath and returns its output.
func inNS(t *testing.T, nsPath string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + nsPath, "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), nsPath, err, out)
	}
	return string(out)
}

// TestClusterNodesShareALANAndNothingElse: three real nodes on one LAN, each
// in namespaces and a cgroup root of its own, with every daemon in the
// node's freezer cgroup: a pod on each node is reachable from the host, from
// the other nodes and from pods elsewhere (across the LAN), the API server's
// ClusterIP works from every node (through the LAN's gateway), and every
// namespace the lab made (each node's, the LAN's) has a dead-end default route.
func TestClusterNodesShareALANAndNothingElse(t *testing.T) {
	cp, cl := kubenodetest.StartCluster(t, 3, kubenodetest.Options{})
	c := cp.Client()
	ctx := context.Background()
	if len(cl.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(cl.Nodes))
	}
	podIP := map[string]string{}
	for _, n := range cl.Nodes {
		p := pod("broker-"+n.Name, n.Name, images.MosquittoRef, nil)
		if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range cl.Nodes {
		got := waitPod(t, c, "broker-"+n.Name, time.Minute, "running", running)
		podIP[n.Name] = got.Status.PodIP
		_, cidr, _ := net.ParseCIDR(n.PodCIDR)
		if !cidr.Contains(net.ParseIP(got.Status.PodIP)) {
			t.Errorf("pod on %s has IP %s, not in %s", n.Name, got.Status.PodIP, n.PodCIDR)
		}
	}
	seenNS := map[string]string{}
	for _, n := range cl.Nodes {
		ns, _ := os.Readlink(n.NetNS)
		if other, ok := seenNS[ns]; ok {
			t.Errorf("%s and %s share network namespace %s", n.Name, other, ns)
		}
		seenNS[ns] = n.Name
		if r := inNS(t, n.NetNS, "ip", "route", "show", "default"); !strings.HasPrefix(r, "unreachable default") {
			t.Errorf("%s: default route %q, want unreachable", n.Name, r)
		}
		// Every daemon (and so every shim and container) is in the node's freezer cgroup.
		procs, err := n.Processes()
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range procs {
			cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if err != nil {
				continue // gone meanwhile
			}
			if !strings.Contains(string(cg), ":freezer:/"+n.Cgroup+"/") {
				t.Errorf("%s: process %d is not in freezer:/%s:\n%s", n.Name, pid, n.Cgroup, cg)
			}
		}
		if len(procs) < 7 { // holder, containerd, kubelet, kube-proxy, shim, pause, broker
			t.Errorf("%s: %d processes, want the daemons, the shim and the pod's", n.Name, len(procs))
		}
	}
	if r := inNS(t, cl.LAN.NetNS, "ip", "route", "show", "default"); !strings.HasPrefix(r, "unreachable default") {
		t.Errorf("LAN: default route %q, want unreachable", r)
	}
	dial := func(from, addr string) error {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var conn net.Conn
		var err error
		if from == "" {
			var d net.Dialer
			conn, err = d.DialContext(dctx, "tcp", addr)
		} else {
			conn, err = kubenode.DialIn(dctx, from, addr)
		}
		if err != nil {
			return err
		}
		return conn.Close()
	}
	for _, target := range cl.Nodes {
		addr := net.JoinHostPort(podIP[target.Name], "1883")
		if err := dial("", addr); err != nil {
			t.Errorf("host → pod on %s (%s): %v", target.Name, addr, err)
		}
		for _, from := range cl.Nodes {
			if err := dial(from.NetNS, addr); err != nil {
				t.Errorf("%s → pod on %s (%s): %v", from.Name, target.Name, addr, err)
			}
		}
	}
	for _, n := range cl.Nodes {
		if err := dial(n.NetNS, "10.96.0.1:443"); err != nil {
			t.Errorf("%s → the kubernetes Service: %v", n.Name, err)
		}
	}
	// From a pod's own network namespace to a pod on another node.
	pid, err := cl.Nodes[0].ContainerPID(ctx, metav1.NamespaceDefault, "broker-"+cl.Nodes[0].Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	podNS := fmt.Sprintf("/proc/%d/ns/net", pid)
	if err := dial(podNS, net.JoinHostPort(podIP[cl.Nodes[1].Name], "1883")); err != nil {
		t.Errorf("pod on %s → pod on %s: %v", cl.Nodes[0].Name, cl.Nodes[1].Name, err)
	}
	if err := dial(podNS, "10.96.0.1:443"); err != nil {
		t.Errorf("pod on %s → the kubernetes Service: %v", cl.Nodes[0].Name, err)
	}
}
