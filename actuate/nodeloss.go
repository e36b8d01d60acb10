package actuate

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"time"

	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// Node loss (DESIGN.md, "Losing a whole node"): the actuator's part. Package
// liveness tells a lost node from a slow or cut-off one; the agent's wiring
// runs it and tells the actuator, which alone knows the pairs:
//
//   - who guards whom. The agent of the node that runs a hot standby's pod
//     guards the node of its primary's pod. Each agent learns which pods run
//     on its node from their signals (a pod signals only to its own node's
//     agent), and writes it on the standby Deployment, which both agents of
//     a pair watch anyway: the primary's agent writes
//     contract.AnnPrimaryNode, the standby's agent contract.AnnStandbyNode.
//     No new read right, no list of pods or Nodes. A cold standby has no pod,
//     so nothing guards its primary (its failover would take a pod start, over
//     the 5 s a node loss is to take; DESIGN.md).
//   - the failover. A lost node is the crash input of the primary's Gate in
//     the guard's actuator (InNodeLost), after a fresh read of the primary:
//     no action on a primary already retired or on a record that moved. The
//     record's compare-and-swap keeps two guards from both acting, and the
//     retirement scales the primary to 0, so its pod on the lost node is
//     deleted when that node comes back: one primary remains.

// Guards is what the actuator tells the agent's liveness: the nodes it
// guards (those of the primaries whose hot standby runs here) and the nodes
// that guard it (those of the hot standbys of the primaries running here),
// each sorted.
type Guards struct {
	Guard, GuardedBy []string
}

func (g Guards) equal(o Guards) bool {
	return slices.Equal(g.Guard, o.Guard) && slices.Equal(g.GuardedBy, o.GuardedBy)
}

// nodeAnnEvery is the least time between two writes of one node annotation
// by one agent: two agents that both (wrongly, for a moment) think a pod
// runs on their node cannot make a storm of it.
const nodeAnnEvery = 5 * time.Second

// nodeLoss is the actuator's node-loss state, owned by Run's goroutine.
type nodeLoss struct {
	self     string
	onGuards func(Guards)
	events   chan nodeEvent
	// local maps the Deployments with a pod on this node (learned from
	// their signals) to those pods, in the order they first signalled; the
	// last is the current one (pod). A Deployment's old and new pods can
	// overlap on one node (the old one thawed after a power cut while its
	// replacement starts): the old pod's last signals must neither make it
	// current again nor, when it stops, take the Deployment off this node
	// while the new pod runs here, which dropped the guard of the pair.
	local   map[podKey][]string
	lost    map[string]time.Time // nodes lost (not back yet) → when declared
	retryAt time.Time            // when failLostNodes runs again
	syncAt  time.Time            // when syncNodes runs again without an input (writeNode)
	guards  Guards
	guarded map[podKey]string    // the primaries guarded → their nodes, as syncNodes last saw them
	wrote   map[podKey]time.Time // node annotations last written
}

type nodeEvent struct {
	node string
	at   time.Time
	lost bool // else back
}

func newNodeLoss(self string, onGuards func(Guards)) nodeLoss {
	return nodeLoss{self: self, onGuards: onGuards, events: make(chan nodeEvent),
		local: map[podKey][]string{}, lost: map[string]time.Time{}, wrote: map[podKey]time.Time{}}
}

// signalled records that pod of Deployment dep signalled to this agent, so
// runs on its node; a pod that stops or is gone no longer counts. It returns
// true for a pod new here: its Deployment may have changed roles meanwhile
// (a pod replaced after a failover), so the caller reads it again.
func (n *nodeLoss) signalled(dep podKey, pod string, st podsignal.State) bool {
	if n.self == "" {
		return false
	}
	pods := n.local[dep]
	i := slices.Index(pods, pod)
	switch st {
	case podsignal.Gone, podsignal.Stopping:
		if i >= 0 {
			if pods = slices.Delete(pods, i, i+1); len(pods) == 0 {
				delete(n.local, dep)
			} else {
				n.local[dep] = pods
			}
		}
		return false
	}
	if i >= 0 {
		return false
	}
	n.local[dep] = append(pods, pod)
	return true
}

// pod is the current pod of dep on this node: of those that signal here,
// the one that began to last.
func (n *nodeLoss) pod(dep podKey) (string, bool) {
	pods := n.local[dep]
	if len(pods) == 0 {
		return "", false
	}
	return pods[len(pods)-1], true
}

// NodeLost tells Run that node was declared lost at at (liveness.RunGuard's
// OnLost): every primary on it that this agent guards fails over to its hot
// standby. It waits for Run to take it, or for ctx (unbuffered: a call
// returns once Run has finished with the one before).
func (a *Actuator) NodeLost(ctx context.Context, node string, at time.Time) {
	a.sendNode(ctx, nodeEvent{node: node, at: at, lost: true})
}

