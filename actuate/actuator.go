package actuate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
	"github.com/amf-edge/amf/statehub"
)

// Config configures an Actuator.
type Config struct {
	// Cluster is what the actuator reads and writes; default
	// cluster.NewKube(Client).
	Cluster Cluster
	// Client talks to the API server when Cluster is nil. It needs exactly
	// Rules().
	Client kubernetes.Interface
	// Logger receives one JSON line per decision ("msg":"decision"); default discard.
	Logger *slog.Logger
	// Now is the clock; default time.Now. Tests of the driver inject one.
	Now func() time.Time
	// DryRun (the agent's --observe-only) logs every decision and writes
	// nothing: the Cluster is wrapped in DryRun, so the switchover logic runs
	// as it would, on the cluster as it is. As nothing is written, a
	// simulated switchover leaves no record behind: the primary is read
	// again afterwards as it is, without the new record's cooldown.
	DryRun bool
	// Instance names this agent in Events (reportingInstance), e.g. the node.
	Instance string
	// ResumeOnStart lists the Deployments once when Run starts and resumes
	// every switchover whose record is in progress at once, also those no
	// pod will signal for again (a primary already scaled to 0 in phase
	// Retiring whose standby does not name it in amf.io/primary). Without
	// it a switchover resumes on the next signal of the primary or of the
	// standby that names it. Needs list on deployments (RulesWithResume).
	ResumeOnStart bool
	// Registerer receives the actuator's metrics (amf_actuate_*); nil: not registered.
	Registerer prometheus.Registerer
	// OwnerCacheSize bounds the pod → Deployment cache; default 4096.
	OwnerCacheSize int
	// Node is this agent's node. With it, the actuator takes part in node
	// loss (nodeloss.go): it records on each hot standby the nodes of the
	// pair's pods that signal to it, reports through OnGuards which nodes it
	// guards and which guard it, and fails a primary over when NodeLost
	// says its node is lost. Empty: none of that.
	Node string
	// DeleteRetiredOn is this agent's node when it runs node mode: when it
	// retires a node-mode primary, it deletes that primary's pods on this
	// node itself, right after the scale to 0, instead of leaving them to
	// the ReplicaSet controller. A node-mode pod has no readiness gate to
	// hold it out of its Services, and a crashed broker's container is
	// restarted by its kubelet at once: until the controller deletes the
	// pod (seconds when the controller manager is slow, after an API
	// server restart say) the old broker, empty, serves beside the new
	// primary. Needs delete on pods (nodewatch.Rules), confined to the
	// agent's own node by manifests/overlays/node-mode's admission policy;
	// without the right the controller's deletion stands. Empty: never.
	DeleteRetiredOn string
	// OnGuards is called from Run's goroutine whenever the Guards change;
	// it must not block. Optional.
	OnGuards func(Guards)
	// Command sends a command to one pod's sidecar (agent.Agent.Command):
	// the fence's lever (fence.go). Nil: a fence is only reported.
	Command func(podsignal.Command) error
	// States is the agent's state hub: a stateful pair's final state goes
	// through it at a planned switchover (state.go). Nil: no state is
	// carried, and stateful pairs are told so in an Event.
	States *statehub.Hub
	// StateWait bounds a handover (state.go): a new primary whose state has
	// not come within it joins its Services without it; default 10 s.
	StateWait time.Duration
	// StateAddr is where the agents of other nodes reach States
	// ("http://<node address>:<port>"), written on the standby of a
	// stateful pair whose pod runs here; StateRelay sends the states of
	// this node's primaries to the standby's node when that is another.
	// Either empty: a pair across two nodes carries no state, and says
	// so in an Event.
	StateAddr  string
	StateRelay StateRelay
}

// StateRelay sends a state handed in here on to the state hub of another
// node (statehub.Relay).
type StateRelay interface {
	Forward(hubURL string, st statehub.State)
}

// Controller is the reportingController of the agent's Events.
const Controller = "amf.io/agent"

// Actuator drives one Gate per primary Deployment from the agent's signals.
// All Gates are owned by the goroutine of Run, so they need no locks; the
// standby watches and the timer feed it through channels.
type Actuator struct {
	cluster Cluster
	log     *slog.Logger
	now     func() time.Time
	dryRun  bool
	inst    string
	resume  bool
	m       *metrics
	// deleteRetiredOn: Config.DeleteRetiredOn; deleteRefused, that the API
	// server refused such a delete once (said once at Warn, then at Debug).
	deleteRetiredOn string
	deleteRefused   bool

	owners    map[podKey]string // pod → Deployment; pods never change owner
	ownersMax int
	sized     map[podKey]int64     // pods resized to their pair's recorded size (keepPodSize)
	workloads map[podKey]*workload // keyed by the primary Deployment
	loads     uint64
	readyCh   chan readiness
	roleCh    chan roleChange
	events    *recorder
	nl        nodeLoss
	fc        fencing
	// sendCommand is Config.Command.
	sendCommand func(podsignal.Command) error
	// Broker state (state.go): the hub, the pods whose readiness is held,
	// the handovers under way by new primary, the standby readiness last
	// written by standby Deployment.
	states     *statehub.Hub
	held       map[podKey]heldPod
	handovers  map[podKey]*handover
	readyMarks map[podKey]string
	stateWait  time.Duration
	stateAddr  string
	relay      StateRelay
	// relays maps the primaries with a pod here to the hub of their
	// standby's node, when it is another.
	relays map[podKey]relayRoute
	// gateRetries are the readiness gates not written yet (kube.go).
	gateRetries map[podKey]gateRetry
}

