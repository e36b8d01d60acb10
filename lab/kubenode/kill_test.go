package kubenode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

const childEnv = "AMF_KUBENODE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// childReport is what the child says once its nodes run a pod.
type childReport struct {
	Nodes          []childNode
	LAN            int    // the LAN's slot, -1 without one
	Uplink         string // the host's end of the LAN's uplink
	ControlPlane   string
	Pod            string
	ContainerPID   int
	Err            string
	ImagesArchives []string
}

type childNode struct {
	Index       int
	Cgroup, Dir string
}

// runChild starts a control plane and a node with a running pod — or, with
// AMF_KUBENODE_TEST_CLUSTER=1, a cluster of two nodes on a LAN with a pod on
// the first, power-cut (frozen, its port down) — reports them on stdout,
// and waits to be killed.
func runChild() int {
	rep := childReport{LAN: -1}
	_ = json.Unmarshal([]byte(os.Getenv("AMF_KUBENODE_TEST_IMAGES")), &rep.ImagesArchives)
	say := func() {
		b, _ := json.Marshal(rep)
		fmt.Println(string(b))
	}
	err := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		dir, err := os.MkdirTemp("", "kubenode-kill-cp-")
		if err != nil {
			return err
		}
		rep.ControlPlane = dir
		cp, err := controlplane.Launch(ctx, dir, controlplane.Options{ServingIPs: kubenode.ServingIPs(), NoFakeNodes: true}, func(string, ...any) {})
		if err != nil {
			return err
		}
		var nodes []*kubenode.Node
		if os.Getenv("AMF_KUBENODE_TEST_CLUSTER") == "1" {
			cl, err := kubenode.LaunchCluster(ctx, kubenode.ClusterConfig{ControlPlane: cp, Nodes: 2, Node: kubenode.Config{Images: rep.ImagesArchives}})
			if err != nil {
				return err
			}
			rep.LAN, rep.Uplink, nodes = cl.LAN.Index, cl.LAN.Uplink, cl.Nodes
		} else {
			n, err := kubenode.Launch(ctx, kubenode.Config{ControlPlane: cp, Images: rep.ImagesArchives})
			if err != nil {
				return err
			}
			nodes = []*kubenode.Node{n}
		}
		for _, n := range nodes {
			rep.Nodes = append(rep.Nodes, childNode{Index: n.Index, Cgroup: n.Cgroup, Dir: n.Dir})
		}
		n := nodes[0]
		p := pod("victim", n.Name, images.MosquittoRef, nil)
		if _, err := cp.Client().CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return err
		}
		for {
			pid, err := n.ContainerPID(ctx, p.Namespace, p.Name, "main")
			if err == nil {
				rep.Pod, rep.ContainerPID = p.Name, pid
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("pod not running: %w (%v)", ctx.Err(), err)
			case <-time.After(100 * time.Millisecond):
			}
		}
		if rep.LAN >= 0 {
			if _, err := n.PowerCut(ctx); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		rep.Err = err.Error()
	}
	say()
	select {} // until killed
}

// waitTeardown waits for the janitor of cgroup cg (amf-node<i> or
// amf-lan<j>) to end, then tries to take its slot's lock, which it holds
// until the test ends. It reports whether it got the lock: only then are the
// names that belong to the slot, not to this node (its cgroup, links and
// routes), free of another lab process that took the slot once the teardown
// let it go — other packages' tests start nodes beside this one.
func waitTeardown(t *testing.T, cg, lockName string) bool {
	t.Helper()
	for _, pid := range janitors(t, cg) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // already gone
		}
		if !slices.Contains(janitors(t, cg), pid) { // the PID was reused before the open
			unix.Close(fd)
			continue
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(time.Minute/time.Millisecond))
		unix.Close(fd)
		if err != nil {
			t.Fatalf("await janitor %d of %s: %v", pid, cg, err)
		}
		if n == 0 {
			t.Fatalf("the janitor of %s (process %d) still runs a minute after its lab process was killed", cg, pid)
		}
	}
	lock, err := os.OpenFile(filepath.Join("/run/amf-lab/kubenode", lockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Logf("slot %s was taken by another lab process after its teardown: the checks of its cgroup, links and routes are skipped", lockName)
		return false
	}
	return true
}