// NodeBack tells Run that a lost node heartbeats again (RunGuard's OnBack).
func (a *Actuator) NodeBack(ctx context.Context, node string, at time.Time) {
	a.sendNode(ctx, nodeEvent{node: node, at: at})
}

func (a *Actuator) sendNode(ctx context.Context, e nodeEvent) {
	select {
	case a.nl.events <- e:
	case <-ctx.Done():
	}
}

func (a *Actuator) nodeEvent(ctx context.Context, e nodeEvent) {
	if !e.lost {
		delete(a.nl.lost, e.node)
		a.log.Info("node back", slog.String("node", e.node))
		return
	}
	if !slices.Contains(a.nl.guards.Guard, e.node) {
		// Liveness watches only the nodes it was given (OnGuards); one
		// dropped since is not this agent's to act on, and no NodeBack
		// would ever clear it.
		a.log.Info("node lost, but no longer guarded here: ignored", slog.String("node", e.node))
		return
	}
	a.nl.lost[e.node] = e.at
	a.log.Warn("node lost", slog.String("node", e.node), slog.Time("at", e.at))
	a.failLostNodes(ctx)
}

// guarded says whether w is a primary this agent guards, and on which node:
// hot, its standby's pod here, its own elsewhere.
func (a *Actuator) guarded(w *workload) (string, bool) {
	if a.nl.self == "" || !pairOf(w) {
		return "", false
	}
	if _, here := a.nl.pod(podKey{w.key.ns, w.gate.Policy.Standby}); !here {
		return "", false
	}
	n := w.standbyAnn[contract.AnnPrimaryNode]
	return n, n != "" && n != a.nl.self
}

// pairOf says whether w is the primary of a hot pair whose standby, as last
// seen, names it (amf.io/primary, which inject --standby and every role
// exchange write): an agent whose Gate outlived a role exchange it did not
// take (the old primary's) then writes no node and guards nothing.
func pairOf(w *workload) bool {
	return w.managed && w.gate.Policy.Redundancy == contract.Hot && w.standbyAnn != nil && w.standbyAnn[contract.AnnPrimary] == w.key.name
}

// failLostNodes feeds every guarded primary on a lost node its InNodeLost,
// after reading it afresh; what could not be read or recorded (the API
// server unreachable) is tried again after retryDelay, while the node is
// still lost.
func (a *Actuator) failLostNodes(ctx context.Context) {
	if len(a.nl.lost) == 0 {
		return
	}
	keys := make([]podKey, 0, len(a.workloads))
	for k := range a.workloads {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y podKey) int { return cmp.Or(cmp.Compare(x.ns, y.ns), cmp.Compare(x.name, y.name)) })
	again := false
	for _, k := range keys {
		w := a.workloads[k]
		if w == nil {
			continue // retired by an earlier failover of this loop
		}
		node, ok := a.guarded(w)
		if !ok {
			continue
		}
		at, lost := a.nl.lost[node]
		if !lost {
			continue
		}
		switch w.gate.Rec.Phase {
		case PhaseFailover, PhaseRetiring:
			continue // taken already
		}
		d, err := a.cluster.Deployment(ctx, k.ns, k.name)
		if err != nil {
			a.log.Warn("primary on a lost node not read: not acting on what may be stale", slog.String("deployment", k.String()),
				slog.String("node", node), slog.String("error", err.Error()))
			again = true
			continue
		}
		if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
			continue // retired already (by another guard, or an operator)
		}
		if d.Annotations[contract.AnnRecord] != w.written {
			// Someone else moved the record: continue from it (the load
			// reads the standby again, and its Gate may be past this).
			a.log.Info("primary on a lost node reloaded: its record moved", slog.String("deployment", k.String()))
			seen := w.standbyAnn
			if w = a.load(ctx, d); !w.managed || a.workloads[k] != w {
				continue
			}
			w.standbyAnn = seen // until the new watch says otherwise: the guard stays as it is meanwhile
		}
		a.step(ctx, w, NodeLost(at, node))
		if a.workloads[k] == w { // else retired and exchanged within the step
			switch w.gate.Rec.Phase {
			case PhaseFailover, PhaseRetiring:
			default:
				again = true // the record was not written (the step was forgotten): try again
			}
		}
	}
	if again {
		a.nl.retryAt = a.now().Add(retryDelay)
	}
}