type podKey struct{ ns, name string }

func (k podKey) String() string { return k.ns + "/" + k.name }

// workload is one Deployment the agent has seen a signal for.
type workload struct {
	key     podKey
	managed bool  // carries a valid policy
	invalid error // why the policy was rejected: warned about at every signal (one Event series)
	gate    *Gate
	written string // the record JSON as last read or written (the CAS value)
	// unsaved: the Gate moved on without its record (the API refused it:
	// the step's actions wait in retry, or a scale-up went out beside it);
	// the next step or the retry at retryAt writes it, whichever is first.
	unsaved bool
	uid     string
	// annotations of the primary when loaded: the policy copied by a role exchange.
	annotations map[string]string
	stop        context.CancelFunc // the standby watch
	// standbyAnn are the standby's annotations as its watch last saw them
	// (nil before): the nodes of the pair (contract.AnnPrimaryNode,
	// AnnStandbyNode).
	standbyAnn map[string]string
	gen        uint64 // distinguishes loads of the same Deployment
	// retry holds the actions left by a failed one, or those of a step
	// whose record was refused, to try again at retryAt while the Gate is
	// still in retryPhase.
	retry      []Action
	retryAt    time.Time
	retryPhase Phase
	loaded     time.Time
	// resizePollAt is when a resize in progress next reads its pod
	// (pollResize); resizeRefused, a refusal of the API to hand to the Gate there.
	resizePollAt  time.Time
	resizeRefused string
	// pods are the last few pods that signalled for this Deployment while
	// it was loaded, oldest first (Config.DeleteRetiredOn): those a
	// retirement deletes.
	pods []string
}

// podsKept bounds workload.pods: a Deployment's pods that overlap (a
// rollout, a pod replaced on a lost node) are two or three.
const podsKept = 4

// readiness is an observation of a standby by its watch.
type readiness struct {
	primary podKey
	gen     uint64 // the workload load it belongs to; stale watches are ignored
	status  standbyStatus
	ann     map[string]string // the standby's annotations
	at      time.Time
}

// standbyStatus is what the Gate is told of a standby (InStandby).
type standbyStatus struct{ ready, scaled, drained bool }

func statusOf(d *appsv1.Deployment) standbyStatus {
	observed := d.Status.ObservedGeneration >= d.Generation
	scaled := d.Spec.Replicas == nil || *d.Spec.Replicas >= 1 // nil defaults to 1
	return standbyStatus{ready: standbyReady(d), scaled: scaled, drained: observed && !scaled && d.Status.Replicas == 0}
}

// standbyReady reports whether the standby d could serve now: Ready, or,
// for a stateful pair, whose pods the agent holds out of their Services,
// named ready by its pod's agent (contract.AnnStandbyReady) while it runs a
// pod at its current generation.
func standbyReady(d *appsv1.Deployment) bool {
	if !statefulDeployment(d) {
		return deploymentReady(d)
	}
	scaled := d.Spec.Replicas == nil || *d.Spec.Replicas >= 1
	return d.Annotations[contract.AnnStandbyReady] != "" && scaled && d.Status.ObservedGeneration >= d.Generation && d.Status.Replicas >= 1
}

// Validate says what is wrong with c, if anything. It is the one check of
// c's values: New makes it, and the agent calls it before it starts
// anything. A zero value that takes a default is valid.
func (c Config) Validate() error {
	if c.Cluster == nil && c.Client == nil {
		return errors.New("actuate: Config.Cluster or Config.Client is required")
	}
	return nil
}