// janitors lists the running janitors of cgroup cg.
func janitors(t *testing.T, cg string) []int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), "\x00kubenode-janitor\x00"+cg+"\x00") {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// TestKilledLabProcessLeavesNothingBehind: a process that runs a node (with a
// pod), or a cluster on a LAN with one node power-cut (frozen), and is killed
// outright (SIGKILL: no deferred cleanup runs) leaves no process, cgroup
// (the hybrid cgroup2 mirror included), network link, host route, mount or
// file behind: the janitors of the nodes and of the LAN tear everything down.
func TestKilledLabProcessLeavesNothingBehind(t *testing.T) {
	kubenodetest.Require(t)
	var archives []string
	for _, im := range kubenodetest.Images(t) {
		archives = append(archives, im.Archive)
	}
	for _, tc := range []struct {
		name    string
		cluster bool
	}{
		{"one node", false},
		{"a cluster on a LAN, one node power-cut", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			killChild(t, archives, tc.cluster)
		})
	}
}

func killChild(t *testing.T, archives []string, cluster bool) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	env, _ := json.Marshal(archives)
	cmd.Env = append(os.Environ(), childEnv+"=1", "AMF_KUBENODE_TEST_IMAGES="+string(env))
	if cluster {
		cmd.Env = append(cmd.Env, "AMF_KUBENODE_TEST_CLUSTER=1")
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child said nothing: %v", err)
	}
	var rep childReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil || rep.Err != "" {
		t.Fatalf("child: %q %v", line, err)
	}
	defer os.RemoveAll(rep.ControlPlane)
	t.Logf("child runs nodes %+v (LAN %d) with pod %s, container process %d", rep.Nodes, rep.LAN, rep.Pod, rep.ContainerPID)

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ours := map[int]bool{} // the node slots this test holds again
	for _, n := range rep.Nodes {
		ours[n.Index] = waitTeardown(t, n.Cgroup, fmt.Sprintf("%d.lock", n.Index))
	}
	lanOurs := rep.LAN >= 0 && waitTeardown(t, fmt.Sprintf("amf-lan%d", rep.LAN), fmt.Sprintf("lan%d.lock", rep.LAN))

	if _, err := os.Stat(fmt.Sprintf("/proc/%d", rep.ContainerPID)); err == nil {
		t.Errorf("the pod's container process %d is still running", rep.ContainerPID)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	routes, _ := exec.Command("ip", "route", "show").CombinedOutput()
	for _, n := range rep.Nodes {
		if _, err := os.Stat(n.Dir); err == nil {
			t.Errorf("node folder %s left", n.Dir)
		}
		if strings.Contains(string(mounts), n.Dir) {
			t.Errorf("mounts of %s left", n.Dir)
		}
		if !ours[n.Index] {
			continue
		}
		if left, _ := filepath.Glob("/sys/fs/cgroup/*/" + n.Cgroup); len(left) > 0 {
			t.Errorf("cgroups left: %v", left)
		}
		if _, err := net.InterfaceByName(fmt.Sprintf("amfv%d", n.Index)); err == nil {
			t.Errorf("the node's veth amfv%d is left", n.Index)
		}
		for _, r := range strings.Split(string(routes), "\n") {
			if strings.HasPrefix(r, fmt.Sprintf("10.214.%d.0/24 ", n.Index)) || strings.HasPrefix(r, fmt.Sprintf("10.215.%d.2 ", n.Index)) {
				t.Errorf("host route to node slot %d left: %s", n.Index, r)
			}
		}
	}
	if lanOurs {
		if left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/amf-lan%d", rep.LAN)); len(left) > 0 {
			t.Errorf("LAN cgroups left: %v", left)
		}
		if _, err := net.InterfaceByName(rep.Uplink); err == nil {
			t.Errorf("the LAN's uplink %s is left", rep.Uplink)
		}
		if strings.Contains(string(routes), rep.Uplink) {
			t.Errorf("host routes through the LAN's uplink left:\n%s", routes)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		s := string(b)
		for _, n := range rep.Nodes {
			if strings.Contains(s, n.Dir) {
				t.Errorf("process %s left: %s", filepath.Dir(p), strings.ReplaceAll(s, "\x00", " "))
			}
		}
		if strings.Contains(s, rep.ControlPlane) {
			t.Errorf("process %s left: %s", filepath.Dir(p), strings.ReplaceAll(s, "\x00", " "))
		}
	}
}
