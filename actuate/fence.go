package actuate

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// The fence (DESIGN.md, "Losing a whole node"): an agent cut off from the
// API server and from every guard of its node (liveness.Fencer) pauses the
// brokers of the primaries on its node that a guard elsewhere would take
// over, through their sidecars (Config.Command), before any guard can
// declare the node lost. Once the API server answers again, each is read
// afresh: one that is still the serving primary (a policy, replicas, no
// failover recorded) is resumed; one that was retired meanwhile stays
// paused until its kubelet stops it (its sidecar lets the SIGTERM
// through), so it never serves beside the standby that took over.

// fencing is the fence's state. It is used from liveness's goroutine while
// Run's may be blocked on the API server, so it has a lock of its own; Run
// only replaces here.
type fencing struct {
	mu     sync.Mutex
	here   []fencedPod          // the guarded primaries' pods on this node, as last synced
	fenced map[podKey]fencedPod // commanded to pause and not settled yet
	// checked maps each guarded primary to its pod that liftOnArrival has
	// checked since this agent started (Run's goroutine only).
	checked map[podKey]string
}

type fencedPod struct {
	dep   podKey // the primary Deployment
	pod   string
	guard string // the node of its standby, whose agent guards it
	// nodeMode: the agent runs its pipeline itself; no sidecar to pause
	// its broker, so its fence is only reported.
	nodeMode bool
}

// setHere records the guarded primaries on this node (syncNodes).
func (f *fencing) setHere(p []fencedPod) {
	f.mu.Lock()
	f.here = p
	f.mu.Unlock()
}

// Fence pauses the brokers of this node's primaries guarded by one of
// guards (the guards that may be taking them over): a command to each
// one's sidecar. It never touches the API server, which is out of reach
// when it is called.
func (a *Actuator) Fence(_ context.Context, why string, guards []string) {
	a.fc.mu.Lock()
	defer a.fc.mu.Unlock()
	n := 0
	for _, p := range a.fc.here {
		if !slices.Contains(guards, p.guard) {
			continue
		}
		if p.nodeMode {
			a.log.Error("fence only reported: in node mode no sidecar can pause the broker", slog.String("pod", p.dep.ns+"/"+p.pod))
			n++
			continue
		}
		a.command(p, true, why)
		a.fc.fenced[p.dep] = p
		n++
	}
	if n == 0 {
		a.log.Warn("fence: no primary on this node guarded by these guards", slog.Any("guards", guards))
	}
}

// Lift settles the fence once the API server answers: every fenced primary
// still serving is resumed, every retired one left paused. It returns how
// many could not be read (tried again by the caller).
func (a *Actuator) Lift(ctx context.Context) (unsettled int) {
	a.fc.mu.Lock()
	pods := make([]fencedPod, 0, len(a.fc.fenced))
	for _, p := range a.fc.fenced {
		pods = append(pods, p)
	}
	a.fc.mu.Unlock()
	slices.SortFunc(pods, func(x, y fencedPod) int { return strings.Compare(x.dep.String(), y.dep.String()) })
	for _, p := range pods {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		d, err := a.cluster.Deployment(rctx, p.dep.ns, p.dep.name)
		cancel()
		if err != nil {
			a.log.Warn("fence kept: the fenced primary could not be read", slog.String("deployment", p.dep.String()), slog.String("error", err.Error()))
			unsettled++
			continue
		}
		serving, why := stillServing(d)
		if serving {
			a.command(p, false, "the API server answers again and "+why)
		} else {
			a.log.Warn("fence kept until the kubelet stops the pod", slog.String("deployment", p.dep.String()),
				slog.String("pod", p.pod), slog.String("why", why))
		}
		a.fc.mu.Lock()
		delete(a.fc.fenced, p.dep)
		a.fc.mu.Unlock()
	}
	return unsettled
}

// liftOnArrival lifts any fence an earlier run of this agent may have left
// on the guarded primaries here, each once it is known here (the agent
// restarted while fenced: its retained commands went with it, and the
// sidecar keeps its broker paused, the safe side), after a fresh read that
// says it still serves; unreadable, it is checked again at the next sync.
// A pod this agent has fenced itself is left to Lift. Run's goroutine
// calls it (syncNodes).
func (a *Actuator) liftOnArrival(ctx context.Context, here []fencedPod) {
	if a.sendCommand == nil {
		return
	}
	for _, p := range here {
		if p.nodeMode || a.fc.checked[p.dep] == p.pod {
			continue
		}
		if a.liftIfServing(ctx, p.dep, p.pod) {
			a.fc.checked[p.dep] = p.pod
		}
	}
}

// liftIfServing sends pod a lift if its Deployment still serves and this
// agent has not fenced it; it reports whether it could tell.
func (a *Actuator) liftIfServing(ctx context.Context, dep podKey, pod string) bool {
	a.fc.mu.Lock()
	_, fenced := a.fc.fenced[dep]
	a.fc.mu.Unlock()
	if fenced {
		return true
	}
	d, err := a.cluster.Deployment(ctx, dep.ns, dep.name)
	if err != nil {
		return false
	}
	if ok, why := stillServing(d); ok {
		a.command(fencedPod{dep: dep, pod: pod}, false, "this agent started and "+why)
	}
	return true
}

// stillServing says whether d is still a primary that serves: it names a
// standby, has replicas, and no failover is recorded on it.
func stillServing(d *appsv1.Deployment) (bool, string) {
	if d.Annotations[contract.AnnStandby] == "" {
		return false, "it is no longer a primary (roles exchanged)"
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
		return false, "it was retired (0 replicas)"
	}
	var rec Record
	if raw := d.Annotations[contract.AnnRecord]; raw != "" && json.Unmarshal([]byte(raw), &rec) == nil {
		switch rec.Phase {
		case PhaseFailover, PhaseRetiring:
			return false, fmt.Sprintf("a failover is recorded (%s)", rec.Phase)
		}
	}
	return true, "it is still the primary"
}

func (a *Actuator) command(p fencedPod, fence bool, why string) {
	if a.sendCommand == nil {
		a.log.Error("fence not carried out: no command channel to the sidecars", slog.String("pod", p.dep.ns+"/"+p.pod))
		return
	}
	c := podsignal.Command{Namespace: p.dep.ns, Pod: p.pod, Fence: fence, Time: a.now(), Reason: podsignal.ShortReason(why)}
	if a.dryRun {
		a.log.Info("dry run: command not sent", slog.String("pod", p.dep.ns+"/"+p.pod), slog.Bool("fence", fence))
		return
	}
	if err := a.sendCommand(c); err != nil {
		a.log.Error("command to a sidecar not sent", slog.String("pod", p.dep.ns+"/"+p.pod), slog.Bool("fence", fence), slog.String("error", err.Error()))
		return
	}
	a.m.fence.WithLabelValues(c.Name()).Inc()
}