// New checks cfg (Validate) and returns an Actuator; call Run.
func New(cfg Config) (*Actuator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.Cluster
	if c == nil {
		c = cluster.NewKube(cfg.Client)
	}
	if cfg.DryRun {
		c = DryRun(c)
	}
	a := &Actuator{
		cluster: c, log: cfg.Logger, now: cfg.Now, dryRun: cfg.DryRun, inst: cfg.Instance, resume: cfg.ResumeOnStart, m: newMetrics(cfg.Registerer),
		owners: make(map[podKey]string), ownersMax: cfg.OwnerCacheSize, sized: make(map[podKey]int64), gateRetries: make(map[podKey]gateRetry),
		workloads: make(map[podKey]*workload), readyCh: make(chan readiness, 64),
		roleCh: make(chan roleChange, 16),
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.ownersMax <= 0 {
		a.ownersMax = 4096
	}
	if a.inst == "" {
		a.inst = "amf-agent"
	}
	a.events = newRecorder(a.cluster, a.log, a.now, a.inst)
	a.nl = newNodeLoss(cfg.Node, cfg.OnGuards)
	a.deleteRetiredOn = cfg.DeleteRetiredOn
	a.fc.fenced, a.fc.checked = map[podKey]fencedPod{}, map[podKey]string{}
	a.sendCommand = cfg.Command
	a.states, a.held, a.handovers, a.readyMarks = cfg.States, map[podKey]heldPod{}, map[podKey]*handover{}, map[podKey]string{}
	a.stateWait, a.stateAddr, a.relay, a.relays = cfg.StateWait, cfg.StateAddr, cfg.StateRelay, map[podKey]relayRoute{}
	if a.relay == nil || a.states == nil {
		a.stateAddr = "" // a hub that takes nothing relayed is not advertised
	}
	if a.stateWait <= 0 {
		a.stateWait = defaultStateWait
	}
	return a, nil
}

// unmanagedTTL is how long a Deployment without a policy is remembered as
// such: a policy added later is picked up after at most this long.
const unmanagedTTL = 30 * time.Second

// Run consumes signals until ctx ends or in is closed. API errors are logged
// and the step is retried on the next input; they never stop Run.
func (a *Actuator) Run(ctx context.Context, in <-chan podsignal.Observation) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ectx, stopEvents := context.WithCancel(ctx)
	eventsDone := make(chan struct{})
	go func() { defer close(eventsDone); a.events.run(ectx) }()
	defer func() {
		for _, w := range a.workloads {
			if w.stop != nil {
				w.stop()
			}
		}
		// The Events still queued and the series counts not written yet
		// are written (briefly) before Run returns.
		stopEvents()
		<-eventsDone
	}()
	if a.resume {
		a.resumeAll(ctx)
	}
	var taken <-chan statehub.State // nil without a hub: never ready
	if a.states != nil {
		taken = a.states.Received()
	}
	for {
		a.resetTimer(timer)
		select {
		case <-ctx.Done():
			return nil
		case s, ok := <-in:
			if !ok {
				return nil
			}
			if s.Missed > 0 {
				// A lost sample only delays a debounce (counts restart at the
				// next clear sample); a lost transition is repaired by the next
				// one. Say so loudly: the actuator is too slow for the load.
				a.log.Warn("actuation missed signals", slog.Uint64("missed", s.Missed))
			}
			a.handleSignal(ctx, s)
		case r := <-a.readyCh:
			w := a.workloads[r.primary]
			if w == nil || !w.managed || w.gen != r.gen {
				continue
			}
			w.standbyAnn = r.ann
			a.step(ctx, w, StandbyStatus(r.at, r.status.ready, r.status.scaled, r.status.drained))
		case r := <-a.roleCh:
			if w := a.workloads[r.key]; w != nil && w.gen == r.gen {
				a.log.Info("roles changed by another agent: read again", slog.String("deployment", r.key.String()))
				w.loaded = time.Time{}
				if _, err := a.workload(ctx, r.key); err != nil {
					a.log.Warn("deployment not read", slog.String("deployment", r.key.String()), slog.String("error", err.Error()))
				} else {
					a.releaseHeld(ctx, r.key)
				}
			}
		case e := <-a.nl.events:
			a.nodeEvent(ctx, e)
		case st := <-taken:
			a.stateTaken(ctx, st)
		case <-timer.C:
			now := a.now()
			if !a.nl.retryAt.IsZero() && !a.nl.retryAt.After(now) {
				a.nl.retryAt = time.Time{}
				a.failLostNodes(ctx)
			}
			if !a.nl.syncAt.IsZero() && !a.nl.syncAt.After(now) {
				a.nl.syncAt = time.Time{} // syncNodes runs below
			}
			a.stateDeadlines(ctx, now)
			a.gateRetriesDue(ctx, now)
			for _, w := range a.workloads {
				if (len(w.retry) > 0 || w.unsaved) && !w.retryAt.After(now) {
					a.retry(ctx, w)
				}
				if !w.managed || a.workloads[w.key] != w {
					continue // unmanaged, or retired by the retry above
				}
				if p := w.resizePollAt; w.gate.Rec.Phase == PhaseResizing && !p.IsZero() && !p.After(now) {
					a.pollResize(ctx, w)
				}
				if d, ok := w.gate.Deadline(); ok && !d.After(now) {
					a.step(ctx, w, Tick(now))
				}
			}
		}
		a.syncNodes(ctx)
	}
}

// resumeAll loads every Deployment whose switchover record is in progress,
// whose hot standby is still to be brought back (Record.Restore), or whose
// cold standby is scaled up with nothing recorded (an orphaned scale-up, see
// Gate.orphan). Several agents may resume the same record: every write of it
// is a compare-and-swap and every action is idempotent, so they do not
// conflict.
func (a *Actuator) resumeAll(ctx context.Context) {
	items, err := a.cluster.Deployments(ctx)
	if err != nil {
		a.log.Error("switchovers not resumed: deployments not listed", slog.String("error", err.Error()))
		return
	}
	byKey := make(map[podKey]*appsv1.Deployment, len(items))
	for i := range items {
		byKey[podKey{items[i].Namespace, items[i].Name}] = &items[i]
	}
	resumed := false
	for i := range items {
		d := &items[i]
		if _, loaded := a.workloads[podKey{d.Namespace, d.Name}]; loaded {
			continue // by the resume of an earlier one
		}
		why, ok := resumable(d, byKey)
		if ok && resumed {
			// An earlier resume may have moved this one (a role exchange
			// writes both Deployments of a pair): the list's copy is older
			// than that, and resuming from it would repeat the exchange.
			fresh, err := a.cluster.Deployment(ctx, d.Namespace, d.Name)
			if err != nil {
				a.log.Warn("switchover not resumed: deployment not read", slog.String("deployment", d.Namespace+"/"+d.Name), slog.String("error", err.Error()))
				continue
			}
			d = fresh
			why, ok = resumable(d, byKey)
		}
		if !ok {
			continue
		}
		resumed = true
		a.log.Info("resuming switchover", slog.String("deployment", d.Namespace+"/"+d.Name), slog.String("phase", why))
		if w := a.load(ctx, d); w.invalid != nil {
			a.warnInvalid(w)
		}
	}
}

