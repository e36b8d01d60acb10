package kubenode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels the CRI plugin puts on containerd's containers.
const (
	labelPodUID       = "io.kubernetes.pod.uid"
	labelPodName      = "io.kubernetes.pod.name"
	labelPodNamespace = "io.kubernetes.pod.namespace"
	labelKind         = "io.cri-containerd.kind" // "sandbox" or "container"
	labelContainer    = "io.kubernetes.container.name"
)

// cniNetwork is the name in cniConfig: host-local keeps its reservations in
// /var/lib/cni/networks/<name> inside the node's mount namespace.
const cniNetwork = "amf-lab"

// Leftovers lists what the node still holds for pods the API server no
// longer binds to it — what a fault may leak and the kubelet or containerd
// should have cleaned: a running sandbox or container (a process left), a pod
// cgroup under the node's kubepods, a pod address reserved by the CNI plugin
// for a sandbox that no longer runs — and a pod's sandbox or container
// running twice. Stopped containers are not listed: the kubelet's container
// GC removes them within a minute by design.
//
// Call it when the node is quiet: a pod being started or torn down at the
// same moment may show for an instant.
func (n *Node) Leftovers(ctx context.Context) ([]string, error) {
	pods, err := n.cfg.ControlPlane.Client().CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return nil, fmt.Errorf("kubenode %s: list the node's pods: %w", n.Name, err)
	}
	bound := map[string]bool{}
	for _, p := range pods.Items {
		bound[string(p.UID)] = true
	}
	running, err := n.runningTasks(ctx)
	if err != nil {
		return nil, err
	}
	var left []string
	// A pod runs one sandbox and each of its containers once: a second one
	// running is a leak too (a start the kubelet did not finish before it
	// died, then did again).
	type slot struct{ uid, kind, container string }
	runs := map[slot][]string{}
	for id := range running {
		out, err := n.Ctr(ctx, "containers", "info", id)
		if err != nil {
			return nil, err
		}
		var info struct {
			Labels map[string]string `json:"Labels"`
		}
		if err := json.Unmarshal(out, &info); err != nil {
			return nil, fmt.Errorf("kubenode %s: ctr containers info %s: %w", n.Name, id, err)
		}
		l := info.Labels
		if uid := l[labelPodUID]; uid == "" || !bound[uid] {
			left = append(left, fmt.Sprintf("running %s %.12s of pod %s/%s (uid %s), which the API server does not bind to the node",
				l[labelKind], id, l[labelPodNamespace], l[labelPodName], uid))
			continue
		}
		k := slot{l[labelPodUID], l[labelKind], l[labelContainer]}
		runs[k] = append(runs[k], fmt.Sprintf("%.12s of pod %s/%s", id, l[labelPodNamespace], l[labelPodName]))
	}
	for k, ids := range runs {
		if len(ids) > 1 {
			sort.Strings(ids)
			left = append(left, fmt.Sprintf("%s %q running %d times in one pod: %s", k.kind, k.container, len(ids), strings.Join(ids, ", ")))
		}
	}
	// Pod cgroups: the kubelet removes one before it lets the API server
	// delete the pod, so one without its pod is a leak.
	for _, qos := range []string{"", "burstable", "besteffort"} {
		dir := filepath.Join("/sys/fs/cgroup/memory", n.Cgroup, "kubepods", qos)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // the QoS class has no cgroup (yet)
		}
		for _, e := range ents {
			uid, ok := strings.CutPrefix(e.Name(), "pod")
			if ok && e.IsDir() && !bound[uid] {
				left = append(left, fmt.Sprintf("pod cgroup %s of no pod bound to the node", filepath.Join(dir, e.Name())))
			}
		}
	}
	// Addresses host-local reserved: each file is an address, its first
	// line the sandbox it was given to.
	dir := filepath.Join(n.nodeRoot(), "var/lib/cni/networks", cniNetwork)
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("kubenode %s: the CNI plugin's reservations: %w", n.Name, err)
	}
	for _, e := range ents {
		if e.IsDir() || strings.HasPrefix(e.Name(), "last_reserved_ip") || e.Name() == "lock" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // released meanwhile
		}
		id, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if !running[strings.TrimSpace(id)] {
			left = append(left, fmt.Sprintf("pod address %s reserved for sandbox %.12s, which is not running", e.Name(), id))
		}
	}
	sort.Strings(left)
	return left, nil
}

// runningTasks returns the IDs of containerd's running tasks (sandboxes and
// containers) in the k8s.io namespace.
func (n *Node) runningTasks(ctx context.Context) (map[string]bool, error) {
	out, err := n.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return nil, err
	}
	running := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// TASK PID STATUS; the header's PID is not a number.
		if len(f) == 3 && f[2] == "RUNNING" {
			if _, err := strconv.Atoi(f[1]); err == nil {
				running[f[0]] = true
			}
		}
	}
	return running, nil
}

// nodeRoot is the root of the node's mount namespace as the host sees it
// (the namespace holder's /proc/<pid>/root): the tmpfs the node mounted over
// /var/lib/cni and /run/netns are only visible there.
func (n *Node) nodeRoot() string {
	return fmt.Sprintf("/proc/%d/root", n.holder.cmd.Process.Pid)
}
