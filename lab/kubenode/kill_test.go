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
	"strings"
	"syscall"
	"testing"
	"time"

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

// childReport is what the child says once its node runs a pod.
type childReport struct {
	Index          int
	Cgroup, Dir    string
	ControlPlane   string
	Pod            string
	ContainerPID   int
	Err            string
	ImagesArchives []string
}

// runChild starts a control plane and a node with a running pod, reports
// them on stdout, and waits to be killed.
func runChild() int {
	var rep childReport
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
		cp, err := controlplane.Launch(ctx, dir, controlplane.Options{ServingIPs: kubenode.ServingIPs()}, func(string, ...any) {})
		if err != nil {
			return err
		}
		n, err := kubenode.Launch(ctx, kubenode.Config{ControlPlane: cp, Images: rep.ImagesArchives})
		if err != nil {
			return err
		}
		rep.Index, rep.Cgroup, rep.Dir = n.Index, n.Cgroup, n.Dir
		p := pod("victim", n.Name, images.MosquittoRef, nil)
		if _, err := cp.Client().CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return err
		}
		for {
			pid, err := n.ContainerPID(ctx, p.Namespace, p.Name, "main")
			if err == nil {
				rep.Pod, rep.ContainerPID = p.Name, pid
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("pod not running: %w (%v)", ctx.Err(), err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	if err != nil {
		rep.Err = err.Error()
	}
	say()
	select {} // until killed
}

// TestKilledLabProcessLeavesNothingBehind: a process that runs a node (with a
// pod) and is killed outright (SIGKILL: no deferred cleanup runs) leaves no
// process, cgroup, network link, mount or file of the node behind: its janitor
// tears everything down.
func TestKilledLabProcessLeavesNothingBehind(t *testing.T) {
	kubenodetest.Require(t)
	var archives []string
	for _, im := range kubenodetest.Images(t) {
		archives = append(archives, im.Archive)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	env, _ := json.Marshal(archives)
	cmd.Env = append(os.Environ(), childEnv+"=1", "AMF_KUBENODE_TEST_IMAGES="+string(env))
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
	t.Logf("child runs node %s (%s) with pod %s, container process %d", rep.Cgroup, rep.Dir, rep.Pod, rep.ContainerPID)

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The slot's lock is the janitor's until the teardown is over: taking it
	// waits for exactly that.
	lock, err := os.OpenFile(filepath.Join("/run/amf-lab/kubenode", fmt.Sprintf("%d.lock", rep.Index)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	locked := make(chan error, 1)
	go func() { locked <- syscall.Flock(int(lock.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the node's slot is still taken a minute after its lab process was killed")
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	if _, err := os.Stat(fmt.Sprintf("/proc/%d", rep.ContainerPID)); err == nil {
		t.Errorf("the pod's container process %d is still running", rep.ContainerPID)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/" + rep.Cgroup); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	if _, err := os.Stat(rep.Dir); err == nil {
		t.Errorf("node folder %s left", rep.Dir)
	}
	if _, err := net.InterfaceByName(fmt.Sprintf("amfv%d", rep.Index)); err == nil {
		t.Errorf("the node's veth amfv%d is left", rep.Index)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), rep.Dir) {
		t.Errorf("mounts of %s left", rep.Dir)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if s := string(b); strings.Contains(s, rep.Dir) || strings.Contains(s, rep.ControlPlane) {
			t.Errorf("process %s left: %s", filepath.Dir(p), strings.ReplaceAll(s, "\x00", " "))
		}
	}
}