// resumable says whether resumeAll loads d, and why: its record's phase, or
// an orphaned cold standby (byKey holds the Deployments by key).
func resumable(d *appsv1.Deployment, byKey map[podKey]*appsv1.Deployment) (string, bool) {
	var rec Record
	if raw := d.Annotations[contract.AnnRecord]; raw != "" && json.Unmarshal([]byte(raw), &rec) != nil {
		return "", false // load would start it from Idle: nothing to resume
	}
	if rec.Active() || rec.Restore {
		return string(rec.Phase), true
	}
	p, managed, err := contract.ParsePolicy(d.Name, d.Annotations)
	sb := byKey[podKey{d.Namespace, p.Standby}]
	if !managed || err != nil || p.Redundancy != contract.Cold || sb == nil || !statusOf(sb).scaled {
		return "", false
	}
	return "orphaned standby", true
}

func (a *Actuator) deadline(w *workload) (time.Time, bool) {
	if !w.managed {
		return time.Time{}, false
	}
	d, ok := w.gate.Deadline()
	if (len(w.retry) > 0 || w.unsaved) && (!ok || w.retryAt.Before(d)) {
		d, ok = w.retryAt, true
	}
	if p := w.resizePollAt; w.gate.Rec.Phase == PhaseResizing && !p.IsZero() && (!ok || p.Before(d)) {
		d, ok = p, true
	}
	return d, ok
}

// retryDelay is how long a failed action waits before it is tried again.
const retryDelay = 2 * time.Second

