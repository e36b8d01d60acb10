package vmnode

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ContainerCgroup returns the guest's cgroup folder (under /sys/fs/cgroup)
// of a running container of pod, as the kubelet and containerd laid it out
// with the systemd driver: kubepods.slice/[kubepods-<qos>.slice/]
// kubepods[-<qos>]-pod<uid>.slice/cri-containerd-<id>.scope.
func (n *Node) ContainerCgroup(ctx context.Context, pod *corev1.Pod, container string) (string, error) {
	id := ""
	for _, s := range append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if s.Name == container && s.State.Running != nil {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if id == "" {
		return "", fmt.Errorf("vmnode: container %s of pod %s/%s is not running", container, pod.Namespace, pod.Name)
	}
	for _, pattern := range []string{"/sys/fs/cgroup/kubepods.slice/*/cri-containerd-%s.scope", "/sys/fs/cgroup/kubepods.slice/*/*/cri-containerd-%s.scope"} {
		m, err := n.Glob(ctx, fmt.Sprintf(pattern, id))
		if err != nil {
			return "", err
		}
		if len(m) == 1 {
			return m[0], nil
		}
	}
	return "", fmt.Errorf("vmnode: no cgroup for container %s (%s) of pod %s/%s under /sys/fs/cgroup/kubepods.slice", container, id, pod.Namespace, pod.Name)
}

// ContainerPID returns the guest PID of a process of a running container.
func (n *Node) ContainerPID(ctx context.Context, pod *corev1.Pod, container string) (int, error) {
	cg, err := n.ContainerCgroup(ctx, pod, container)
	if err != nil {
		return 0, err
	}
	b, err := n.ReadFile(ctx, path.Join(cg, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("vmnode: no process in %s", cg)
	}
	return strconv.Atoi(f[0])
}

// PodLog reads the log file the kubelet keeps of a container of pod (the
// API server cannot reach this node's kubelet for kubectl logs).
func (n *Node) PodLog(ctx context.Context, pod *corev1.Pod, container string) ([]byte, error) {
	m, err := n.Glob(ctx, fmt.Sprintf("/var/log/pods/%s_%s_%s/%s/*.log", pod.Namespace, pod.Name, pod.UID, container))
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, p := range m { // 0.log, 1.log, ...: restarts in order
		b, err := n.ReadFile(ctx, p)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}
