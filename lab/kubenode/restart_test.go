package kubenode_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// TestRestartedDaemonComesBackInTheNodesNamespacesAndCgroups restarts each
// of the node's daemons, crashed (SIGKILL) and stopped (SIGTERM), beside a
// running pod: the new process is another one in the node's network and mount
// namespaces and in the same cgroups as the one it replaces (so the janitor
// still tears it down), the pod's container keeps running untouched (its shim
// is not containerd's process), and the node works again at once: an exec goes
// through the API server, the kubelet and containerd. At the end the node
// stops and no restarted daemon outlives it.
func TestRestartedDaemonComesBackInTheNodesNamespacesAndCgroups(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{})
	c := cp.Client()
	ctx := context.Background()
	p := pod("survivor", n.Name, images.MosquittoRef, nil)
	if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitPod(t, c, p.Name, time.Minute, "running", running)
	containerPID, err := n.ContainerPID(ctx, p.Namespace, p.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	nodeNet, _ := os.Readlink(n.NetNS)
	nodeMnt, _ := os.Readlink(strings.TrimSuffix(n.NetNS, "net") + "mnt")

	var restarted []int
	for _, tc := range []struct {
		daemon string
		sig    syscall.Signal
	}{
		{kubenode.Containerd, syscall.SIGKILL},
		{kubenode.Containerd, syscall.SIGTERM},
		{kubenode.Kubelet, syscall.SIGKILL},
		{kubenode.Kubelet, syscall.SIGTERM},
		{kubenode.KubeProxy, syscall.SIGKILL},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.daemon, tc.sig), func(t *testing.T) {
			old := n.DaemonPID(tc.daemon)
			oldCgroups, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", old))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(oldCgroups), ":/"+n.Cgroup+"/system\n") {
				t.Fatalf("%s (pid %d) is not in /%s/system before the restart:\n%s", tc.daemon, old, n.Cgroup, oldCgroups)
			}
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			t0 := time.Now()
			if err := n.RestartDaemon(rctx, tc.daemon, tc.sig); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s back %v after %v", tc.daemon, time.Since(t0).Round(time.Millisecond), tc.sig)
			pid := n.DaemonPID(tc.daemon)
			restarted = append(restarted, pid)
			if pid == old {
				t.Fatalf("%s still runs as pid %d", tc.daemon, pid)
			}
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", old)); err == nil {
				t.Errorf("the old %s (pid %d) is still there", tc.daemon, old)
			}
			if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); !bytes.Equal(cg, oldCgroups) {
				t.Errorf("restarted %s is in cgroups\n%s\nwant those of the one it replaced:\n%s", tc.daemon, cg, oldCgroups)
			}
			if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); ns != nodeNet {
				t.Errorf("restarted %s in network namespace %q, want the node's %q", tc.daemon, ns, nodeNet)
			}
			if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); ns != nodeMnt {
				t.Errorf("restarted %s in mount namespace %q, want the node's %q", tc.daemon, ns, nodeMnt)
			}
			// The container was not touched: same process, never restarted.
			if now, err := n.ContainerPID(rctx, p.Namespace, p.Name, "main"); err != nil || now != containerPID {
				t.Errorf("the pod's container runs as pid %d (%v), want %d as before the restart", now, err, containerPID)
			}
			var out bytes.Buffer
			cmd, err := n.Exec(rctx, p.Namespace, p.Name, "main", []string{images.LabBinary, "help"}, &out, &out)
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Errorf("exec through the API server, kubelet and containerd after the restart: %v: %s", err, out.String())
			}
		})
	}
	got, err := c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != first.UID || restarts(got) != 0 {
		t.Errorf("pod %s: uid %s → %s, %d restarts: want the same pod, never restarted", p.Name, first.UID, got.UID, restarts(got))
	}
	if t.Failed() {
		n.DumpLogs() // before Stop removes them
	}
	n.Stop()
	for _, pid := range append(restarted, containerPID) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("process %d outlived the node's Stop", pid)
		}
	}
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}