// resetTimer arms the timer for the earliest Gate deadline.
func (a *Actuator) resetTimer(t *time.Timer) {
	var next time.Time
	for _, w := range a.workloads {
		if d, ok := a.deadline(w); ok && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	sd, _ := a.nextStateDeadline()
	for _, r := range []time.Time{a.nl.retryAt, a.nl.syncAt, sd, a.nextGateRetry()} {
		if !r.IsZero() && (next.IsZero() || r.Before(next)) {
			next = r
		}
	}
	wait := time.Hour
	if !next.IsZero() {
		wait = max(next.Sub(a.now()), 0)
	}
	t.Reset(wait)
}

func (a *Actuator) handleSignal(ctx context.Context, s podsignal.Observation) {
	pk := podKey{s.Namespace, s.Pod}
	var pod *corev1.Pod
	if s.Transition {
		delete(a.gateRetries, pk) // superseded by this transition
		p, err := a.cluster.Pod(ctx, s.Namespace, s.Pod)
		if err != nil {
			a.log.Warn("pod not read", slog.String("pod", pk.String()), slog.String("error", err.Error()))
			a.retryGate(pk, s)
		} else {
			pod = p
			if !statefulPod(p) {
				a.gateOrRetry(ctx, p, s)
			}
		}
	}
	dep, err := a.owner(ctx, pk, pod)
	if err != nil {
		a.log.Warn("pod not mapped to a Deployment", slog.String("pod", pk.String()), slog.String("error", err.Error()))
		return
	}
	if dep == "" {
		if pod != nil && statefulPod(pod) {
			a.gateOrRetry(ctx, pod, s) // no pair to hold it for
		}
		return // not owned by a Deployment: nothing to actuate
	}
	if a.nl.signalled(podKey{s.Namespace, dep}, s.Pod, s.State) {
		if w, ok := a.workloads[podKey{s.Namespace, dep}]; ok && (!w.managed || w.gate.Rec.Phase == PhaseIdle) {
			w.loaded = time.Time{} // read again below (workload): never in the middle of a switchover
		}
	}
	w, err := a.workload(ctx, podKey{s.Namespace, dep})
	if err != nil {
		a.log.Warn("deployment not read", slog.String("deployment", s.Namespace+"/"+dep), slog.String("error", err.Error()))
		return
	}
	if w.invalid != nil {
		a.warnInvalid(w)
	}
	if pod != nil && statefulPod(pod) {
		a.gateStateful(ctx, w, pod, s)
	}
	a.keepPodSize(ctx, w, s)
	if !w.managed {
		if w.invalid == nil {
			a.resumeFromStandby(ctx, w, pk)
		}
		return
	}
	if a.deleteRetiredOn != "" && !slices.Contains(w.pods, s.Pod) {
		if w.pods = append(w.pods, s.Pod); len(w.pods) > podsKept {
			w.pods = w.pods[1:]
		}
	}
	if a.workloads[w.key] != w {
		return // retired while being loaded (resume)
	}
	a.step(ctx, w, Observed(s))
}

// resumeFromStandby loads the primary that an unmanaged Deployment names as
// a standby (amf.io/primary: written by inject --standby and by every role
// exchange), unless this agent knows it already. Loading it resumes a
// switchover in progress. It matters for one stop: after the primary was
// scaled to 0 and before the roles were exchanged, the primary has no pod
// left to signal, and its standby, which serves now, has no policy; without
// ResumeOnStart (manifests/base's agent cannot list Deployments) nothing
// else would load the primary again, and the pair would stay unprotected
// with the record in Retiring. The standby's sidecar re-sends its state
// whenever it reconnects, so a restarted agent hears it at once.
func (a *Actuator) resumeFromStandby(ctx context.Context, standby *workload, pod podKey) {
	name := standby.annotations[contract.AnnPrimary]
	if name == "" || name == standby.key.name {
		return
	}
	k := podKey{standby.key.ns, name}
	if _, known := a.workloads[k]; known {
		return // loaded by this agent: its own signals and watch drive it
	}
	d, err := a.cluster.Deployment(ctx, k.ns, k.name)
	if err != nil {
		a.log.Warn("primary of a standby not read", slog.String("deployment", k.String()), slog.String("standby", standby.key.String()),
			slog.String("pod", pod.String()), slog.String("error", err.Error()))
		return
	}
	var rec Record
	if raw := d.Annotations[contract.AnnRecord]; raw != "" && json.Unmarshal([]byte(raw), &rec) == nil && (rec.Active() || rec.Restore) {
		a.log.Info("resuming switchover", slog.String("deployment", k.String()), slog.String("phase", string(rec.Phase)),
			slog.String("signalled_by", pod.String()))
	}
	w := a.load(ctx, d)
	if w.invalid != nil {
		a.warnInvalid(w)
	}
}

// warnInvalid reports a signal of a workload whose policy is invalid: a
// Warning Event at every signal, folded into one Event series (count and
// last time), so it says how long and how often it went unprotected without
// creating an object per signal.
func (a *Actuator) warnInvalid(w *workload) {
	a.emitKey(w, true, "InvalidPolicy", "Invalid", w.invalid.Error())
}

// owner maps a pod to its Deployment through the controller ownerReferences
// pod → ReplicaSet → Deployment. Lookups (get pod, get replicaset) are cached
// per pod: a pod's owner never changes. "" means not owned by a Deployment.
func (a *Actuator) owner(ctx context.Context, pk podKey, pod *corev1.Pod) (string, error) {
	if d, ok := a.owners[pk]; ok {
		return d, nil
	}
	if pod == nil {
		p, err := a.cluster.Pod(ctx, pk.ns, pk.name)
		if err != nil {
			return "", fmt.Errorf("get pod: %w", err)
		}
		pod = p
	}
	dep := ""
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "ReplicaSet" {
		rs, err := a.cluster.ReplicaSet(ctx, pk.ns, ref.Name)
		if err != nil {
			return "", fmt.Errorf("get replicaset %s: %w", ref.Name, err)
		}
		if ref := metav1.GetControllerOf(rs); ref != nil && ref.Kind == "Deployment" {
			dep = ref.Name
		}
	}
	if len(a.owners) >= a.ownersMax {
		clear(a.owners) // crude but bounded; re-learned on demand
	}
	a.owners[pk] = dep
	return dep, nil
}

// workload returns the state of Deployment k, loading (or reloading an
// unmanaged one after unmanagedTTL) its policy and record from the server.
func (a *Actuator) workload(ctx context.Context, k podKey) (*workload, error) {
	// A workload is re-read after unmanagedTTL when nothing is in progress,
	// so an added or edited policy takes effect; never in the middle of a
	// debounce or switchover, whose state is in memory and in the record.
	if w, ok := a.workloads[k]; ok && (a.now().Sub(w.loaded) < unmanagedTTL || (w.managed && w.gate.Rec.Phase != PhaseIdle)) {
		return w, nil
	}
	d, err := a.cluster.Deployment(ctx, k.ns, k.name)
	if err != nil {
		return nil, err
	}
	return a.load(ctx, d), nil
}

// load (re)builds the workload of Deployment d from its annotations and
// resumes an interrupted switchover.
func (a *Actuator) load(ctx context.Context, d *appsv1.Deployment) *workload {
	k := podKey{d.Namespace, d.Name}
	old := a.workloads[k]
	if old != nil && old.stop != nil {
		old.stop()
	}
	a.loads++
	w := &workload{key: k, uid: string(d.UID), annotations: d.Annotations, loaded: a.now(), gen: a.loads}
	a.workloads[k] = w
	p, managed, err := contract.ParsePolicy(d.Name, d.Annotations)
	if !managed {
		if d.Annotations[contract.AnnPrimary] != "" {
			// A standby with a pod here: another agent may make it the
			// primary (its primary's crash or anomaly, decided on the
			// primary's node), and its signals, healthy, would not say so
			// before unmanagedTTL, if ever. This agent must know at once:
			// it records the new primary's node for the guard.
			wctx, cancel := context.WithCancel(ctx)
			w.stop = cancel
			go a.watchRole(wctx, k, w.gen, d)
		}
		return w
	}
	if err != nil {
		w.invalid = err
		return w
	}
	if statefulDeployment(d) && d.Annotations[contract.AnnHold] == "" {
		// A stateful pair's clients cannot move before the retirement
		// (its standby is held out of its Services until it holds the
		// state), so a hold would only wait: the handover that follows
		// the retirement is the evidence (DESIGN.md, "Broker state").
		p.Gates.Hold = 0
	}
	var rec Record
	w.written = d.Annotations[contract.AnnRecord]
	if w.written != "" {
		if err := json.Unmarshal([]byte(w.written), &rec); err != nil {
			a.emitKey(w, true, "InvalidRecord", "Invalid", fmt.Sprintf("%s not readable (%v): starting from Idle", contract.AnnRecord, err))
			rec = Record{}
		}
	}
	rec.StandbyReady = false // learned again from the watch
	w.managed, w.gate = true, NewGate(p, rec)
	if w.written == "" {
		// Write the Idle record now, off the decision's path: later writes
		// then take writeRecord's one-round-trip path.
		err := a.writeRecord(ctx, w)
		if errors.Is(err, cluster.ErrRecordMoved) {
			// The other agent of a pair across two nodes loaded it at the
			// same moment and wrote its own Idle record: take that one, so
			// that this agent's first decision is not refused (and its
			// samples so far forgotten) for a record that says the same.
			if a.movedIdle(ctx, w, w.gate.Rec) {
				err = nil
			}
		}
		if err != nil {
			a.log.Warn("switchover record not initialised", slog.String("deployment", k.String()), slog.String("error", err.Error()))
		}
	}
	// The standby as it is now: where its watch starts, and whether a cold
	// one was left scaled up with nothing recorded. Read here, not from the
	// watch's stream, so the check never sees a status from before this
	// agent's own scale-back.
	sb, err := a.cluster.Deployment(ctx, k.ns, p.Standby)
	if err != nil {
		a.log.Warn("standby not read", slog.String("standby", k.ns+"/"+p.Standby), slog.String("error", err.Error()))
		sb = nil // the watch reads it again
	}
	if sb != nil && !rec.Active() && exchangeUnfinished(k, sb) {
		// An agent stopped between the two writes of a role exchange
		// (retire writes the new primary first): the old primary still
		// carries its policy, names this Deployment as its standby and is
		// Retiring. Its load resumes the retirement (the scale to 0 again,
		// idempotent, and the exchange), which loads this one again. Until
		// that is done this one is not managed: its Record.Restore would
		// bring the old primary back while it is still a primary, and the
		// first signal of its new pod would retire it again.
		a.log.Info("resuming an unfinished role exchange", slog.String("deployment", k.String()), slog.String("old_primary", k.ns+"/"+sb.Name))
		a.load(ctx, sb)
		if nw, ok := a.workloads[k]; ok && nw != w {
			return nw
		}
		// Not finished yet (the retirement waits for this one to be Ready,
		// which the old primary's watch of it tells): unmanaged meanwhile.
		w.managed, w.gate = false, nil
		return w
	}
	wctx, cancel := context.WithCancel(ctx)
	w.stop = cancel
	go a.watchStandby(wctx, k, w.gen, p.Standby, sb)
	if sb != nil && statusOf(sb).scaled && p.Redundancy == contract.Cold && !rec.Active() {
		a.step(ctx, w, Orphaned(a.now()))
		if a.workloads[k] != w {
			return a.workloads[k] // reloaded: the record had moved
		}
	}
	if acts := w.gate.Resume(); len(acts) > 0 {
		a.decision(w, "resume", nil)
		a.do(ctx, w, acts)
	}
	return w
}

// exchangeUnfinished says whether sb, the standby of the primary k, is
// still a primary itself, naming k as its standby, with its record Retiring:
// a role exchange of sb's retirement stopped after its first write.
func exchangeUnfinished(k podKey, sb *appsv1.Deployment) bool {
	if sb.Annotations[contract.AnnStandby] != k.name {
		return false
	}
	var rec Record
	return json.Unmarshal([]byte(sb.Annotations[contract.AnnRecord]), &rec) == nil && rec.Phase == PhaseRetiring
}

// step feeds one input to w's Gate, persists the record if needed and
// carries out the actions: after the record is written (write-ahead), but
// for the standby's scale-up, which goes out at the same time (see early):
// decision → scale request on the wire is not held up by the record's round
// trip.
func (a *Actuator) step(ctx context.Context, w *workload, in Input) {
	t0 := a.now()
	old := w.gate.Rec
	acts := w.gate.Step(in)
	entered, decision := w.gate.Rec.Phase, w.gate.Rec.Decision
	if in.Kind == InStandby && in.Ready && (old.Phase == PhaseWaitReady || old.Phase == PhaseFailover) && entered != old.Phase {
		a.m.stages.WithLabelValues("standby_ready").Observe(in.At.Sub(decision).Seconds())
	}
	persist := w.gate.Persist(old) || w.unsaved
	if !persist {
		a.do(ctx, w, acts)
		return
	}
	var first []Action // sent while the record is written
	for _, act := range acts {
		if early(act) {
			first = append(first, act)
		}
	}
	var err error
	scaledUp := false
	if len(first) == 0 {
		err = a.writeRecord(ctx, w)
	} else {
		acts = slices.DeleteFunc(slices.Clone(acts), early)
		// The record is written by another goroutine and the scale-up sent
		// from this one, already on a CPU: on a busy node, waking a
		// goroutine can take longer than the request itself. w is not
		// touched here until the record's goroutine is done.
		standby := podKey{w.key.ns, w.gate.Policy.Standby}
		recorded := make(chan error, 1)
		go func() { recorded <- a.writeRecord(ctx, w) }()
		errs := make([]error, len(first))
		for i, act := range first {
			errs[i] = a.scale(ctx, standby, act.Replicas)
		}
		took := a.now().Sub(t0)
		err = <-recorded
		for i, act := range first {
			a.m.action(string(act.Kind), errs[i], a.dryRun, took)
			a.decision(w, string(act.Kind), errs[i], slog.Int("replicas", int(act.Replicas)), slog.Bool("with_record", true),
				slog.Duration("took", took))
			if errs[i] == nil {
				scaledUp = true
			} else {
				// Tried again by do, after the record: it is safe either way.
				acts = append([]Action{act}, acts...)
			}
		}
	}
	if errors.Is(err, cluster.ErrRecordMoved) && !old.Active() && a.movedIdle(ctx, w, old) {
		// The pair's other agent wrote an Idle record of its own (what it
		// saw of the standby): this step from Idle stands on it.
		err = a.writeRecord(ctx, w)
	}
	if err != nil {
		a.log.Error("switchover record not written", slog.String("deployment", w.key.String()),
			slog.String("phase", string(w.gate.Rec.Phase)), slog.Bool("standby_scaled_up", scaledUp), slog.String("error", err.Error()))
		if errors.Is(err, cluster.ErrRecordMoved) {
			// Continue from what is recorded there. A standby scaled up
			// meanwhile is found by the load: kept if that record's
			// switchover uses it, else adopted as an orphan and scaled back.
			a.reload(ctx, w)
			return
		}
		// The step is kept, not forgotten: the Gate as decided, its record
		// tried again after retryDelay, or with the next input if that
		// comes first. Forgetting it would wait for an input that may
		// never come: a standby's readiness is seen once, a crashed
		// primary sends nothing more. A stop before the write leaves the
		// old record, which a restart takes up.
		w.unsaved, w.retryAt = true, a.now().Add(retryDelay)
		if scaledUp {
			// The standby is up already, as the cluster is; what else the
			// step had to do is its Events (a scale-up never shares a step
			// with a retirement or a scale-down: writeorder_test checks).
			// A stop before the record leaves an orphaned standby, which a
			// restart adopts.
			a.do(ctx, w, acts)
			return
		}
		// Nothing else of the step is done before its record is written
		// (the write order): its actions wait in retry. A step without
		// actions keeps those of an earlier refused step, which still wait
		// for this record.
		if len(acts) > 0 {
			w.retry, w.retryPhase = acts, w.gate.Rec.Phase
		}
		return
	}
	if w.unsaved && len(acts) == 0 && w.retryPhase == w.gate.Rec.Phase {
		// The record of a refused step is written now: its actions follow
		// it at once, not at the retry.
		acts = w.retry
	}
	w.unsaved = false
	a.do(ctx, w, acts)
	a.m.steps.WithLabelValues(string(entered)).Observe(a.now().Sub(t0).Seconds())
}

// retry takes up what the API refused: the record first if the Gate moved
// on without it (a refused step, or a scale-up whose record failed), then
// the actions left, if the Gate is still in the phase they belong to.
func (a *Actuator) retry(ctx context.Context, w *workload) {
	acts := w.retry
	w.retry = nil
	if w.gate.Rec.Phase != w.retryPhase {
		acts = nil // superseded by a later step
	}
	if w.unsaved {
		if err := a.writeRecord(ctx, w); err != nil {
			a.log.Error("switchover record not written", slog.String("deployment", w.key.String()),
				slog.String("phase", string(w.gate.Rec.Phase)), slog.Bool("retry", true), slog.String("error", err.Error()))
			if errors.Is(err, cluster.ErrRecordMoved) {
				a.reload(ctx, w)
				return
			}
			w.retry, w.retryAt, w.retryPhase = acts, a.now().Add(retryDelay), w.gate.Rec.Phase
			return
		}
		w.unsaved = false
	}
	a.do(ctx, w, acts)
}

// reload re-reads w from the server after its record was changed by someone
// else (another agent), so the Gate continues from what is recorded there.
// movedIdle reports whether the record on w's Deployment, which moved
// from the one w wrote, is still an Idle one of the same switchover history
// as old (the step's starting point); if so w takes it as written. The
// agents of a pair across two nodes both keep a Gate of its primary (one
// to decide, the guard to fail it over if the node is lost), and each
// writes what it saw of the standby while Idle: without this, one's
// write refused the other's next decision, and its reload forgot the
// samples counted so far.
func (a *Actuator) movedIdle(ctx context.Context, w *workload, old Record) bool {
	d, err := a.cluster.Deployment(ctx, w.key.ns, w.key.name)
	if err != nil {
		return false
	}
	raw := d.Annotations[contract.AnnRecord]
	var rec Record
	if json.Unmarshal([]byte(raw), &rec) != nil || rec.Active() || !rec.LastSwitch.Equal(old.LastSwitch) || rec.Restore != old.Restore || rec.Standby != old.Standby {
		return false
	}
	w.written = raw
	return true
}

func (a *Actuator) reload(ctx context.Context, w *workload) {
	d, err := a.cluster.Deployment(ctx, w.key.ns, w.key.name)
	if err != nil {
		return // keep the in-memory Gate; the next input tries again
	}
	a.load(ctx, d)
}

// writeRecord stores w's record with optimistic concurrency: the write only
// happens if the annotation still holds what this agent last read or wrote
// (Cluster.SwapRecord); cluster.ErrRecordMoved if someone else changed it.
func (a *Actuator) writeRecord(ctx context.Context, w *workload) error {
	b, err := json.Marshal(w.gate.Rec)
	if err != nil {
		return err
	}
	if err := a.cluster.SwapRecord(ctx, w.key.ns, w.key.name, w.written, string(b)); err != nil {
		return err
	}
	w.written = string(b)
	return nil
}

// do carries out the Gate's actions in order. It stops at the first failure
// and tries the rest again after retryDelay if the Gate is still in the same
// phase (new actions supersede it; a restart repeats it from the record).
// A step without actions (most samples, a standby's status) leaves a
// pending retry alone: samples come every second, the retry after 2 s, and
// clearing it there dropped a refused scale-back for good.
//
// Events go last: they are evidence, queued for the recorder's goroutine
// once the step's cluster actions are done.
func (a *Actuator) do(ctx context.Context, w *workload, acts []Action) {
	if len(acts) == 0 {
		return
	}
	w.retry = nil
	acts = slices.Clone(acts)
	slices.SortStableFunc(acts, func(x, y Action) int { return cmp.Compare(eventLast(x), eventLast(y)) })
	for i, act := range acts {
		t0 := a.now()
		var err error
		switch act.Kind {
		case ActEvent:
			a.emitKey(w, act.Warning, act.Reason, "Switchover", act.Message)
		case ActScaleStandby:
			if act.Replicas == 0 {
				// A standby is scaled back only while the primary is Ready:
				// never both to 0 by our hand, whatever happened since the
				// Gate last heard from the primary.
				err = a.primaryReady(ctx, w)
			}
			if err == nil {
				err = a.scale(ctx, podKey{w.key.ns, w.gate.Policy.Standby}, act.Replicas)
			}
		case ActResize:
			var refused string
			refused, err = a.resizePod(ctx, w, act)
			if rz := w.gate.Rec.Resize; w.gate.Rec.Phase == PhaseResizing && act.Memory == rz.To && err == nil {
				// Its outcome is read from the pod from now on; a refusal
				// goes to the Gate from there, not from inside this step.
				w.resizeRefused, w.resizePollAt = refused, a.now()
				if refused == "" {
					w.resizePollAt = a.now().Add(resizePollEvery)
				}
			}
			if refused != "" {
				a.log.Warn("resize in place refused", slog.String("deployment", w.key.String()), slog.String("pod", act.Pod),
					slog.Int64("memory", act.Memory), slog.String("why", refused))
			}
		case ActKeepSize:
			err = a.keepSize(ctx, w, act.Memory)
		case ActRetirePrimary:
			decision := w.gate.Rec.Decision
			if err = a.retire(ctx, w); err == nil && !a.dryRun && !decision.IsZero() {
				a.m.stages.WithLabelValues("retired").Observe(a.now().Sub(decision).Seconds())
			}
		}
		a.m.action(string(act.Kind), err, a.dryRun, a.now().Sub(t0))
		attrs := []slog.Attr{slog.Int("replicas", int(act.Replicas)), slog.String("reason", act.Reason),
			slog.String("message", act.Message), slog.Duration("took", a.now().Sub(t0))}
		if act.Kind == ActResize {
			attrs = append(attrs, slog.String("pod", act.Pod), slog.Int64("memory", act.Memory))
		}
		a.decision(w, string(act.Kind), err, attrs...)
		if err != nil {
			if a.workloads[w.key] == w {
				w.retry, w.retryAt, w.retryPhase = acts[i:], a.now().Add(retryDelay), w.gate.Rec.Phase
			}
			return
		}
	}
}

func eventLast(a Action) int {
	if a.Kind == ActEvent {
		return 1
	}
	return 0
}

// decision writes the JSON decision line of one step.
func (a *Actuator) decision(w *workload, action string, err error, attrs ...slog.Attr) {
	level := slog.LevelInfo
	all := []slog.Attr{slog.String("deployment", w.key.String()), slog.String("action", action),
		slog.String("phase", string(w.gate.Rec.Phase)), slog.String("standby", w.gate.Policy.Standby),
		slog.Bool("dry_run", a.dryRun)}
	if why := w.gate.Rec.Why; why != "" && w.gate.Rec.Active() {
		all = append(all, slog.String("explanation", why))
	}
	if err != nil {
		level = slog.LevelError
		all = append(all, slog.String("error", err.Error()))
	}
	a.log.LogAttrs(context.Background(), level, "decision", append(all, attrs...)...)
}
