package kubenode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// grace is the controller manager's --node-monitor-grace-period in these
// tests (Kubernetes' default is 50 s): shortened to keep them bounded; what
// they assert holds for any value.
const grace = 20 * time.Second

// MQTT 3.1.1 packets: CONNECT (clean session, keep-alive 60 s, client "x"),
// PINGREQ, and the first bytes of the broker's answers.
var (
	mqttConnect = []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, 1, 'x'}
	mqttPing    = []byte{0xc0, 0}
)

const (
	connack  = 0x20
	pingresp = 0xd0
)

// mqttDial opens a TCP connection to a broker, from the host (ns "") or from
// inside a network namespace.
func mqttDial(ctx context.Context, ns, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if ns == "" {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	return kubenode.DialIn(ctx, ns, addr)
}

// roundTrip sends pkt and wants an answer starting with want within timeout.
func roundTrip(c net.Conn, pkt []byte, want byte, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(pkt); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if _, err := io.ReadFull(c, make([]byte, b[1])); err != nil { // the rest (short packets only)
		return fmt.Errorf("read: %w", err)
	}
	if b[0] != want {
		return fmt.Errorf("answer %#x, want %#x", b[0], want)
	}
	return nil
}

// hangs sends pkt on c and wants silence for d: no answer, no reset, no end
// of stream — only the read's own deadline.
func hangs(c net.Conn, pkt []byte, d time.Duration) error {
	err := roundTrip(c, pkt, 0xff, d)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	return fmt.Errorf("the connection did not hang: %v", err)
}

// openSession opens an MQTT session from the host to addr (its CONNECT
// answered), closed when the test ends.
func openSession(ctx context.Context, t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := mqttDial(ctx, "", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := roundTrip(c, mqttConnect, connack, 5*time.Second); err != nil {
		t.Fatalf("an MQTT session to %s: %v", addr, err)
	}
	return c
}

// serves waits until a fresh connection from ns to addr gets a CONNACK.
func serves(ctx context.Context, ns, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		c, err := mqttDial(ctx, ns, addr, 2*time.Second)
		if err == nil {
			err = roundTrip(c, mqttConnect, connack, 2*time.Second)
			c.Close()
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s does not serve MQTT within %v: %v", addr, within, last)
}

// waitNode watches a Node until cond holds and returns when it was seen.
func waitNode(t *testing.T, c kubernetes.Interface, name string, timeout time.Duration, what string, cond func(*corev1.Node) bool) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", name))
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		n, ok := ev.Object.(*corev1.Node)
		return ok && cond(n), nil
	})
	if err != nil {
		t.Fatalf("Node %s: not %s within %v: %v", name, what, timeout, err)
	}
	return time.Now()
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func notReady(n *corev1.Node) bool { return !ready(n) }

// lease is the node's Lease in kube-node-lease (the kubelet's heartbeat).
func lease(t *testing.T, c kubernetes.Interface, node string) *coordinationv1.Lease {
	t.Helper()
	l, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		all, _ := c.CoordinationV1().Leases(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
		var names []string
		for _, l := range all.Items {
			names = append(names, l.Namespace+"/"+l.Name)
		}
		t.Fatalf("%v (leases: %v)", err, names)
	}
	return l
}

// checkGrace: the Node went NotReady at seen, no earlier than the grace after
// the last heartbeat the kubelet wrote (renewed), and no later than the grace
// plus the kubelet's renew interval (10 s) and the controller's period (5 s)
// plus slack after the fault.
func checkGrace(t *testing.T, what string, fault, renewed, seen time.Time) {
	t.Helper()
	t.Logf("%s: NotReady %v after the fault, %v after the last heartbeat (grace %v)", what,
		seen.Sub(fault).Round(time.Millisecond), seen.Sub(renewed).Round(time.Millisecond), grace)
	if seen.Sub(renewed) < grace {
		t.Errorf("%s: NotReady %v after the last heartbeat, before the grace %v", what, seen.Sub(renewed), grace)
	}
	if late := grace + 10*time.Second + 5*time.Second + 5*time.Second; seen.Sub(fault) > late {
		t.Errorf("%s: NotReady %v after the fault, want ≤ %v", what, seen.Sub(fault), late)
	}
}

func othersReady(t *testing.T, c kubernetes.Interface, cl *kubenode.Cluster, except *kubenode.Node) {
	t.Helper()
	for _, n := range cl.Nodes {
		if n == except {
			continue
		}
		nd, err := c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !ready(nd) {
			t.Errorf("%s is not Ready while only %s has a fault", n.Name, except.Name)
		}
	}
}

// TestNodeFaultsLookLikeTheRealOnes runs each fault of a whole node on a
// three-node cluster and undoes it, asserting what a peer and the API server
// see:
//   - power cut: every process of the node is frozen at once, and a TCP
//     connection to its broker hangs (no answer, no reset, no FIN), from the
//     host as from another node; the Node goes NotReady only after the grace
//     since its last heartbeat, its pod still Running in the API; the other
//     nodes stay Ready;
//   - partition: the node runs on (its broker serves from inside the node)
//     while the outside's connections hang; NotReady after the grace;
//   - slow node: a CPU quota holds the whole node (a busy pod included) to
//     its share, and the kubelet still renews its Lease: the Node stays Ready;
//   - kubelet dead: the pods run on and serve; NotReady after the grace;
//   - asymmetric partition: a session opened before the cut is served, a new
//     connection into the node hangs while the node's own connections out
//     open; its pod, deleted in the API meanwhile, runs on until the heal,
//     when its kubelet carries the deletion out; NotReady after the grace;
//   - restore: each time the node comes back Ready and its broker serves.
func TestNodeFaultsLookLikeTheRealOnes(t *testing.T) {
	cp, cl := kubenodetest.StartCluster(t, 3, kubenodetest.Options{ControlPlane: controlplane.Options{
		ControllerManagerFlags: []string{"--node-monitor-grace-period=" + grace.String()},
	}})
	c := cp.Client()
	ctx := context.Background()
	addr := map[*kubenode.Node]string{}
	for _, n := range cl.Nodes {
		p := pod("broker-"+n.Name, n.Name, images.MosquittoRef, nil)
		if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range cl.Nodes {
		got := waitPod(t, c, "broker-"+n.Name, time.Minute, "running", running)
		addr[n] = net.JoinHostPort(got.Status.PodIP, "1883")
		if err := serves(ctx, "", addr[n], 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// heal restores n and waits until it is Ready again.
	heal := func(ctx context.Context, t *testing.T, n *kubenode.Node) {
		t.Helper()
		if err := n.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		if f := n.Faulty(); f != "" {
			t.Errorf("after Restore %s still has: %s", n.Name, f)
		}
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// restore heals n and waits until its broker serves.
	restore := func(t *testing.T, n *kubenode.Node) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		t0 := time.Now()
		heal(rctx, t, n)
		ready := time.Since(t0)
		if err := serves(rctx, "", addr[n], 30*time.Second); err != nil {
			t.Error(err)
		}
		t.Logf("%s: Ready %v after the restore, its broker serving %v after", n.Name, ready.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	}

	t.Run("power cut", func(t *testing.T) {
		n, peer := cl.Nodes[0], cl.Nodes[1]
		session := openSession(ctx, t, addr[n])
		idle, err := mqttDial(ctx, "", addr[n], 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer idle.Close()
		fromPeer, err := mqttDial(ctx, peer.NetNS, addr[n], 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer fromPeer.Close()

		cut, err := n.PowerCut(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("power cut: %d processes frozen in %v", cut.Processes, cut.Frozen.Round(time.Microsecond))
		if st, err := n.FreezerState(); err != nil || st != "FROZEN" {
			t.Errorf("freezer %q (%v), want FROZEN", st, err)
		}
		procs, err := n.Processes()
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range procs {
			cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if err == nil && !bytes.Contains(cg, []byte(":freezer:/"+n.Cgroup+"/")) {
				t.Errorf("process %d of %s is outside its freezer cgroup:\n%s", pid, n.Name, cg)
			}
		}
		for _, tc := range []struct {
			name string
			conn net.Conn
			pkt  []byte
		}{
			{"host, MQTT session (PINGREQ)", session, mqttPing},
			{"host, fresh connection (CONNECT)", idle, mqttConnect},
			{"other node (CONNECT)", fromPeer, mqttConnect},
		} {
			if err := hangs(tc.conn, tc.pkt, 3*time.Second); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
		if c, err := mqttDial(ctx, "", addr[n], 2*time.Second); err == nil {
			c.Close()
			t.Error("a new connection to the cut node's broker was accepted")
		} else if !errors.Is(err, context.DeadlineExceeded) && !os.IsTimeout(err) {
			t.Errorf("a new connection to the cut node: %v, want a timeout (no refusal, no reset)", err)
		}
		renewed := lease(t, c, n.Name).Spec.RenewTime.Time
		seen := waitNode(t, c, n.Name, grace+time.Minute, "NotReady", notReady)
		checkGrace(t, "power cut", cut.At, renewed, seen)
		p, err := c.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "broker-"+n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			t.Errorf("the cut node's pod is %s (deleted %v) in the API: Kubernetes alone waits out its toleration", p.Status.Phase, p.DeletionTimestamp)
		}
		othersReady(t, c, cl, n)
		restore(t, n)
	})

	t.Run("partition", func(t *testing.T) {
		n := cl.Nodes[1]
		session := openSession(ctx, t, addr[n])
		kubelet := n.DaemonPID(kubenode.Kubelet)
		t0 := time.Now()
		if err := n.Partition(ctx); err != nil {
			t.Fatal(err)
		}
		if err := hangs(session, mqttPing, 3*time.Second); err != nil {
			t.Errorf("host's MQTT session: %v", err)
		}
		// The node runs on: its broker serves inside it, its kubelet lives.
		if err := serves(ctx, n.NetNS, addr[n], 10*time.Second); err != nil {
			t.Errorf("inside the partitioned node: %v", err)
		}
		if st, _ := n.FreezerState(); st != "THAWED" {
			t.Errorf("partitioned node's freezer %s", st)
		}
		renewed := lease(t, c, n.Name).Spec.RenewTime.Time
		seen := waitNode(t, c, n.Name, grace+time.Minute, "NotReady", notReady)
		checkGrace(t, "partition", t0, renewed, seen)
		if err := syscall.Kill(kubelet, 0); err != nil {
			t.Errorf("the partitioned node's kubelet (pid %d) is gone: %v", kubelet, err)
		}
		othersReady(t, c, cl, n)
		restore(t, n)
	})

	t.Run("slow node", func(t *testing.T) {
		n := cl.Nodes[2]
		busy, err := n.Exec(ctx, metav1.NamespaceDefault, "broker-"+n.Name, "main", []string{images.LabBinary, "stress", "--profile", "40s:cpu=2"}, io.Discard, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = busy.Process.Kill(); _ = busy.Wait() }()
		// Busy first (the exec goes through the kubelet), then starved.
		rate := func(d time.Duration) float64 {
			u0, t0 := cpuUsage(t, n), time.Now()
			time.Sleep(d) // a measurement window, not a synchronisation
			return (cpuUsage(t, n) - u0).Seconds() / time.Since(t0).Seconds()
		}
		deadline := time.Now().Add(30 * time.Second)
		for r := rate(500 * time.Millisecond); r < 0.8; r = rate(500 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the busy pod's node uses %.2f CPUs, want ≥ 0.8 before the starvation", r)
			}
		}
		const share = 0.1
		before := lease(t, c, n.Name).Spec.RenewTime.Time
		t0 := time.Now()
		if err := n.Starve(ctx, share); err != nil {
			t.Fatal(err)
		}
		used := rate(3 * time.Second)
		// The kubelet renews every 10 s: wait for one renewal while starved.
		var renewed time.Time
		for deadline := t0.Add(25 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if r := lease(t, c, n.Name).Spec.RenewTime.Time; r.After(before) {
				renewed = r
				break
			}
		}
		t.Logf("slow node: %.3f CPUs used at a quota of %.2f with a busy pod; Lease renewed %v after the starvation began", used, share, renewed.Sub(t0).Round(time.Millisecond))
		if renewed.IsZero() {
			t.Error("the starved kubelet did not renew its Lease within 25 s")
		}
		if used > share*1.5 {
			t.Errorf("the starved node used %.3f CPUs, over its quota %.2f", used, share)
		}
		if used < share*0.5 {
			t.Errorf("the starved node used %.3f CPUs with a busy pod: the quota %.2f did not bind", used, share)
		}
		nd, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !ready(nd) {
			t.Error("the slow node is not Ready")
		}
		_ = busy.Process.Kill()
		restore(t, n)
	})

	t.Run("kubelet dead", func(t *testing.T) {
		n := cl.Nodes[2]
		containerPID, err := n.ContainerPID(ctx, metav1.NamespaceDefault, "broker-"+n.Name, "main")
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := n.StopDaemon(ctx, kubenode.Kubelet, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if f := n.Faulty(); f != "kubelet down" {
			t.Errorf("Faulty() = %q, want kubelet down", f)
		}
		renewed := lease(t, c, n.Name).Spec.RenewTime.Time
		seen := waitNode(t, c, n.Name, grace+time.Minute, "NotReady", notReady)
		checkGrace(t, "kubelet dead", t0, renewed, seen)
		if err := serves(ctx, "", addr[n], 5*time.Second); err != nil {
			t.Errorf("without its kubelet the node's pod should serve: %v", err)
		}
		if err := syscall.Kill(containerPID, 0); err != nil {
			t.Errorf("the broker (pid %d) died with the kubelet: %v", containerPID, err)
		}
		restore(t, n)
	})

	// Last: the node's pod is deleted on the way.
	t.Run("asymmetric partition", func(t *testing.T) {
		n, peer := cl.Nodes[0], cl.Nodes[1]
		session := openSession(ctx, t, addr[n])
		brokerPID, err := n.ContainerPID(ctx, metav1.NamespaceDefault, "broker-"+n.Name, "main")
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := n.CutInbound(ctx); err != nil {
			t.Fatal(err)
		}
		if f := n.Faulty(); f != "inbound cut" {
			t.Errorf("Faulty() = %q, want inbound cut", f)
		}
		if err := roundTrip(session, mqttPing, pingresp, 3*time.Second); err != nil {
			t.Errorf("an MQTT session opened before the cut: %v, want it served", err)
		}
		if c, err := mqttDial(ctx, peer.NetNS, addr[n], 2*time.Second); err == nil {
			c.Close()
			t.Error("a new connection from another node to the cut node's broker was accepted")
		} else if !errors.Is(err, context.DeadlineExceeded) && !os.IsTimeout(err) {
			t.Errorf("a new connection from another node: %v, want a timeout (no refusal, no reset)", err)
		}
		if err := serves(ctx, n.NetNS, addr[peer], 10*time.Second); err != nil {
			t.Errorf("out of the cut node to another node's broker: %v", err)
		}
		// Deleted in the API, the pod runs on: the kubelet no longer hears
		// the API server (the first version of this fault let it carry
		// out the deletion 6 s after the cut).
		if err := c.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, "broker-"+n.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		renewed := lease(t, c, n.Name).Spec.RenewTime.Time
		seen := waitNode(t, c, n.Name, grace+time.Minute, "NotReady", notReady)
		checkGrace(t, "asymmetric partition", t0, renewed, seen)
		if err := syscall.Kill(brokerPID, 0); err != nil {
			t.Errorf("the deleted pod's broker (pid %d) ended %v after the cut: its kubelet heard the API server", brokerPID, time.Since(t0).Round(time.Second))
		}
		if err := serves(ctx, n.NetNS, addr[n], 5*time.Second); err != nil {
			t.Errorf("inside the cut node, its deleted pod: %v", err)
		}
		othersReady(t, c, cl, n)

		rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		heal(rctx, t, n)
		// Heard again, its kubelet carries the deletion out.
		lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "pods", metav1.NamespaceDefault, fields.OneTermEqualSelector("metadata.name", "broker-"+n.Name))
		if _, err := watchtools.UntilWithSync(rctx, lw, nil, func(store cache.Store) (bool, error) { return len(store.List()) == 0, nil },
			func(ev watch.Event) (bool, error) { return ev.Type == watch.Deleted, nil }); err != nil {
			t.Fatalf("after the heal the deleted pod is not gone: %v", err)
		}
	})
}

// cpuUsage is the node's whole CPU time (cpuacct.usage of its cgroup root).
func cpuUsage(t *testing.T, n *kubenode.Node) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", n.Cgroup, "cpuacct.usage"))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ns)
}