// syncNodes writes the pair's nodes on the hot standbys where this agent
// knows better, and reports the Guards when they changed. Run calls it
// after every input.
func (a *Actuator) syncNodes(ctx context.Context) {
	if a.nl.self == "" {
		return
	}
	var g Guards
	var here []fencedPod
	guarded := map[podKey]string{} // the primaries guarded → their nodes
	for _, w := range a.workloads {
		if !pairOf(w) {
			continue
		}
		sk := podKey{w.key.ns, w.gate.Policy.Standby}
		if pod, ok := a.nl.pod(w.key); ok {
			a.writeNode(ctx, sk, contract.AnnPrimaryNode, w.standbyAnn)
			a.syncRelay(w, pod)
			if n := w.standbyAnn[contract.AnnStandbyNode]; n != "" && n != a.nl.self {
				g.GuardedBy = append(g.GuardedBy, n)
				here = append(here, fencedPod{dep: w.key, pod: pod, guard: n, nodeMode: w.annotations[contract.AnnMode] == string(contract.ModeNode)})
			}
		}
		if _, here := a.nl.pod(sk); here {
			a.writeNode(ctx, sk, contract.AnnStandbyNode, w.standbyAnn)
			if a.stateAddr != "" && a.held[podKey{sk.ns, w.standbyAnn[contract.AnnStandbyReady]}].dep == sk {
				// A stateful standby's pod runs here: its primary's
				// agent relays the states to this hub.
				a.writeAnn(ctx, sk, contract.AnnStandbyHub, a.stateAddr, w.standbyAnn)
			}
			if n, ok := a.guarded(w); ok {
				g.Guard = append(g.Guard, n)
				guarded[w.key] = n
			}
		}
	}
	a.fc.setHere(here)
	a.liftOnArrival(ctx, here)
	for _, l := range []*[]string{&g.Guard, &g.GuardedBy} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	if !g.equal(a.nl.guards) {
		a.nl.guards = g
		a.log.Info("guards", slog.Any("guard", g.Guard), slog.Any("guarded_by", g.GuardedBy))
		if a.nl.onGuards != nil {
			a.nl.onGuards(g)
		}
		// A loss holds only while its node stays guarded: liveness stops
		// watching a node dropped from the guards, so no NodeBack would
		// ever come for it, and a stale loss would fail over the primary
		// of a later pair on that node, healthy by then (the agents of the
		// lab's three nodes did so after a heal, back and forth). A node
		// guarded again is declared lost again by liveness if it still is.
		for n := range a.nl.lost {
			if !slices.Contains(g.Guard, n) {
				delete(a.nl.lost, n)
				a.log.Info("lost node no longer guarded here: its loss forgotten", slog.String("node", n))
			}
		}
	}
	// A primary guarded from now on, on a node lost and guarded since (its
	// pair's nodes learnt after the loss, the node guarded for another
	// pair), is failed over now: the loss is said once.
	fresh := false
	for k, n := range guarded {
		if _, lost := a.nl.lost[n]; lost && a.nl.guarded[k] != n {
			fresh = true
		}
	}
	a.nl.guarded = guarded
	if fresh {
		a.failLostNodes(ctx)
	}
}

// writeNode sets annotation key of the standby sk to this node, unless it
// says so already (as last seen) or was written within nodeAnnEvery.
func (a *Actuator) writeNode(ctx context.Context, sk podKey, key string, seen map[string]string) {
	a.writeAnn(ctx, sk, key, a.nl.self, seen)
}

// writeAnn sets annotation key of the standby sk to val, unless it says so
// already (as last seen) or was written within nodeAnnEvery.
func (a *Actuator) writeAnn(ctx context.Context, sk podKey, key, val string, seen map[string]string) {
	if seen[key] == val {
		return
	}
	wk := podKey{sk.ns, sk.name + "\x00" + key}
	if t, ok := a.nl.wrote[wk]; ok && a.now().Sub(t) < nodeAnnEvery {
		// Written moments ago and gone again (a role exchange clears
		// it): write it once the bound has passed, even if no input comes
		// then (a healthy pod sends none).
		if at := t.Add(nodeAnnEvery); a.nl.syncAt.IsZero() || at.Before(a.nl.syncAt) {
			a.nl.syncAt = at
		}
		return
	}
	a.nl.wrote[wk] = a.now()
	if err := a.cluster.PatchAnnotations(ctx, sk.ns, sk.name, map[string]*string{key: ptr.To(val)}); err != nil {
		a.log.Warn("node of a pair not recorded", slog.String("standby", sk.String()), slog.String("annotation", key), slog.String("error", err.Error()))
		return
	}
	a.log.Info("node of a pair recorded", slog.String("standby", sk.String()), slog.String("annotation", key), slog.String("node", a.nl.self))
}
