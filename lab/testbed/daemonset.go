package testbed

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/amf-edge/amf/lab/controlplane"
)

// AgentDaemonSet is the agent's DaemonSet in manifests/base.
const AgentDaemonSet = "amf-agent"

// DeployAgent installs the agent as a user does — `kubectl apply -k
// manifests/base` from repo — and sets the container's arguments to the
// DaemonSet's own plus extra (e.g. --log-level=debug, --observe-only); it
// returns once the agent's pod on node runs those arguments and is Ready, with
// its log followed (Lines, Subscribe). Applying it again with other extra
// arguments rolls the pod and follows the new one.
func DeployAgent(ctx context.Context, cp *controlplane.ControlPlane, repo, node string, extra []string) (*AgentPod, error) {
	return DeployAgentLayout(ctx, cp, repo, "base", node, extra)
}

// DeployAgentLayout is DeployAgent from another kustomize layout of
// manifests/ (e.g. "overlays/node-mode").
func DeployAgentLayout(ctx context.Context, cp *controlplane.ControlPlane, repo, layout, node string, extra []string) (*AgentPod, error) {
	as, err := deployAgents(ctx, cp, repo, layout, []string{node}, extra)
	if err != nil {
		return nil, err
	}
	return as[0], nil
}

// DeployAgents is DeployAgent for several nodes of one cluster: one apply,
// one change of the arguments, then the agent's pod on each node Ready and
// its log followed, in the order of nodes.
func DeployAgents(ctx context.Context, cp *controlplane.ControlPlane, repo string, nodes []string, extra []string) ([]*AgentPod, error) {
	return deployAgents(ctx, cp, repo, "base", nodes, extra)
}

// DeployAgentsLayout is DeployAgents from another kustomize layout of
// manifests/ (e.g. "overlays/node-mode").
func DeployAgentsLayout(ctx context.Context, cp *controlplane.ControlPlane, repo, layout string, nodes []string, extra []string) ([]*AgentPod, error) {
	return deployAgents(ctx, cp, repo, layout, nodes, extra)
}

func deployAgents(ctx context.Context, cp *controlplane.ControlPlane, repo, layout string, nodes []string, extra []string) ([]*AgentPod, error) {
	if out, err := cp.Kubectl(ctx, nil, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join(repo, "manifests", filepath.FromSlash(layout))); err != nil {
		return nil, fmt.Errorf("kubectl apply -k manifests/%s: %w: %s", layout, err, out)
	}
	c := cp.Client()
	ds, err := c.AppsV1().DaemonSets(AgentNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	args := append(slices.Clone(ds.Spec.Template.Spec.Containers[0].Args), extra...)
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}})
	if err != nil {
		return nil, err
	}
	if _, err := c.AppsV1().DaemonSets(AgentNamespace).Patch(ctx, AgentDaemonSet, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("set the agent's arguments: %w", err)
	}
	var agents []*AgentPod
	for _, node := range nodes {
		pod, err := waitAgentPod(ctx, c, node, args, 2*time.Minute)
		if err != nil {
			for _, a := range agents {
				a.Stop()
			}
			return nil, err
		}
		a := &AgentPod{Addr: pod.Status.HostIP + ":1884", Pod: pod.Name}
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		a.stop = cancel
		a.followed = make(chan struct{})
		a.reconnect = make(chan struct{}, 1)
		go func() {
			defer close(a.followed)
			a.follow(lctx, c, pod.Name)
		}()
		agents = append(agents, a)
	}
	return agents, nil
}

// waitAgentPod waits (watch) for the agent's pod on node that runs args and is Ready.
func waitAgentPod(ctx context.Context, c kubernetes.Interface, node string, args []string, timeout time.Duration) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(c.CoreV1().RESTClient(), "pods", AgentNamespace, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/name=amf-agent"
		o.FieldSelector = "spec.nodeName=" + node
	})
	var got *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted || p.DeletionTimestamp != nil || !slices.Equal(p.Spec.Containers[0].Args, args) {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				got = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no Ready agent pod on %s running %s within %v: %w", node, strings.Join(args, " "), timeout, err)
	}
	return got, nil
}

// follow streams the pod's log (through the API server and the kubelet, as
// kubectl logs -f does) into onLine until ctx ends. A stream ends when the
// container restarts or the kubelet does; the next one starts at the second
// of the last line read (the API's SinceTime has whole seconds), and a
// logResume skips what was read before, so nothing is read twice and a
// restarted container's first lines are not lost to a SinceTime taken after
// it started.
func (a *AgentPod) follow(ctx context.Context, c kubernetes.Interface, pod string) {
	var r logResume
	for ctx.Err() == nil {
		since := metav1.NewTime(time.Now().Add(-time.Hour))
		if !r.last.IsZero() {
			since = metav1.NewTime(r.last)
		}
		sctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-a.reconnect:
				cancel()
			case <-sctx.Done():
			}
		}()
		rc, err := c.CoreV1().Pods(AgentNamespace).GetLogs(pod, &corev1.PodLogOptions{Follow: true, Timestamps: true, SinceTime: &since}).Stream(sctx)
		if err == nil {
			sc := bufio.NewScanner(rc)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				if line, ok := r.fresh(sc.Text()); ok {
					a.onLine(line)
				}
			}
			rc.Close()
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // the restarted container's log is not there at once
		}
	}
}

// logResume tells the lines of a log stream with timestamps (the runtime's
// time of each write, in the log's own order) from those an earlier stream
// already gave. The lines' own "time" fields cannot: the agent's goroutines
// take a line's time before they take the log handler's lock, so a line
// may be written after one with a later time (under load, a RetirePrimary
// decision line was dropped that way).
type logResume struct {
	last   time.Time           // write time of the newest line passed on
	atLast map[string]struct{} // the lines written at exactly last
}

// fresh returns s's line without its timestamp, and whether it is new.
func (r *logResume) fresh(s string) (string, bool) {
	ts, line, ok := strings.Cut(s, " ")
	at, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return "", false
	}
	switch {
	case at.Before(r.last):
		return "", false // read before the stream started again
	case at.Equal(r.last):
		if _, seen := r.atLast[line]; seen {
			return "", false
		}
	default:
		r.last, r.atLast = at, map[string]struct{}{}
	}
	r.atLast[line] = struct{}{}
	return line, true
}
