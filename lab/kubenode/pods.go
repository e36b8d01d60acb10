package kubenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// EventType is what happened to a container, as the kubelet reports it in
// the pod's status.
type EventType string

// Event types.
const (
	// EventExited: the container ended (Reason Error, Completed, ...).
	EventExited EventType = "Exited"
	// EventOOMKilled: the container ended because the kernel killed it for
	// memory (Reason OOMKilled; sent instead of EventExited).
	EventOOMKilled EventType = "OOMKilled"
	// EventRestarted: the kubelet started the container again.
	EventRestarted EventType = "Restarted"
)

// Event is a container's change, from the pod status the kubelet writes.
type Event struct {
	// Time is when it happened as the kubelet reports it (finishedAt or
	// startedAt: whole seconds); Seen is when the watch delivered it.
	Time, Seen   time.Time
	Type         EventType
	Namespace    string
	Pod          string
	UID          types.UID
	Container    string
	ContainerID  string // without the runtime prefix
	RestartCount int32
	ExitCode     int32
	Reason       string
}

// Subscribe returns the container events of the pods on this node from now on
// (a pod watch on spec.nodeName) and a function that ends the subscription.
// The channel is closed when it ends.
func (n *Node) Subscribe(ctx context.Context) (<-chan Event, func()) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan Event, 4096)
	c := n.cfg.ControlPlane.Client()
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		fields.OneTermEqualSelector("spec.nodeName", n.Name))
	type key struct {
		uid       types.UID
		container string
	}
	last := map[key]corev1.ContainerStatus{}
	var mu sync.Mutex
	emit := func(ev Event) {
		select {
		case out <- ev:
		default: // a reader that falls 4096 events behind loses events, never blocks the watch
		}
	}
	// A container's first sighting only records it: events are changes.
	seen := func(p *corev1.Pod) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		all := append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, s := range all {
			k := key{p.UID, s.Name}
			prev, had := last[k]
			last[k] = s
			if !had {
				continue
			}
			base := Event{Seen: now, Namespace: p.Namespace, Pod: p.Name, UID: p.UID, Container: s.Name, RestartCount: s.RestartCount}
			// A termination is new when its container ID is: the current
			// state's (not restarted yet) or the last state's (restarted).
			term, termID := s.State.Terminated, ""
			if term == nil {
				term = s.LastTerminationState.Terminated
			}
			if term != nil {
				termID = trimRuntime(term.ContainerID)
			}
			prevTermID := ""
			if prev.State.Terminated != nil {
				prevTermID = trimRuntime(prev.State.Terminated.ContainerID)
			} else if prev.LastTerminationState.Terminated != nil {
				prevTermID = trimRuntime(prev.LastTerminationState.Terminated.ContainerID)
			}
			if term != nil && termID != "" && termID != prevTermID {
				ev := base
				ev.Type, ev.Time, ev.ContainerID, ev.ExitCode, ev.Reason = EventExited, term.FinishedAt.Time, termID, term.ExitCode, term.Reason
				if term.Reason == "OOMKilled" {
					ev.Type = EventOOMKilled
				}
				emit(ev)
			}
			if s.RestartCount > prev.RestartCount && s.State.Running != nil {
				ev := base
				ev.Type, ev.Time, ev.ContainerID = EventRestarted, s.State.Running.StartedAt.Time, trimRuntime(s.ContainerID)
				emit(ev)
			}
		}
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				seen(p)
			}
		},
		UpdateFunc: func(_, o any) {
			if p, ok := o.(*corev1.Pod); ok {
				seen(p)
			}
		},
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.Run(ctx.Done())
	}()
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			close(out)
		})
	}
	return out, stop
}

func trimRuntime(id string) string {
	if _, rest, ok := strings.Cut(id, "://"); ok {
		return rest
	}
	return id
}

// Pod gets a pod from the API server.
func (n *Node) pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return n.cfg.ControlPlane.Client().CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// ContainerCgroup returns the cgroup path (relative to a v1 hierarchy's root,
// e.g. /amf-node0/kubepods/burstable/pod<uid>/<id>) of a running container.
func (n *Node) ContainerCgroup(ctx context.Context, namespace, pod, container string) (string, error) {
	p, err := n.pod(ctx, namespace, pod)
	if err != nil {
		return "", err
	}
	id := ""
	for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if s.Name == container && s.State.Running != nil {
			id = trimRuntime(s.ContainerID)
		}
	}
	if id == "" {
		return "", fmt.Errorf("kubenode: container %s of pod %s/%s is not running", container, namespace, pod)
	}
	podDir := "pod" + string(p.UID)
	for _, qos := range []string{"", "burstable", "besteffort"} {
		rel := filepath.Join("/", n.Cgroup, "kubepods", qos, podDir, id)
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", rel)); err == nil {
			return rel, nil
		}
	}
	return "", fmt.Errorf("kubenode: no cgroup for container %s (%s) of pod %s/%s under /%s/kubepods", container, id, namespace, pod, n.Cgroup)
}

// ContainerPID returns a host PID of a process in a running container (for its
// namespaces: /proc/<pid>/ns/net is the pod's network namespace).
func (n *Node) ContainerPID(ctx context.Context, namespace, pod, container string) (int, error) {
	cg, err := n.ContainerCgroup(ctx, namespace, pod, container)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cg, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("kubenode: no process in %s", cg)
	}
	var pid int
	_, err = fmt.Sscanf(f[0], "%d", &pid)
	return pid, err
}

// Exec runs argv in a container through the API server, the kubelet and the
// runtime, as kubectl exec does (the process joins the container's
// namespaces and cgroups). The command runs until it exits or ctx ends.
func (n *Node) Exec(ctx context.Context, namespace, pod, container string, argv []string, stdout, stderr io.Writer) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("kubenode: exec: empty argv")
	}
	cp := n.cfg.ControlPlane
	args := append([]string{"--kubeconfig=" + cp.Kubeconfig, "exec", "-n", namespace, pod, "-c", container, "--"}, argv...)
	cmd := exec.CommandContext(ctx, cp.KubectlPath, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Env = append(os.Environ(), "HOME="+n.Dir)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubenode: exec in %s/%s %s: %w", namespace, pod, container, err)
	}
	return cmd, nil
}
